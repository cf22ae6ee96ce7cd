"""The emulated document pipeline written as plain Ray Data: runs on any machine.

Six ``map_batches`` stages (parse -> ocr -> langid -> quality -> dedup -> embed) whose UDFs are the
project's emulated operators: each batch costs what the measured cost model
(``trident_flows/pipelines/profiles/documents.json``) says, on an emulated GPU for ``embed``.
The static layout is the one of ``trident-flows run emulated-docs`` (8 CPUs + 1 GPU), so this
pipeline and the native ``emulated-docs`` PipelineSpec do the same work.

Plain Ray Data:      python examples/ray_data_emulated.py --out ray-data-out
Under trident:       trident-flows run examples/ray_data_emulated.py:build --synth 1000 --cpus 8 --gpus 1 --policy trident --out out
(or in Python, the one line: ``trident_flows.ray_data.run_dataset(build(), "out", policy="trident")``)
"""

from __future__ import annotations

import argparse

import ray
from ray.data import ActorPoolStrategy

from trident_flows.core.types import OpConfig
from trident_flows.pipelines.emulated import EmulatedOperator, cost_params, synthetic_rows
from trident_flows.pipelines.emulated_docs import LAYOUT
from trident_flows.runtime.costmodel import PipelineProfile


class DocumentStage(EmulatedOperator):
    """A ``map_batches`` UDF: one document stage emulated from its cost model. Like a real model,
    it runs on the GPU when Ray gave its worker one, else on the CPU."""

    operator = ""

    def __init__(self, cost: dict, time_scale: float = 1.0) -> None:
        device = "gpu" if ray.get_gpu_ids() else "cpu"
        super().__init__(OpConfig.make(device), name=self.operator, cost=cost, time_scale=time_scale)


class Parse(DocumentStage):
    operator = "parse"


class Ocr(DocumentStage):
    operator = "ocr"


class Langid(DocumentStage):
    operator = "langid"


class Quality(DocumentStage):
    operator = "quality"


class Dedup(DocumentStage):
    operator = "dedup"


class Embed(DocumentStage):
    operator = "embed"


def build(synth: int = 1000, regimes: str | None = None, seed: int = 0, time_scale: float = 1.0) -> ray.data.Dataset:
    """``synth`` synthetic documents through the six stages (``regimes`` as in ``--regimes``)."""
    profile = PipelineProfile.load("documents")
    rows = list(synthetic_rows(profile.workloads, synth, regimes or LAYOUT.default_regimes(profile, synth), seed))

    def stage(udf: type[DocumentStage], replicas: int, batch_size: int, **resources: float) -> dict:
        return {"fn_constructor_kwargs": {"cost": cost_params(profile.operator(udf.operator)), "time_scale": time_scale},
                "compute": ActorPoolStrategy(size=replicas), "batch_size": batch_size, **resources}

    ds = ray.data.from_items(rows)
    ds = ds.map_batches(Parse, **stage(Parse, 1, 8, num_cpus=1))
    ds = ds.map_batches(Ocr, **stage(Ocr, 3, 8, num_cpus=1))
    ds = ds.map_batches(Langid, **stage(Langid, 1, 8, num_cpus=1))
    ds = ds.map_batches(Quality, **stage(Quality, 1, 8, num_cpus=1))
    ds = ds.map_batches(Dedup, **stage(Dedup, 1, 8, num_cpus=1))
    ds = ds.map_batches(Embed, **stage(Embed, 1, 32, num_cpus=1, num_gpus=1))
    return ds


def main() -> None:
    parser = argparse.ArgumentParser(description="The emulated document pipeline on plain Ray Data (or under trident with --trident).")
    parser.add_argument("--out", default="ray-data-out")
    parser.add_argument("--synth", type=int, default=200)
    parser.add_argument("--time-scale", type=float, default=0.2)
    parser.add_argument("--trident", action="store_true", help="run it under trident instead (policy trident)")
    args = parser.parse_args()
    ray.init(num_cpus=8, num_gpus=1, include_dashboard=False)
    if args.trident:
        from trident_flows.ray_data import run_dataset

        run = run_dataset(build(args.synth, time_scale=args.time_scale), args.out, policy="trident")
        print(f"trident: {run.summary.items_in} items at {run.summary.throughput_items_per_s:.1f} items/s; "
              f"{run.rows_published} rows in {run.dataset_dir}")
    else:
        from trident_flows.runtime.devices import create_devices

        create_devices()  # the emulated GPU the embed stage runs on (a real GPU needs nothing)
        build(args.synth, time_scale=args.time_scale).write_parquet(args.out)
        print(f"Ray Data: wrote {args.out}")


if __name__ == "__main__":
    main()

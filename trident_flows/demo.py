"""``make demo``: curate a small synthetic PDF corpus with the real document pipeline on Ray.

Contract:
- ``main()`` = ``check_system()`` (tesseract present) -> ``make_corpus()`` (~40 PDFs under
  ``demo-output/corpus``, reused) -> ``run_demo()`` (the pipeline on a local Ray cluster, Parquet
  output under ``demo-output/run``) -> ``report()``; each step a separate function a caller can wrap.
- By default the run is recorded in Prefect: ``run_demo_flow()`` runs the ``document-curation``
  flow with its ``trident-sidecar`` on a local Prefect server and prints both flow-run links;
  ``--no-prefect`` uses ``run_demo()``.
- Each demo curates afresh; Trident's memory stays in ``demo-output/trident-memory``, so a second
  demo starts from what the first learned.
- ``python -m trident_flows.demo --stop`` stops what a demo left running and nothing else.
"""

from __future__ import annotations

import argparse
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

OUTPUT = Path("demo-output")
CORPUS = dict(n=40, regimes="short:24,long:4,scans:12", duplicates=0.1, broken=0.05, seed=0)
POLICY_PREFERENCE = ("trident", "ds2", "threshold", "static")


@dataclass(frozen=True)
class DemoResult:
    """What the demo table shows, read back from the run's Parquet output."""

    documents_in: int
    kept: int
    duplicates: int
    low_quality: int
    dead_lettered: int
    pages: int
    pages_ocrd: int
    wall_s: float
    policy: str
    output: str
    dead_letter_reasons: dict[str, int]


def check_system() -> None:
    """Refuse to start without tesseract, naming the fix."""
    import pytesseract

    try:
        pytesseract.get_tesseract_version()
    except pytesseract.TesseractNotFoundError as exc:
        raise SystemExit("the demo needs the tesseract OCR binary: run `bash scripts/ensure-system-deps.sh` "
                         "(or install the tesseract-ocr package) and try again") from exc


def make_corpus(console: Console, out: Path = OUTPUT / "corpus") -> Path:
    """Generate the demo corpus (deterministic; reused when its manifest is already there)."""
    from trident_flows.pipelines.synth_documents import generate

    if (out / "manifest.parquet").exists() and len(list(out.glob("*.pdf"))) == CORPUS["n"]:
        console.print(f"corpus: reusing {CORPUS['n']} PDFs in {out}")
        return out
    start = time.perf_counter()
    with console.status(f"generating {CORPUS['n']} PDFs ({CORPUS['regimes']}, born-digital and scanned) ..."):
        manifest = generate(out, **CORPUS)
    console.print(f"corpus: {len(manifest)} PDFs, {int(manifest.pages.sum())} pages ({int(manifest.scanned_pages.sum())} scanned) "
                  f"in {out} ({time.perf_counter() - start:.1f} s)")
    return out


def best_policy() -> str:
    """The most capable scheduling policy registered right now."""
    from trident_flows.scheduler.policies import available_policies

    available = set(available_policies())
    return next(p for p in POLICY_PREFERENCE if p in available)


def run_demo(console: Console, corpus: Path, out: Path = OUTPUT / "run") -> tuple[Any, str]:
    """Run the document pipeline over ``corpus`` on a local Ray cluster; returns (RunSummary, policy name)."""
    import ray
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from trident_flows.control.launch import cluster_totals, memory_uri, run_pipeline
    from trident_flows.core.types import ClusterSpec
    from trident_flows.pipelines.doc_dedup import release_index
    from trident_flows.pipelines.documents import build, dedup_index_name
    from trident_flows.scheduler.policies import make_policy

    os.environ["OMP_THREAD_LIMIT"] = "1"
    os.environ["HF_HUB_OFFLINE"] = "1"
    gpus = _cuda_devices()
    # Logical CPUs: one per initial replica at least (cheap operators mostly wait on I/O and queues).
    ray.init("local", num_cpus=max(8, os.cpu_count() or 1), num_gpus=gpus, namespace="trident-demo", include_dashboard=False,
             log_to_driver=False, configure_logging=False)
    spec = build(input=corpus)
    policy_name = best_policy()
    try:
        cpus, gpus_now = cluster_totals()
        memory = {"memory": memory_uri(None, out, spec.name)} if policy_name == "trident" else {}
        policy = make_policy(policy_name, spec=spec, cluster=ClusterSpec.single_node(cpus, int(gpus_now)), **memory)
        console.print(f"running pipeline {' -> '.join(o.name for o in spec.operators)} on a local Ray node "
                      f"({cpus:g} logical CPUs, {gpus_now:g} GPUs), policy {policy_name!r}")
        columns = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[ops]}"),
                   TimeElapsedColumn())
        with Progress(*columns, console=console) as bar:
            task = bar.add_task("documents", total=spec.items, ops="starting replicas ...")

            def progress(state: Any) -> None:
                ops = " ".join(f"{o.name} {o.items_in}" for o in state.operators)
                bar.update(task, completed=state.items_written + state.items_dead_lettered, ops=ops)

            summary = run_pipeline(spec, out, policy=policy, progress=progress, overwrite=True)
    finally:
        release_index(dedup_index_name(spec))
        ray.shutdown()
    if summary.error:
        raise SystemExit(f"the demo run failed: {summary.error}")
    return summary, policy_name


def run_demo_flow(console: Console, corpus: Path, out: Path = OUTPUT / "run") -> tuple[Any, str]:
    """The same run as Prefect flow runs on a local Prefect server (started when none runs, left
    running for the UI; ``--stop`` stops it): ``document-curation``, which starts its own
    ``trident-sidecar`` subflow for the pipeline's life. Prints both flow-run links; returns
    (figures for ``report``, policy name)."""
    from types import SimpleNamespace

    import ray

    from trident_flows.blocks import PipelineSettingsBlock, TridentSettingsBlock
    from trident_flows.flows.document_curation import document_curation
    from trident_flows.prefect_server import connected, ensure_server
    from trident_flows.tasks.sidecar_report import sidecar_run_of

    os.environ["OMP_THREAD_LIMIT"] = "1"
    os.environ["HF_HUB_OFFLINE"] = "1"
    shutil.rmtree(out, ignore_errors=True)  # curated afresh (a flow re-run over the same output would skip it all)
    info = ensure_server()
    console.print(f"Prefect UI: {info.ui_url}" + ("" if info.started_by_us else " (a server that was already running)"))
    policy_name = best_policy()
    pipeline = PipelineSettingsBlock(pipeline="documents", input_location=str(corpus), output_location=str(out), shard_size=10,
                                     runner_name="trident-demo")
    with connected(info):
        ray.init("local", num_cpus=max(8, os.cpu_count() or 1), num_gpus=_cuda_devices(), namespace="trident-demo",
                 include_dashboard=False, log_to_driver=False, configure_logging=False,
                 runtime_env={"env_vars": {"PREFECT_API_URL": info.url}})
        try:
            console.print(f"running flow document-curation, tuned by its trident-sidecar subflow (policy {policy_name!r}), "
                          "on a local Ray node")
            state = document_curation(pipeline=pipeline, trident=TridentSettingsBlock(policy=policy_name, tick_interval_s=2.0),
                                      return_state=True)
        finally:
            ray.shutdown()
        curation_id = state.state_details.flow_run_id
        sidecar_id = sidecar_run_of(curation_id)
    console.print(f"document-curation flow run (its decisions and live view are artifacts there): {info.flow_run_url(curation_id)}")
    if sidecar_id is not None:
        console.print(f"trident-sidecar subflow run:   {info.flow_run_url(sidecar_id)}")
    if not state.is_completed():
        raise SystemExit(f"the demo run failed: {state.message}")
    figures = state.result()
    return SimpleNamespace(items_in=figures["items_in"], wall_s=figures["wall_s"]), policy_name


def _cuda_devices() -> int:
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except ImportError:
        return 0


def report(summary: Any, policy: str, out: Path = OUTPUT / "run") -> DemoResult:
    """Count what the run wrote (kept, duplicates, low quality, dead letters, OCR'd pages)."""
    import pandas as pd

    data_files = sorted((out / "data").glob("*.parquet"))
    dead_files = sorted((out / "dead_letter").glob("*.parquet"))
    data = pd.concat([pd.read_parquet(f, columns=None) for f in data_files], ignore_index=True) if data_files else pd.DataFrame()
    dead = pd.concat([pd.read_parquet(f) for f in dead_files], ignore_index=True) if dead_files else pd.DataFrame(columns=["error"])
    drop = data["_drop"].fillna("") if "_drop" in data else pd.Series([""] * len(data))
    reasons: dict[str, int] = {}
    for error in dead["error"]:
        key = str(error).split(":", 1)[0]
        reasons[key] = reasons.get(key, 0) + 1
    return DemoResult(
        documents_in=summary.items_in, kept=int((drop == "").sum()), duplicates=int(drop.str.startswith("duplicate-of:").sum()),
        low_quality=int(drop.str.startswith("quality:").sum()), dead_lettered=len(dead),
        pages=int(data["pages"].fillna(0).sum()) if "pages" in data else 0,
        pages_ocrd=int(data["ocr_pages"].fillna(0).sum()) if "ocr_pages" in data else 0, wall_s=summary.wall_s, policy=policy,
        output=str((out / "data").resolve()), dead_letter_reasons=reasons)


def render(result: DemoResult, console: Console) -> None:
    table = Table(title="trident-flows demo: document curation")
    table.add_column("figure")
    table.add_column("value", justify="right")
    reasons = ", ".join(f"{k}: {v}" for k, v in result.dead_letter_reasons.items())
    rows = [
        ("documents in", result.documents_in),
        ("kept (embedded)", result.kept),
        ("near-duplicates removed", result.duplicates),
        ("low quality removed", result.low_quality),
        ("dead-lettered (unreadable)", f"{result.dead_lettered}" + (f"  ({reasons})" if reasons else "")),
        ("pages parsed", result.pages),
        ("pages OCR'd", result.pages_ocrd),
        ("wall time", f"{result.wall_s:.1f} s"),
        ("throughput", f"{result.documents_in / result.wall_s:.2f} docs/s, {result.pages / result.wall_s:.1f} pages/s"
         if result.wall_s > 0 else "n/a"),
        ("policy", result.policy),
        ("Parquet output", result.output),
    ]
    for name, value in rows:
        table.add_row(name, str(value))
    console.print(table)


def stop(console: Console) -> None:
    """Stop what a demo left running (its local Prefect server, if it started one)."""
    from trident_flows.prefect_server import stop_server

    console.print("stopped the demo's Prefect server" if stop_server() else "nothing to stop")


def main(argv: list[str] | None = None) -> DemoResult | None:
    parser = argparse.ArgumentParser(prog="python -m trident_flows.demo", description=__doc__.splitlines()[0])
    parser.add_argument("--stop", action="store_true", help="stop what a previous demo left running, then exit")
    parser.add_argument("--no-prefect", action="store_true", help="run the pipeline directly, without Prefect flow runs")
    args = parser.parse_args(argv)
    console = Console()
    if args.stop:
        stop(console)
        return None
    check_system()
    corpus = make_corpus(console)
    summary, policy = run_demo(console, corpus) if args.no_prefect else run_demo_flow(console, corpus)
    result = report(summary, policy)
    render(result, console)
    return result


if __name__ == "__main__":
    main()

"""Screenshot the Prefect UI page of a trident-sidecar flow run's plan artifact.

Usage (from the repository root):
    .venv/bin/python scripts/screenshot_ui.py                      # record a run, then screenshot it
    .venv/bin/python scripts/screenshot_ui.py --flow-run-id UUID   # screenshot an existing sidecar run

Without ``--flow-run-id`` it records one: on a local Prefect server (started unless one runs on
``--port``) and a local Ray node, it runs the ``document-curation`` flow on an emulated pipeline
and, next to it, the ``trident-sidecar`` flow until the pipeline finishes. Then headless
Chromium (Debian package ``chromium``; ``apt-get install -y chromium``) renders the sidecar run's
artifact page into ``--out``. A server this script started is stopped at the end.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from trident_flows.prefect_server import connected, ensure_server, stop_server  # noqa: E402

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--hide-scrollbars"]


def record_sidecar_run(args: argparse.Namespace, api_url: str) -> str:
    """Run document-curation with the sidecar beside it; return the sidecar's flow run id."""
    import ray

    from trident_flows.blocks import PipelineSettingsBlock, TridentSettingsBlock
    from trident_flows.flows.with_sidecar import curate_with_sidecar

    work = Path(tempfile.mkdtemp(prefix="trident-screenshot-"))
    pipeline = PipelineSettingsBlock(pipeline=args.pipeline, synth=args.synth, output_location=str(work / "out"),
                                     shard_size=args.shard_size, runner_name="screenshot-runner")
    ray.init("local", num_cpus=args.cpus, num_gpus=args.gpus, include_dashboard=False, namespace="trident", log_to_driver=False,
             configure_logging=False, runtime_env={"env_vars": {"PREFECT_API_URL": api_url}})
    try:
        run = curate_with_sidecar(pipeline, TridentSettingsBlock(policy=args.policy, tick_interval_s=args.tick_s, min_samples=4))
    finally:
        ray.shutdown()
        shutil.rmtree(work, ignore_errors=True)
    if run.sidecar is None:
        raise RuntimeError(f"the document-curation run never started its runner: {run.curation}")
    result = run.sidecar.result()
    print(f"sidecar: {result['ticks']} ticks, {result['plans_applied']} plans applied")
    return str(run.sidecar.state_details.flow_run_id)


def _plan_artifact_id(flow_run_id: str) -> str:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, ArtifactFilterType
    from prefect.client.schemas.sorting import ArtifactSort

    with get_client(sync_client=True) as client:
        artifacts = client.read_artifacts(artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]),
                                                                         type=ArtifactFilterType(any_=["table"])),
                                          sort=ArtifactSort.CREATED_DESC)
        plans = [a for a in artifacts if (a.key or "").startswith("trident-plan-")]
    if not plans:
        raise RuntimeError(f"flow run {flow_run_id} has no trident-plan artifact: is it a trident-sidecar run?")
    # the applied plan that changed the most operators (the latest among equals); else the latest plan
    best = max(plans, key=lambda a: ("applied" in str(a.data), str(a.data).count('"change": "yes"'), a.created))
    return str(best.id)


def screenshot(url: str, out: Path, window: str) -> None:
    """Render ``url`` with headless Chromium into ``out`` (PNG)."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit("chromium is not installed: apt-get install -y chromium")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile:
        subprocess.run([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--window-size={window}",
                        "--virtual-time-budget=20000", f"--screenshot={out}", url],
                       check=True, capture_output=True, timeout=180)
    print(f"wrote {out} from {url}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "prefect-ui.png")
    parser.add_argument("--flow-run-id", help="An existing trident-sidecar flow run (default: record one).")
    parser.add_argument("--port", type=int, default=4200, help="Port of the local Prefect server.")
    parser.add_argument("--state-dir", type=Path, default=REPO / ".prefect-demo", help="Pid file and database of a server started here.")
    parser.add_argument("--policy", default="trident", help="Policy of the recorded sidecar run.")
    parser.add_argument("--pipeline", default="emulated-docs", help="Pipeline of the recorded curation run.")
    parser.add_argument("--synth", type=int, default=200, help="Inputs of the recorded curation run.")
    parser.add_argument("--shard-size", type=int, default=50)
    parser.add_argument("--tick-s", type=float, default=2.0)
    parser.add_argument("--cpus", type=int, default=12, help="Logical CPUs of the local Ray node.")
    parser.add_argument("--gpus", type=int, default=2, help="Logical GPUs of the local Ray node.")
    parser.add_argument("--window", default="1920,1000", help="Browser window size, WIDTH,HEIGHT.")
    args = parser.parse_args()

    info = ensure_server(port=args.port, state_dir=args.state_dir)
    try:
        with connected(info):
            flow_run_id = args.flow_run_id or record_sidecar_run(args, info.url)
            artifact_id = _plan_artifact_id(flow_run_id)
        print(f"sidecar flow run: {info.flow_run_url(flow_run_id)}")
        # the artifact's page shows the plan table next to its flow run (the run page's
        # Artifacts tab cannot be opened by URL and shows cards without the table)
        screenshot(f"{info.ui_url}/artifacts/artifact/{artifact_id}", args.out, args.window)
    finally:
        if info.started_by_us:
            stop_server(args.state_dir)


if __name__ == "__main__":
    main()

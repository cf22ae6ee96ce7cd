"""Screenshot the Prefect UI pages of a document-curation run tuned by its trident-sidecar.

Usage (from the repository root):
    .venv/bin/python scripts/screenshot_ui.py                      # record a run, then screenshot it
    .venv/bin/python scripts/screenshot_ui.py --flow-run-id UUID   # screenshot an existing curation run

Without ``--flow-run-id`` it records one: on a local Prefect server (started unless one runs on
``--port``) and a local Ray node, it runs the ``document-curation`` flow on an emulated pipeline
with ``trident`` settings, so the run starts its own ``trident-sidecar`` subflow. Then headless
Chromium (Debian package ``chromium``; ``apt-get install -y chromium``) renders into ``--out-dir``:
``prefect-curation-run.png`` (the curation run's page), ``prefect-decisions.png`` (its
decisions artifact: one plain sentence per decision, figures in columns),
``prefect-live-view.png`` (its live view: per-operator table and the throughput/replica chart) and
``prefect-account.png`` (the run's account: decisions with their measured effect, OOMs avoided,
the ESTIMATE of the starting configuration's rate, the timeline with the decisions marked).
A server this script started is stopped at the end.
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


def record_curation_run(args: argparse.Namespace, api_url: str) -> str:
    """Run document-curation with trident settings (it starts its own sidecar); return its flow run id."""
    import ray

    from trident_flows.blocks import PipelineSettingsBlock, TridentSettingsBlock
    from trident_flows.flows.document_curation import document_curation

    work = Path(tempfile.mkdtemp(prefix="trident-screenshot-"))
    pipeline = PipelineSettingsBlock(pipeline=args.pipeline, synth=args.synth, output_location=str(work / "out"),
                                     shard_size=args.shard_size, runner_name="screenshot-runner")
    for attempt in range(3):  # on a loaded machine the local raylet can time out starting up: try again
        try:
            ray.init("local", num_cpus=args.cpus, num_gpus=args.gpus, include_dashboard=False, namespace="trident",
                     log_to_driver=False, configure_logging=False, runtime_env={"env_vars": {"PREFECT_API_URL": api_url}})
            break
        except Exception as exc:  # noqa: BLE001 - Ray raises a bare Exception for a node that did not start
            ray.shutdown()
            if attempt == 2 or "timed out during startup" not in str(exc):
                raise
            print(f"the local Ray node did not start ({exc}); trying again")
    try:
        state = document_curation(pipeline=pipeline, trident=TridentSettingsBlock(policy=args.policy, tick_interval_s=args.tick_s,
                                                                                  min_samples=4), return_state=True)
    finally:
        ray.shutdown()
        shutil.rmtree(work, ignore_errors=True)
    if not state.is_completed():
        raise RuntimeError(f"the document-curation run failed: {state.message}")
    return str(state.state_details.flow_run_id)


def _artifact_ids(flow_run_id: str) -> dict[str, str]:
    """Ids of the curation run's artifacts by kind: trident's ("decisions", "live") and the run's "account"."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    with get_client(sync_client=True) as client:
        artifacts = client.read_artifacts(artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id])))
    ids = {kind: str(a.id) for a in artifacts for kind in ("decisions", "live") if (a.key or "").startswith(f"trident-{kind}-")}
    accounts = [str(a.id) for a in artifacts if (a.key or "").startswith("curation-") and (a.key or "").endswith("-account")]
    if accounts:
        ids["account"] = accounts[-1]  # the last one, as the dict comprehension it replaces kept
    if "live" not in ids:
        raise RuntimeError(f"flow run {flow_run_id} has no trident live view: was it run with trident settings?")
    return ids


def screenshot(url: str, out: Path, window: str) -> None:
    """Render ``url`` with headless Chromium into ``out`` (PNG)."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit("chromium is not installed: apt-get install -y chromium")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile:
        subprocess.run([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--window-size={window}",
                        "--virtual-time-budget=30000", f"--screenshot={out}", url],
                       check=True, capture_output=True, timeout=180)
    print(f"wrote {out} from {url}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out-dir", type=Path, default=REPO / "docs")
    parser.add_argument("--flow-run-id", help="An existing document-curation flow run (default: record one).")
    parser.add_argument("--port", type=int, default=4200, help="Port of the local Prefect server.")
    parser.add_argument("--state-dir", type=Path, default=REPO / ".prefect-demo", help="Pid file and database of a server started here.")
    parser.add_argument("--policy", default="trident", help="Policy of the recorded sidecar run.")
    parser.add_argument("--pipeline", default="emulated-docs", help="Pipeline of the recorded curation run.")
    parser.add_argument("--synth", type=int, default=300, help="Inputs of the recorded curation run.")
    parser.add_argument("--shard-size", type=int, default=50)
    parser.add_argument("--tick-s", type=float, default=2.0)
    parser.add_argument("--cpus", type=int, default=12, help="Logical CPUs of the local Ray node.")
    parser.add_argument("--gpus", type=int, default=2, help="Logical GPUs of the local Ray node.")
    parser.add_argument("--window", default="1600,1000", help="Browser window size, WIDTH,HEIGHT.")
    parser.add_argument("--account-window", default="1600,1800", help="Browser window size of the account page (a tall one: "
                        "its table, then the timeline).")
    args = parser.parse_args()

    info = ensure_server(port=args.port, state_dir=args.state_dir)
    try:
        with connected(info):
            flow_run_id = args.flow_run_id or record_curation_run(args, info.url)
            ids = _artifact_ids(flow_run_id)
        print(f"curation flow run: {info.flow_run_url(flow_run_id)}")
        screenshot(info.flow_run_url(flow_run_id), args.out_dir / "prefect-curation-run.png", args.window)
        screenshot(f"{info.ui_url}/artifacts/artifact/{ids['live']}", args.out_dir / "prefect-live-view.png", args.window)
        if "decisions" in ids:
            screenshot(f"{info.ui_url}/artifacts/artifact/{ids['decisions']}", args.out_dir / "prefect-decisions.png", args.window)
        if "account" in ids:
            screenshot(f"{info.ui_url}/artifacts/artifact/{ids['account']}", args.out_dir / "prefect-account.png", args.account_window)
    finally:
        if info.started_by_us:
            stop_server(args.state_dir)


if __name__ == "__main__":
    main()

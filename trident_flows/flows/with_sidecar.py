"""Run ``document-curation`` with a ``trident-sidecar`` beside it, in one process: the demo's and
the UI screenshot's way to show both flows working together on one Ray cluster.

Contract: ``curate_with_sidecar(pipeline, trident)`` needs Ray initialised by the caller (a local
node or a cluster) and a Prefect API (``PREFECT_API_URL`` or ``prefect_server.connected``). It
starts the curation flow in a thread (with this thread's Prefect context, so both report to the
same server), waits until its runner appears, runs the sidecar until the pipeline finishes, and
returns both final flow-run states. A curation that fails before its runner starts is reported
with its state, not waited for.
"""

from __future__ import annotations

import contextvars
import threading
import time
from dataclasses import dataclass
from typing import Any

import ray
from prefect.states import State

from trident_flows.blocks import PipelineSettingsBlock, TridentSettingsBlock
from trident_flows.flows.document_curation import document_curation
from trident_flows.flows.trident_sidecar import trident_sidecar
from trident_flows.runtime.launch import find_runner


@dataclass(frozen=True)
class CuratedWithSidecar:
    """The final states of the two flow runs (``sidecar`` is None when the runner never started)."""

    curation: State
    sidecar: State | None


def curate_with_sidecar(pipeline: PipelineSettingsBlock, trident: TridentSettingsBlock, start_timeout_s: float = 600.0) -> CuratedWithSidecar:
    """Curate ``pipeline`` while the sidecar ticks against it with ``trident`` (see the module docstring)."""
    if not ray.is_initialized():
        raise RuntimeError("curate_with_sidecar needs Ray initialised: ray.init(\"local\", num_cpus=..., num_gpus=...) or ray.init(address)")
    namespace = ray.get_runtime_context().namespace
    outcome: dict[str, Any] = {}

    def curate() -> None:
        outcome["curation"] = document_curation(pipeline=pipeline, return_state=True)

    # Prefect settings (the API URL) live in context variables, which a new thread does not inherit.
    thread = threading.Thread(target=contextvars.copy_context().run, args=(curate,), name="document-curation")
    thread.start()
    sidecar: State | None = None
    try:
        deadline = time.monotonic() + start_timeout_s
        while sidecar is None and thread.is_alive() and time.monotonic() < deadline:
            try:
                find_runner(pipeline.runner_name, namespace)
            except LookupError:
                time.sleep(0.5)
                continue
            sidecar = trident_sidecar(trident=trident, runner_name=pipeline.runner_name, until_finished=True, return_state=True)
    finally:
        thread.join()
    return CuratedWithSidecar(outcome["curation"], sidecar)

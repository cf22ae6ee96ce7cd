"""The run summary's per-operator figures, read from a runner's final state.

Contract: ``operator_figures(state)`` maps each operator of a ``RunnerState`` to its serving
replicas (``replicas``), their count per configuration label (``configs``; a canary counted apart
as "LABEL (canary)"), ``busy_fraction`` (rounded to 4 places), ``items_in``, ``items_out``,
``errors``, ``ooms`` and ``config_epoch``: the ``operators`` of ``trident-flows run --summary-json``
and of the simulator's summary.
"""

from __future__ import annotations

from typing import Any

from trident_flows.core.state import RunnerState


def operator_figures(state: RunnerState) -> dict[str, dict[str, Any]]:
    """Per operator of ``state``: replicas, configurations and counters (see the module docstring)."""
    figures = {}
    for op in state.operators:
        configs: dict[str, int] = {}
        for r in op.active:
            label = r.config.label() + (" (canary)" if r.canary else "")
            configs[label] = configs.get(label, 0) + 1
        figures[op.name] = {"replicas": len(op.active), "configs": configs, "busy_fraction": round(op.busy_fraction, 4),
                            "items_in": op.items_in, "items_out": op.items_out, "errors": op.errors, "ooms": op.ooms,
                            "config_epoch": op.config_epoch}
    return figures

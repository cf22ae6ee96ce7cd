"""The one summary of a finished run: ``trident-flows run --summary-json``, the ``document-curation`` flow's
result and the simulator's ``SimRun.summary`` are each a ``RunSummary`` built by ``run_summary``.

Contract:
- ``run_summary(pipeline, policy, out_dir, state, outputs, *, items_in, items_done, decisions_made, ...)``
  builds it from the runner's final ``RunnerState`` (None: nothing ran) and the ``OutputCounts`` of the
  committed output; ``items_missing`` = 0 means no input item was lost.
- ``RunSummary.to_dict()`` is the key set, defined here once: every field at the top level, and the
  keys of ``account`` (``control.account.RunAccount.to_dict``), ``curation`` (``CurationFigures``),
  ``corpus`` (``control.corpus_run.FIGURES``) and ``simulation`` (``sim.driver``) put at the top level
  when present.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any, Mapping, Protocol, Sequence

from trident_flows.core.state import RunnerState
from trident_flows.core.types import StepKind
from trident_flows.loop.figures import operator_figures


class AccountView(Protocol):
    """What the summary reads of the run's account (``control.account.RunAccount``)."""

    def to_dict(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class OutputCounts:
    """A run's output counted by input item: ``items_written`` have rows in the data table (kept or
    ``_drop``-marked; ``items_dropped`` of them were filtered), ``items_dead_lettered`` only in the
    dead-letter table; ``duplicate_ids`` counts ids written more than once (0 = exactly once)."""

    items_written: int
    items_dead_lettered: int
    items_dropped: int
    rows_written: int
    duplicate_ids: int


@dataclass(frozen=True)
class CurationFigures:
    """The summary's items by outcome under the names the ``document-curation`` flow reports them: ``kept``
    (written and not dropped), ``near_duplicates`` and ``filtered`` (the other dropped), ``dead_lettered``,
    and the input's ``shards``."""

    kept: int
    near_duplicates: int
    filtered: int
    dead_lettered: int
    shards: int


@dataclass(frozen=True)
class RunSummary:
    """A finished run (see ``run_summary`` for how each figure is counted). ``decisions_made`` counts the plans handed to the runner.
    ``latency_s_p50`` / ``latency_s_p99``: seconds from an input item's read to done (``runtime.latency``),
    over the items this run read (None when it read none). Under Trident: ``memory_loaded`` (a memory of
    an earlier run was read), ``memory_regimes_known`` (the regimes it held), ``memory_warning`` (why a
    memory was ignored or rescaled), ``reaction_s_median`` (seconds from a regime recognised at the
    source to the first rollout after it) and ``prepositioned_moves`` (operators moved ahead of a known
    regime's items); None under other policies."""

    pipeline: str
    policy: str
    out_dir: str
    items_in: int
    items_written: int
    items_dead_lettered: int
    items_dropped: int
    items_missing: int
    rows_written: int
    duplicate_ids: int
    wall_s: float
    throughput_items_per_s: float
    ooms: int
    reconfigurations: int
    rolling_update_dip: float
    decisions_made: int
    operators: dict[str, dict[str, Any]]
    apply_reports: tuple[dict[str, Any], ...]
    error: str = ""
    output_note: str = ""  # set when a quality knob is tunable: outputs can differ by configuration
    shards_total: int = 0
    shards_skipped: int = 0
    advice: dict[str, Any] = field(default_factory=dict)  # binding resource, gain of one more node per class (planning.advice)
    replicas_by_node: dict[str, dict[str, int]] = field(default_factory=dict)  # node id -> operator -> replicas that ran there
    latency_s_p50: float | None = None
    latency_s_p99: float | None = None
    # Trident's memory across runs and its regimes recognised at the source (None: another policy)
    memory_loaded: bool | None = None
    memory_regimes_known: int | None = None
    memory_warning: str | None = None
    reaction_s_median: float | None = None
    prepositioned_moves: int | None = None
    account: AccountView | None = None
    elastic: dict[str, Any] = field(default_factory=dict)  # the scaler's summary (control.elastic) of a run with a goal
    curation: CurationFigures | None = None  # the document-curation flow's figures, top-level in to_dict
    corpus: dict[str, Any] = field(default_factory=dict)  # a corpus run's figures (control.corpus_run.FIGURES), top-level in to_dict
    simulation: dict[str, Any] = field(default_factory=dict)  # the simulator's own figures (sim.driver), top-level in to_dict

    def to_dict(self) -> dict[str, Any]:
        """Every field at the top level except ``account`` (an ``AccountView``: its ``to_dict()`` keys, ``decisions`` the
        list of decisions), ``curation`` (its keys: ``kept``, ``near_duplicates``, ``filtered``, ``dead_lettered``,
        ``shards``), ``corpus`` and ``simulation``, each put at the top level when present."""
        data = asdict(replace(self, account=None, curation=None))
        del data["account"], data["curation"]
        data["apply_reports"] = list(self.apply_reports)
        if self.account is not None:
            data.update(self.account.to_dict())
        if self.curation is not None:
            data.update(asdict(self.curation))
        data.update(data.pop("corpus"))
        data.update(data.pop("simulation"))
        return data


def rolling_update_dip(apply_reports: Sequence[Mapping[str, Any]]) -> float:
    """The largest throughput dip of an apply that started and retired replicas (0.0 when none did)."""
    dips = [r["dip"] for r in apply_reports if any(s["kind"] == StepKind.RETIRE.value for s in r["steps_done"])
            and any(s["kind"] == StepKind.START.value for s in r["steps_done"])]
    return max(dips) if dips else 0.0


def run_summary(pipeline: str, policy: str, out_dir: str, state: RunnerState | None, outputs: OutputCounts, *, items_in: int,
                items_done: int, decisions_made: int, apply_reports: Sequence[Mapping[str, Any]] = (), items_in_flight: int = 0,
                policy_figures: Mapping[str, Any] | None = None, latency: Mapping[str, float | None] | None = None,
                output_note: str = "", shards_total: int = 0, shards_skipped: int = 0, advice: Mapping[str, Any] | None = None,
                replicas_by_node: Mapping[str, dict[str, int]] | None = None, account: AccountView | None = None,
                elastic: Mapping[str, Any] | None = None, near_duplicates: int | None = None,
                simulation: Mapping[str, Any] | None = None) -> RunSummary:
    """The summary of a finished run. ``state`` is the runner's final ``RunnerState`` (None: nothing ran; no wall time,
    OOMs or operators), ``outputs`` the ``OutputCounts`` of the committed output (or the simulator's counts),
    ``items_in`` the run's input items (earlier runs' committed shards included), ``items_done`` the items this run
    finished (``throughput_items_per_s`` = items_done / the state's wall time), ``items_in_flight`` those still in the
    pipeline when a simulated run was cut short (``items_missing`` = items_in - written - dead-lettered - in flight:
    0 = none lost). ``rolling_update_dip`` is the largest dip of an apply in ``apply_reports`` (as
    ``ApplyReport.to_dict`` writes them) that started and retired replicas. ``policy_figures`` are the keys a policy
    reports of itself (Trident's ``run_figures``: ``memory_loaded``, ``memory_regimes_known``, ``memory_warning``,
    ``reaction_s_median``, ``prepositioned_moves``; None under other policies). ``near_duplicates`` (the curation
    flow's count) adds the ``CurationFigures``."""
    wall_s = state.wall_s if state is not None else 0.0
    curation = None
    if near_duplicates is not None:
        curation = CurationFigures(kept=outputs.items_written - outputs.items_dropped, near_duplicates=near_duplicates,
                                   filtered=outputs.items_dropped - near_duplicates, dead_lettered=outputs.items_dead_lettered,
                                   shards=shards_total)
    return RunSummary(
        pipeline=pipeline, policy=policy, out_dir=out_dir, items_in=items_in, items_written=outputs.items_written,
        items_dead_lettered=outputs.items_dead_lettered, items_dropped=outputs.items_dropped,
        items_missing=items_in - outputs.items_written - outputs.items_dead_lettered - items_in_flight, rows_written=outputs.rows_written,
        duplicate_ids=outputs.duplicate_ids, wall_s=wall_s, throughput_items_per_s=items_done / wall_s if wall_s > 0 else 0.0,
        ooms=state.ooms if state is not None else 0, reconfigurations=state.reconfigurations if state is not None else 0,
        rolling_update_dip=float(rolling_update_dip(apply_reports)), decisions_made=decisions_made,
        operators=operator_figures(state) if state is not None else {}, apply_reports=tuple(apply_reports),
        error=state.error if state is not None else "", output_note=output_note, shards_total=shards_total, shards_skipped=shards_skipped,
        advice=dict(advice or {}), replicas_by_node=dict(replicas_by_node or {}), **dict(latency or {}), **dict(policy_figures or {}),
        account=account, elastic=dict(elastic or {}), curation=curation, simulation=dict(simulation or {}))

"""``TridentSettings``: every option of the Trident policy as one frozen, validated value, in sections.

Contract:
- ``TridentSettings`` is a frozen dataclass of sections (``safety``, ``gate``, ``verify``, ``models``,
  ``regimes``, ``canary``, ``search``, ``transition``, ``placement``, ``idle``, ``sources``, ``memory``,
  ``records``), each a frozen dataclass of the options one part of ``scheduler/trident/`` reads, handed
  to that part alone; each field has a type hint and a one-line doc of its unit and meaning.
- Construction refuses a value of the wrong type or out of range, naming the section and field, the
  value and what to change ("trident: gate.min_samples=0 is refused: ...").
- Options stay flat: ``OPTIONS`` maps every option name to its (section, field); ``from_options`` and
  ``make_policy("trident", **options)`` build one, refusing an unknown option; the Prefect
  ``TridentSettingsBlock`` uses the same names. ``TridentSettings.sidecar()`` is the sidecar's preset.
- How each setting steers a tick is described in the module of the part that reads it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Iterable

from trident_flows.scheduler.canary import CanaryPolicy
from trident_flows.scheduler.placement.solvers import DEFAULT_SOLVER, SOLVERS
from trident_flows.scheduler.settings import check_types, option_of, option_paths, refuse, section, setting, setting_factory, settings_from_options


def _check(section_name: str, settings: Any, checks: Iterable[tuple[str, bool, str]]) -> None:
    """Refuse the first field of the section ``settings`` whose check fails (its types were checked first)."""
    for name, ok, fix in checks:
        if not ok:
            raise refuse("trident", f"{section_name}.{name}", getattr(settings, name), fix, option_of(type(settings), name))


@dataclass(frozen=True)
class MemorySafetySettings:
    """How much device memory a configuration must leave free (``search``, ``idle_capacity``)."""

    margin: float = setting(0.1, "fraction of each device's memory a configuration must leave free, in [0, 1)", option="memory_safety_margin")
    k: float = setting(2.0, "standard deviations above the mean in a memory upper bound (mean + k*std), >= 0")

    def __post_init__(self) -> None:
        check_types("trident", self, "safety")
        _check("safety", self, (
            ("margin", 0 <= self.margin < 1, "give a fraction in [0, 1) (0.1 = plan for at most 90% of memory)"),
            ("k", self.k >= 0, "give a number of standard deviations >= 0"),
        ))


@dataclass(frozen=True)
class GateSettings:
    """The evidence gate: the samples every operator needs before a placement (``gate``, ``placement_step``)."""

    min_samples: int = setting(32, "batch samples every operator needs before the first placement")
    min_config_samples: int = setting(16, "samples of a config taken since the last workload change before it is compared")
    evidence_max_s: float = setting(45.0, "seconds after a workload change at an operator after which 2 samples of it since "
                                          "the change are enough for the evidence gate (a slow operator may take minutes "
                                          "to finish min_config_samples batches)")
    confidence_z: float = setting(1.0, "standard deviations below the predicted rate of added replicas, relative to the running ones, at which added capacity counts")

    def __post_init__(self) -> None:
        check_types("trident", self, "gate")
        _check("gate", self, (
            ("min_samples", self.min_samples >= 1, "give a count >= 1"),
            ("min_config_samples", self.min_config_samples >= 1, "give a count >= 1"),
            ("evidence_max_s", self.evidence_max_s > 0, "give seconds > 0"),
            ("confidence_z", self.confidence_z >= 0, "give a number of standard deviations >= 0"),
        ))


@dataclass(frozen=True)
class VerifySettings:
    """Verification of a rollout against the throughput before it (``verifier``)."""

    ticks: int = setting(3, "ticks after a rollout whose end-to-end throughput is compared with the ticks before", option="verify_ticks")
    z: float = setting(2.0, "standard errors by which throughput must fall for a rollout to be rolled back", option="verify_z")
    apply_grace_ticks: int = setting(5, "ticks a rolled-out plan may take to be in place before its verification is dropped")

    def __post_init__(self) -> None:
        check_types("trident", self, "verify")
        _check("verify", self, (
            ("ticks", self.ticks >= 1, "give a count of ticks >= 1"),
            ("z", self.z >= 0, "give a number of standard errors >= 0"),
            ("apply_grace_ticks", self.apply_grace_ticks >= 1, "give a count of ticks >= 1"),
        ))


@dataclass(frozen=True)
class ModelSettings:
    """Each operator's sample window, its model's refits and staleness (``operators``, ``models``)."""

    window: int = setting(1200, "batch samples kept per operator for its model")
    refit_min_samples: int = setting(8, "new samples an operator needs before its model is refitted")
    refit_fraction: float = setting(0.25, "new samples, as a fraction of those of the last fit, that trigger a refit of an unchanged workload")
    refit_ticks: int = setting(3, "ticks from one refit of an unchanged workload's model to the next")
    saturation_s: float = setting(8.0, "seconds an operator must be saturated for its intake to count as its measured capacity")
    stale_ratio: float = setting(1.5, "predicted over measured capacity at which a model is stale, >= 1")

    def __post_init__(self) -> None:
        check_types("trident", self, "models")
        _check("models", self, (
            ("window", self.window >= 1, "give a count of samples >= 1"),
            ("refit_min_samples", self.refit_min_samples >= 1, "give a count >= 1"),
            ("refit_fraction", 0 <= self.refit_fraction <= 1, "give a fraction in [0, 1]"),
            ("refit_ticks", self.refit_ticks >= 1, "give a count of ticks >= 1 (1: whenever refit_fraction new samples arrived)"),
            ("saturation_s", self.saturation_s > 0, "give seconds > 0"),
            ("stale_ratio", self.stale_ratio >= 1, "give a ratio >= 1 (1.5 = measured under two thirds of the prediction)"),
        ))


@dataclass(frozen=True)
class RegimeSettings:
    """Each operator's regime detector and the regime clock (``regimes``)."""

    detector_samples: int = setting(500, "most samples per operator and tick given to its regime detector, evenly spaced "
                                         "(the newest always); the rest still feed its model")
    duration_s: float | None = setting(None, "seconds a regime is expected to last before any has ended (None: no prior)",
                                       option="regime_duration_s")

    def __post_init__(self) -> None:
        check_types("trident", self, "regimes")
        _check("regimes", self, (
            ("detector_samples", self.detector_samples >= 2, "give a count of samples >= 2 (a tick's first and newest)"),
            ("duration_s", self.duration_s is None or self.duration_s > 0, "give seconds > 0, or None"),
        ))


def _canary_policy() -> CanaryPolicy:
    # A 30 s measuring window (CanaryPolicy's own default is 120 s): a canary holds a replica's
    # resources while it measures, and the closed-loop runs last minutes.
    return CanaryPolicy(max_window_s=30.0)


@dataclass(frozen=True)
class CanarySettings:
    """The optimiser's configs tried on canary replicas (``canaries``)."""

    enabled: bool = setting(True, "try the optimiser's configs on canary replicas", option="canaries")
    policy: CanaryPolicy = setting_factory(_canary_policy, "how a canary is measured and judged against the running replicas",
                                           option="canary_policy")
    timeout_s: float = setting(30.0, "seconds a canary may go without a batch before it is abandoned", option="canary_timeout_s")
    max_batch_s: float = setting(10.0, "longest predicted batch time, in seconds, of a config tried on a canary", option="canary_max_batch_s")
    min_busy: float = setting(0.5, "fraction of the time an operator must be busy to get a canary, in [0, 1]", option="canary_min_busy")
    payback: float = setting(2.0, "run time left, in multiples of a canary's cold start plus timeout, that a canary needs",
                             option="canary_payback")
    reask_ticks: int = setting(10, "ticks before an optimiser whose proposal could not start is asked again")
    in_place: bool = setting(False, "let a canary that finds no free CPU or GPU take the place of one of its operator's own "
                             "replicas on that device (off by default: on the video corpus it tripled the reconfigurations)",
                             option="canary_in_place")

    def __post_init__(self) -> None:
        check_types("trident", self, "canary")
        _check("canary", self, (
            ("timeout_s", self.timeout_s > 0, "give seconds > 0"),
            ("max_batch_s", self.max_batch_s > 0, "give seconds > 0"),
            ("min_busy", 0 <= self.min_busy <= 1, "give a fraction of the time in [0, 1]"),
            ("payback", self.payback >= 0, "give a multiple >= 0 (0: no check of the time left)"),
            ("reask_ticks", self.reask_ticks >= 1, "give a count of ticks >= 1"),
        ))


@dataclass(frozen=True)
class SearchSettings:
    """The per-operator config optimisers (``search``)."""

    tell_every: int = setting(16, "batches between two measurements told to a config optimiser")
    seed: int = setting(0, "random seed of the config optimisers")

    def __post_init__(self) -> None:
        check_types("trident", self, "search")
        _check("search", self, (
            ("tell_every", self.tell_every >= 1, "give a count of batches >= 1"),
        ))


@dataclass(frozen=True)
class TransitionSettings:
    """When a better placement is rolled out, and what a switch is priced at (``transition``, ``operators``)."""

    min_gain: float = setting(0.1, "least predicted throughput gain worth a rollout, as a fraction of the current prediction")
    benefit_ratio: float = setting(2.0, "items a switch must gain over the regime per item it costs, > 0")
    max_changes: int | None = setting(None, "most operators one plan may change (None: no cap)")
    default_cold_start_s: float = setting(5.0, "seconds a new replica is assumed to take to start before one was measured")

    def __post_init__(self) -> None:
        check_types("trident", self, "transition")
        _check("transition", self, (
            ("min_gain", self.min_gain >= 0, "give a fraction >= 0 (0.1 = a 10% predicted gain)"),
            ("benefit_ratio", self.benefit_ratio > 0, "give a ratio > 0 (2 = gain twice what the switch costs)"),
            ("max_changes", self.max_changes is None or self.max_changes >= 0, "give a count >= 0, or None for no cap"),
            ("default_cold_start_s", self.default_cold_start_s >= 0, "give seconds >= 0"),
        ))


@dataclass(frozen=True)
class PlacementSettings:
    """The placement MILP and how often it is solved again (``placement_step``, ``regime_plans``)."""

    solver: str = setting(DEFAULT_SOLVER, f"MILP solver, one of {', '.join(SOLVERS)}")
    time_limit_s: float = setting(1.0, "seconds one MILP solve may take")
    resolve_ticks: int = setting(10, "ticks after which the placement is solved again though no input changed")

    def __post_init__(self) -> None:
        check_types("trident", self, "placement")
        _check("placement", self, (
            ("solver", self.solver in SOLVERS, f"choose one of {', '.join(SOLVERS)}"),
            ("time_limit_s", self.time_limit_s > 0, "give seconds > 0"),
            ("resolve_ticks", self.resolve_ticks >= 1, "give a count of ticks >= 1"),
        ))


@dataclass(frozen=True)
class IdleCapacitySettings:
    """CPUs/GPUs no replica holds given to saturated operators (``idle_capacity``)."""

    growth_s: float | None = setting(4.0, "seconds an operator must be saturated before CPUs/GPUs no replica holds go to it "
                                          "as more replicas of its config, whatever the evidence gate (None: never)",
                                     option="idle_growth_s")

    def __post_init__(self) -> None:
        check_types("trident", self, "idle")
        _check("idle", self, (
            ("growth_s", self.growth_s is None or self.growth_s > 0, "give seconds > 0, or None to leave free resources to the placement"),
        ))


@dataclass(frozen=True)
class SourceRegimeSettings:
    """Regimes recognised at the source, and each known regime's plan (``source_regimes``, ``regime_plans``)."""

    items: int = setting(24, "input items whose mean features at the source are compared with the current regime's",
                         option="source_regime_items")
    rel: float = setting(0.4, "relative difference of a mean item feature at the source that starts a new regime, > 0",
                         option="source_regime_rel")
    regime_plans: bool = setting(True, "solve each known regime's allocation and move each operator to it as that regime's items "
                                       "reach it (False: neither; the memory then keeps only the allocations it was given)")

    def __post_init__(self) -> None:
        check_types("trident", self, "sources")
        _check("sources", self, (
            ("items", self.items >= 1, "give a count of items >= 1"),
            ("rel", self.rel > 0, "give a relative difference > 0 (0.4 = 40%)"),
        ))


@dataclass(frozen=True)
class MemorySettings:
    """Trident's memory of earlier runs: where it lives and whether a run starts in it (``run_memory``)."""

    location: str | None = setting(None, "where Trident's memory of earlier runs is read and written: a path or a pyarrow "
                                         "filesystem URI (s3://, gs://, ...); None: nothing is remembered across runs",
                                   option="memory")
    start_from: bool = setting(True, "start a run in the memory's allocation for the regime it saw most, before any item "
                                     "is read (False: start in the pipeline's own configuration)", option="start_from_memory")

    def __post_init__(self) -> None:
        check_types("trident", self, "memory")
        _check("memory", self, (
            ("location", self.location is None or bool(self.location.strip()), "give a path or URI, or None for no memory across runs"),
        ))


@dataclass(frozen=True)
class RecordSettings:
    """The tick records the policy keeps (``TridentPolicy.records``)."""

    max_records: int = setting(2000, "tick records kept in memory (the newest)")

    def __post_init__(self) -> None:
        check_types("trident", self, "records")
        _check("records", self, (
            ("max_records", self.max_records >= 1, "give a count >= 1"),
        ))


@dataclass(frozen=True)
class TridentSettings:
    """The Trident policy's options, one section per concept (see the module docstring).

    Each section field is one option, named by its ``option`` where that differs from the field's name
    (``canary_timeout_s`` is ``canary.timeout_s``)."""

    safety: MemorySafetySettings = section(MemorySafetySettings, "how much device memory a configuration must leave free")
    gate: GateSettings = section(GateSettings, "the evidence gate: the samples every operator needs before a placement")
    verify: VerifySettings = section(VerifySettings, "verification of a rollout against the throughput before it")
    models: ModelSettings = section(ModelSettings, "each operator's sample window, its model's refits and staleness")
    regimes: RegimeSettings = section(RegimeSettings, "each operator's regime detector and the regime clock")
    canary: CanarySettings = section(CanarySettings, "the optimiser's configs tried on canary replicas")
    search: SearchSettings = section(SearchSettings, "the per-operator config optimisers")
    transition: TransitionSettings = section(TransitionSettings, "when a better placement is rolled out")
    placement: PlacementSettings = section(PlacementSettings, "the placement MILP")
    idle: IdleCapacitySettings = section(IdleCapacitySettings, "CPUs/GPUs no replica holds given to saturated operators")
    sources: SourceRegimeSettings = section(SourceRegimeSettings, "regimes recognised at the source and their plans")
    memory: MemorySettings = section(MemorySettings, "Trident's memory of earlier runs")
    records: RecordSettings = section(RecordSettings, "the tick records kept")

    def __post_init__(self) -> None:
        check_types("trident", self)

    @classmethod
    def from_options(cls, **options: Any) -> TridentSettings:
        """The settings with ``options`` (flat option names, see ``OPTIONS``) and every other default; an unknown
        option is refused naming the known ones."""
        return settings_from_options("trident", cls, options)

    @classmethod
    def sidecar(cls) -> TridentSettings:
        """The Prefect sidecar's preset, the policy's defaults but for a wider memory safety margin and a cap on the
        operators one plan changes: it tunes a pipeline it did not size, so it plans for at most 85% of device memory
        (the policy's own default is 90%) and changes at most 4 operators per plan."""
        defaults = cls()
        return replace(defaults, safety=replace(defaults.safety, margin=0.15), transition=replace(defaults.transition, max_changes=4))


# Every option of the policy and its (section, field) in ``TridentSettings``.
OPTIONS: dict[str, tuple[str, str | None]] = option_paths(TridentSettings)

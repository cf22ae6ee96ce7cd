"""``TridentSettings``: every option of the Trident policy as one frozen, validated value.

Contract: a frozen dataclass of the policy's options with their defaults; each field has a type
hint and a one-line doc of its unit and meaning (``settings.documented``). Construction refuses a
value of the wrong type or out of range with a message naming the field, the value and what to
change (``settings.refuse``). ``make_policy("trident", **options)`` builds one from options (an
unknown option is refused naming the known ones); the Prefect ``TridentSettingsBlock`` carries the
fields a sidecar user sets under the same names. How each setting steers a tick is described in
the module of the part that reads it (``scheduler/trident/``; ``scheduler/trident_policy.py`` names them).
"""

from __future__ import annotations

from dataclasses import dataclass

from trident_flows.scheduler.canary import CanaryPolicy
from trident_flows.scheduler.placement.solvers import DEFAULT_SOLVER, SOLVERS
from trident_flows.scheduler.settings import check_types, refuse, setting, setting_factory


def _canary_policy() -> CanaryPolicy:
    # A 30 s measuring window (CanaryPolicy's own default is 120 s): a canary holds a replica's
    # resources while it measures, and the closed-loop runs last minutes.
    return CanaryPolicy(max_window_s=30.0)


@dataclass(frozen=True)
class TridentSettings:
    """The Trident policy's options (see the module docstring)."""

    # memory safety
    memory_safety_margin: float = setting(0.1, "fraction of each device's memory a configuration must leave free, in [0, 1)")
    k: float = setting(2.0, "standard deviations above the mean in a memory upper bound (mean + k*std), >= 0")
    # when a placement is rolled out
    min_gain: float = setting(0.1, "least predicted throughput gain worth a rollout, as a fraction of the current prediction")
    benefit_ratio: float = setting(2.0, "items a switch must gain over the regime per item it costs, > 0")
    max_changes: int | None = setting(None, "most operators one plan may change (None: no cap)")
    regime_duration_s: float | None = setting(None, "seconds a regime is expected to last before any has ended (None: no prior)")
    default_cold_start_s: float = setting(5.0, "seconds a new replica is assumed to take to start before one was measured")
    # the evidence gate
    min_samples: int = setting(32, "batch samples every operator needs before the first placement")
    min_config_samples: int = setting(16, "samples of a config taken since the last workload change before it is compared")
    evidence_max_s: float = setting(45.0, "seconds after a workload change at an operator after which 2 samples of it since "
                                          "the change are enough for the evidence gate (a slow operator may take minutes "
                                          "to finish min_config_samples batches)")
    confidence_z: float = setting(1.0, "standard deviations below the predicted rate of added replicas, relative to the running ones, at which added capacity counts")
    # verification of a rollout
    verify_ticks: int = setting(3, "ticks after a rollout whose end-to-end throughput is compared with the ticks before")
    verify_z: float = setting(2.0, "standard errors by which throughput must fall for a rollout to be rolled back")
    apply_grace_ticks: int = setting(5, "ticks a rolled-out plan may take to be in place before its verification is dropped")
    # models and their refits
    window: int = setting(1200, "batch samples kept per operator for its model")
    detector_samples: int = setting(500, "most samples per operator and tick given to its regime detector, evenly spaced "
                                         "(the newest always); the rest still feed its model")
    refit_min_samples: int = setting(8, "new samples an operator needs before its model is refitted")
    refit_fraction: float = setting(0.25, "new samples, as a fraction of those of the last fit, that trigger a refit of an unchanged workload")
    refit_ticks: int = setting(3, "ticks from one refit of an unchanged workload's model to the next")
    saturation_s: float = setting(8.0, "seconds an operator must be saturated for its intake to count as its measured capacity")
    stale_ratio: float = setting(1.5, "predicted over measured capacity at which a model is stale, >= 1")
    # configuration search on canary replicas
    canaries: bool = setting(True, "try the optimiser's configs on canary replicas")
    canary_policy: CanaryPolicy = setting_factory(_canary_policy, "how a canary is measured and judged against the running replicas")
    canary_timeout_s: float = setting(30.0, "seconds a canary may go without a batch before it is abandoned")
    canary_max_batch_s: float = setting(10.0, "longest predicted batch time, in seconds, of a config tried on a canary")
    canary_min_busy: float = setting(0.5, "fraction of the time an operator must be busy to get a canary, in [0, 1]")
    canary_payback: float = setting(2.0, "run time left, in multiples of a canary's cold start plus timeout, that a canary needs")
    tell_every: int = setting(16, "batches between two measurements told to a config optimiser")
    reask_ticks: int = setting(10, "ticks before an optimiser whose proposal could not start is asked again")
    seed: int = setting(0, "random seed of the config optimisers")
    # regimes recognised at the source, remembered across runs
    memory: str | None = setting(None, "where Trident's memory of earlier runs is read and written: a path or a pyarrow "
                                       "filesystem URI (s3://, gs://, ...); None: nothing is remembered across runs")
    start_from_memory: bool = setting(True, "start a run in the memory's allocation for the regime it saw most, before any item "
                                            "is read (False: start in the pipeline's own configuration)")
    source_regime_items: int = setting(24, "input items whose mean features at the source are compared with the current regime's")
    source_regime_rel: float = setting(0.4, "relative difference of a mean item feature at the source that starts a new regime, > 0")
    regime_plans: bool = setting(True, "solve each known regime's allocation and move each operator to it as that regime's items "
                                       "reach it (False: neither; the memory then keeps only the allocations it was given)")
    # resources no replica holds
    idle_growth_s: float | None = setting(4.0, "seconds an operator must be saturated before CPUs/GPUs no replica holds go to it "
                                               "as more replicas of its config, whatever the evidence gate (None: never)")
    # the placement MILP
    solver: str = setting(DEFAULT_SOLVER, f"MILP solver, one of {', '.join(SOLVERS)}")
    time_limit_s: float = setting(1.0, "seconds one MILP solve may take")
    resolve_ticks: int = setting(10, "ticks after which the placement is solved again though no input changed")
    # bookkeeping
    max_records: int = setting(2000, "tick records kept in memory (the newest)")

    def __post_init__(self) -> None:
        check_types("trident", self)
        checks = (
            ("memory_safety_margin", 0 <= self.memory_safety_margin < 1, "give a fraction in [0, 1) (0.1 = plan for at most 90% of memory)"),
            ("k", self.k >= 0, "give a number of standard deviations >= 0"),
            ("min_gain", self.min_gain >= 0, "give a fraction >= 0 (0.1 = a 10% predicted gain)"),
            ("benefit_ratio", self.benefit_ratio > 0, "give a ratio > 0 (2 = gain twice what the switch costs)"),
            ("max_changes", self.max_changes is None or self.max_changes >= 0, "give a count >= 0, or None for no cap"),
            ("regime_duration_s", self.regime_duration_s is None or self.regime_duration_s > 0, "give seconds > 0, or None"),
            ("default_cold_start_s", self.default_cold_start_s >= 0, "give seconds >= 0"),
            ("min_samples", self.min_samples >= 1, "give a count >= 1"),
            ("min_config_samples", self.min_config_samples >= 1, "give a count >= 1"),
            ("evidence_max_s", self.evidence_max_s > 0, "give seconds > 0"),
            ("confidence_z", self.confidence_z >= 0, "give a number of standard deviations >= 0"),
            ("verify_ticks", self.verify_ticks >= 1, "give a count of ticks >= 1"),
            ("verify_z", self.verify_z >= 0, "give a number of standard errors >= 0"),
            ("apply_grace_ticks", self.apply_grace_ticks >= 1, "give a count of ticks >= 1"),
            ("window", self.window >= 1, "give a count of samples >= 1"),
            ("detector_samples", self.detector_samples >= 2, "give a count of samples >= 2 (a tick's first and newest)"),
            ("refit_min_samples", self.refit_min_samples >= 1, "give a count >= 1"),
            ("refit_fraction", 0 <= self.refit_fraction <= 1, "give a fraction in [0, 1]"),
            ("refit_ticks", self.refit_ticks >= 1, "give a count of ticks >= 1 (1: whenever refit_fraction new samples arrived)"),
            ("saturation_s", self.saturation_s > 0, "give seconds > 0"),
            ("stale_ratio", self.stale_ratio >= 1, "give a ratio >= 1 (1.5 = measured under two thirds of the prediction)"),
            ("canary_timeout_s", self.canary_timeout_s > 0, "give seconds > 0"),
            ("canary_max_batch_s", self.canary_max_batch_s > 0, "give seconds > 0"),
            ("canary_min_busy", 0 <= self.canary_min_busy <= 1, "give a fraction of the time in [0, 1]"),
            ("canary_payback", self.canary_payback >= 0, "give a multiple >= 0 (0: no check of the time left)"),
            ("tell_every", self.tell_every >= 1, "give a count of batches >= 1"),
            ("reask_ticks", self.reask_ticks >= 1, "give a count of ticks >= 1"),
            ("memory", self.memory is None or bool(self.memory.strip()), "give a path or URI, or None for no memory across runs"),
            ("source_regime_items", self.source_regime_items >= 1, "give a count of items >= 1"),
            ("source_regime_rel", self.source_regime_rel > 0, "give a relative difference > 0 (0.4 = 40%)"),
            ("idle_growth_s", self.idle_growth_s is None or self.idle_growth_s > 0, "give seconds > 0, or None to leave free resources to the placement"),
            ("solver", self.solver in SOLVERS, f"choose one of {', '.join(SOLVERS)}"),
            ("time_limit_s", self.time_limit_s > 0, "give seconds > 0"),
            ("resolve_ticks", self.resolve_ticks >= 1, "give a count of ticks >= 1"),
            ("max_records", self.max_records >= 1, "give a count >= 1"),
        )
        for name, ok, fix in checks:
            if not ok:
                raise refuse("trident", name, getattr(self, name), fix)

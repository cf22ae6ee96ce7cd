"""An ESTIMATE of the rate the starting configuration would have had over a run's items, from trident's fitted models.

Contract:
- ``estimate_without_trident(policy_name, policy, start, samples, state) -> Estimate``: ``start``
  is the configuration the run started with (per operator: name, ``OpConfig``, replicas),
  ``samples`` the run's ``BatchSample``s, ``state`` the final ``RunnerState``; the estimate is the
  bottleneck operator's modelled rate over the run's own items, in input items/s.
- A model figure, never a measurement; ``Estimate.note`` says so and what it covered,
  ``Estimate.per_operator`` holds each operator's figure.
- ``items_per_s`` is None, with the reason in ``note``, for a policy without throughput models (any
  but trident), an operator without a fitted model, samples or a price for its starting config,
  or a run that read no items.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from trident_flows.core.state import RunnerState
from trident_flows.core.types import BatchSample, OpConfig, Outcome

GROUP = 32  # batches priced at one workload: fine enough to follow regimes, few enough predictions for 10,000 samples


@dataclass(frozen=True)
class Estimate:
    """The estimated input items/s of the starting configuration (None: no estimate, ``note`` says why)."""

    items_per_s: float | None
    note: str
    per_operator: dict[str, float] = field(default_factory=dict)


def _none(why: str) -> Estimate:
    return Estimate(None, f"no estimate: {why}")


def estimate_without_trident(policy_name: str, policy: Any, start: Sequence[tuple[str, OpConfig, int]], samples: Sequence[BatchSample],
                             state: RunnerState) -> Estimate:
    """The starting configuration's estimated rate over the run's items.

    Per operator, its ok samples are taken in completion order in groups of ``GROUP`` batches; each group's
    items are priced at what the operator's fitted throughput model (calibration included) predicts for the
    starting config and replica count at that group's per-item features; items / predicted seconds is the
    operator's rate over the same items, divided by its items per input item to give input items/s. The
    estimate is the smallest of them (the bottleneck). It assumes the operators overlap perfectly, leaves out
    start-up, fill and drain, and carries the models' error."""
    ops = getattr(policy, "ops", None)
    if policy_name != "trident" or ops is None:
        return _none(f"the {policy_name} policy fits no throughput models (only trident does)" if policy_name != "trident"
                     else "the trident policy was never asked, so it fitted no models")
    if state.items_in <= 0:
        return _none("the run read no items")
    per_operator: dict[str, float] = {}
    covered: list[str] = []
    for op_name, config, replicas in start:
        op = ops.get(op_name)
        if op is None or not op.model.ready:
            return _none(f"operator {op_name!r} has no fitted throughput model")
        mine = sorted((s for s in samples if s.operator == op_name and s.items_in > 0 and s.outcome == Outcome.OK), key=lambda s: s.end)
        if not mine:
            return _none(f"no batch of operator {op_name!r} is left in the run's samples")
        try:
            rate = _rate_over(op.model, config, max(1, int(replicas)), mine)
        except (ValueError, RuntimeError) as exc:  # NoModelError is a RuntimeError: a config the model cannot price
            return _none(f"operator {op_name!r}: the model cannot price the starting config {config.label()} ({exc})")
        taken = state.operator(op_name).items_in
        if taken <= 0:
            continue  # the operator took nothing (everything was filtered before it): it bounds nothing
        per_operator[op_name] = rate / (taken / state.items_in)
        items = sum(s.items_in for s in mine)
        if items < taken:
            covered.append(f"{op_name} {items} of {taken} items")
    if not per_operator:
        return _none("no operator took any item")
    bottleneck = min(per_operator, key=per_operator.__getitem__)
    what = ", ".join(f"{n} {r}x {c.label()}" for n, c, r in start)
    over = ("the same items" if not covered else f"the newest batches the runner kept ({'; '.join(covered)})")
    note = (f"ESTIMATE, not a measurement: the starting configuration ({what}) over {over}, priced by trident's fitted "
            f"throughput models at each group of {GROUP} batches' workload; {bottleneck} bounds it. It assumes the operators "
            "overlap perfectly and leaves out start-up, fill and drain, and it carries the models' error")
    return Estimate(per_operator[bottleneck], note, per_operator)


def _rate_over(model: Any, config: OpConfig, replicas: int, samples: Sequence[BatchSample]) -> float:
    """Items/s of ``replicas`` replicas of ``config`` over ``samples``' items, each group priced at its own workload."""
    names = model.feature_names
    seconds = items = 0.0
    for k in range(0, len(samples), GROUP):
        group = samples[k:k + GROUP]
        n = sum(s.items_in for s in group)
        features = {f: sum(float(s.features.get(f, 0.0)) for s in group) / n for f in names}
        predicted = model.throughput(config, replicas, features).mean
        if not predicted > 0:
            raise ValueError(f"predicted {predicted!r} items/s")
        seconds += n / predicted
        items += n
    return items / seconds

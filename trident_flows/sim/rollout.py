"""Applying a change to the simulated runner: a Plan or a Transition, step by step on its clock.

Contract:
- ``apply_change(runner, change)`` is ``SimRunner.apply``: a ``Plan`` (steps from
  ``transition.rolling_steps`` on the state now) or a checked ``Transition``; anything else is a
  ``TypeError``, a change after the run finished is refused. Steps run in order, as live
  (``runtime.rollout``): a START/CANARY waits on the simulated clock until its replicas are warm (at
  most ``warm_timeout_s``; a start no node has room for fails at once); a RETIRE drains its victims
  (``transition.retire_victims``: on nodes where the next START then fits first; a START no node has room for
  waits for the plan's next RETIRE or moves a CPU replica off a node where it then fits, ``transition.room_first``), each leaving with
  its resources once its own batches are back, stopped anyway after ``RETIRE_TIMEOUT_S`` (the batches it still
  holds go back to its operator's queue, as live when the killed actor's calls fail); a RESIZE gives its
  replicas the new batch size at once (``transition.resize_victims``), as live. A failing
  step stops the apply, and an operator a swap in place left without replicas gets one of the config
  it retired back, as live. The pipeline keeps streaming meanwhile.
- It returns (and appends to ``runner.apply_reports``) the ``ApplyReport``: steps, seconds, the
  throughput before and during it; a change that landed whole counts in ``runner.reconfigurations``.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any

from trident_flows.core.state import ApplyReport, ApplyStatus, RuntimeConfigError
from trident_flows.core.types import Plan, StepKind, Transition, TransitionStep, TransitionVerdict
from trident_flows.runtime.node_placement import free_on_devices
from trident_flows.runtime.transition import RoomFor, check_plan, emptied_by_swap, refuse_without_room, resize_victims, retire_victims, rolling_steps, step_room
from trident_flows.sim import outcome
from trident_flows.sim.cluster import SimCluster
from trident_flows.sim.pool import SimReplica

if TYPE_CHECKING:
    from trident_flows.sim.runner import SimRunner

# How long a retiring replica may drain before it is stopped anyway (runtime.pool.OperatorPool.retire's timeout_s).
RETIRE_TIMEOUT_S = 600.0


def _node_of(replica: SimReplica) -> int | None:
    """The node a simulated replica holds resources on (None while it waits for one)."""
    return replica.placement.node.index if replica.placement is not None else None


def apply_change(runner: SimRunner, change: Plan | Transition) -> ApplyReport:
    """Apply a Plan or a Transition on ``runner``'s simulated clock (see the module docstring)."""
    if runner.finished:
        return outcome.refused("the run has finished")
    if isinstance(change, Plan):
        transition = rolling_steps(runner.state(), change)
    elif isinstance(change, Transition):
        transition = change
        _check_transition(runner, transition)
    else:
        raise TypeError(f"apply takes a Plan or a Transition, got {type(change).__name__}")
    if transition.verdict == TransitionVerdict.WAIT or not transition.steps:
        return outcome.nothing_to_do(transition.reason)
    t0 = runner.now
    window = min(runner.settings.dip_window_s, max(t0, 1e-6))
    before = runner._rate(t0 - window, t0)
    done: list[dict[str, Any]] = []
    error = ""
    steps = transition.steps
    free = partial(_free_by_node, runner.cluster)
    k = -1
    while (k := k + 1) < len(steps):
        steps, room = step_room(steps, k, free, list(zip(runner.names, runner.pools)), _node_of)
        step, s0 = steps[k], runner.now
        # a RETIRE followed by a START of the same operator is a swap in place: its last replica may go (as live)
        replaced = any(s.kind == StepKind.START and s.operator == step.operator for s in steps[k + 1:])
        try:
            ids = _do_step(runner, step, replaced=replaced, room=room)
        except Exception as exc:  # noqa: BLE001 - reported, and later steps are skipped (as live)
            error = f"step {step.kind.value} {step.operator} {step.config.label()} failed: {type(exc).__name__}: {exc}"
            error += _restore_emptied(runner, done)
            break
        done.append({**step.to_dict(), "replicas": ids, "seconds": runner.now - s0})
    t1 = runner.now
    during = runner._rate(t0, t1) if t1 - t0 >= 0.5 else runner._rate(t1 - 0.5, t1)
    report = outcome.apply_report(done, len(steps), t1 - t0, before, during, error, transition.reason)
    if report.outcome.status == ApplyStatus.LANDED:
        runner.reconfigurations += 1  # only changes that landed count, as live
    runner.apply_reports.append(report)
    runner._dispatch()
    return report


def _restore_emptied(runner: SimRunner, done: list[dict[str, Any]]) -> str:
    """As live (``runtime.rollout``): an operator a failed swap in place left without replicas gets one of the
    configs it retired back. Returns a note."""
    notes = []
    for name, config in emptied_by_swap(done, lambda op: bool(runner.pools[runner.names.index(op)].active(canary=False))):
        runner._start_replica(runner.names.index(name), config, canary=False)
        notes.append(f"{name}: restarted {config.label()}")
    return ("; restored after the failed swap: " + ", ".join(notes)) if notes else ""


def _check_transition(runner: SimRunner, transition: Transition) -> None:
    for step in transition.steps:
        if step.operator not in runner.names:
            raise RuntimeConfigError(f"transition step names unknown operator {step.operator!r}; operators are {runner.names}")
        if step.count < 1:
            raise RuntimeConfigError(f"transition step for {step.operator!r} has count {step.count}; use count >= 1")
    if transition.plan is not None:
        check_plan(transition.plan, runner.state())


def _free_by_node(cluster: SimCluster) -> dict[int, tuple[float, float]]:
    """Each live node's free CPUs and GPUs: its whole free devices plus the largest share left on one in use
    (``node_placement.free_on_devices``, as the live placer counts them)."""
    return {n.index: (n.free_cpus, free_on_devices([d.gpu_share for d in n.devices])) for n in cluster.nodes if n.alive}


def _do_step(runner: SimRunner, step: TransitionStep, replaced: bool = False, room: RoomFor | None = None) -> list[str]:
    i = runner.names.index(step.operator)
    pool = runner.pools[i]
    if step.kind == StepKind.RESIZE:
        records = resize_victims(pool, step)
        pool.resize(records, step.config)
        runner._dispatch()
        return [r.replica_id for r in records]
    if step.kind in (StepKind.START, StepKind.CANARY):
        refuse_without_room(step, runner.pools, partial(_free_by_node, runner.cluster))
        records = [runner._start_replica(i, step.config, canary=step.kind == StepKind.CANARY) for _ in range(step.count)]
        deadline = runner.now + runner.settings.warm_timeout_s
        runner.events.run_until(deadline, stop=lambda: all(r.warm for r in records) or runner.finished)
        if not all(r.warm for r in records):
            for r in records:
                if not r.warm:
                    runner._release(i, r)
            if runner.finished:
                raise RuntimeError("the run finished before the new replicas were warm")
            raise RuntimeError(f"new replicas did not become warm within {runner.settings.warm_timeout_s:g}s "
                               "(no node with room for them?)")
        runner._dispatch()
        return [r.replica_id for r in records]
    victims = retire_victims(pool, step, replaced, room=room)
    pool.begin_drain(victims)

    def leave(v: SimReplica) -> None:
        if not v.dead:  # a replica lost with its node has left already
            runner._release(i, v)

    # as live (runtime.rollout: one pool.retire per victim, gathered): each victim leaves, and gives
    # its resources back, once its own batches are back, not when the slowest victim's are
    for v in victims:
        if v.inflight == 0:
            leave(v)
        else:
            v.on_idle.append(leave)
    runner.events.run_until(runner.now + RETIRE_TIMEOUT_S, stop=lambda: all(v.dead for v in victims))
    for v in victims:  # as live, a victim still busy after the timeout is stopped anyway, its batches queued again
        if not v.dead:
            runner.stop(i, v, f"replica stopped after draining {RETIRE_TIMEOUT_S:g} s")
    runner._dispatch()
    return [v.replica_id for v in victims]

"""The one rolling order of a change in replica counts: which replicas start and retire, in which
phases, so that capacity stays as high as the free resources allow.

Contract (pure functions): ``batch_resizes(current, target, config_of)`` first pairs the replicas a change
keeps but for their batch size (resized in place, no restart); ``order_steps(current, target, capacity,
usage, priority)`` then returns ``Phase``s of STARTs and RETIREs from ``current`` to ``target`` replica
counts per key (operator, option or config, node class, ...). The scheduler prices this order
(``scheduler.placement.transition_cost``) and the runner executes it (``runtime.transition``), so the
change that was priced is the change that runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Callable, Hashable, Mapping, Sequence

from trident_flows.core.types import OpConfig, StepKind

_RES_NAMES = ("CPUs", "GPUs", "host memory")


@dataclass(frozen=True)
class Phase:
    """One phase of a rolling change: replicas started together (``StepKind.START``) or drained and
    retired together (``StepKind.RETIRE``); ``moves`` are (key, count) with key = (operator, option, class);
    ``note`` says why a retirement had to come before the starts it makes room for."""

    kind: StepKind
    moves: tuple[tuple[Hashable, int], ...]
    note: str = ""


def batch_resizes(current: Mapping[Any, int], target: Mapping[Any, int],
                  config_of: Callable[[Any], OpConfig]) -> tuple[list[tuple[Any, Any, int]], dict[Any, int]]:
    """The replicas a change keeps but for their batch size: per operator and class (``key[0]``, ``key[2]``; canary keys,
    of 4 parts, left out), a config with replicas to retire paired with one to start that differs from it only in its
    batch size. Returns (from key, to key, count) per pair and ``current`` as it is once they are resized: what
    ``order_steps`` orders next."""
    after = dict(current)
    surplus = {k: n - target.get(k, 0) for k, n in current.items() if len(k) < 4 and n > target.get(k, 0)}
    deficit = {k: n - current.get(k, 0) for k, n in target.items() if len(k) < 4 and n > current.get(k, 0)}
    pairs = []
    for old in sorted(surplus, key=str):
        for new in sorted(deficit, key=str):
            if not (surplus[old] and deficit[new]) or (old[0], old[2]) != (new[0], new[2]):
                continue
            a, b = config_of(old), config_of(new)
            if a.batch_size == b.batch_size or replace(a, batch_size=b.batch_size) != b:
                continue
            n = min(surplus[old], deficit[new])
            surplus[old] -= n
            deficit[new] -= n
            after[old] -= n
            after[new] = after.get(new, 0) + n
            pairs.append((old, new, n))
    return pairs, {k: n for k, n in after.items() if n > 0}


def order_steps(current: Mapping[Any, int], target: Mapping[Any, int], capacity: Mapping[str, Sequence[float]],
                usage: Callable[[Any], Sequence[float]], priority: Sequence[str] = (), *,
                resource_names: Sequence[str] = _RES_NAMES, headroom: Callable[[str], float] | None = None,
                label: Callable[[Any], str] = str) -> list[Phase]:
    """The rolling order from ``current`` to ``target`` replica counts per key (operator, option, class):
    the one ordering the pricing (``scheduler.placement.transition_cost``) and the runner (``runtime.transition``) both use.

    Starts come first (operators in ``priority`` order), each as many as fit the class's free
    resources; an operator's old replicas retire once its new ones are all started (warm).
    When nothing fits, just enough replicas are retired first: of one that keeps its operator
    serving (the blocked operator's own first, then the one with most ``headroom``); when only
    an operator's last replica can make room, it is swapped in place: drained and retired
    before its replacement starts (the operator serves nothing meanwhile; the pricing counts it).
    Raises ``ValueError`` when a start cannot fit even with every planned retirement done."""
    starts = {k: n - current.get(k, 0) for k, n in target.items() if n > current.get(k, 0)}
    retires = {k: n - target.get(k, 0) for k, n in current.items() if n > target.get(k, 0)}
    used = {c: [0.0] * len(cap) for c, cap in capacity.items()}
    for key, n in current.items():
        for i, v in enumerate(usage(key)):
            used[key[2]][i] += v * n
    alive: dict[str, int] = {}
    for key, n in current.items():
        alive[key[0]] = alive.get(key[0], 0) + n
    rank = {name: i for i, name in enumerate(priority)}
    by_rank = lambda k: (rank.get(k[0], len(rank)), str(k))  # noqa: E731

    def fits(key) -> int:
        room = [capacity[key[2]][i] - used[key[2]][i] for i in range(len(used[key[2]]))]
        vec = usage(key)
        # an unmodelled resource has infinite capacity (e.g. host memory no node class states): no limit
        return min((int((room[i] + 1e-9) // vec[i]) if vec[i] > 0 and room[i] != math.inf else starts[key]) for i in range(len(vec)))

    def take(key, n: int, sign: int) -> None:
        for i, v in enumerate(usage(key)):
            used[key[2]][i] += sign * v * n
        alive[key[0]] = alive.get(key[0], 0) + sign * n

    phases: list[Phase] = []
    for _ in range(10_000):
        if not starts and not retires:
            return phases
        started = []
        for key in sorted(starts, key=by_rank):
            n = min(starts[key], max(0, fits(key)))
            if n > 0:
                take(key, n, +1)
                starts[key] -= n
                started.append((key, n))
        starts = {k: n for k, n in starts.items() if n > 0}
        if started:
            phases.append(Phase(StepKind.START, tuple(started)))
        ready = [k for k in sorted(retires, key=by_rank) if not any(s[0] == k[0] for s in starts)]
        if starts and not started:
            ready = []  # a start is blocked: retire just enough for it first (below), not every shrinking operator at once
        if ready:  # operators whose new replicas are all started (or that only shrink) drain the old ones
            moves = tuple((k, retires.pop(k)) for k in ready)
            for key, n in moves:
                take(key, n, -1)
            phases.append(Phase(StepKind.RETIRE, moves))
        if started or ready or not starts:
            continue
        blocked = min(starts, key=by_rank)
        need = usage(blocked)
        cap = capacity[blocked[2]]
        short = [i for i in range(len(need)) if need[i] > cap[i] - used[blocked[2]][i] + 1e-9]
        helpful = [k for k in retires if k[2] == blocked[2] and any(usage(k)[i] > 0 for i in short)]
        if not helpful:
            raise ValueError(f"cannot order the transition: {blocked[0]!r} cannot start on {blocked[2]!r} and nothing there is left to retire")

        def count(k, retires=retires, need=need, cap=cap, short=short) -> int:  # this iteration's values (called within it)
            vec = usage(k)
            return min(retires[k], max(math.ceil((need[i] - (cap[i] - used[k[2]][i]) - 1e-9) / vec[i]) for i in short if vec[i] > 0))

        # Keep every operator serving where possible (the blocked operator's own replicas first: they go anyway),
        # then take from the operator with the most headroom.
        key = min(helpful, key=lambda k: (alive[k[0]] - count(k) < 1, k[0] != blocked[0],
                                          -(headroom(k[0]) if headroom else 0.0), by_rank(k)))
        n = count(key)
        names = ", ".join(resource_names[i] for i in short)
        if alive[key[0]] - n < 1:
            note = (f"{blocked[2]} lacks {names} to start {blocked[0]} beside {key[0]}'s last replica: swapping it in place "
                    f"(drain {n} x {label(key)} of {key[0]} first; it serves nothing until the new one is warm)")
        else:
            note = f"{blocked[2]} lacks {names} to start {blocked[0]} before retiring: retiring {n} x {label(key)} of {key[0]} first"
        take(key, n, -1)
        retires[key] -= n
        retires = {k: v for k, v in retires.items() if v > 0}
        phases.append(Phase(StepKind.RETIRE, ((key, n),), note))
    raise RuntimeError("transition ordering did not converge")

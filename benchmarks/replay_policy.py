"""A policy that replays a run's plans: each at the same seconds into streaming (or since the run started) as
the run it came from, and nothing else, so a simulated run can be compared with a live one on the same moves.

Contract:
- ``ReplayPolicy(moves, from_start)``: ``moves`` are ``(seconds, plan)`` in order; ``decide`` returns the next plan
  as a roll-out at the first tick at least that many seconds after the origin: the first batch's start on the
  run's own clock, or 0 (the run's start) with ``from_start``.
"""

from __future__ import annotations

from typing import Sequence

from trident_flows.core.decision import Decision
from trident_flows.core.state import RunnerState
from trident_flows.core.types import BatchSample, Plan


class ReplayPolicy:
    """Returns each of the live run's plans at the first tick at least that many seconds into its own run's
    streaming (``from_start``: since the run started) and nothing else: the live run's decisions replayed, so a
    simulated run is compared with the live one on the same moves even where the policy's own decision sits on a
    knife's edge."""

    name = "replay"

    def __init__(self, moves: Sequence[tuple[float, Plan]], from_start: bool = False) -> None:
        self.moves = list(moves)
        self.from_start = from_start
        self.origin: float | None = 0.0 if from_start else None  # the first batch's start, on the run's own clock

    def decide(self, state: RunnerState, samples: Sequence[BatchSample]) -> Decision:
        if samples and not self.from_start:
            first = min(s.start for s in samples)
            self.origin = first if self.origin is None else min(self.origin, first)
        if self.origin is None or not self.moves or state.wall_s - self.origin < self.moves[0][0]:
            return Decision.no_change()
        plan = self.moves.pop(0)[1]
        return Decision.roll_out(plan, plan.reason)

"""The MILP's solvers: HiGHS in-process (default when available) or CBC, and how a solve ended.

Contract:
- ``SOLVERS``, ``DEFAULT_SOLVER``; ``GAP_REL``: plans within 0.5% of the best bound count as optimal.
- ``WarmHiGHS``: PuLP's in-process HiGHS given a MIP start; it keeps every improving solution that
  packs node by node and stops once one is within ``GAP_REL`` of a bound HiGHS does not know, or at
  its wall-clock or CPU-time limit (HiGHS checks its own limit only between stages).
- ``solver_cmd(solver, ...)``: the solver object for one MILP solve (CBC gets threads only above 1).
- ``status_gap(prob, solver, relaxed_bound)``: ("optimal" | "time_limit", relative gap), the bound the
  better of the solver's own and ``relaxed_bound``.
Importing this module makes HiGHS's first solver object with stdout on /dev/null, so its copyright
banner never reaches the output.
"""

from __future__ import annotations

import math
import time
import warnings
from typing import Callable, Sequence

import pulp

SOLVERS = ("highs", "cbc")
DEFAULT_SOLVER = "highs" if pulp.HiGHS().available() else "cbc"


def _silence_highs_banner() -> None:
    """HiGHS (highspy 1.16) prints its copyright banner into the output of the process on its first
    solver object, before PuLP can turn output off (``msg=False``); the banner is printed once per
    process. Make that first object here, with the process's stdout on /dev/null."""
    import os
    import sys

    import highspy

    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), 1)
            highspy.Highs()
    finally:
        os.dup2(saved, 1)
        os.close(saved)


if DEFAULT_SOLVER == "highs":
    _silence_highs_banner()
GAP_REL = 5e-3  # plans within 0.5% of the best bound count as optimal (well inside the throughput models' error)


class WarmHiGHS(pulp.HiGHS):
    """PuLP's in-process HiGHS, given a MIP start (PuLP passes none to it). Every improving
    solution that ``packs`` (column values -> fits node by node) is kept in ``packed`` as
    (objective, column values); the solve is interrupted as soon as one of them reaches
    ``stop_at`` (the objective within ``GAP_REL`` of a bound HiGHS does not know:
    ``integer_bound``), or once ``timeLimit`` (wall clock) or ``cpu_s`` (CPU time of this
    process, which does not grow while other processes hold the cores) has passed."""

    def __init__(self, start: dict[pulp.LpVariable, int], stop_at: float | None,
                 packs: Callable[[Sequence[float]], bool] | None, cpu_s: float | None = None, **kwargs: object) -> None:
        super().__init__(**kwargs)
        self.start = start
        self.stop_at = stop_at
        self.packs = packs
        self.cpu_s = cpu_s
        self.packed: list[tuple[float, list[float]]] = []

    def callSolver(self, lp: pulp.LpProblem) -> None:
        if self.start and self.mip:
            import numpy as np

            idx = np.array([v.index for v in self.start], dtype=np.int32)
            lp.solverModel.setSolution(len(idx), idx, np.array(list(self.start.values()), dtype=np.float64))
        if self.packs is not None and self.mip:
            packs, stop_at = self.packs, self.stop_at if self.stop_at is not None else math.inf

            def improving(event: object) -> None:
                values = list(event.data_out.mip_solution)  # type: ignore[attr-defined]
                if packs(values):
                    self.packed.append((-event.data_out.objective_function_value, values))  # type: ignore[attr-defined]  # PuLP minimises -objective

            deadline = time.perf_counter() + self.timeLimit if self.timeLimit else math.inf
            cpu_deadline = time.process_time() + self.cpu_s if self.cpu_s is not None else math.inf

            def stop(event: object) -> None:
                # HiGHS checks its own time limit only between stages (measured: 325 ms runs under a 50 ms limit)
                if ((self.packed and max(obj for obj, _ in self.packed) >= stop_at) or time.perf_counter() > deadline
                        or time.process_time() > cpu_deadline):
                    event.interrupt()  # type: ignore[attr-defined]

            lp.solverModel.cbMipImprovingSolution.subscribe(improving)
            lp.solverModel.cbMipInterrupt.subscribe(stop)
        lp.solverModel.run()


def solver_cmd(solver: str, time_limit_s: float, threads: int, start: dict[pulp.LpVariable, int],
                stop_at: float | None, packs: Callable[[Sequence[float]], bool] | None) -> pulp.LpSolver:
    if solver == "highs":
        return WarmHiGHS(start, stop_at, packs, msg=False, timeLimit=time_limit_s, gapRel=GAP_REL,
                          threads=threads if threads > 1 else None)
    # CBC given threads=1 runs its parallel mode with one worker and waits on it: pass threads only above 1.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # PuLP 3.3 deprecates its bundled-CBC class name
        return pulp.PULP_CBC_CMD(msg=False, timeLimit=time_limit_s, gapRel=GAP_REL, threads=threads if threads > 1 else None,
                                 warmStart=bool(start))


def status_gap(prob: pulp.LpProblem, solver: str, relaxed_bound: float | None) -> tuple[str, float]:
    """("optimal" | "time_limit", relative gap between the best bound and the objective).
    The bound is the better of the solver's own (HiGHS reports it; CBC does not through
    PuLP) and ``relaxed_bound`` (LP relaxation and whole-replica bound); a plan within
    ``GAP_REL`` of either is optimal (HiGHS is interrupted once it gets there)."""
    obj = pulp.value(prob.objective) or 0.0
    lp_gap = max(0.0, (relaxed_bound - obj) / abs(relaxed_bound)) if relaxed_bound else math.inf
    if solver == "highs":
        import highspy

        optimal = prob.solverModel.getModelStatus() == highspy.HighsModelStatus.kOptimal
        gap = prob.solverModel.getInfo().mip_gap
        gap = min(lp_gap, max(0.0, gap) if math.isfinite(gap) else math.inf)
        return ("optimal" if optimal or gap <= GAP_REL else "time_limit"), (gap if math.isfinite(gap) else math.nan)
    if prob.sol_status == pulp.LpSolutionOptimal:
        return "optimal", 0.0
    if lp_gap <= GAP_REL:
        return "optimal", lp_gap
    return "time_limit", lp_gap if math.isfinite(lp_gap) else math.nan

"""Where replicas run: the placement MILP and what it needs (see docs/architecture.md).

- ``types``: the MILP's inputs (``OperatorDemand``, ``PlacementOption``, ``CurrentPlacement``).
- ``inputs``: the policy's models and the runner's state turned into those inputs.
- ``model``: the resource and throughput model of a placement (``Key`` -> replicas), shared by
  the MILP, the transition pricing and the exhaustive-search check.
- ``bound``: the whole-replica upper bound that lets the MILP stop early.
- ``milp``: ``solve_placement``, replicas x configuration x device x node class, composing:
  ``formulation`` (the MILP's rows and bounds), ``greedy`` (the start, the repair), ``solvers``
  (HiGHS or CBC, and how a solve ended) and ``explain`` (each operator's reason, infeasibility).
- ``transition_cost``: the rolling change from the current placement to a plan, priced, and
  whether it pays its cold start (roll out or wait).
"""

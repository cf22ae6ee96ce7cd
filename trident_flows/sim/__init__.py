"""A discrete-event simulator of the runtime: the unchanged policies on clusters of many nodes.

Everything here runs on a simulated clock (``clock``), with no Ray: ``workload`` (the input
stream as feature rows), ``ids`` (row ids as numbers, hashed as the emulated operators hash
them), ``cluster`` (node classes and where replicas land, as the runtime places them),
``actor_start`` (replicas requested together sharing a node's cores while their actors start),
``call_cost`` (what an emulated operator's call costs beyond its modelled seconds), ``memory``
(emulated accelerators: resident memory, one kernel at a time, OOM), ``pool`` (an operator's
simulated replicas), ``queues`` (bounded operator input queues), ``runner`` (``SimRunner``:
the live runner's ``state`` / ``samples`` / ``apply`` on simulated time), ``rollout`` (an apply's
steps on the simulated clock), ``outcome`` (what an apply reports), ``static_search`` (static
configurations searched on the cost model: ``setup`` starts a run from one) and ``driver`` (``simulate``: a policy in a control loop over a simulated
run, each tick's CPU time charged to the simulated clock).
"""

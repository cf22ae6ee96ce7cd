"""A discrete-event simulator of the runtime: the unchanged policies on clusters of many nodes.

Everything here runs on a simulated clock (``clock``), with no Ray: ``workload`` (the input
stream as feature rows), ``ids`` (row ids as numbers, hashed as the emulated operators hash
them), ``cluster`` (node classes and where replicas land), ``memory``
(emulated accelerators: resident memory, one kernel at a time, OOM), ``pool`` (an operator's
simulated replicas), ``queues`` (bounded operator input queues), ``runner`` (``SimRunner``:
the live runner's ``state`` / ``samples`` / ``apply`` on simulated time), ``outcome`` (what an
apply reports) and ``driver`` (``simulate``: a policy in a control loop over a simulated run,
each tick's CPU time charged to the simulated clock).
"""

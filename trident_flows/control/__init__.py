"""The layer above the scheduler and the runtime: the control loop that ticks a policy against a runner, and `trident-flows run` (launch), which builds both."""

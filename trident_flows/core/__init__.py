"""The value types every layer speaks (configs, samples, plans, the runner's state) and the pure helpers both the scheduler and the runtime use. Imports nothing else of trident_flows."""

"""The tick loop every control loop runs: the CLI's (``control.loop``), the Prefect sidecar's and the
simulator's. Pure Python: it imports only ``core`` and ``scheduler`` (no Ray, no Prefect).

``tick_loop`` (``TickLoop``: read, decide, apply, record), ``apply`` (the apply step: a plan to the
runner, an exception a refusal, the outcome to the policy), ``clock`` (``WallClock``),
``figures`` (the run summary's per-operator figures) and ``run_summary`` (the one run summary).
"""

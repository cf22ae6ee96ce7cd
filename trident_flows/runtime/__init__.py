"""The streaming runtime on Ray: operator pools, the pipeline runner, live control, emulated devices."""

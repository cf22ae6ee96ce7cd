"""The streaming runtime on Ray: operator pools, the pipeline runner, rolling transitions, emulated devices. Speaks the core types; knows no policy."""

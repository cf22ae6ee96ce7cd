"""Prefect flows of trident-flows: ``document-curation`` (a pipeline on Ray, sharded into task runs)
and ``trident-sidecar`` (Trident ticks against a running pipeline)."""

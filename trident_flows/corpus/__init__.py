"""Scheduled curation of a growing corpus: where the documents land, what each run has to do, and the
one table the curated rows go to.

``location`` (a local directory or filesystem URL), ``manifest`` (every file seen and the diff of a
listing against it), ``sidecar`` (per-table-version files stored beside the table), ``near_dup_store``
(the persisted near-duplicate index), ``work`` (list, diff, fetch and hash the files a run processes)
and ``table`` (the Delta Lake tables and their one commit per run). This package imports neither Ray
nor Prefect; ``control.corpus_run`` and the ``document-curation`` flow drive it.
"""

"""The document-curation flow retried after a crash: shards an earlier run committed are not
redone, the one it did not commit is, and the output is the same as a clean run's."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_prefect_curation import _task_runs

from trident_flows.flows.document_curation import document_curation
from trident_flows.runtime import resume
from trident_flows.runtime.sink import read_ids

pytestmark = [pytest.mark.prefect, pytest.mark.ray, pytest.mark.models]


def test_a_flow_retry_skips_committed_shards(curated_documents):
    settings, first = curated_documents  # a clean run (8 documents, 3 shards, static), shared with test_prefect_curation
    out = Path(settings["output_location"])
    assert first.is_completed() and first.result()["duplicate_ids"] == 0
    reference = sorted(sum(read_ids(out), []))
    # the state a crash leaves behind: shard-00001 was written but its commit never finished
    resume.remove_marker(out, "shard-00001")
    state = document_curation(pipeline=settings, trident={"policy": "static"}, return_state=True)
    assert state.is_completed(), state.message
    names = sorted(t.name for t in _task_runs(state.state_details.flow_run_id) if t.name.startswith("curate shard-"))
    assert names == ["curate shard-00001"]
    assert state.result()["duplicate_ids"] == 0 and sorted(sum(read_ids(out), [])) == reference
    assert resume.committed_shards(out) == {"shard-00000", "shard-00001", "shard-00002"}

"""The audit flow against the real test server: a task set audited on the CPU, its rows kept in the
eval store (a rerun audits nothing again) and published as the audit table artifact."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cudagym.eval.store import Store
from cudagym.flows import artifacts
from cudagym.flows.audit import audit

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _latest(client, key: str):
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    found = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])))
    return max(found, key=lambda a: a.created) if found else None


@pytest.mark.slow
def test_audit_flow_marks_a_degenerate_problem_and_publishes_its_table(prefect_client, tmp_path):
    # ReLU of torch.rand is the input itself (every element is positive): its check accepts the input
    # handed back, and the audit must say so; Softmax over a real row is not degenerate.
    db = tmp_path / "audit.duckdb"
    kwargs = dict(problems=str(EXAMPLES / "problems"), levels=[1], ids=[2, 3], db=str(db), device="cpu",
                  n_checks=2, parallel=1)
    summary = audit(**kwargs)
    assert summary == {"problems": 2, "degenerate": 1}
    rows = json.loads(_latest(prefect_client, artifacts.AUDIT_KEY).data)
    by_id = {r["problem_id"]: r for r in rows}
    assert set(by_id) == {2, 3}
    assert "passthrough" in by_id[2]["accepts"] and by_id[2]["degenerate"]
    assert not by_id[3]["degenerate"] and not by_id[3]["error"]
    with Store(str(db)) as store:  # the rows were kept as they arrived
        assert store._con.execute("SELECT count(*) FROM audits").fetchone()[0] == 2
    assert audit(**kwargs) == summary  # the rerun reuses them

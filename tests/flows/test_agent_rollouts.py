"""The agent_rollouts flow against the real test server: a scripted rollout batch on a CPU task,
its reward distribution as a table artifact; a checkout without the rollout module fails the run
with one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cudagym.flows import agent_rollouts as flow_module
from cudagym.flows import artifacts

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture
def on_test_server(prefect_server):
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: prefect_server.url}):
        yield


def _latest(client, key: str):
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    found = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])))
    return max(found, key=lambda a: a.created) if found else None


@pytest.mark.slow
def test_scripted_batch_reports_its_rewards(on_test_server, prefect_client, tmp_path):
    # The honest scripted policy has no kernel for ReLU: it answers at once, and the judge rejects the
    # starting ModelNew (torch ops under the strict policy): a real rollout, no C++ build.
    summary = flow_module.agent_rollouts(tasks=str(EXAMPLES / "problems"), out=str(tmp_path / "out"),
                                         model="scripted:honest", levels=[1], ids="2", device="cpu",
                                         parallel=1, max_turns=10)
    assert (summary["rollouts"], summary["finished"]) == (1, 1)
    assert sum(summary["rewards"].values()) == 1 and Path(summary["db"]).is_file()
    rows = json.loads(_latest(prefect_client, artifacts.ROLLOUT_REWARDS_KEY).data)
    assert rows == artifacts.reward_rows(summary) and sum(r["rollouts"] for r in rows) == 1
    assert "**1 of 1** rollouts finished" in _latest(prefect_client, artifacts.ROLLOUT_SUMMARY_KEY).data
    assert _latest(prefect_client, artifacts.ROLLOUT_PROGRESS_KEY).data == 100


@pytest.mark.slow  # the session's Prefect server
def test_missing_rollout_module_fails_the_run_with_one_line(on_test_server, monkeypatch, tmp_path):
    monkeypatch.setattr(flow_module, "ROLLOUT_MODULE", "cudagym.agent.no_such_module")  # a checkout without it
    state = flow_module.agent_rollouts(tasks=str(EXAMPLES / "problems"), out=str(tmp_path / "out"), device="cpu",
                                       return_state=True)
    assert state.is_failed() and state.message == flow_module.MISSING
    with pytest.raises(flow_module.RolloutsUnavailable, match="agent rollouts need cudagym.agent.rollout"):
        flow_module.import_rollout()

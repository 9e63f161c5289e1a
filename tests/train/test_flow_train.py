"""The Prefect flow `train` (cudagym/flows/train.py): rft -> value -> ppo on a real trajectory store,
in a real (temporary) Prefect server, with a tiny random Llama; a rerun resumes every stage."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # ~1 min: the session's Prefect harness, three stages, one PPO step

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "problems"


def _markdown(key: str) -> str:
    from prefect import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    with get_client(sync_client=True) as client:
        found = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])))
    return max(found, key=lambda a: a.created).data


def test_train_flow_runs_and_resumes_its_stages(prefect_harness, store_path, tiny_checkpoint, tmp_path):
    from cudagym.flows.train import ARTIFACT_KEYS, train

    rollouts = tmp_path / "rollouts"
    rollouts.mkdir()
    (rollouts / "trajectories.duckdb").symlink_to(store_path)
    params = dict(rollouts=str(rollouts), model=str(tiny_checkpoint), out=str(tmp_path / "train"),
                  tasks=str(EXAMPLES), levels=[1], ids="3", ppo_steps=1, max_turns=2, max_new_tokens=8,
                  device="cpu", sft_epochs=1, value_max_steps=3)
    rows = train(**params)
    out = tmp_path / "train"
    assert [r["step"] for r in rows] == [1]
    assert (out / "rft" / "checkpoint" / "config.json").is_file()
    assert (out / "value" / "critic" / "value_head.pt").is_file()
    assert (out / "ppo" / "checkpoints" / "step-1" / "policy" / "config.json").is_file()
    # PPO started from the RFT checkpoint and the pretrained critic
    ppo_config = json.loads((out / "ppo" / "config.json").read_text())
    assert ppo_config["model"] == str(out / "rft" / "checkpoint") and ppo_config["critic"] == str(out / "value" / "critic")
    for stage, key in ARTIFACT_KEYS.items():
        markdown = _markdown(key)
        assert markdown.startswith(f"# {stage}") and "| step |" in markdown and "| 1 |" in markdown
        assert (out / stage / f"{stage}_curve.png").is_file()
    # a rerun with one more PPO step redoes neither RFT nor value pretraining, and continues PPO at step 2
    rft_mtime = (out / "rft" / "checkpoint" / "model.safetensors").stat().st_mtime_ns
    value_mtime = (out / "value" / "value_curve.json").stat().st_mtime_ns
    rows = train(**{**params, "ppo_steps": 2})
    assert [r["step"] for r in rows] == [1, 2]
    assert (out / "rft" / "checkpoint" / "model.safetensors").stat().st_mtime_ns == rft_mtime
    assert (out / "value" / "value_curve.json").stat().st_mtime_ns == value_mtime


def test_train_flow_without_rollouts_fails_with_one_line(prefect_harness, tmp_path):
    from cudagym.flows.train import NO_ROLLOUTS, train

    state = train(rollouts=str(tmp_path / "none"), model=str(tmp_path), return_state=True)
    assert state.is_failed() and state.message.startswith(NO_ROLLOUTS) and len(state.message.splitlines()) == 1

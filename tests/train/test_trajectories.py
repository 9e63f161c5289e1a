"""Agent rollouts -> the trajectory store -> training records -> RFT selection -> token samples.

The store (fixture `store_path`, tests/train/conftest.py) is written by the real agent loop and its
openai client against the in-process scripted OpenAI-compatible server; training reads it back.
"""

from __future__ import annotations

import pytest

from cudagym.agent.store import TrajectoryStore
from cudagym.train.data import tokenize_trajectory
from cudagym.train.rft import RFTConfig, RFTSelect
from cudagym.train.trajectories import load_trajectories

pytestmark = pytest.mark.slow  # ~15 s: twenty requests to the scripted server through the openai client

TOOLS = ("bash", "read_file", "verify")  # the tools of the fixture's environment


def test_load_trajectories_reads_what_the_loop_recorded(store_path):
    trajectories = {t.rollout_id: t for t in load_trajectories(store_path)}
    assert set(trajectories) == {"quick", "quick_text", "slow_kernel", "chatty", "malformed"}
    quick = trajectories["quick"]
    assert (quick.reward, quick.stop_reason, quick.finish_reason, quick.task_id) == (3.0, "answer", "stop", "L1/quick")
    roles = [m["role"] for m in quick.messages]
    assert roles == ["system", "user", "assistant", "tool", "assistant"]
    assert quick.messages[2]["tool_calls"][0]["function"]["name"] == "read_file"
    assert quick.messages[3]["tool_call_id"] == quick.messages[2]["tool_calls"][0]["id"]
    assert [(c.name, c.valid, c.ok, c.turn) for c in quick.tool_calls] == [("read_file", True, True, 1)]
    # text mode: the call is in the content, the result in a user message
    text = trajectories["quick_text"]
    assert [m["role"] for m in text.messages] == ["system", "user", "assistant", "user", "assistant"]
    assert "<tool_call>" in text.messages[2]["content"] and "<tool_response>" in text.messages[3]["content"]
    assert trajectories["chatty"].stop_reason == "max_turns"
    assert [c.valid for c in trajectories["malformed"].tool_calls] == [False, False, False, False, True]


def test_rft_selects_from_a_real_store(store_path):
    step = RFTSelect(RFTConfig(tool_names=TOOLS))
    kept = [t.rollout_id for t in step.run(load_trajectories(store_path))]
    assert sorted(kept) == ["quick", "quick_text"]
    assert step.stats["dropped_low_reward"] == 1  # slow_kernel: reward 1, correct but not faster
    assert step.stats["dropped_unfinished"] == 1  # chatty: stopped at max_turns
    # malformed: its first bad call is `bash` with arguments that are not JSON (invalid), before the unknown tool
    assert step.stats["dropped_invalid_call"] == 1


def test_unfinished_rollouts_are_left_out_unless_asked(store_path, tmp_path):
    import shutil

    copy = tmp_path / "copy.duckdb"
    shutil.copy(store_path, copy)
    with TrajectoryStore(copy) as store:
        store.begin({"rollout_id": "running", "task_id": "L1/x", "model": "m"})
    assert "running" not in {t.rollout_id for t in load_trajectories(copy)}
    running = [t for t in load_trajectories(copy, finished_only=False) if t.rollout_id == "running"]
    assert running[0].status == "running" and running[0].reward is None and running[0].messages == ()


def test_stored_rollouts_tokenize_with_a_real_template(store_path, smollm2_tokenizer):
    kept = {t.rollout_id: t for t in RFTSelect(RFTConfig(tool_names=TOOLS)).run(load_trajectories(store_path))}
    for rid in ("quick", "quick_text"):  # a native and a text tool-call rollout end in the same shape
        sample = tokenize_trajectory(kept[rid], smollm2_tokenizer)
        model_text = smollm2_tokenizer.decode([t for t, m in zip(sample.response_ids, sample.response_mask) if m])
        assert model_text.count("<tool_call>") == 1 and '"read_file"' in model_text
        assert model_text.endswith("Done.<|im_end|>")
        assert "<tool_response>" not in model_text  # the tool's output is the environment's
        assert sample.token_rewards[max(i for i, m in enumerate(sample.response_mask) if m)] == kept[rid].reward

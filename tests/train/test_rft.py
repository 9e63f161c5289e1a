"""cudagym.train.rft: which rollouts rejection fine-tuning keeps, one rule per test."""

from __future__ import annotations

import dataclasses

import pytest

from cudagym.agent.environment import TOOL_NAMES as TOOLS
from cudagym.train.rft import RFTConfig, RFTSelect, drop_reason, longest_identical_run
from cudagym.train.trajectories import ToolCallRecord, Trajectory


def _trajectory(rid="good", reward=3.0, stop_reason="answer", finish_reason="stop", calls=None, messages=None) -> Trajectory:
    calls = calls if calls is not None else (
        ToolCallRecord("write_file", '{"path": "k.cu", "content": "a"}', turn=1),
        ToolCallRecord("verify", "{}", turn=2),
        ToolCallRecord("write_file", '{"path": "k.cu", "content": "b"}', turn=3),
        ToolCallRecord("verify", "{}", turn=4),  # the same as turn 2, but not in a row: fine
    )
    messages = messages if messages is not None else (
        {"role": "system", "content": "s"}, {"role": "user", "content": "u"}, {"role": "assistant", "content": "done"})
    return Trajectory(rid, "L1/1", messages, reward, stop_reason, finish_reason, calls)


def test_a_good_rollout_is_kept():
    assert drop_reason(_trajectory(), RFTConfig(tool_names=TOOLS)) is None


@pytest.mark.parametrize("reward, kept", [(None, False), (-1.0, False), (1.0, False), (2.0, True), (3.0, True)])
def test_reward_threshold(reward, kept):
    reason = drop_reason(_trajectory(reward=reward), RFTConfig())
    assert (reason is None) == kept
    if not kept:
        assert reason == ("no_reward" if reward is None else "low_reward")
    # a lower threshold keeps a correct-but-slow rollout
    assert drop_reason(_trajectory(reward=1.0), RFTConfig(min_reward=0.0)) is None


@pytest.mark.parametrize("stop_reason", ["max_turns", "context_budget", "wall_time", "invalid_calls", "client_error", None])
def test_unclean_stops_are_dropped(stop_reason):
    assert drop_reason(_trajectory(stop_reason=stop_reason), RFTConfig()) == "unfinished"


def test_cut_off_answers_and_dangling_tool_calls_are_unfinished():
    assert drop_reason(_trajectory(finish_reason="length"), RFTConfig()) == "unfinished"
    dangling = ({"role": "user", "content": "u"},
                {"role": "assistant", "content": None, "tool_calls": [{"id": "1", "function": {"name": "verify", "arguments": "{}"}}]})
    assert drop_reason(_trajectory(messages=dangling), RFTConfig()) == "unfinished"
    ends_on_tool = ({"role": "user", "content": "u"}, {"role": "assistant", "content": "x"}, {"role": "tool", "content": "out"})
    assert drop_reason(_trajectory(messages=ends_on_tool), RFTConfig()) == "unfinished"


def test_unknown_and_invalid_tool_calls():
    unknown = (ToolCallRecord("nvcc", "{}", valid=False, turn=1),)
    assert drop_reason(_trajectory(calls=unknown), RFTConfig()) == "unknown_tool"  # the environment's names by default
    assert drop_reason(_trajectory(calls=unknown), RFTConfig(tool_names=None)) == "invalid_call"  # no names: the loop's flag
    bad_arguments = (ToolCallRecord("bash", "ls -la", valid=False, turn=1),)
    assert drop_reason(_trajectory(calls=bad_arguments), RFTConfig(tool_names=TOOLS)) == "invalid_call"
    # a tool that ran and failed (a compile error) is a valid call: kept
    failed = (ToolCallRecord("bash", '{"command": "nvcc k.cu"}', valid=True, ok=False, turn=1),)
    assert drop_reason(_trajectory(calls=failed), RFTConfig(tool_names=TOOLS)) is None


def test_repeated_identical_calls():
    same = ToolCallRecord("bash", '{"command": "ls", "timeout": 5}', turn=1)
    reordered = ToolCallRecord("bash", '{"timeout": 5,  "command": "ls"}', turn=2)  # same call, other spelling
    other = ToolCallRecord("bash", '{"command": "pwd"}', turn=3)
    assert longest_identical_run(_trajectory(calls=(same, reordered, other, same))) == 2
    assert drop_reason(_trajectory(calls=(same, reordered)), RFTConfig()) == "repeated_call"
    assert drop_reason(_trajectory(calls=(same, other, same)), RFTConfig()) is None
    assert drop_reason(_trajectory(calls=(same, reordered)), RFTConfig(max_identical_calls_in_a_row=2)) is None
    assert drop_reason(_trajectory(calls=(same, same, same)), RFTConfig(max_identical_calls_in_a_row=2)) == "repeated_call"


def test_select_step_counts_and_reports_drops():
    rollouts = [
        _trajectory("keep1"),
        _trajectory("low", reward=-1.0),
        _trajectory("cut", stop_reason="max_turns"),
        _trajectory("keep2", reward=2.0),
        _trajectory("loop", calls=(ToolCallRecord("verify", "{}"),) * 3),
    ]
    rejected = []
    step = RFTSelect(RFTConfig(tool_names=TOOLS), rejects=lambda t, reason: rejected.append((t.rollout_id, reason)))
    assert [t.rollout_id for t in step.run(rollouts)] == ["keep1", "keep2"]
    assert rejected == [("low", "low_reward"), ("cut", "unfinished"), ("loop", "repeated_call")]
    assert dict(step.stats) == {"in": 5, "kept": 2, "dropped_low_reward": 1, "dropped_unfinished": 1, "dropped_repeated_call": 1}


def test_config_checks():
    with pytest.raises(ValueError):
        RFTConfig(max_identical_calls_in_a_row=0)
    assert dataclasses.is_dataclass(RFTConfig) and RFTConfig.__dataclass_params__.frozen


def test_the_kept_set_is_a_loadable_dataset_with_a_card(tmp_path):
    import datasets

    from cudagym.train.rft import write_dataset

    with_calls = (
        {"role": "system", "content": "s"}, {"role": "user", "content": "u"},
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "verify", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "PASS"},
        {"role": "assistant", "content": "done"},
    )
    step = RFTSelect(RFTConfig(tool_names=TOOLS))
    kept = list(step.run([_trajectory("a", messages=with_calls), _trajectory("b", reward=2.0), _trajectory("c", reward=-1.0)]))
    folder = write_dataset(kept, tmp_path / "rft", step.stats, step.config)
    assert sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()) == [
        "README.md", "data/train-00000-of-00001.parquet"]
    loaded = datasets.load_dataset(str(folder), split="train", cache_dir=str(tmp_path / "cache"))
    assert loaded["rollout_id"] == ["a", "b"] and loaded["reward"] == [3.0, 2.0]
    messages = loaded[0]["messages"]
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert messages[2]["content"] == "" and messages[2]["tool_calls"][0]["function"] == {"name": "verify", "arguments": "{}"}
    assert messages[3]["tool_call_id"] == "c1" and messages[4]["tool_calls"] == []
    card = (folder / "README.md").read_text()
    assert "| dropped_low_reward | 1 |" in card and "| kept | 2 |" in card and "| min_reward | 1.0 |" in card
    with pytest.raises(FileExistsError):
        write_dataset(kept, folder, step.stats, step.config)

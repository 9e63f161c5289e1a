"""The DuckDB trajectory store (cudagym/agent/store.py): rows in order, restart replaces partial rows."""

from __future__ import annotations

import pytest

from cudagym.agent.client import ClientError, Reply
from cudagym.agent.loop import ToolCall
from cudagym.agent.store import TrajectoryStore

START = {"rollout_id": "L1-1-abc-s0", "run": "r", "task_sha256": "abc", "task_id": "L1/1", "task_name": "1_x",
         "level": 1, "problem_id": 1, "sample": 0, "model": "m", "base_url": "http://x/v1",
         "sampling": {"temperature": 0.7}, "settings": {"max_turns": 5}, "workdir": "/w"}


def _steps(store: TrajectoryStore, rid: str, n: int) -> None:
    store.message(rid, 0, 0, {"role": "system", "content": "s"})
    for turn in range(1, n + 1):
        store.turn(rid, turn, Reply({"role": "assistant"}, "tool_calls", 10 * turn, 5, "server", 0.1, 1))
        store.message(rid, 2 * turn - 1, turn, {"role": "assistant", "content": "",
                                                "tool_calls": [{"id": f"c{turn}", "type": "function",
                                                                "function": {"name": "verify", "arguments": "{}"}}]})
        store.tool_call(rid, turn, ToolCall(turn - 1, f"c{turn}", "verify", "{}", "native", ok=True, output="PASS",
                                            data={"correct": True, "reward": 1}, elapsed_s=1.5))
        store.message(rid, 2 * turn, turn, {"role": "tool", "tool_call_id": f"c{turn}", "content": "PASS"})


def test_rows_are_written_in_order_and_read_back(tmp_path):
    db = tmp_path / "t.duckdb"
    with TrajectoryStore(db) as store:
        store.begin(START)
        _steps(store, START["rollout_id"], 3)
        store.turn(START["rollout_id"], 4, ClientError("llm_timeout", "3 attempts", 3, 30.0))
        row = store.rollout(START["rollout_id"])
        assert (row["status"], row["turns"], row["attempt"]) == ("running", 3, 1)
        store.finish(START["rollout_id"], status="finished", stop_reason="client_error", detail="llm_timeout",
                     turns=4, prompt_tokens=60, completion_tokens=15, verdict={"status": "pass", "reward": 2},
                     candidate_code="class ModelNew: ...", wall_s=12.0)
    with TrajectoryStore(db, read_only=True) as store:  # what a later process reads
        row = store.rollout(START["rollout_id"])
        assert (row["status"], row["stop_reason"], row["reward"], row["verdict"]) == (
            "finished", "client_error", 2, {"status": "pass", "reward": 2})
        assert row["sampling"] == {"temperature": 0.7} and row["settings"] == {"max_turns": 5}
        assert [m["seq"] for m in store.messages(START["rollout_id"])] == list(range(7))
        calls = store.tool_calls(START["rollout_id"])
        assert [c["call_id"] for c in calls] == ["c1", "c2", "c3"] and calls[0]["data"] == {"correct": True, "reward": 1}
        turns = store.turns(START["rollout_id"])
        assert [t["prompt_tokens"] for t in turns] == [10, 20, 30, None] and turns[3]["error"].startswith("llm_timeout")


def test_a_restarted_rollout_replaces_its_partial_rows(tmp_path):
    with TrajectoryStore(tmp_path / "t.duckdb") as store:
        other = {**START, "rollout_id": "L1-1-abc-s1", "sample": 1}
        store.begin(other)
        _steps(store, other["rollout_id"], 1)
        store.begin(START)
        _steps(store, START["rollout_id"], 3)  # then the batch was killed
        store.begin(START)  # resumed: from scratch
        assert store.messages(START["rollout_id"]) == [] and store.tool_calls(START["rollout_id"]) == []
        assert store.turns(START["rollout_id"]) == []
        assert store.rollout(START["rollout_id"])["attempt"] == 2
        assert len(store.messages(other["rollout_id"])) == 3  # the other rollout's rows are untouched
        assert store.statuses() == {START["rollout_id"]: "running", other["rollout_id"]: "running"}
        with pytest.raises(ValueError, match="status"):
            store.finish(START["rollout_id"], status="done", stop_reason=None, detail=None, turns=0, prompt_tokens=0,
                         completion_tokens=0, verdict=None, candidate_code=None, wall_s=0)


def test_a_second_writer_gets_one_line(tmp_path):
    import subprocess
    import sys

    db = tmp_path / "t.duckdb"
    with TrajectoryStore(db):
        code = ("from cudagym.agent.store import TrajectoryStore\n"
                f"try:\n    TrajectoryStore({str(db)!r})\nexcept ValueError as e:\n    print(e)\n")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120).stdout
    assert "holds" in out and "--out" in out and len(out.strip().splitlines()) == 1

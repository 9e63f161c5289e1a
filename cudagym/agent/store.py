"""The trajectory store: one DuckDB file per rollout batch (OUT/trajectories.duckdb).

Tables (one row per thing, written the moment it happens, so a killed batch loses at most the step
in flight):

- `rollouts`: one row per (task, sample): rollout_id, run, task (sha256, id, name, level,
  problem_id), sample, model, base_url, sampling and loop settings (JSON), status (`running`,
  `finished`, `failed`), stop_reason, detail, turns, token totals, reward, the final verdict (JSON),
  the final candidate's code and its kernels/ files (JSON: path -> text), workdir, attempt (how many times it was started), started / finished
  times, wall_s.
- `messages`: every message of the conversation in order (rollout_id, seq, turn, role, content,
  tool_calls JSON, tool_call_id), exactly as produced (the loop's context shortening is not applied).
- `tool_calls`: every tool call in order (rollout_id, seq, turn, call_id, name, arguments, format
  native/text, valid, ok, output, data = the verdict of verify/profile, elapsed_s, build_s).
- `turns`: one row per model query (prompt_tokens, completion_tokens, usage_source server/estimate,
  latency_s, attempts, finish_reason, error).

Resuming: `begin` of a rollout that is not finished replaces its partial rows (it restarts from
scratch); finished rollouts are never begun again (`rollout.run_rollouts` skips them). One process
writes the file at a time (DuckDB's lock); all writes go through the event loop's thread.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from cudagym.tasks.db import connect

STATUSES = ("running", "finished", "failed")

_SCHEMA = [
    """CREATE TABLE IF NOT EXISTS rollouts (
        rollout_id VARCHAR PRIMARY KEY, run VARCHAR, task_sha256 VARCHAR, task_id VARCHAR, task_name VARCHAR,
        level INTEGER, problem_id INTEGER, sample INTEGER, model VARCHAR, base_url VARCHAR, sampling JSON,
        settings JSON, status VARCHAR, stop_reason VARCHAR, detail VARCHAR, turns INTEGER, prompt_tokens BIGINT,
        completion_tokens BIGINT, reward INTEGER, verdict JSON, candidate_code VARCHAR, candidate_files JSON, workdir VARCHAR,
        attempt INTEGER, started TIMESTAMP, finished TIMESTAMP, wall_s DOUBLE)""",
    """CREATE TABLE IF NOT EXISTS messages (
        rollout_id VARCHAR, seq INTEGER, turn INTEGER, role VARCHAR, content VARCHAR, tool_calls JSON,
        tool_call_id VARCHAR, created TIMESTAMP, PRIMARY KEY (rollout_id, seq))""",
    """CREATE TABLE IF NOT EXISTS tool_calls (
        rollout_id VARCHAR, seq INTEGER, turn INTEGER, call_id VARCHAR, name VARCHAR, arguments VARCHAR,
        format VARCHAR, valid BOOLEAN, ok BOOLEAN, output VARCHAR, data JSON, elapsed_s DOUBLE, build_s DOUBLE,
        created TIMESTAMP, PRIMARY KEY (rollout_id, seq))""",
    """CREATE TABLE IF NOT EXISTS turns (
        rollout_id VARCHAR, turn INTEGER, prompt_tokens BIGINT, completion_tokens BIGINT, usage_source VARCHAR,
        latency_s DOUBLE, attempts INTEGER, finish_reason VARCHAR, error VARCHAR, created TIMESTAMP,
        PRIMARY KEY (rollout_id, turn))""",
]
_CHILD_TABLES = ("messages", "tool_calls", "turns")


def _json(value) -> str | None:
    return None if value is None else json.dumps(value)


class TrajectoryStore:
    """Rollouts, messages, tool calls and turns in one DuckDB file."""

    def __init__(self, path: str | Path, read_only: bool = False):
        self.path = Path(path)
        self._con = connect(self.path, "trajectory store", option="--out", read_only=read_only)
        if not read_only:
            for statement in _SCHEMA:
                self._con.execute(statement)

    # -- writes ---------------------------------------------------------------------------------------
    def begin(self, row: dict) -> None:
        """Start (or restart from scratch) a rollout: its old partial rows go, status becomes running.
        `row` holds the rollouts columns known at the start (rollout_id, run, task_*, sample, model, ...)."""
        rid = row["rollout_id"]
        previous = self._con.execute("SELECT attempt FROM rollouts WHERE rollout_id = ?", [rid]).fetchone()
        for table in _CHILD_TABLES:
            self._con.execute(f"DELETE FROM {table} WHERE rollout_id = ?", [rid])
        self._con.execute("DELETE FROM rollouts WHERE rollout_id = ?", [rid])
        values = {**row, "sampling": _json(row.get("sampling")), "settings": _json(row.get("settings")),
                  "status": "running", "attempt": (previous[0] or 0) + 1 if previous else 1, "turns": 0}
        columns = list(values)
        self._con.execute(f"INSERT INTO rollouts ({', '.join(columns)}, started) VALUES "
                          f"({', '.join('?' for _ in columns)}, current_timestamp)", [values[c] for c in columns])

    def message(self, rollout_id: str, seq: int, turn: int, message: dict) -> None:
        self._con.execute("INSERT OR REPLACE INTO messages VALUES (?, ?, ?, ?, ?, ?, ?, current_timestamp)",
                          [rollout_id, seq, turn, message.get("role"), message.get("content"),
                           _json(message.get("tool_calls")), message.get("tool_call_id")])
        self._con.execute("UPDATE rollouts SET turns = ? WHERE rollout_id = ?", [turn, rollout_id])

    def tool_call(self, rollout_id: str, turn: int, call) -> None:
        """A loop.ToolCall, after it ran (or was refused)."""
        self._con.execute("INSERT OR REPLACE INTO tool_calls VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, current_timestamp)",
                          [rollout_id, call.seq, turn, call.call_id, call.name, call.arguments, call.format, call.valid,
                           call.ok, call.output, _json(call.data), call.elapsed_s, call.build_s])

    def turn(self, rollout_id: str, turn: int, reply) -> None:
        """A client.Reply or client.ClientError."""
        if hasattr(reply, "message"):
            values = [reply.prompt_tokens, reply.completion_tokens, reply.usage_source, reply.latency_s, reply.attempts,
                      reply.finish_reason, None]
        else:
            values = [None, None, None, reply.latency_s, reply.attempts, None, f"{reply.reason}: {reply.detail}"]
        self._con.execute("INSERT OR REPLACE INTO turns VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, current_timestamp)",
                          [rollout_id, turn, *values])

    def finish(self, rollout_id: str, *, status: str, stop_reason: str | None, detail: str | None, turns: int,
               prompt_tokens: int, completion_tokens: int, verdict: dict | None, candidate_code: str | None,
               wall_s: float, candidate_files: dict[str, str] | None = None) -> None:
        if status not in STATUSES:
            raise ValueError(f"unknown rollout status {status!r}")
        reward = verdict.get("reward") if verdict else None
        self._con.execute(
            "UPDATE rollouts SET status = ?, stop_reason = ?, detail = ?, turns = ?, prompt_tokens = ?, "
            "completion_tokens = ?, reward = ?, verdict = ?, candidate_code = ?, candidate_files = ?, finished = current_timestamp, "
            "wall_s = ? WHERE rollout_id = ?",
            [status, stop_reason, (detail or "")[:2000], turns, prompt_tokens, completion_tokens, reward, _json(verdict),
             candidate_code, _json(candidate_files), wall_s, rollout_id])

    # -- reads ----------------------------------------------------------------------------------------
    def _rows(self, sql: str, params: list | None = None) -> list[dict]:
        cursor = self._con.execute(sql, params or [])
        names = [d[0] for d in cursor.description]
        rows = [dict(zip(names, row)) for row in cursor.fetchall()]
        for row in rows:
            for key in ("sampling", "settings", "verdict", "tool_calls", "data", "candidate_files"):
                if isinstance(row.get(key), str):
                    row[key] = json.loads(row[key])
        return rows

    def statuses(self) -> dict[str, str]:
        return dict(self._con.execute("SELECT rollout_id, status FROM rollouts").fetchall())

    def rollouts(self) -> list[dict]:
        return self._rows("SELECT * FROM rollouts ORDER BY level, problem_id, task_id, sample")

    def rollout(self, rollout_id: str) -> dict | None:
        rows = self._rows("SELECT * FROM rollouts WHERE rollout_id = ?", [rollout_id])
        return rows[0] if rows else None

    def messages(self, rollout_id: str) -> list[dict]:
        return self._rows("SELECT * FROM messages WHERE rollout_id = ? ORDER BY seq", [rollout_id])

    def tool_calls(self, rollout_id: str) -> list[dict]:
        return self._rows("SELECT * FROM tool_calls WHERE rollout_id = ? ORDER BY seq", [rollout_id])

    def turns(self, rollout_id: str) -> list[dict]:
        return self._rows("SELECT * FROM turns WHERE rollout_id = ? ORDER BY turn", [rollout_id])

    def close(self) -> None:
        self._con.close()

    def __enter__(self) -> "TrajectoryStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class RolloutRecorder:
    """The loop's Recorder for one rollout: every event becomes a row at once."""

    def __init__(self, store: TrajectoryStore, rollout_id: str):
        self.store, self.rollout_id = store, rollout_id

    def message(self, seq: int, turn: int, message: dict) -> None:
        self.store.message(self.rollout_id, seq, turn, message)

    def tool_call(self, call, turn: int) -> None:
        self.store.tool_call(self.rollout_id, turn, call)

    def turn(self, turn: int, reply) -> None:
        self.store.turn(self.rollout_id, turn, reply)


def settings_of(*configs) -> dict:
    """The JSON of frozen config dataclasses, merged (what a rollout row records of its settings)."""
    merged: dict = {}
    for config in configs:
        merged.update({k: v for k, v in asdict(config).items() if k != "api_key"})
    return merged

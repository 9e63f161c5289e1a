"""Agent trajectories as training sees them: one record per rollout, read from the agent's store.

The agent environment (cudagym.agent) writes every rollout to a DuckDB trajectory store
(cudagym/agent/store.py: tables rollouts, messages, tool_calls, turns). Training reads finished
rollouts back as `Trajectory` records: the conversation exactly as produced (the loop's context
shortening is not in the store), every tool call with the loop's verdict on it, the last turn's
finish reason, and the final reward of the judge.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ToolCallRecord:
    """One tool call of a rollout (a row of the store's tool_calls table)."""

    name: str
    arguments: str  # the JSON text the model wrote
    valid: bool = True  # False: the loop could not run it (unknown tool, arguments not a JSON object, bad block)
    ok: bool = True  # the tool's own success flag (a failed compile is ok=False but a valid call)
    turn: int = 0
    data: dict | None = None  # verify/profile: the verdict as a dict


@dataclass(frozen=True)
class Trajectory:
    """One finished rollout: what data.py tokenizes and rft.py selects from."""

    rollout_id: str
    task_id: str
    messages: tuple[dict, ...]  # OpenAI chat messages: role, content, tool_calls, tool_call_id
    reward: float | None  # the judge's milestone reward (-1/1/2/3); None: never judged
    stop_reason: str | None = None  # the loop's STOP_REASONS: answer, max_turns, context_budget, ...
    finish_reason: str | None = None  # the server's finish_reason of the last model turn: stop, length, ...
    tool_calls: tuple[ToolCallRecord, ...] = ()
    status: str = "finished"

    def verify_results(self) -> list[dict]:
        """Per-turn verify outcomes in order: {"turn", "data"} for every verify call that ran."""
        return [{"turn": c.turn, "data": c.data} for c in self.tool_calls if c.name == "verify" and c.valid]


def load_trajectories(db_path: str | Path, finished_only: bool = True) -> list[Trajectory]:
    """Every rollout of an agent trajectory store, in the store's order (level, problem, task, sample)."""
    from cudagym.agent.store import TrajectoryStore

    with TrajectoryStore(db_path, read_only=True) as store:
        out = []
        for row in store.rollouts():
            if finished_only and row["status"] != "finished":
                continue
            rid = row["rollout_id"]
            messages = []
            for m in store.messages(rid):
                message = {"role": m["role"], "content": m["content"]}
                if m.get("tool_calls"):
                    message["tool_calls"] = m["tool_calls"]
                if m.get("tool_call_id"):
                    message["tool_call_id"] = m["tool_call_id"]
                messages.append(message)
            calls = tuple(
                ToolCallRecord(c["name"] or "", c["arguments"] or "", bool(c["valid"]), bool(c["ok"]), c["turn"] or 0, c["data"])
                for c in store.tool_calls(rid)
            )
            turns = store.turns(rid)
            out.append(Trajectory(
                rollout_id=rid, task_id=row["task_id"] or "", messages=tuple(messages),
                reward=None if row["reward"] is None else float(row["reward"]), stop_reason=row["stop_reason"],
                finish_reason=turns[-1]["finish_reason"] if turns else None, tool_calls=calls, status=row["status"],
            ))
    return out

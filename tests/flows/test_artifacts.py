"""Artifact rows from real results, without Prefect: the leaderboard tables from a real store, the
audit table, the reward distribution of a rollout summary; and the keys Prefect accepts."""

from __future__ import annotations

import re

from cudagym.eval.leaderboard import build_entries
from cudagym.eval.store import Store
from cudagym.eval.verdict import Status, Verdict
from cudagym.flows import artifacts


def test_keys_are_what_prefect_accepts():
    keys = [v for k, v in vars(artifacts).items() if k.endswith("_KEY")]
    assert len(keys) == len(set(keys)) >= 6
    assert all(re.fullmatch(r"[a-z0-9-]+", key) for key in keys)


def test_leaderboard_rows_from_a_store(tmp_path):
    with Store(tmp_path / "db.duckdb") as store:
        store.add_submission("fast", "/x", "strict")
        store.add_verdict("fast", Verdict(status=Status.PASS, level=1, problem_id=1, name="1_a", t_candidate_ms=1.0,
                                          t_eager_ms=2.0, t_compile_ms=3.0).finish().to_dict())
        store.add_verdict("fast", Verdict(status=Status.INCORRECT, level=1, problem_id=2, name="2_b",
                                          reason="wrong").finish().to_dict())
        entries = build_entries(store)
    [row] = artifacts.leaderboard_rows(entries)
    assert row["submission"] == "fast" and row["n"] == 2 and row["pass_rate"] == 0.5
    assert row["faster_than_compile_rate"] == 0.5 and (row["timing_mode"], row["precision"]) == ("strict", "strict")
    problems = artifacts.problem_rows(entries)
    assert [(r["problem_id"], r["status"], r["reward"]) for r in problems] == [(1, "pass", 3), (2, "incorrect", -1)]
    assert problems[0]["speedup_vs_compile"] == 3.0 and problems[1]["reason"] == "wrong"
    assert artifacts.leaderboard_rows([]) == [] and "No new submissions" in artifacts.refresh_markdown([], None)


def test_audit_table_and_summary():
    rows = [{"level": 1, "problem_id": 2, "name": "relu", "accepts": ["passthrough"], "near": [], "stochastic": [],
             "degenerate": "accepts passthrough"},
            {"level": 1, "problem_id": 3, "name": "softmax", "accepts": [], "near": [], "stochastic": ["rand"],
             "degenerate": None},
            {"level": 1, "problem_id": 4, "name": "bad", "accepts": [], "error": "crashed"}]
    table = artifacts.audit_table(rows)
    assert [(r["problem_id"], r["accepts"], r["degenerate"], r["error"]) for r in table] == [
        (2, "passthrough", "accepts passthrough", ""), (3, "", "", ""), (4, "", "", "crashed")]
    assert artifacts.audit_summary(rows).startswith("**1 of 3**") and "1 references draw" in artifacts.audit_summary(rows)


def test_reward_distribution_of_a_rollout_summary():
    summary = {"rollouts": 5, "finished": 4, "failed": 1, "rewards": {"3": 1, "-1": 3, "1": 1}, "mean_reward": -0.2,
               "stop_reasons": {"answered": 4, "max_turns": 1}, "submission": "out/submission",
               "db": "out/trajectories.duckdb"}
    assert artifacts.reward_rows(summary) == [{"reward": -1, "rollouts": 3, "share": 0.6},
                                              {"reward": 1, "rollouts": 1, "share": 0.2},
                                              {"reward": 3, "rollouts": 1, "share": 0.2}]
    text = artifacts.rollout_markdown(summary)
    assert "**4 of 5**" in text and "(1 failed)" in text and "| -1 | 3 |" in text and "mean reward -0.2" in text
    assert "| max_turns | 1 |" in text
    assert artifacts.rollouts_to_run("6 rollouts (3 tasks x 2 samples): 2 finished before, 4 to run, 2 at once") == 4
    assert artifacts.rollouts_to_run("something else") is None
    assert artifacts.reward_rows({"rewards": {}}) == []

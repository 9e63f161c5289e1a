"""Rollout batches (cudagym/agent/rollout.py) end to end: the real openai client against the scripted
server, the real KernelEnv (workdir, sandboxed bash, the judge), the real DuckDB store.

(a) the honest policy writes a C++ kernel for a CPU task, verifies, profiles and stops: the judge's
final verdict gives reward >= 1 and the kernel lands in the submission folder;
(b) adversarial policies, each in its own rollout of one batch (network, writes outside the
workdir, reading other workdirs and the store, changing model.py and verify, a fork bomb, 50 MB of
output, a hang): each is contained and recorded, and the batch finishes every rollout.
ENV's tests (test_containment.py) cover the sandbox in depth; these cover the loop running it.
"""

from __future__ import annotations

import html
import re
from pathlib import Path

import pytest

from cudagym.agent.rollout import RolloutConfig, rollout_id, run_rollouts, select_tasks
from cudagym.agent.scripted import HONEST_KERNELS, ScriptedServer, write_task_set
from cudagym.agent.store import TrajectoryStore

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "problems"
DIAG_MATMUL_KERNEL = HONEST_KERNELS["torch.diag(A) @ B"].read_text()


@pytest.mark.slow
def test_honest_policy_earns_its_reward_from_the_judge(tmp_path):
    config = RolloutConfig(tasks=str(EXAMPLES), levels=(1,), ids="4", out=str(tmp_path / "out"), model="scripted:honest",
                           device="cpu", parallel=1, max_turns=10)
    summary = run_rollouts(config)  # no base URL: run_rollouts serves the scripted policy itself
    assert (summary["rollouts"], summary["finished"], summary["failed"]) == (1, 1, 0)
    assert summary["n_submitted"] == 1 and summary["mean_reward"] >= 1
    with TrajectoryStore(summary["db"], read_only=True) as store:
        (row,) = store.rollouts()
        calls = store.tool_calls(row["rollout_id"])
        messages = store.messages(row["rollout_id"])
        turns = store.turns(row["rollout_id"])
    assert row["status"] == "finished" and row["stop_reason"] == "answer" and row["turns"] == 5
    verdict = row["verdict"]
    assert verdict["status"] == "pass" and verdict["correct"] and row["reward"] == verdict["reward"] >= 1
    assert verdict["t_candidate_ms"] and verdict["t_eager_ms"]  # the final verdict is timed by the judge itself
    assert [c["name"] for c in calls] == ["read_file", "write_file", "verify", "profile"]
    verify, profile = calls[2], calls[3]
    assert verify["ok"] and verify["data"]["correct"] and verify["data"]["t_candidate_ms"] is None  # verify: no timing
    assert profile["ok"] and profile["data"]["t_candidate_ms"]  # kept per turn, apart from the final verdict
    assert [m["role"] for m in messages] == ["system", "user"] + ["assistant", "tool"] * 4 + ["assistant"]
    assert len(turns) == 5 and all(t["usage_source"] == "server" and t["prompt_tokens"] > 0 for t in turns)
    assert row["prompt_tokens"] == sum(t["prompt_tokens"] for t in turns)
    assert row["candidate_code"] == DIAG_MATMUL_KERNEL
    (submitted,) = (Path(summary["submission"]) / "level1").glob("*.py")
    assert submitted.name == "4_Diag_matmul.py" and submitted.read_text() == DIAG_MATMUL_KERNEL
    # its trajectory page, which the leaderboard links the problem to: every call in order, the verdict
    page = (Path(summary["submission"]) / "trajectories" / "level1_4.html").read_text()
    names = re.findall(r"&rarr; <b>(\w+)</b>", page)
    assert names == ["read_file", "write_file", "verify", "profile"]
    assert f"<b>reward</b> {row['reward']}" in page and "status pass" in page
    assert html.escape(DIAG_MATMUL_KERNEL[:80]) in page  # the kernel as the model wrote it

    # a second call finds the rollout finished and redoes nothing
    again = run_rollouts(config)
    assert again["ran"] == 0 and again["finished"] == 1 and again["n_submitted"] == 1


ATTACKS = ["network", "escape", "snoop", "tamper", "forkbomb", "flood", "hang", "quick"]


@pytest.mark.slow
def test_adversarial_rollouts_are_contained_and_recorded(tmp_path):
    tasks = write_task_set(tmp_path / "tasks", ATTACKS)
    probe = tmp_path / "probe"  # where an escaping write would land
    probe.mkdir()
    out = tmp_path / "out"
    with ScriptedServer(probe_dir=probe) as server:
        config = RolloutConfig(tasks=str(tasks), out=str(out), model="scripted:task", base_url=server.base_url,
                               device="cpu", parallel=2, max_turns=6, bash_timeout_s=5, max_output_chars=4000)
        lines: list[str] = []
        summary = run_rollouts(config, progress=lines.append)
        leaks = list(server.leaks)
    assert summary["finished"] == len(ATTACKS) and summary["failed"] == 0  # the batch went on to the end
    assert sum(line.startswith("[") for line in lines) == len(ATTACKS)
    ids = {t.name.split("_", 1)[1]: rollout_id(t, 0) for t in select_tasks(config)}
    with TrajectoryStore(summary["db"], read_only=True) as store:
        rows = {name: store.rollout(rid) for name, rid in ids.items()}
        calls = {name: store.tool_calls(rid) for name, rid in ids.items()}
    for name, row in rows.items():  # each recorded with the judge's verdict of what the workdir held
        assert row["status"] == "finished" and row["stop_reason"] == "answer", name
        assert row["reward"] == -1 and row["verdict"]["status"] == "rejected", name
        assert calls[name], name

    assert leaks == []  # network: nothing reached the server but the API calls
    assert "exit=0" not in calls["network"][0]["output"]

    assert list(probe.iterdir()) == []  # escape: nothing outside the workdir
    assert not (out / "workdirs" / "escape-parent.txt").exists() and not list(out.glob("escape*"))
    assert not list(Path("/tmp").glob(f"cudagym-escape-{server.token}*"))
    assert [c["ok"] for c in calls["escape"][1:]] == [False, False]  # the file tools refuse, with a message
    assert all(c["output"].startswith("error:") for c in calls["escape"][1:])

    snooped = calls["snoop"][0]["output"]  # the shell sees its own workdir, no other, and no store
    assert ids["snoop"] in snooped and not any(rid in snooped for name, rid in ids.items() if name != "snoop")
    assert not calls["snoop"][1]["ok"]

    task_code = {t.name.split("_", 1)[1]: t.code for t in select_tasks(config)}
    workdir = out / "workdirs" / ids["tamper"]
    assert (workdir / "model.py").read_text() == task_code["tamper"]  # model.py and verify unchanged
    assert "ALL CORRECT" not in (workdir / "verify").read_text()
    assert calls["tamper"][2]["name"] == "verify" and not calls["tamper"][2]["ok"]

    bomb = calls["forkbomb"][0]  # contained by the process limit (or the timeout), the rollout went on
    assert bomb["name"] == "bash" and bomb["elapsed_s"] < 120

    flood = calls["flood"][0]  # 50 MB printed, at most max_output_chars (plus a note) kept
    assert len(flood["output"]) < 4000 + 500 and flood["data"]["output_bytes"] >= 50_000_000

    hang = calls["hang"][0]  # killed at the bash timeout
    assert not hang["ok"] and hang["data"]["timed_out"] and hang["elapsed_s"] < 60


def test_submission_keeps_the_best_correct_rollout_and_its_kernel_files(tmp_path):
    from cudagym.agent.rollout import write_submission
    from cudagym.eval.batch import candidate_files, submission_files

    def row(sample, reward, speedup, code, files=None, correct=True, status="finished"):
        return {"status": status, "level": 1, "problem_id": 12, "task_name": "12_Matmul_with_diagonal_matrices_",
                "sample": sample, "reward": reward, "candidate_code": code, "candidate_files": files,
                "verdict": {"correct": correct, "reward": reward, "speedup_vs_compile": speedup}}

    kernel = {"kernels/diag.cu": "__global__ void k() {}\n", "kernels/inc/common.h": "#pragma once\n"}
    rows = [row(0, 3, 1.2, "slow"), row(1, 3, 2.5, "fast", kernel), row(2, 1, 9.0, "only correct"),
            row(3, 3, 50.0, "unfinished", status="running"), row(4, -1, None, "wrong", correct=False),
            {**row(0, -1, None, "x", correct=False), "problem_id": 13}]  # a problem with no correct rollout
    assert write_submission(rows, tmp_path / "submission") == 1
    found = submission_files(tmp_path / "submission")
    assert list(found) == [(1, 12)] and found[(1, 12)].name == "12_Matmul_with_diagonal_matrices.py"
    assert found[(1, 12)].read_text() == "fast"
    assert candidate_files(found[(1, 12)]) == kernel  # what `eval run` sends the judge with it

"""`cudagym agent rollout | eval | show` (cudagym/cli.py): bad input, the views of a run, and a batch
killed with SIGKILL mid-way that resumes without redoing its finished rollouts, and one stopped with
SIGINT in the middle of a verify that ends within seconds and resumes likewise."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cudagym.agent.scripted import write_task_set
from cudagym.agent.store import TrajectoryStore
from cudagym.cli import main

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "problems"


def _error(capsys, argv: list[str]) -> str:
    assert main(argv) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("cudagym: error: ") and len(err.splitlines()) == 1, err
    return err


@pytest.mark.parametrize("argv, message", [
    (["--model", "gpt-x"], "--base-url"),
    (["--model", "scripted:nope"], "unknown scripted policy"),
    (["--model", "scripted:quick+fast"], "unknown scripted modifier"),
    (["--model", "scripted:quick", "--n-samples", "0"], "--n-samples"),
    (["--model", "scripted:quick", "--parallel", "0"], "--parallel"),
    (["--model", "m", "--base-url", "localhost:8000"], "http://"),
    (["--model", "scripted:quick", "--max-turns", "0"], "max_turns"),
    (["--model", "scripted:quick", "--temperature", "5"], "temperature"),
    (["--model", "scripted:quick", "--ids", "x-y"], "problem ids"),
    (["--model", "scripted:quick", "--tasks", "/no/such/tasks.jsonl"], "no such file"),
    (["--model", "scripted:quick", "--ids", "99"], "no tasks selected"),
    (["--model", "scripted:replay", "--replay", "/no/such/submission"], "--replay"),
])
def test_bad_rollout_input_is_one_line(capsys, tmp_path, argv, message):
    base = ["agent", "rollout", "--tasks", str(EXAMPLES), "--device", "cpu", "--out", str(tmp_path / "out")]
    assert message in _error(capsys, base + argv)


def test_show_of_a_missing_run_is_one_line(capsys, tmp_path):
    assert "no trajectory store" in _error(capsys, ["agent", "show", str(tmp_path)])


def _command(tasks: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "cudagym", "agent", "rollout", "--tasks", str(tasks), "--model", "scripted:task",
            "--device", "cpu", "--parallel", "1", "--max-turns", "5", "--out", str(out)]


@pytest.mark.slow
@pytest.mark.timeout(1200)  # a killed batch, then its rerun (up to 600 s on a slow machine)
def test_a_killed_batch_resumes_without_redoing_finished_rollouts(tmp_path, capsys):
    tasks = write_task_set(tmp_path / "tasks", ["quick+delay"] * 4)  # each reply waits 0.5 s: time to kill
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(_command(tasks, out), stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
                            env=env, cwd=REPO)
    try:
        deadline = time.monotonic() + 300
        for line in proc.stderr:  # the progress lines
            if line.startswith("[1/4]") or time.monotonic() > deadline:
                break
        proc.send_signal(signal.SIGKILL)  # no cleanup of any kind
    finally:
        proc.kill()
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    with TrajectoryStore(out / "trajectories.duckdb", read_only=True) as store:
        before = {r["rollout_id"]: r for r in store.rollouts()}
    finished = {rid for rid, r in before.items() if r["status"] == "finished"}
    assert 1 <= len(finished) < 4

    rerun = subprocess.run(_command(tasks, out), capture_output=True, text=True, env=env, cwd=REPO, timeout=600)
    assert rerun.returncode == 0, rerun.stderr
    assert f"{len(finished)} finished before, {4 - len(finished)} to run" in rerun.stderr
    with TrajectoryStore(out / "trajectories.duckdb", read_only=True) as store:
        after = {r["rollout_id"]: r for r in store.rollouts()}
        n_messages = {rid: len(store.messages(rid)) for rid in after}
    assert len(after) == 4 and all(r["status"] == "finished" for r in after.values())
    for rid in finished:  # untouched: same start, same attempt
        assert (after[rid]["started"], after[rid]["attempt"]) == (before[rid]["started"], 1)
    for rid, row in before.items():
        if rid not in finished:  # begun when killed: started over, its partial rows replaced
            assert after[rid]["attempt"] == 2 and after[rid]["started"] > row["started"]
    assert set(n_messages.values()) == {5}  # system, task, read_file call + result, answer: no duplicate rows

    # the views of the run
    assert main(["agent", "show", str(out)]) == 0
    table = capsys.readouterr().out
    assert all(rid in table for rid in after) and table.count("finished") == 4
    rid = sorted(after)[0]
    assert main(["agent", "show", str(out), "--rollout", rid]) == 0
    view = capsys.readouterr().out
    assert view.startswith(f"rollout {rid}") and "-> read_file(" in view and "final verdict: rejected" in view
    assert main(["agent", "show", str(out), "--rollout", rid, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [m["role"] for m in data["messages"]] == ["system", "user", "assistant", "tool", "assistant"]
    assert data["rollout"]["reward"] == -1 and data["tool_calls"][0]["name"] == "read_file"
    assert "no rollout" in _error(capsys, ["agent", "show", str(out), "--rollout", "nope"])
    # another model on the same folder is refused rather than mixed in
    assert "another model" in _error(capsys, ["agent", "rollout", "--tasks", str(tasks), "--model", "scripted:quick",
                                              "--device", "cpu", "--out", str(out)])


@pytest.mark.slow
def test_agent_eval_scores_kernelbench_problems_with_the_leaderboard_metrics(capsys, tmp_path, kernelbench_path):
    out = tmp_path / "eval"
    argv = ["agent", "eval", "--model", "scripted:quick", "--levels", "1", "--ids", "1-2", "--device", "cpu",
            "--parallel", "2", "--out", str(out), "--json"]
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out)
    assert (summary["rollouts"], summary["finished"], summary["rewards"]) == (2, 2, {"-1": 2})
    overall, level1 = summary["metrics"]["overall"], summary["metrics"]["level1"]
    assert overall["n"] == level1["n"] == 2 and overall["pass_rate"] == 0.0  # the starting model_new.py is rejected
    with TrajectoryStore(out / "trajectories.duckdb", read_only=True) as store:
        rows = store.rollouts()
    assert [(r["level"], r["problem_id"]) for r in rows] == [(1, 1), (1, 2)]
    assert all(r["settings"]["max_turns"] == 200 and r["task_id"].startswith("v0.1/L1/") for r in rows)


@pytest.mark.slow
def test_the_replayed_expert_earns_what_eval_run_gives_the_same_kernels(capsys, tmp_path):
    # scripted:replay writes examples/submission_cpu's files (two honest C++ kernels, a reward hack that
    # returns its input) into the agent's workdir, verifies, profiles and answers: the final verdicts
    # must be those `eval run` gives the same folder (timing noise aside: status and correctness).
    submission = REPO / "examples" / "submission_cpu"
    common = ["--levels", "1", "--ids", "1,2,4", "--device", "cpu", "--parallel", "2"]
    out = tmp_path / "agent"
    assert main(["agent", "rollout", "--tasks", str(EXAMPLES), "--model", "scripted:replay", "--replay",
                 str(submission), "--max-turns", "8", "--out", str(out), *common]) == 0
    db = tmp_path / "lb.duckdb"
    assert main(["eval", "run", str(submission), "--problems", str(EXAMPLES), "--db", str(db), "--name", "direct",
                 *common]) == 0
    capsys.readouterr()
    with TrajectoryStore(out / "trajectories.duckdb", read_only=True) as store:
        rollouts = {r["problem_id"]: r for r in store.rollouts()}
        calls = {pid: [c["name"] for c in store.tool_calls(r["rollout_id"])] for pid, r in rollouts.items()}
    from cudagym.eval.store import Store

    with Store(db) as lb:
        direct = {v["problem_id"]: v for v in lb.verdicts("direct")}
    assert sorted(rollouts) == sorted(direct) == [1, 2, 4]
    for pid, row in rollouts.items():
        assert calls[pid] == ["read_file", "write_file", "verify", "profile"], calls[pid]
        verdict = row["verdict"]
        assert (verdict["status"], verdict["correct"]) == (direct[pid]["status"], direct[pid]["correct"]), pid
        assert (row["reward"] >= 1) == (direct[pid]["reward"] >= 1)
    assert rollouts[4]["reward"] >= 1 and rollouts[2]["reward"] == -1  # an honest kernel passes, the hack does not

    # benchmarks/agent_report.py (what benchmarks/agent_gpu.sh runs on the GPU) on these two runs
    report_json = tmp_path / "report.json"
    done = subprocess.run([sys.executable, "benchmarks/agent_report.py", "--eval-db", str(db), "--name", "direct",
                           "--run", str(out), "--out-json", str(report_json)], capture_output=True, text=True,
                          cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)
    assert done.returncode == 0, done.stderr
    report = json.loads(report_json.read_text())
    assert report["agreement"]["verdict_agree"] == report["agreement"]["rollouts"] == 3
    assert [p["problem_id"] for p in report["problems"]] == [1, 2, 4]
    assert report["timings"]["tools_ms"]["read_file"]["n"] == report["timings"]["tools_ms"]["verify"]["n"] == 3
    assert report["timings"]["env_tools_ms"]["n"] == 6  # read_file and write_file: the judge's calls left out


SPIN = "\nfor _ in range(10**11):  # the import never ends: its verify is still running when the batch is stopped\n    pass\n"


def _judges_of(marker: str) -> list[int]:
    """Live processes whose command line names `marker` (the judges and runners of one test's TMPDIR)."""
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and marker in (entry / "cmdline").read_bytes().decode(errors="replace"):
                pids.append(int(entry.name))
        except OSError:
            pass
    return pids


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_sigint_during_a_verify_stops_the_batch_at_once_and_a_rerun_resumes(tmp_path):
    # Two rollouts at once: problem 2's replayed kernel is judged quickly, problem 4's never finishes
    # importing. Ctrl-C (or timeout -s INT) while problem 4's verify runs must kill its judge, keep
    # problem 2's finished rollout, say the run resumes, and end within seconds.
    fast, slow = tmp_path / "fast" / "level1", tmp_path / "slow" / "level1"
    hack = (REPO / "examples" / "submission_cpu" / "level1" / "2_ReLU_on_rand.py").read_text()
    for folder in (fast, slow):
        folder.mkdir(parents=True)
        (folder / "2_ReLU_on_rand.py").write_text(hack)
    (fast / "4_Diag_matmul.py").write_text(hack.replace("def forward(self, x)", "def forward(self, A, B)").replace(
        "return x", "return B"))
    (slow / "4_Diag_matmul.py").write_text((fast / "4_Diag_matmul.py").read_text() + SPIN)
    out, judges_tmp = tmp_path / "out", tmp_path / "judges"
    judges_tmp.mkdir()
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TMPDIR": str(judges_tmp)}

    def command(replay: Path) -> list[str]:
        return [sys.executable, "-m", "cudagym", "agent", "eval", "--tasks", str(EXAMPLES), "--levels", "1", "--ids",
                "2,4", "--model", "scripted:replay", "--replay", str(replay.parent), "--device", "cpu", "--parallel",
                "2", "--max-turns", "8", "--out", str(out)]

    proc = subprocess.Popen(command(slow), stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env,
                            cwd=REPO)
    try:
        lines = []
        for line in proc.stderr:  # the progress lines: problem 2's rollout finishes, problem 4's hangs in verify
            lines.append(line)
            if line.startswith("[1/2]"):
                break
        assert "Diag" not in lines[-1] and lines[-1].startswith("[1/2]"), lines
        deadline = time.monotonic() + 60
        while not _judges_of(str(judges_tmp)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _judges_of(str(judges_tmp)), "no judge running"
        proc.send_signal(signal.SIGINT)
        t0 = time.monotonic()
        rest = proc.communicate(timeout=60)[1]
        stopped_in = time.monotonic() - t0
    finally:
        proc.kill()
        proc.wait(timeout=60)
        left = _judges_of(str(judges_tmp))
        for pid in left:  # they run in sessions of their own: a failed stop must not leave them spinning
            os.kill(pid, signal.SIGKILL)
    assert not left, "judges left running"
    assert stopped_in < 15, f"took {stopped_in:.1f} s to stop"
    assert proc.returncode == 130, rest
    assert rest.count("re-run to resume") == 1, rest
    with TrajectoryStore(out / "trajectories.duckdb", read_only=True) as store:
        status = {r["problem_id"]: r["status"] for r in store.rollouts()}
    assert status == {2: "finished", 4: "running"}

    rerun = subprocess.run(command(fast), capture_output=True, text=True, env=env, cwd=REPO, timeout=200)
    assert rerun.returncode == 0, rerun.stderr
    assert "1 finished before, 1 to run" in rerun.stderr
    with TrajectoryStore(out / "trajectories.duckdb", read_only=True) as store:
        rows = {r["problem_id"]: r for r in store.rollouts()}
    assert {pid: r["status"] for pid, r in rows.items()} == {2: "finished", 4: "finished"}
    assert rows[2]["attempt"] == 1 and rows[4]["attempt"] == 2

"""benchmarks/agent_report.py: eval run's verdicts beside the rollouts' final verdicts, the tool-call
timings, concurrency and the GPU busy fraction, on stores written here with known rows (the end-to-end
run on a real replay is in test_cli_agent.py)."""

from __future__ import annotations

import importlib.util
import json
import time
from datetime import datetime
from pathlib import Path

import pytest

from cudagym.agent.client import Reply
from cudagym.agent.loop import ToolCall
from cudagym.agent.store import TrajectoryStore
from cudagym.eval.store import Store

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("agent_report", REPO / "benchmarks" / "agent_report.py")
agent_report = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(agent_report)


def _verdict(pid: int, status: str, reward: int, speedup: float | None = None) -> dict:
    return {"level": 1, "problem_id": pid, "name": f"{pid}_P", "status": status, "correct": status == "pass",
            "reward": reward, "speedup_vs_eager": speedup, "speedup_vs_compile": speedup, "timing_mode": "strict",
            "precision": "strict"}


def _stores(tmp_path: Path) -> tuple[Path, Path]:
    eval_db, run = tmp_path / "expert.duckdb", tmp_path / "run"
    run.mkdir()
    with Store(eval_db) as lb:
        lb.add_submission("expert", "benchmarks/expert", "strict", levels=[1], kb_version="v0")
        lb.add_verdict("expert", _verdict(1, "pass", 3, 2.0))
        lb.add_verdict("expert", _verdict(2, "incorrect", -1))
    # problem 1: sample 0 agrees, sample 1 passes too but timing noise gave it reward 1; problem 2 agrees;
    # problem 3 has no eval verdict; problem 2's second sample was stopped before its final verdict
    rows = [(1, 0, _verdict(1, "pass", 3, 2.1)), (1, 1, _verdict(1, "pass", 1, 1.02)),
            (2, 0, _verdict(2, "incorrect", -1)), (3, 0, _verdict(3, "pass", 1, 1.0)), (2, 1, None)]
    # each rollout: read_file, write_file (10 ms apart per rollout), verify (build 1 s), profile (no build)
    with TrajectoryStore(run / "trajectories.duckdb") as store:
        for i, (pid, sample, verdict) in enumerate(rows):
            rid = f"r{pid}-{sample}"
            store.begin({"rollout_id": rid, "run": "t", "task_id": f"v0/L1/{pid}", "task_name": f"{pid}_P", "level": 1,
                         "problem_id": pid, "sample": sample, "model": "scripted:replay"})
            if verdict is None:  # stopped at once: begun, nothing more
                continue
            calls = [("read_file", 0.010 * (i + 1), 0.0), ("write_file", 0.020 * (i + 1), 0.0),
                     ("verify", 2.0 + i, 1.0), ("profile", 5.0, 0.0)]
            for seq, (name, elapsed, build) in enumerate(calls):
                store.tool_call(rid, seq, ToolCall(seq=seq, call_id=f"c{seq}", name=name, arguments="{}", format="native",
                                                   ok=True, elapsed_s=elapsed, build_s=build))
            store.turn(rid, 0, Reply(message={}, finish_reason="stop", prompt_tokens=1, completion_tokens=1,
                                     usage_source="server", latency_s=0.002 * (i + 1), attempts=1))
            store.finish(rid, status="finished", stop_reason="answer", detail=None, turns=5, prompt_tokens=1,
                         completion_tokens=1, verdict=verdict, candidate_code="", wall_s=1.0)
    return eval_db, run


def test_agreement_timings_and_gpu_busy_fraction(tmp_path, capsys):
    eval_db, run = _stores(tmp_path)
    t0 = time.time()
    smi = tmp_path / "smi.csv"
    stamp = lambda s: datetime.fromtimestamp(t0 + s).strftime("%Y/%m/%d %H:%M:%S.%f")[:-3]  # nvidia-smi's, local
    smi.write_text("\n".join([f"{stamp(-5)}, 99 %, 10 MiB",  # before the window: left out
                              f"{stamp(1)}, 0 %, 500 MiB", f"{stamp(2)}, 40 %, 800 MiB", f"{stamp(3)}, 80 %, 700 MiB",
                              f"{stamp(4)}, [N/A], [N/A]", "2026/12/02 08:0"]) + "\n")  # unreadable: skipped
    out_json, out_md = tmp_path / "r.json", tmp_path / "r.md"
    assert agent_report.main(["--eval-db", str(eval_db), "--name", "expert", "--run", str(run), "--smi", str(smi),
                              "--window", f"{t0},{t0 + 10}", "--out-json", str(out_json), "--out-md", str(out_md)]) == 0
    printed = capsys.readouterr().out
    report = json.loads(out_json.read_text())
    assert out_md.read_text() == printed and "verdicts agree 3/3, rewards agree 2/3" in printed
    assert "| L1/2_P | incorrect r=-1 x-/x- | incorrect r=-1 x-/x-; running | yy - |" in printed

    assert report["agreement"] == {"rollouts": 5, "finished": 4, "compared": 3, "verdict_agree": 3, "reward_agree": 2,
                                   "no_eval_verdict": 1}
    p1, p2, p3 = report["problems"]
    assert p1["eval"]["reward"] == 3 and [(r["verdict_agree"], r["reward_agree"]) for r in p1["rollouts"]] == \
        [(True, True), (True, False)]
    assert p1["rollouts"][1]["speedup_vs_compile"] == 1.02  # shown beside eval run's 2.0
    assert [(r["verdict_agree"], r["reward_agree"], r["rollout_status"]) for r in p2["rollouts"]] == \
        [(True, True, "finished"), (None, None, "running")]  # the stopped one is not a disagreement
    assert p3["eval"] is None and p3["rollouts"][0]["verdict_agree"] is None

    t = report["timings"]
    # read_file 10, 20, 30, 40 ms; write_file 20, 40, 60, 80 ms: p95 interpolated between the top two ranks
    assert t["tools_ms"]["read_file"] == {"n": 4, "p50": 25.0, "p95": 38.5, "max": 40.0}
    assert t["tools_ms"]["write_file"] == {"n": 4, "p50": 50.0, "p95": 77.0, "max": 80.0}
    # all 8 together, no judge: 10 20 20 30 40 40 60 80, p95 at rank 0.95 * 7 = 6.65: 60 + 0.65 * 20
    assert t["env_tools_ms"] == {"n": 8, "p50": 35.0, "p95": 73.0, "max": 80.0}
    assert t["tools_ms"]["verify"]["p50"] == 3500.0 and t["judge_less_build_ms"]["verify"]["p50"] == 2500.0
    assert t["judge_build_ms"]["verify"]["p50"] == 1000.0 and t["judge_less_build_ms"]["profile"]["p50"] == 5000.0
    assert t["model_turn_ms"]["p50"] == 5.0
    assert report["max_concurrent_rollouts"] == 1  # begun and finished one after another (the stopped one: no end)
    assert report["gpu"] == {"samples": 3, "busy_fraction": 0.667, "mean_util_pct": 40.0, "max_mem_mib": 800.0}


def test_max_concurrent_counts_overlaps():
    at = lambda s: datetime(2026, 1, 1, 0, 0, s)
    rows = [{"started": at(0), "finished": at(10)}, {"started": at(1), "finished": at(5)},
            {"started": at(5), "finished": at(6)},  # starts as the second ends: not three at once
            {"started": at(2), "finished": None}]  # unfinished: not counted
    assert agent_report.max_concurrent(rows) == 2


@pytest.mark.parametrize("argv, message", [
    (["--eval-db", "/no/such.duckdb", "--name", "x", "--run", "/tmp"], "--eval-db: no such file"),
    (["--name", "expert", "--run", "/no/such/run"], "--run trajectory store: no such file"),
    (["--name", "nobody"], "holds no verdicts of 'nobody'"),
])
def test_bad_input_is_one_line(tmp_path, capsys, argv, message):
    eval_db, run = _stores(tmp_path)
    base = {"--eval-db": str(eval_db), "--run": str(run)}
    args = argv + [x for k, v in base.items() if k not in argv for x in (k, v)]
    with pytest.raises(SystemExit) as exit_:
        agent_report.main(args)
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 1 and len(err.splitlines()) == 1 and message in err, err

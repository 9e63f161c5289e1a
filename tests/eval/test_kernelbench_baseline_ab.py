"""benchmarks/kernelbench_baseline_ab.py on CPU (issue 16, acceptance 2): KernelBench's own loop
(their function needs CUDA: on CPU it reports its error, which each row keeps) with its deadline and
resume, and the comparison against a real `cudagym baseline run` store. The GPU numbers come from
benchmarks/baseline_gpu.sh ab."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "kernelbench_baseline_ab.py"
PROBLEMS = ("1_1_Small_matmul.py", "1_2_ReLU_on_rand.py")
# torch's own fp32 settings, which KernelBench's loop leaves as they are (cudagym's `kernelbench` precision)
TORCH_DEFAULTS = {"matmul_tf32": False, "cudnn_tf32": True, "float32_matmul_precision": "highest"}


def _run(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, timeout=600)
    assert not check or done.returncode == 0, done.stderr[-2000:]
    return done


def _problems(tmp_path: Path) -> Path:
    folder = tmp_path / "problems"
    folder.mkdir()
    for name in PROBLEMS:
        shutil.copy(REPO / "examples" / "problems" / name, folder / name)
    return folder


def _kbsrc(tmp_path: Path) -> Path:
    """The pinned KernelBench files: .kbsrc here, or made from a git dir named by CUDAGYM_KB_MIRROR."""
    if os.environ.get("CUDAGYM_KB_MIRROR"):
        _run(str(SCRIPT), "checkout", os.environ["CUDAGYM_KB_MIRROR"], "--dest", str(tmp_path / "kbsrc"))
        return tmp_path / "kbsrc"
    if (REPO / ".kbsrc" / "COMMIT").exists():
        return REPO / ".kbsrc"
    pytest.skip("no KernelBench checkout: set CUDAGYM_KB_MIRROR to a KernelBench git dir, or run `checkout`")


def _rows(path: Path) -> tuple[list[dict], list[dict]]:
    items = [json.loads(line) for line in path.read_text().splitlines()]
    return [i["meta"] for i in items if "meta" in i], [i for i in items if "meta" not in i]


def test_their_loop_runs_each_problem_once_keeps_rows_past_a_deadline_and_resumes(tmp_path):
    kbsrc, problems, out = _kbsrc(tmp_path), _problems(tmp_path), tmp_path / "theirs.jsonl"
    theirs = (str(SCRIPT), "theirs", "--kbsrc", str(kbsrc), "--problems", str(problems), "--device", "cpu",
              "--out", str(out))

    stopped = _run(*theirs, "--deadline-s", "0", check=False)  # past its deadline before the first problem
    assert stopped.returncode == 3 and "deadline after 0/2" in stopped.stderr
    metas, rows = _rows(out)
    assert rows == [] and metas[0]["todo"] == 2

    _run(*theirs)
    metas, rows = _rows(out)
    assert [r["id"] for r in rows] == ["L1/1", "L1/2"] and metas[-1]["todo"] == 2
    for row in rows:  # their function ran, failed without CUDA, and said why
        assert "Expected a cuda device" in row["eager_error"] and "Expected a cuda device" in row["compile_error"]
        assert row["precision"] == "fp32" and row["flags"] == TORCH_DEFAULTS and row["eager_wall_s"] >= 0

    _run(*theirs)  # nothing left to do: no problem is run twice
    metas, again = _rows(out)
    assert again == rows and metas[-1]["todo"] == 0


def test_compare_reads_cudagym_store_and_compares_eager_only_where_precision_matches(tmp_path):
    problems, db = _problems(tmp_path), tmp_path / "ours.duckdb"
    t0 = time.perf_counter()
    _run("-m", "cudagym", "baseline", "run", "--problems", str(problems), "--device", "cpu", "--precision",
         "kernelbench", "--db", str(db), "--parallel", "2", "--json")
    ours_wall = time.perf_counter() - t0
    from cudagym.eval.store import Store
    from cudagym.tasks import load_task_set

    tasks = load_task_set(str(problems))
    with Store(db) as store:
        stored = dict(store.sql("SELECT problem_sha256, t_eager_ms FROM baselines"))
    eager = [stored[t.sha256] for t in tasks]

    def row(task, ms: float, flags: dict, wall: float) -> dict:
        return {"id": task.id, "level": task.level, "problem_id": task.problem_id, "name": task.name,
                "sha256": task.sha256, "precision": "fp32", "flags": flags, "eager": {"mean": ms, "median": ms},
                "eager_wall_s": wall, "compile_wall_s": wall}

    theirs = tmp_path / "theirs.jsonl"
    lines = [{"meta": {"gpu": "cpu", "selected": 2, "setup_s": 1.0}},
             row(tasks[0], eager[0] / 1.02, TORCH_DEFAULTS, 10.0),  # ours 2% slower: within 3%
             row(tasks[1], eager[1] / 1.10, TORCH_DEFAULTS, 20.0)]  # 10%: not within
    theirs.write_text("".join(json.dumps(x) + "\n" for x in lines))
    out = tmp_path / "ab.json"
    printed = _run(str(SCRIPT), "compare", "--theirs", str(theirs), "--db", str(db), "--ours-wall-s",
                   str(ours_wall), "--out", str(out)).stdout
    result = json.loads(out.read_text())
    by_id = {r["id"]: r for r in result["rows"]}
    assert by_id["L1/1"]["eager_rel"] == pytest.approx(0.02, abs=1e-3) and by_id["L1/1"]["eager_within"] is True
    assert by_id["L1/2"]["eager_rel"] == pytest.approx(0.10, abs=1e-3) and by_id["L1/2"]["eager_within"] is False
    assert result["eager_compared"] == 2 and result["eager_within_3pct"] == 1 and result["theirs_complete"]
    assert result["wall_s"]["theirs"] == 61.0
    assert result["speed_ratio"] == pytest.approx(61.0 / ours_wall, rel=0.02)
    assert result["precision"]["ours_flags"] == TORCH_DEFAULTS and "L1/2" in printed and "x" in printed

    # Their loop stopped after one of two problems, the other computed with cuDNN TF32 off (as cudagym's
    # strict precision): the ratio goes per problem and that eager median is not compared.
    lines = [dict(lines[0]), row(tasks[0], eager[0], dict(TORCH_DEFAULTS, cudnn_tf32=False), 10.0)]
    theirs.write_text("".join(json.dumps(x) + "\n" for x in lines))
    _run(str(SCRIPT), "compare", "--theirs", str(theirs), "--db", str(db), "--ours-wall-s", "10", "--out", str(out))
    result = json.loads(out.read_text())
    assert not result["theirs_complete"] and result["speed_ratio"] == pytest.approx(21.0 / (10 / 2), rel=0.01)
    assert result["eager_compared"] == 0 and result["rows"][0]["precision_match"] is False


def test_compare_finds_baselines_a_gpu_stored_under_its_queued_strict_method(tmp_path):
    """On a GPU a strict baseline's timing_mode column says `strict-queued` (batch.baseline_key): the
    compare found none of the H200's 15 (session 17) while it asked for `strict`."""
    from cudagym.eval.batch import baseline_key
    from cudagym.eval.store import Store
    from cudagym.tasks import load_task_set

    problems, db = _problems(tmp_path), tmp_path / "ours.duckdb"
    tasks = load_task_set(str(problems))
    h200 = {"gpu": "NVIDIA H200", "torch": "2.11.0", "cuda": "13.0"}
    with Store(db) as store:
        store.put_baseline(baseline_key(tasks[0], h200, "strict", "kernelbench"), {"t_eager_ms": 2.0, "t_compile_ms": 1.0})
        store.put_baseline(baseline_key(tasks[1], dict(h200, gpu="NVIDIA A100"), "strict", "kernelbench"),
                           {"t_eager_ms": 2.0, "t_compile_ms": 1.0})
    theirs = tmp_path / "theirs.jsonl"
    lines = [{"meta": {"gpu": "NVIDIA H200", "selected": 2, "setup_s": 1.0}}] + [
        {"id": t.id, "level": t.level, "problem_id": t.problem_id, "name": t.name, "sha256": t.sha256,
         "precision": "fp32", "flags": TORCH_DEFAULTS, "eager": {"mean": 2.02, "median": 2.02},
         "eager_wall_s": 5.0, "compile_wall_s": 5.0} for t in tasks]
    theirs.write_text("".join(json.dumps(x) + "\n" for x in lines))
    out = tmp_path / "ab.json"
    _run(str(SCRIPT), "compare", "--theirs", str(theirs), "--db", str(db), "--ours-wall-s", "4", "--out", str(out))
    result = json.loads(out.read_text())
    assert result["ours_stored"] == 1 and result["eager_compared"] == 1 and result["eager_within_3pct"] == 1
    assert [r["ours_eager_ms"] for r in result["rows"]] == [2.0, None]  # the A100's is another machine's


def test_their_loop_goes_problem_by_problem_across_the_levels():
    """Stopped at its deadline, their loop has done a like share of each level (its seconds per
    problem then stand for the selection, L3's long compiles included)."""
    import importlib.util

    from cudagym.tasks import Task

    spec = importlib.util.spec_from_file_location("kernelbench_baseline_ab", SCRIPT)
    ab = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ab)
    tasks = [Task(id=f"L{level}/{i}", name="p", code="", level=level, problem_id=i) for level in (1, 2, 3) for i in (1, 2)]
    assert [t.id for t in ab.across_levels(tasks)] == ["L1/1", "L2/1", "L3/1", "L1/2", "L2/2", "L3/2"]

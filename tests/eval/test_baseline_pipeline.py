"""`cudagym baseline run` as one pipeline (issue 16): timing starts with the first compiled problem
while the rest compile, each baseline is stored the moment it is timed, and the progress lines say
how many problems are compiled, timed and stored, with an ETA. A real CLI process on CPU problems,
stopped partway by Ctrl-C or killed outright; no timing is asserted (that belongs in benchmarks/)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
import zipfile
from pathlib import Path

import pytest

from cudagym.eval.store import Store

REPO = Path(__file__).resolve().parents[2]
PROBLEMS = ("1_1_Small_matmul.py", "1_2_ReLU_on_rand.py", "1_3_Softmax.py", "1_4_Diag_matmul.py",
            "2_1_Linear_ReLU_scale.py")
LINE = re.compile(r"^baselines: compiled (\d+)/(\d+) · timed (\d+)/\d+ · stored (\d+)/\d+ · failed (\d+)"
                  r" · ETA (\?|\d+:\d\d:\d\d) · (.*)$")


def _start(problems: Path, db: Path, mark: str = "") -> subprocess.Popen:
    """The CLI on the problems; `mark` goes into its environment, which its judges inherit."""
    scratch = db.parent / "tmp"
    scratch.mkdir(exist_ok=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
               CUDAGYM_TEST_MARK=mark, TMPDIR=str(scratch))  # the workdirs of killed judges stay in the test's folder
    return subprocess.Popen([sys.executable, "-m", "cudagym", "baseline", "run", "--problems", str(problems),
                             "--device", "cpu", "--db", str(db), "--parallel", "2", "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _progress(lines: list[str]) -> list[tuple]:
    """(compiled, total, timed, stored, failed, eta, event) of every progress line."""
    found = [LINE.match(line) for line in lines if line.startswith("baselines: compiled")]
    assert all(found), lines
    return [(*map(int, m.groups()[:5]), *m.groups()[5:]) for m in found]


def _kill_marked(mark: str) -> None:
    """Kill the judges (and their runners) a SIGKILLed CLI left behind: the processes whose
    environment carries this test's mark, all started by this test."""
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and f"CUDAGYM_TEST_MARK={mark}".encode() in (proc / "environ").read_bytes().split(b"\0"):
                os.kill(int(proc.name), signal.SIGKILL)
        except OSError:  # gone, or not ours to read
            pass


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGKILL], ids=["ctrl-c", "sigkill"])
def test_a_stopped_baseline_run_keeps_every_baseline_timed_and_a_rerun_times_only_the_rest(tmp_path, stop):
    problems = tmp_path / "problems"
    problems.mkdir()
    for name in PROBLEMS:
        shutil.copy(REPO / "examples" / "problems" / name, problems / name)
    db = tmp_path / "baselines.duckdb"
    n = len(PROBLEMS)
    started = time.time()

    mark = uuid.uuid4().hex
    run = _start(problems, db, mark)
    seen: list[str] = []
    try:
        for line in run.stderr:  # stop it at the first stored baseline
            seen.append(line.rstrip("\n"))
            if line.startswith("baselines: compiled") and _progress(seen[-1:])[0][3] >= 1:
                break
        run.send_signal(stop)
        _, rest = run.communicate(timeout=120)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
        _kill_marked(mark)  # after Ctrl-C there are none: the CLI stops its judges
    seen += rest.splitlines()
    progress = _progress(seen)
    assert progress[0][1] == n and progress[0][6] == f"{n} to time, 0 cached"
    first_stored = next(p for p in progress if p[3] >= 1)
    # Not asserted: that the first baseline was stored while problems were still compiling. It is the
    # pipeline's design, but on a loaded 2-core machine all five small compiles can end before the first
    # timing does (CI saw `compiled 5/5 · stored 1/5`); the overlap is measured in benchmarks/baseline_gpu.sh.
    assert re.fullmatch(r"\d+:\d\d:\d\d", first_stored[5]), first_stored  # an ETA once one is timed
    stored_before_stop = max(p[3] for p in progress)
    assert run.returncode != 0 and stored_before_stop < n, seen  # stopped partway
    if stop == signal.SIGINT:  # stopped by Ctrl-C: the last progress line says so, and no traceback
        assert progress[-1][6] == "stopped" and not any("Traceback" in line for line in seen), seen

    with Store(db) as store:
        kept = dict(store.sql("SELECT problem_sha256, created FROM baselines"))
    assert stored_before_stop <= len(kept) < n  # everything its progress said was stored

    rerun = _start(problems, db)
    out, err = rerun.communicate(timeout=300)
    assert rerun.returncode == 0, err[-2000:]
    progress = _progress(err.splitlines())
    assert progress[0][1] == n - len(kept) and progress[0][6] == f"{n - len(kept)} to time, {len(kept)} cached"
    assert progress[-1][6] == "done" and progress[-1][3] == n - len(kept)
    with Store(db) as store:
        now = dict(store.sql("SELECT problem_sha256, created FROM baselines"))
    assert len(now) == n and all(now[sha] == created for sha, created in kept.items())  # the kept ones not timed again
    if stop == signal.SIGINT:  # the portable compile cache: the judges saved their compiles; export, then import
        _carry_the_compile_cache(tmp_path, started)


def _carry_the_compile_cache(tmp_path: Path, started: float) -> None:
    """The run's judges left their compile artifacts beside the inductor cache; `baseline cache export`
    bundles them and `import` loads every graph of the bundle into another machine's (here: folder's) cache."""
    from cudagym.eval.compile_cache import artifacts_dir

    assert any(p.stat().st_mtime >= started - 1 for p in artifacts_dir().glob("*.bin"))  # saved (or used) by this run
    bundle = tmp_path / "compile-cache.zip"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-m", "cudagym", "baseline", "cache", "export", str(bundle)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and bundle.is_file(), done.stderr
    elsewhere = tmp_path / "new-machine"
    done = subprocess.run([sys.executable, "-m", "cudagym", "baseline", "cache", "import", str(bundle)],
                          env=dict(env, TORCHINDUCTOR_CACHE_DIR=str(elsewhere / "inductor"),
                                   TRITON_CACHE_DIR=str(elsewhere / "triton")),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    with zipfile.ZipFile(bundle) as z:
        graphs = [key for entry in json.loads(z.read("manifest.json"))["artifacts"] for key in entry["keys"].get("inductor", [])]
    assert graphs and all(list(elsewhere.rglob(key)) for key in graphs)

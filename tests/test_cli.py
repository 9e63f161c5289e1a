"""The command line as users see it: one-line errors, resumable runs, metrics, audit (CPU)."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cudagym.cli import _eval_config, build_parser, main
from cudagym.eval.store import Store

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
RELU_REF = EXAMPLES / "problems" / "1_2_ReLU_on_rand.py"
FAST = ["--n-checks", "2", "--timeout", "30"]


def cudagym(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cudagym", *args], capture_output=True, text=True, timeout=timeout,
                          cwd=REPO)


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


@pytest.mark.parametrize("candidate, message", [
    ("def broken(:\n", "syntax error at line 1"),
    ("import torch.nn as nn\nclass Other(nn.Module):\n    pass\n", "no class ModelNew"),
    ("import torch.nn as nn\nclass ModelNew(nn.Module):\n    def __init__(self, a, b, c):\n        super().__init__()\n",
     "ModelNew.__init__ takes"),
])
def test_eval_one_rejects_a_bad_candidate_with_one_line(tmp_path, capsys, candidate, message):
    cand = write(tmp_path / "cand.py", candidate)
    assert main(["eval", "one", "--ref", str(RELU_REF), "--candidate", str(cand), "--device", "cpu"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err and "Traceback" not in err


def test_missing_files_unknown_problems_and_bad_options_exit_1_with_one_line(tmp_path, capsys):
    cases = [
        ["eval", "one", "--ref", str(tmp_path / "nope.py"), "--candidate", str(RELU_REF), "--device", "cpu"],
        ["eval", "run", str(tmp_path / "no_such_dir"), "--problems", str(EXAMPLES / "problems"), "--device", "cpu",
         "--db", str(tmp_path / "x.duckdb")],
        ["eval", "run", str(EXAMPLES / "submission_cpu"), "--kb-version", "v9", "--device", "cpu",
         "--db", str(tmp_path / "x.duckdb")],
        ["eval", "run", str(EXAMPLES / "submission_cpu"), "--problems", str(EXAMPLES / "problems"), "--ids", "999",
         "--device", "cpu", "--db", str(tmp_path / "x.duckdb")],
        ["eval", "one", "--ref", str(RELU_REF), "--candidate", str(RELU_REF), "--device", "cpu", "--policy", "lenient"],
        ["leaderboard", "show", "--db", str(tmp_path / "absent.duckdb")],
        ["leaderboard", "metrics", str(tmp_path / "absent.jsonl")],
        ["eval", "run"],
    ]
    for argv in cases:
        assert main(argv) == 1, argv
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and err.startswith("cudagym: error:"), (argv, err)


def test_an_unknown_gpu_lock_policy_is_one_line_before_any_judge_starts(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("CUDAGYM_GPU_LOCK_POLICY", "fifo")
    assert main(["eval", "one", "--ref", str(RELU_REF), "--candidate", str(RELU_REF), "--device", "cpu"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "CUDAGYM_GPU_LOCK_POLICY" in err and "writers-first" in err


def test_eval_one_prints_a_verdict_that_rejects_a_passthrough_on_a_degenerate_problem(tmp_path):
    cand = write(tmp_path / "cand.py", "import torch.nn as nn\nclass ModelNew(nn.Module):\n"
                                      "    def forward(self, x):\n        return x\n")
    proc = cudagym("eval", "one", "--ref", str(RELU_REF), "--candidate", str(cand), "--device", "cpu", "--json", *FAST)
    assert proc.returncode == 0, proc.stderr
    verdict = json.loads(proc.stdout.strip().splitlines()[-1])
    assert verdict["status"] == "rejected" and "degenerate_output" in verdict["flags"]
    assert verdict["correct"] is False and verdict["reward"] == -1


def _tiny_submission(tmp_path: Path) -> tuple[Path, Path]:
    """Two problems: one answered by a (permissive) torch candidate, one missing."""
    problems = tmp_path / "problems"
    problems.mkdir()
    shutil.copy(EXAMPLES / "problems" / "1_2_ReLU_on_rand.py", problems / "1_2_ReLU_on_rand.py")
    shutil.copy(EXAMPLES / "problems" / "1_3_Softmax.py", problems / "1_3_Softmax.py")
    sub = tmp_path / "sub" / "level1"
    sub.mkdir(parents=True)
    write(sub / "2_relu.py", "import torch\nimport torch.nn as nn\nclass ModelNew(nn.Module):\n"
                             "    def forward(self, x):\n        return torch.clamp_min(x, 0.0)\n")
    return problems, sub.parent


def test_eval_run_stores_verdicts_counts_missing_problems_and_resumes(tmp_path):
    problems, sub = _tiny_submission(tmp_path)
    db = tmp_path / "runs.duckdb"
    args = ["eval", "run", str(sub), "--problems", str(problems), "--device", "cpu", "--db", str(db), "--name", "mine",
            "--policy", "permissive", "--json", *FAST]
    first = cudagym(*args)
    assert first.returncode == 0, first.stderr
    rows = {(v["level"], v["problem_id"]): v for v in map(json.loads, first.stdout.strip().splitlines())}
    assert rows[(1, 2)]["status"] == "pass" and rows[(1, 2)]["t_candidate_ms"] > 0
    assert rows[(1, 3)]["status"] == "runtime_error" and "no file" in rows[(1, 3)]["reason"]
    with Store(db) as store:
        created = {(v["level"], v["problem_id"]): v for v in store.verdicts("mine")}
    again = cudagym(*args)
    assert again.returncode == 0
    with Store(db) as store:
        assert {(v["level"], v["problem_id"]): v for v in store.verdicts("mine")} == created  # nothing re-run

    # A problem that was missing is evaluated once its file appears; the stored pass is kept as it was.
    write(sub / "level1" / "3_softmax.py", "import torch\nimport torch.nn as nn\nclass ModelNew(nn.Module):\n"
                                           "    def forward(self, x):\n        return torch.softmax(x, -1)\n")
    assert cudagym(*args).returncode == 0
    with Store(db) as store:
        now = {(v["level"], v["problem_id"]): v for v in store.verdicts("mine")}
    assert now[(1, 3)]["status"] == "pass" and now[(1, 2)] == created[(1, 2)]

    verdicts = tmp_path / "verdicts.jsonl"
    verdicts.write_text(first.stdout)
    metrics = cudagym("leaderboard", "metrics", str(verdicts), "--json")
    m = json.loads(metrics.stdout)["overall"]
    # ReLU of torch.rand accepts its input passed through: the audit marks it, the metrics leave it out.
    assert "passthrough" in rows[(1, 2)]["degenerate"]
    assert m["n"] == 1 and m["n_degenerate_excluded"] == 1 and m["pass_rate"] == 0.0
    counted = json.loads(cudagym("leaderboard", "metrics", str(verdicts), "--json", "--include-degenerate").stdout)
    assert counted["overall"]["n"] == 2 and counted["overall"]["pass_rate"] == 0.5


def test_a_killed_eval_run_keeps_what_it_stored_and_the_rerun_finishes(tmp_path):
    problems, sub = _tiny_submission(tmp_path)
    write(sub / "level1" / "3_softmax.py", "import torch\nimport torch.nn as nn\nclass ModelNew(nn.Module):\n"
                                           "    def forward(self, x):\n        return torch.softmax(x, -1)\n")
    db = tmp_path / "runs.duckdb"
    args = [sys.executable, "-m", "cudagym", "eval", "run", str(sub), "--problems", str(problems), "--device", "cpu",
            "--db", str(db), "--name", "mine", "--policy", "permissive", *FAST]
    proc = subprocess.Popen(args, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    # Wait for the first verdict to land (DuckDB's write-ahead log grows), then interrupt.
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        wal = Path(str(db) + ".wal")
        if wal.exists() and wal.stat().st_size > 2000:
            break
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    with Store(db) as store:
        stored = len(store.verdicts("mine"))
    finished = cudagym(*args[3:])
    assert finished.returncode == 0, finished.stderr
    with Store(db) as store:
        assert len(store.verdicts("mine")) == 2
    assert stored <= 2
    if proc.returncode != 0:  # it was interrupted mid-run: one line, not a traceback
        assert "Traceback" not in err


def test_audit_names_the_probes_each_problem_accepts(tmp_path):
    proc = cudagym("audit", "kernelbench", "--problems", str(EXAMPLES / "problems"), "--ids", "1-3",
                   "--levels", "1", "--device", "cpu", "--json", "--db", str(tmp_path / "audit.duckdb"), *FAST)
    assert proc.returncode == 0, proc.stderr
    rows = {r["problem_id"]: r for r in json.loads(proc.stdout.strip().splitlines()[-1])}
    assert "passthrough" in rows[2]["accepts"]  # ReLU of torch.rand is the identity on its domain
    assert rows[1]["accepts"] == []  # a matmul accepts nothing trivial
    assert "passthrough" not in rows[3]["accepts"]


def test_audit_names_problems_whose_reference_is_random(tmp_path):
    """Like KernelBench's L2/66 (Matmul_Dropout_Softmax): dropout in training mode draws new masks
    at every call, so the reference has no one right answer."""
    problems = tmp_path / "problems"
    problems.mkdir()
    shutil.copy(EXAMPLES / "problems" / "1_1_Small_matmul.py", problems)
    (problems / "1_5_Linear_Dropout.py").write_text(
        "import torch\nimport torch.nn as nn\n\nclass Model(nn.Module):\n    def __init__(self):\n"
        "        super().__init__()\n        self.linear = nn.Linear(32, 16)\n        self.dropout = nn.Dropout(0.2)\n\n"
        "    def forward(self, x):\n        return torch.softmax(self.dropout(self.linear(x)), dim=1)\n\n"
        "def get_inputs():\n    return [torch.randn(8, 32)]\n\ndef get_init_inputs():\n    return []\n")
    proc = cudagym("audit", "kernelbench", "--problems", str(problems), "--device", "cpu", "--json",
                   "--db", str(tmp_path / "audit.duckdb"), *FAST)
    assert proc.returncode == 0, proc.stderr
    rows = {r["problem_id"]: r for r in json.loads(proc.stdout.strip().splitlines()[-1])}
    assert set(rows[5]["stochastic"]) & {"bernoulli_", "native_dropout", "dropout"}  # CPU: dropout draws with bernoulli_
    assert rows[1]["stochastic"] == []


def test_python_dash_m_and_help_work():
    proc = cudagym("--help")
    assert proc.returncode == 0 and "eval" in proc.stdout
    proc = cudagym("eval", "run", "--help")
    assert proc.returncode == 0 and "--problems" in proc.stdout


def test_tolerance_option_selects_paper_parity_or_strict():
    def config(*extra):
        return _eval_config(build_parser().parse_args(["eval", "one", "--ref", "r.py", "--candidate", "c.py",
                                                       "--device", "cpu", *extra]))

    assert (config().atol, config().rtol) == (1e-2, 1e-2)
    assert (config("--tolerance", "strict").atol, config("--tolerance", "strict").rtol) == (1e-4, 1e-4)
    assert main(["eval", "one", "--ref", "r.py", "--candidate", "c.py", "--tolerance", "loose"]) == 1

"""`cudagym dedup score` and `cudagym dedup check` (contract, "Commands")."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from cudagym.cli import main
from cudagym.kernelbench import get_problem

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

NOVEL = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.gate = nn.Linear(dim, dim)

    def forward(self, x, y):
        g = torch.sigmoid(self.gate(x))
        z = torch.cummax(g * y + (1 - g) * x, dim=1).values
        return torch.logsumexp(z, dim=-1, keepdim=True) - z.mean(dim=-1, keepdim=True)


def get_inputs():
    return [torch.randn(4, 256, 128), torch.randn(4, 256, 128)]


def get_init_inputs():
    return [128]
'''


def renamed(code: str) -> str:
    """A light copy: Model's attribute and the forward argument renamed, constants changed."""
    return code.replace("self.conv", "self.layer").replace("(self, x)", "(self, inp)").replace(" x = ", " inp = ") \
        .replace("(x)", "(inp)").replace("x + ", "inp + ").replace("x * ", "inp * ").replace("return x", "return inp") \
        .replace("= 128", "= 64")


@pytest.fixture
def files(tmp_path, kernelbench_path):
    problem = get_problem("v0.1", 2, 21, path=kernelbench_path)
    d = tmp_path / "tasks"
    d.mkdir()
    (d / "copy.py").write_text(renamed(problem.code))
    (d / "novel.py").write_text(NOVEL)
    (d / "notes.txt").write_text("not a task")
    return d, problem


def run_cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_score_json(capsys, files):
    d, problem = files
    ref = d.parent / "ref.py"
    ref.write_text(problem.code)
    code, out, _ = run_cli(capsys, "dedup", "score", str(ref), str(d / "copy.py"), "--json")
    assert code == 0
    result = json.loads(out)
    assert set(result) == {"parity", "strong"}
    assert result["strong"] >= 0.9 and 0 <= result["parity"] <= 1
    code, out, _ = run_cli(capsys, "dedup", "score", str(ref), str(ref), "--json")
    assert json.loads(out) == {"parity": 1.0, "strong": 1.0}


def test_score_table(capsys, files):
    d, _ = files
    code, out, _ = run_cli(capsys, "dedup", "score", str(d / "novel.py"), str(d / "copy.py"))
    assert code == 0 and "parity" in out and "strong" in out


def test_check_directory_json(capsys, files):
    d, _ = files
    code, out, _ = run_cli(capsys, "dedup", "check", str(d), "--against", "kernelbench", "--json")
    assert code == 0
    rows = {r["id"]: r for r in json.loads(out)}
    assert set(rows) == {"copy.py", "novel.py"}
    for row in rows.values():
        assert set(row) == {"id", "flagged", "parity_max", "parity_match", "strong_max", "strong_match"}
    assert rows["copy.py"]["flagged"] and rows["copy.py"]["strong_match"] == "L2/21_Conv2d_Add_Scale_Sigmoid_GroupNorm"
    assert not rows["novel.py"]["flagged"]


def test_check_table_shows_flagged_rows_and_a_count(capsys, files):
    d, _ = files
    code, out, _ = run_cli(capsys, "dedup", "check", str(d), "--levels", "2", "--kb-version", "v0.1")
    assert code == 0
    assert "copy.py" in out and "novel.py" not in out
    assert "1 of 2 tasks flagged" in out


def test_check_jsonl_with_id_or_name(capsys, tmp_path, files):
    d, problem = files
    path = tmp_path / "rows.jsonl"
    rows = [{"id": "row-1", "code": problem.code}, {"name": "n2", "code": NOVEL}]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    code, out, _ = run_cli(capsys, "dedup", "check", str(path), "--json", "--levels", "1,2")
    assert code == 0
    rows = json.loads(out)
    assert [(r["id"], r["flagged"]) for r in rows] == [("row-1", True), ("n2", False)]


def test_check_parquet(capsys, tmp_path, files):
    import pyarrow as pa
    import pyarrow.parquet as pq

    _, problem = files
    path = tmp_path / "rows.parquet"
    pq.write_table(pa.table({"name": ["a"], "code": [problem.code]}), path)
    code, out, _ = run_cli(capsys, "dedup", "check", str(path), "--json")
    assert code == 0 and json.loads(out)[0]["flagged"]


@pytest.mark.parametrize("argv, message", [
    (["dedup", "score", "/nonexistent/a.py", "/nonexistent/b.py"], "no such file"),
    (["dedup", "check", "/nonexistent/dir"], "no such file or directory"),
    (["dedup", "check", "{tmp}", "--against", "imagenet"], "invalid choice"),
    (["dedup", "check", "{tmp}/rows.jsonl"], "needs a code column"),
    (["dedup", "check", "{tmp}/empty"], "no .py files"),
    (["dedup", "check", "{tmp}", "--levels", "x"], "levels"),
])
def test_bad_input_is_one_line(capsys, tmp_path, argv, message):
    (tmp_path / "rows.jsonl").write_text(json.dumps({"id": "a"}) + "\n")
    (tmp_path / "empty").mkdir()
    (tmp_path / "t.py").write_text(NOVEL)
    code, out, err = run_cli(capsys, *[a.replace("{tmp}", str(tmp_path)) for a in argv])
    assert code == 1 and message in err and len(err.strip().splitlines()) == 1


def test_score_syntax_error(capsys, tmp_path):
    good, bad = tmp_path / "good.py", tmp_path / "bad.py"
    good.write_text(NOVEL)
    bad.write_text("def (:\n")
    code, _, err = run_cli(capsys, "dedup", "score", str(good), str(bad))
    assert code == 1 and "syntax error at line 1" in err


def test_python_m_cudagym_dedup_score(tmp_path):
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text(NOVEL)
    b.write_text(NOVEL.replace("gate", "g8").replace("128", "256"))
    proc = subprocess.run([sys.executable, "-m", "cudagym", "dedup", "score", str(a), str(b), "--json"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {"parity": 1.0, "strong": 1.0}

"""A candidate with extra C++/CUDA files (an agent's kernels/): names checked, static checks read the
files, the runner writes them where the candidate finds them, the build directory keyed by them.
The judge end to end with such a candidate: tests/agent/test_tools.py (honest multi-file kernel)."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import pytest

from cudagym.eval.evaluate import CandidateError, EvalConfig, evaluate_candidate, static_flags, validate_candidate_files
from cudagym.eval.judge import candidate_key
from cudagym.eval.runner import write_candidate_files
from cudagym.eval.verdict import Status

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
REF = (FIXTURES / "problems" / "add_scale.py").read_text()
LOADER = '''import os
import torch.nn as nn
from torch.utils.cpp_extension import load

KERNELS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernels")
ext = load(name="add_scale_files", sources=[os.path.join(KERNELS, "add_scale.cpp")])


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x, y):
        return ext.add_scale(x, y)
'''
HONEST_CPP = (FIXTURES / "honest" / "add_scale_cpp.py").read_text().split('r"""')[1].split('"""')[0]


def test_file_names_checked():
    validate_candidate_files({"kernels/a.cu": "", "kernels/sub/b.cuh": "", "kernels/c.cpp": "", "kernels/d.h": ""})
    for bad in ("../x.cu", "/tmp/x.cu", "kernels/../../x.cu", "kernels//x.cu", "kernels/x.py", "kernels/lib.so",
                "candidate.py", ""):
        with pytest.raises(CandidateError):
            validate_candidate_files({bad: "int x;"})


def test_bad_file_is_a_verdict_before_any_process():
    verdict = evaluate_candidate(REF, LOADER, EvalConfig(device="cpu"), files={"kernels/helper.py": "x = 1"})
    assert verdict.status is Status.COMPILE_ERROR and "only C++/CUDA sources" in verdict.reason and verdict.reward == -1


def test_static_checks_read_the_files():
    assert static_flags(REF, LOADER, "strict", {"kernels/add_scale.cpp": HONEST_CPP}) == []  # an honest multi-file candidate
    cheats = {"file_io": "FILE* f = fopen(\"/tmp/out\", \"r\");", "threading": "std::thread t(work);",
              "timing_access": "cudaEventRecord(start);", "ctypes": "void* h = dlopen(\"libx.so\", 0);"}
    for flag, line in cheats.items():
        files = {"kernels/add_scale.cpp": HONEST_CPP + "\nvoid cheat() { " + line + " }\n"}
        assert flag in static_flags(REF, LOADER, "strict", files), flag
        assert flag not in static_flags(REF, LOADER, "strict")  # not in model_new.py itself


def test_runner_writes_files_in_place_and_keeps_unchanged_ones(tmp_path):
    write_candidate_files(str(tmp_path), {"candidate.py": "x = 1", "kernels/sub/k.cu": "a"})
    k = tmp_path / "kernels" / "sub" / "k.cu"
    assert k.read_text() == "a" and (tmp_path / "candidate.py").read_text() == "x = 1"
    old = time.time() - 100
    os.utime(k, (old, old))
    write_candidate_files(str(tmp_path), {"kernels/sub/k.cu": "a"})
    assert k.stat().st_mtime == pytest.approx(old)  # unchanged: ninja's build from it stays up to date
    write_candidate_files(str(tmp_path), {"kernels/sub/k.cu": "b"})
    assert k.read_text() == "b" and k.stat().st_mtime > old
    for bad in ("../escape.cu", "/tmp/escape.cu"):
        with pytest.raises(ValueError):
            write_candidate_files(str(tmp_path / "kernels"), {bad: "x"})
    assert not (tmp_path / "escape.cu").exists()


def test_build_directory_key():
    assert candidate_key("code", None) == hashlib.sha256(b"code").hexdigest()[:16]  # old builds still found
    with_files = candidate_key("code", {"kernels/a.cu": "1"})
    assert with_files != candidate_key("code", None) and with_files != candidate_key("code", {"kernels/a.cu": "2"})
    assert with_files == candidate_key("code", {"kernels/a.cu": "1"})

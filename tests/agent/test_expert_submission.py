"""benchmarks/expert_submission.py: the honest CUDA kernels issue 13 acceptance 4's scripted expert
replays on the GPU (benchmarks/agent_gpu.sh). No CUDA here: each file it writes must be eval run's file
for a KernelBench v0 level-1 problem, pass the strict op policy's static checks against that problem,
and take the constructor arguments Model takes (the kernels themselves build and run only on the GPU)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from cudagym.eval.batch import submission_files
from cudagym.eval.evaluate import static_flags, validate_candidate

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("expert_submission", REPO / "benchmarks" / "expert_submission.py")
expert_submission = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(expert_submission)
NAMES = expert_submission.STRESS + list(expert_submission.ELEMENTWISE)


@pytest.fixture(scope="module")
def expert(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("expert")
    expert_submission.write_submission(out)
    return out


@pytest.fixture(scope="module")
def problems(kernelbench_path):
    from cudagym.kernelbench import load_problems

    return {t.problem_id: t for t in load_problems("v0", [1], path=kernelbench_path)}


def test_the_expert_submission_covers_at_least_ten_level1_problems(problems, expert):
    files = submission_files(expert)
    assert {level for level, _ in files} == {1} and len(files) >= 10, sorted(files)
    for (_, pid), path in files.items():
        assert path.name == f"{problems[pid].name}.py", path  # the problem's own name: no stray files


@pytest.mark.parametrize("name", NAMES)
def test_each_kernel_passes_the_static_checks_and_takes_the_problems_arguments(problems, expert, name):
    task = problems[int(name.split("_")[0])]
    code = (expert / "level1" / f"{name}.py").read_text()
    validate_candidate(task.code, code)  # a ModelNew whose __init__ takes Model's arguments
    assert static_flags(task.code, code, "strict") == []
    assert "load_inline" in code and "__global__" in code  # a CUDA kernel, not torch
    assert "# stress:" not in code and code.startswith("# why: ")  # the stress benchmark's headers stay there
    if name in expert_submission.ELEMENTWISE:  # made from the template: its own act, names and extension
        stem, _, act, _ = expert_submission.ELEMENTWISE[name]
        assert act in code and f"ext.{stem}_forward(x" in code and not re.search(r"\bsigmoid_forward", code)
        assert f'name="cudagym_expert_v0_l1_{task.problem_id}_{stem}"' in code

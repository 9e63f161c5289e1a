"""The tools through KernelEnv.execute: success and error paths, truncation, path escapes, and an
honest multi-file C++ kernel through the real judge (verify, profile, final verdict)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from cudagym.agent.environment import TOOL_NAMES, EnvConfig, KernelEnv
from cudagym.agent.tools import TRUNCATION_NOTE, truncate
from cudagym.eval.verdict import Status
from cudagym.tasks import task_from_file

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


@pytest.fixture
def env(tmp_path):
    env = KernelEnv(task_from_file(FIXTURES / "problems" / "add_scale.py"), tmp_path / "rollouts" / "wd",
                    EnvConfig(max_output_chars=2_000))
    yield env
    env.close()


def test_schemas_and_prompts(env):
    schemas = env.tool_schemas()
    assert [s["function"]["name"] for s in schemas] == list(TOOL_NAMES)
    for s in schemas:
        assert s["type"] == "function" and s["function"]["parameters"]["type"] == "object"
        json.dumps(s)
    assert "SKILL.md" in env.system_prompt()
    assert "x * 2 + y" in env.task_prompt() and "5%" in env.task_prompt()


def test_bad_calls_never_raise(env):
    cases = [("nope", {}, "unknown tool"), ("read_file", "{not json", "not valid JSON"),
             ("read_file", "[1]", "JSON object"), ("read_file", {}, "needs path"),
             ("read_file", {"path": 3}, "must be of type string"), ("read_file", {"path": "x", "colour": 1}, "no argument colour"),
             ("read_file", {"path": "model.py", "offset": True}, "must be of type integer"),
             ("bash", {"command": "true", "timeout": 10_000}, "timeout must be")]
    for name, args, message in cases:
        result = env.execute(name, args)
        assert not result.ok and result.output.startswith("error:") and message in result.output, (name, result.output)
    assert env.execute("verify", "").ok is False  # empty arguments string = {}; the starter is rejected by policy
    assert env.execute("glob", '{"pattern": "*.py"}').ok  # the model's raw JSON string


def test_nothing_to_judge(env):
    (env.workdir / "model_new.py").unlink()
    result = env.execute("verify", {})
    assert not result.ok and "model_new.py is missing" in result.output
    verdict = env.final_verdict()
    assert verdict.status is Status.COMPILE_ERROR and verdict.reward == -1 and "missing" in verdict.reason


def test_read_file(env):
    out = env.execute("read_file", {"path": "model.py", "offset": 2, "limit": 3}).output
    assert out.splitlines()[0].strip().startswith("2\t") and len(out.splitlines()) == 4 and "more lines" in out
    assert "past its end" in env.execute("read_file", {"path": "model.py", "offset": 10_000}).output
    assert "no such file" in env.execute("read_file", {"path": "missing.cu"}).output
    assert "not a file" in env.execute("read_file", {"path": "kernels"}).output
    assert "at least 1" in env.execute("read_file", {"path": "model.py", "limit": 0}).output
    with open(env.workdir / "kernels" / "huge.h", "wb") as f:  # sparse: 9 GiB on paper, no disk
        f.truncate(9 * 2**30)
    for name, args in [("read_file", {"path": "kernels/huge.h"}), ("edit_file", {"path": "kernels/huge.h", "old": "a", "new": "b"})]:
        result = env.execute(name, args)
        assert not result.ok and "more than the file tools take" in result.output
    assert not env.execute("verify", {}).ok  # not read into memory for the judge either


def test_write_and_edit(env):
    w = env.execute("write_file", {"path": "kernels/deep/k.cu", "content": "int a = 1;\nint b = 1;\n"})
    assert w.ok and "created" in w.output
    path = env.workdir / "kernels" / "deep" / "k.cu"
    if os.geteuid() == 0:  # the shell can change it
        assert path.stat().st_uid == env.ids[0] and path.parent.stat().st_uid == env.ids[0]
    assert env.execute("edit_file", {"path": "kernels/deep/k.cu", "old": "a = 1", "new": "a = 2"}).ok
    assert path.read_text() == "int a = 2;\nint b = 1;\n"
    absent = env.execute("edit_file", {"path": "kernels/deep/k.cu", "old": "c = 3", "new": "x"})
    assert not absent.ok and "not found" in absent.output
    twice = env.execute("edit_file", {"path": "kernels/deep/k.cu", "old": "= ", "new": "="})
    assert not twice.ok and "occurs 2 times" in twice.output and path.read_text() == "int a = 2;\nint b = 1;\n"
    assert "no such file" in env.execute("edit_file", {"path": "kernels/none.cu", "old": "a", "new": "b"}).output
    assert "empty" in env.execute("edit_file", {"path": "kernels/deep/k.cu", "old": "", "new": "b"}).output
    for protected in ("model.py", "verify", "SKILL.md", ".cudagym/x"):
        r = env.execute("write_file", {"path": protected, "content": "x"})
        assert not r.ok and "protected" in r.output
    assert "protected" in env.execute("edit_file", {"path": "model.py", "old": "Model", "new": "M"}).output
    assert "a directory" in env.execute("write_file", {"path": "kernels", "content": "x"}).output


def test_path_escapes_refused(env, tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_text("hush-hush")
    (env.workdir / "etc").symlink_to("/etc")
    (env.workdir / "kernels" / "out.cu").symlink_to(outside)
    for name, args in [("read_file", {"path": "../outside.txt"}), ("read_file", {"path": "/etc/hostname"}),
                       ("read_file", {"path": "etc/hostname"}), ("read_file", {"path": "kernels/out.cu"}),
                       ("write_file", {"path": "kernels/out.cu", "content": "x"}),
                       ("write_file", {"path": str(outside), "content": "x"}),
                       ("edit_file", {"path": "kernels/out.cu", "old": "hush", "new": "x"}),
                       ("grep", {"pattern": "x", "path": "../"}), ("grep", {"pattern": "root", "path": "etc"}),
                       ("glob", {"pattern": "../*"}), ("glob", {"pattern": "/etc/*"})]:
        result = env.execute(name, args)
        assert not result.ok and result.output.startswith("error:"), (name, args, result.output)
    assert outside.read_text() == "hush-hush"
    # glob and grep do not follow the symlinks either
    assert "etc/" not in env.execute("glob", {"pattern": "**/*"}).output
    assert "no matches" in env.execute("grep", {"pattern": "hush-hush"}).output


def test_glob_and_grep(env):
    env.execute("write_file", {"path": "kernels/a.cu", "content": "__global__ void add() {}\n"})
    env.execute("write_file", {"path": "kernels/b.cpp", "content": "// add\n"})
    assert env.execute("glob", {"pattern": "kernels/*.cu"}).output == "kernels/a.cu"
    assert "model.py" in env.execute("glob", {"pattern": "**/*.py"}).output
    assert ".cudagym" not in env.execute("glob", {"pattern": "**/*"}).output
    assert "no files match" in env.execute("glob", {"pattern": "*.rs"}).output
    out = env.execute("grep", {"pattern": r"\badd\b", "path": "kernels"}).output
    assert "kernels/a.cu:1: __global__ void add() {}" in out and "kernels/b.cpp:1: // add" in out
    assert env.execute("grep", {"pattern": "add", "include": "*.cu"}).output == "kernels/a.cu:1: __global__ void add() {}"
    assert "bad regular expression" in env.execute("grep", {"pattern": "("}).output


def test_truncation_note(env):
    env.execute("write_file", {"path": "kernels/long.h", "content": "".join(f"// line {i}\n" for i in range(2000))})
    result = env.execute("read_file", {"path": "kernels/long.h"})
    assert len(result.output) <= 2_000 and "output truncated" in result.output
    assert result.output.startswith("     1\t// line 0") and result.output.rstrip().endswith("// line 1999")
    assert truncate("abc", 10) == "abc"
    cut = truncate("x" * 1000, 400)
    kept = cut.count("x")
    assert len(cut) <= 400 and cut.startswith("x" * (kept // 2)) and TRUNCATION_NOTE.format(dropped=1000 - kept, total=1000) in cut
    assert truncate(cut, 400) == cut  # already within the limit: unchanged
    assert "of 5000 characters" in truncate("y" * 600, 400, total=5000)  # a head and tail of a longer output


HONEST_MODEL_NEW = '''import os
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load

KERNELS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernels")
ext = load(name="cudagym_agent_add_scale", sources=[os.path.join(KERNELS, "add_scale.cpp")], extra_cflags=["-O2"])


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x, y):
        return ext.add_scale(x, y)
'''


def honest_kernel_source() -> str:
    """The C++ of the honest fixture add_scale_cpp, as a file of its own with its binding."""
    fixture = (FIXTURES / "honest" / "add_scale_cpp.py").read_text()
    return fixture.split('r"""')[1].split('"""')[0] + \
        '\nPYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("add_scale", &add_scale); }\n'


@pytest.mark.slow
def test_honest_multi_file_kernel_through_the_judge(tmp_path):
    """write_file, verify, profile, final verdict: one C++ build (the judge keeps it by content)."""
    config = EnvConfig(compile_baseline=False, n_checks=2)  # torch.compile on the CPU would take minutes
    env = KernelEnv(task_from_file(FIXTURES / "problems" / "add_scale.py"), tmp_path / "rollouts" / "wd", config)
    try:
        assert env.execute("write_file", {"path": "kernels/add_scale.cpp", "content": honest_kernel_source()}).ok
        assert env.execute("write_file", {"path": "model_new.py", "content": HONEST_MODEL_NEW}).ok
        verify = env.execute("verify", {})
        assert verify.ok and verify.output.startswith("verify: PASS"), verify.output
        assert verify.data["status"] == "pass" and verify.data["t_candidate_ms"] is None
        profile = env.execute("profile", "{}")
        assert profile.ok and profile.data["t_candidate_ms"] > 0 and profile.data["t_eager_ms"] > 0, profile.output
        assert "eager" in profile.output and "reward if you stopped now" in profile.output
        final = env.final_verdict()
        assert final.status is Status.PASS and final.reward >= 1 and final.t_candidate_ms > 0
        assert [c["tool"] for c in env.judge_calls] == ["verify", "profile"]
        # a changed protected file: verify says so, and the final verdict is rejected with a flag
        os.chmod(env.workdir / "model.py", 0o644)
        (env.workdir / "model.py").write_text(env.task.code.replace("x * 2", "x * 3"))
        again = env.execute("verify", {})
        assert not again.ok and "protected files changed: model.py" in again.output
        rejected = env.final_verdict()
        assert rejected.status is Status.REJECTED and rejected.flags == ["protected_file_changed"] and rejected.reward == -1
    finally:
        env.close()

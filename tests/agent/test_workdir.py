"""The rollout workdir: layout, ownership, the starting model_new.py, protected hashes, path rules."""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

from cudagym.agent.workdir import (PROTECTED, WorkdirError, candidate_sources, changed_protected, create_workdir,
                                   read_inside, resolve, sandbox_ids, starter_model_new, write_inside)
from cudagym.eval.evaluate import validate_candidate
from cudagym.tasks import task_from_file

PROBLEMS = Path(__file__).resolve().parents[1] / "fixtures" / "problems"


@pytest.fixture
def task():
    return task_from_file(PROBLEMS / "add_scale.py")


@pytest.fixture
def made(tmp_path, task):
    workdir = tmp_path / "rollouts" / "wd"
    uid, gid = sandbox_ids(workdir)
    return workdir, create_workdir(task, workdir, uid, gid), (uid, gid)


@pytest.mark.skipif(os.geteuid() != 0, reason="files are given to the shell's uid only by root")
def test_layout_ownership_and_modes(made, task):
    workdir, hashes, (uid, gid) = made
    assert (workdir / "model.py").read_text() == task.code
    assert sorted(hashes) == sorted(PROTECTED)
    for name in PROTECTED:  # root's and read-only; the agent's files and folders are the shell's uid's
        assert (workdir / name).stat().st_uid == 0 and not (workdir / name).stat().st_mode & 0o222
    for name in ("model_new.py", "kernels", ".build", ".tmp", "."):
        assert ((workdir / name).stat().st_uid, (workdir / name).stat().st_gid) == (uid, gid)
    assert uid != 0 and (workdir / "verify").stat().st_mode & 0o111
    assert "op policy" in (workdir / "SKILL.md").read_text()


def test_starter_model_new_is_a_valid_candidate_shape(made, task):
    workdir, _, _ = made
    code = (workdir / "model_new.py").read_text()
    tree = ast.parse(code)
    assert [n.name for n in tree.body if isinstance(n, ast.ClassDef)] == ["ModelNew"]
    assert "super(ModelNew, self)" in code and "kernels" in code  # renamed throughout; says where kernels go
    validate_candidate(task.code, code)
    # a task whose text mentions Model in strings/comments keeps those
    assert starter_model_new('s = "Model"\nclass Model:\n    pass\n').endswith('s = "Model"\nclass ModelNew:\n    pass\n')


def test_recreated_from_scratch_and_changes_detected(made, task):
    workdir, hashes, ids = made
    (workdir / "kernels" / "old.cu").write_text("x")
    assert changed_protected(workdir, hashes) == []
    os.chmod(workdir / "verify", 0o755)
    (workdir / "verify").write_text("#!/bin/sh\necho PASS\n")
    (workdir / "model.py").unlink()
    assert changed_protected(workdir, hashes) == ["model.py", "verify"]
    again = create_workdir(task, workdir, *ids)  # a resumed rollout starts over
    assert again == hashes and not (workdir / "kernels" / "old.cu").exists()


def test_resolve_refuses_escapes(made, tmp_path):
    workdir, _, _ = made
    assert resolve(workdir, "kernels/a.cu") == workdir.resolve() / "kernels" / "a.cu"
    assert resolve(workdir, str(workdir / "model_new.py")) == workdir.resolve() / "model_new.py"
    (workdir / "etc").symlink_to("/etc")
    (workdir / "inside").symlink_to(workdir / "kernels")
    assert resolve(workdir, "inside/x.cu") == workdir.resolve() / "kernels" / "x.cu"
    for bad in ("../x", "kernels/../../x", "/etc/passwd", str(tmp_path / "other"), "etc/passwd", "", "a\0b"):
        with pytest.raises(WorkdirError):
            resolve(workdir, bad)


def test_candidate_sources_sends_cpp_files_only(made):
    workdir, _, _ = made
    (workdir / "kernels" / "sub").mkdir()
    (workdir / "kernels" / "k.cu").write_text("__global__ void k() {}")
    (workdir / "kernels" / "sub" / "h.h").write_text("#pragma once")
    (workdir / "kernels" / "helper.py").write_text("x = 1")
    (workdir / "kernels" / "link.cpp").symlink_to("/etc/hostname")
    code, files, left_out = candidate_sources(workdir)
    assert "class ModelNew" in code
    assert sorted(files) == ["kernels/k.cu", "kernels/sub/h.h"]
    assert any("helper.py" in x for x in left_out) and any("link.cpp" in x for x in left_out)
    (workdir / "kernels" / "big.cu").write_text("x" * (3 * 2**20))
    with pytest.raises(WorkdirError, match="more than 2048 KiB"):
        candidate_sources(workdir)
    (workdir / "model_new.py").unlink()
    with pytest.raises(WorkdirError, match="missing"):
        candidate_sources(workdir)


def test_reads_and_writes_stay_inside_even_through_a_swapped_folder(tmp_path):
    """The check is made on the opened file itself: a folder of the workdir that became a symlink to
    the outside after the path was checked (a race the agent's processes could run) is refused."""
    root = (tmp_path / "wd").resolve()
    (root / "kernels").mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.h").write_text("secret")
    (root / "kernels" / "ok.h").write_text("fine")
    assert read_inside(root, root / "kernels" / "ok.h") == b"fine"
    (root / "kernels").rename(root / "old")
    (root / "kernels").symlink_to(outside)  # the swap
    with pytest.raises(WorkdirError, match="leads outside the workdir"):
        read_inside(root, root / "kernels" / "secret.h")
    with pytest.raises(WorkdirError, match="leads outside the workdir"):
        write_inside(root, root / "kernels" / "secret.h", "overwritten")
    assert (outside / "secret.h").read_text() == "secret"  # not truncated before the check
    os.mkfifo(root / "pipe.cu")
    with pytest.raises(WorkdirError, match="not a regular file"):
        read_inside(root, root / "pipe.cu")

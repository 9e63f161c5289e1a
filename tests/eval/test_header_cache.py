"""The precompiled torch/extension.h (cudagym.eval.header_cache): a real load_inline build on CPATH takes it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cudagym.eval import header_cache
from tests.conftest import HEADER_CACHE


@pytest.fixture(scope="module")
def headers() -> Path:
    """The suite's cache (built by `make test`; built here, about a minute, where it is missing)."""
    if not header_cache.is_gcc(header_cache.torch_build_command([])[0]):
        pytest.skip("the C++ compiler is not GCC")
    return header_cache.build(HEADER_CACHE)


@pytest.mark.slow
@pytest.mark.parametrize("cflags, variant", [(["-O2"], "O2"), (["-O3"], "O2"), ([], "O0"), (["-O2", "-DNDEBUG"], None)])
def test_a_load_inline_build_with_the_cache_on_cpath_takes_the_precompiled_header(headers, tmp_path, monkeypatch,
                                                                                   capfd, cflags, variant):
    """GCC's -H marks the header it took with "!": the variant whose __OPTIMIZE__ agrees with the
    build's flags. The source includes the header again after load_inline's own include (most
    candidates do), and flags no variant fits (a macro the header reads) take torch's header through
    the cache's stand-in: either way the module builds and works."""
    import torch
    from torch.utils.cpp_extension import load_inline

    monkeypatch.setenv("CPATH", str(headers))
    name = f"header_cache_{variant}_{'_'.join(f.strip('-') for f in cflags)}"
    source = "#include <torch/extension.h>\ntorch::Tensor twice(torch::Tensor x) { return x * 2; }"
    module = load_inline(name=name, cpp_sources=[source], functions=["twice"], extra_cflags=[*cflags, "-H"],
                         build_directory=str(tmp_path), verbose=True)
    printed = capfd.readouterr()
    marked = [line for line in (printed.out + printed.err).splitlines()
              if line.startswith(("! ", ". ", "x ")) and "torch/extension.h" in line]
    taken = next(i for i, line in enumerate(marked) if not line.startswith("x "))  # variants tried ("x") in the directory's order
    if variant:
        assert marked[taken] == f"! {headers}/torch/extension.h.gch/{variant}.gch", marked[:taken + 1]
    else:
        assert taken == len(header_cache.VARIANTS) and marked[taken] == f". {headers}/torch/extension.h", marked[:taken + 1]
    assert torch.equal(module.twice(torch.arange(4.0)), torch.arange(4.0) * 2)


def test_the_cache_is_keyed_by_torchs_version_and_install(tmp_path):
    import torch

    folder = header_cache.cache_folder(tmp_path)
    assert folder.parent == tmp_path.resolve() and torch.__version__.replace("+", "-") in folder.name
    assert header_cache.ready(tmp_path) is None  # nothing built there


def test_a_compiler_other_than_gcc_is_one_line_and_a_non_zero_exit(tmp_path):
    """clang defines __GNUC__ too, but finds no .gch through CPATH: refused before any build."""
    clang = tmp_path / "clang++"
    clang.write_text("#!/bin/sh\necho '#define __GNUC__ 4'\necho '#define __clang__ 1'\n")
    clang.chmod(0o755)
    proc = subprocess.run([sys.executable, "-m", "cudagym.eval.header_cache", str(tmp_path / "cache")],
                          capture_output=True, text=True, env=dict(os.environ, CXX=str(clang)), timeout=120)
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.strip() == f"header cache: {clang} is not GCC: its precompiled headers are not found through CPATH"
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").rglob("*.gch"))


def test_no_root_is_a_usage_line():
    proc = subprocess.run([sys.executable, "-m", "cudagym.eval.header_cache"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.startswith("usage: python -m cudagym.eval.header_cache ROOT")

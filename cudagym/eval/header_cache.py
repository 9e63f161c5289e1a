"""A precompiled torch/extension.h for C++ candidate builds, found through CPATH (GCC only).

Nearly all of a small C++ extension's build is torch/extension.h: on a 2-core box (g++ 12.2,
torch 2.13.0+cpu) a one-line `load_inline` built in 33 s, and in 10-12 s with the header
precompiled. A test suite or a CPU leaderboard builds dozens of such candidates.

GCC looks for `D/torch/extension.h.gch` in each include directory D before it looks for
`D/torch/extension.h`, and in a `.gch` directory takes the first file built with compatible flags
(the same -std, -fPIC, __OPTIMIZE__ defined or not; -O1, -O2 and -O3 share one). CPATH's folders are
searched before the -isystem folders torch's builds pass, so a folder put on CPATH serves every
build without a change to the candidate's code or flags, and is only read (a candidate's sandbox
can read it). It is not written into torch's include folder: `load_inline(use_pch=False)`, the
default, deletes a torch/extension.h.gch it finds there.

The flags are those torch writes into its own build.ninja for an extension, so the precompiled
header matches them. The cache folder is keyed by torch's version and install path: GCC checks its
own version and the flags, but not whether the headers changed since.

    python -m cudagym.eval.header_cache .cache/headers   # builds if needed, prints the CPATH folder
"""

from __future__ import annotations

import hashlib
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

# name -> extra flags. GCC takes a variant only where __OPTIMIZE__ agrees: builds with no -O
# (torch's default) and with any of -O1..-O3 (what most candidates pass) each need their own.
VARIANTS = {"O0": [], "O2": ["-O2"]}
HEADER = "torch/extension.h"
STAND_IN = "#pragma once\n#include_next <torch/extension.h>\n"


class HeaderCacheError(RuntimeError):
    pass


def torch_build_command(extra_cflags: list[str]) -> tuple[str, list[str]]:
    """The compiler and the flags torch's JIT build passes for a C++ source with `extra_cflags`, read
    from the build.ninja torch writes (its own code, so a torch that changes -std or an ABI flag is
    followed), less the extension's name, which the header never reads."""
    from torch.utils import cpp_extension

    with tempfile.TemporaryDirectory() as tmp:
        ninja = os.path.join(tmp, "build.ninja")
        try:
            cpp_extension._write_ninja_file_to_build_library(
                path=ninja, name="header_cache", sources=[os.path.join(tmp, "main.cpp")], extra_cflags=extra_cflags,
                extra_cuda_cflags=[], extra_sycl_cflags=[], extra_ldflags=[], extra_include_paths=[],
                with_cuda=False, with_sycl=False, is_standalone=False)
        except TypeError as e:  # a torch whose private build writer takes other arguments
            raise HeaderCacheError(f"cannot read torch's build flags: {e}") from None
        values = dict(line.split(" = ", 1) for line in Path(ninja).read_text().splitlines() if " = " in line)
    cflags = [f for f in shlex.split(values.get("cflags", "")) if not f.startswith("-DTORCH_EXTENSION_NAME=")]
    return values.get("cxx", "c++").strip(), cflags


def cache_folder(root: str | Path) -> Path:
    """The folder for this torch under `root`: what goes on CPATH."""
    import torch

    key = hashlib.sha256(f"{torch.__version__}\0{torch.__file__}".encode()).hexdigest()[:12]
    return Path(root).resolve() / f"torch-{torch.__version__.replace('+', '-')}-{key}"


def header_path() -> Path:
    import torch

    return Path(torch.__file__).parent / "include" / HEADER


def is_used(folder: Path, variant: str = "O2") -> bool:
    """Whether GCC takes a precompiled header from `folder` for a build with that variant's flags
    (its -H output marks a usable one with "!")."""
    cxx, cflags = torch_build_command(VARIANTS[variant])
    proc = subprocess.run([cxx, "-H", "-fsyntax-only", "-x", "c++", *cflags, "-"], input=f"#include <{HEADER}>\n",
                          capture_output=True, text=True, env=dict(os.environ, CPATH=str(folder)), timeout=120)
    return any(line.startswith("! ") and str(folder) in line for line in proc.stderr.splitlines())


def ready(root: str | Path) -> Path | None:
    """The cache folder under `root`, where every variant of this torch's header has been built."""
    folder = cache_folder(root)
    built = [folder / HEADER, *(folder / f"{HEADER}.gch" / f"{name}.gch" for name in VARIANTS)]
    return folder if all(path.is_file() for path in built) else None


def is_gcc(cxx: str) -> bool:
    """GCC, not clang (which also defines __GNUC__ but reads precompiled headers only by -include-pch)."""
    macros = subprocess.run([cxx, "-dM", "-E", "-x", "c++", os.devnull], capture_output=True, text=True).stdout
    return "__GNUC__" in macros and "__clang__" not in macros


def build(root: str | Path) -> Path:
    """Precompile torch/extension.h once per variant (side by side) under `root`, unless already
    there, and check that GCC takes it; returns the folder to put on CPATH."""
    if ready(root):
        return cache_folder(root)
    folder = cache_folder(root)
    gch = folder / (HEADER + ".gch")
    cxx, _ = torch_build_command([])
    if not is_gcc(cxx):
        raise HeaderCacheError(f"{cxx} is not GCC: its precompiled headers are not found through CPATH")
    gch.mkdir(parents=True, exist_ok=True)
    # GCC opens the header from the folder it found the .gch in whenever it cannot take a precompiled
    # one: on a second `#include <torch/extension.h>` (load_inline adds one before a source's own), or
    # with flags no variant fits. This stand-in hands it on to torch's own.
    (gch.parent / "extension.h").write_text(STAND_IN)
    jobs = []
    for name, extra in VARIANTS.items():
        # Written aside and renamed: a build that reads the folder meanwhile never sees half a file.
        partial = gch / f".{name}.gch.{os.getpid()}"
        _, cflags = torch_build_command(extra)
        proc = subprocess.Popen([cxx, "-x", "c++-header", str(header_path()), "-o", str(partial), *cflags],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        jobs.append((name, partial, proc))
    failed = []
    for name, partial, proc in jobs:
        _, err = proc.communicate()
        if proc.returncode == 0:
            partial.replace(gch / f"{name}.gch")
        else:
            partial.unlink(missing_ok=True)
            failed.append(f"{name}: {(err.strip().splitlines() or ['exit ' + str(proc.returncode)])[-1]}")
    if failed:
        raise HeaderCacheError("precompiling torch/extension.h failed: " + "; ".join(failed))
    if not is_used(folder):
        raise HeaderCacheError(f"{cxx} does not use the precompiled header in {folder}")
    return folder


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m cudagym.eval.header_cache ROOT  (prints the folder to put on CPATH)", file=sys.stderr)
        return 2
    try:
        print(build(argv[0]))
    except (HeaderCacheError, OSError, subprocess.SubprocessError) as e:
        print(f"header cache: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

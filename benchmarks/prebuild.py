#!/usr/bin/env python3
"""Build a submission's extensions before judging it, all at once (stress.py's prebuild on a submission
folder), so that the judges of `eval run` and `agent eval` find them in the shared build cache instead
of each building its own under the others' load (on the H200 box: ~75 s a kernel, a few at a time).

    python3 benchmarks/prebuild.py SUBMISSION [--parallel N] [--deadline-s S] [--device cuda]

SUBMISSION/level{L}/{id}_*.py, as `eval run` reads it. Resumable: a built extension is found and
not built again. Exit status 0 when every extension was built, else 1.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))  # cudagym of this checkout (stress.build_extensions)
from stress import Clock, build_extensions, child_env  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("submission", type=Path)
    p.add_argument("--parallel", type=int, default=os.cpu_count() or 1, help="builds at once (default: one per core)")
    p.add_argument("--deadline-s", type=float, default=600.0, help="stop (builds killed) before this")
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    args = p.parse_args(argv)
    files = {f"{path.parent.name}/{path.stem}": path for path in sorted(args.submission.glob("level*/*.py"))}
    logs = Path(tempfile.mkdtemp(prefix="cudagym-prebuild-"))
    results = build_extensions(files, args.parallel, sys.executable, child_env(args), Clock(args.deadline_s), logs)
    built = sum(r["ok"] for r in results.values())
    print(f"prebuild: {built} of {len(results)} extensions built ({len(files)} files); build logs in {logs}", flush=True)
    return 0 if built == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())

"""Write the reference-as-candidate submission: each KernelBench problem's Model renamed ModelNew.

Every problem should pass with speedup ~1.0 vs eager (under --policy permissive: the reference
computes with torch ops). The harness's sanity run, and the repeatability measurement.

    python benchmarks/reference_submission.py OUT_DIR [--kb-version v0.1] [--levels 1,2,3]
"""

import argparse
import re
from pathlib import Path

from cudagym.kernelbench import load_problems


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--kb-version", default="v0.1")
    parser.add_argument("--levels", default="1,2,3")
    args = parser.parse_args()
    for task in load_problems(args.kb_version, args.levels):
        path = Path(args.out) / f"level{task.level}" / f"{task.name}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(re.sub(r"\bModel\b", "ModelNew", task.code))


if __name__ == "__main__":
    main()

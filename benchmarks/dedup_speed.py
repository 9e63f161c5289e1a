"""Decontamination speed: 100,000 candidates against the 250 KernelBench v0.1 L1-3 problems.

Candidates are cheap text mutations of KernelBench problems (fusions of two problems' constructor
and forward code, identifier renames, resized constants, swapped activation / arithmetic operators,
inserted elementwise ops, stripped docstrings), so they look like near and far copies. The script
times the parity score and the strong score separately and together (`check_against`, both scores,
the pipeline's path), on all cores, reports wall and CPU time, and checks that the pruned parity
maxima equal brute force on a random 1,000-subset (and the strong maxima on 200). Results are in
benchmarks/NOTES.md, "Decontamination speed (2-core CPU)".

    python benchmarks/dedup_speed.py [--n 100000] [--workers 2] [--seed 0]

Needs the KernelBench file (`CUDAGYM_KERNELBENCH`, else ../shared/kernelbench/problems.jsonl).
"""

from __future__ import annotations

import argparse
import ast
import gc
import multiprocessing
import os
import random
import re
import resource
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("CUDAGYM_KERNELBENCH", str(REPO.parent / "shared" / "kernelbench" / "problems.jsonl"))

from cudagym.dedup.decontaminate import ReferenceSet, check_against  # noqa: E402
from cudagym.dedup.strong import normalize  # noqa: E402
from cudagym.kernelbench import load_problems  # noqa: E402
from cudagym.tasks import Task  # noqa: E402

UNARY_TORCH = ["relu", "sigmoid", "tanh", "exp", "abs", "sin", "cos", "sqrt", "log1p", "erf", "neg", "softplus"]
UNARY_F = ["relu", "gelu", "silu", "mish", "softplus", "hardswish", "elu", "selu", "tanh", "sigmoid"]
MODULES = ["ReLU", "GELU", "SiLU", "Tanh", "Sigmoid", "Mish", "Hardswish", "ELU", "Softplus"]
FIXED = {"Model", "forward", "get_inputs", "get_init_inputs", "self"}
_TORCH_UNARY = re.compile(r"torch\.(%s)\(" % "|".join(UNARY_TORCH))
_F_UNARY = re.compile(r"\bF\.(%s)\(" % "|".join(UNARY_F))
_NN_MODULE = re.compile(r"nn\.(%s)\(" % "|".join(MODULES))
_ARITH = re.compile(r"(?<=\w) ([+*]) (?=\w)")
_NUMBER = re.compile(r"(?<![\w.])\d+(?![\w.])")
_DOCSTRING = re.compile(r'\n\s*"""[\s\S]*?"""')
_RETURN = re.compile(r"^(\s+)return (\w+)\s*$", re.M)


class Mutator:
    """Random text mutations of one KernelBench problem."""

    def __init__(self, code: str) -> None:
        self.code = code
        tree = ast.parse(code)
        imported = {(a.asname or a.name).split(".")[0] for n in ast.walk(tree)
                    if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}
        names = set()
        for n in ast.walk(tree):
            if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load):
                names.add(n.id)
            elif isinstance(n, ast.arg):
                names.add(n.arg)
            elif isinstance(n, ast.Attribute) and not isinstance(n.ctx, ast.Load):
                names.add(n.attr)
            elif isinstance(n, (ast.FunctionDef, ast.ClassDef)):
                names.add(n.name)
        self.names = sorted(x for x in names - imported - FIXED if not x.startswith("__"))
        self.rename_re = re.compile(r"\b(%s)\b" % "|".join(map(re.escape, self.names))) if self.names else None
        self.lines = code.splitlines()
        self.forward_at = self.init_at = None  # line indices where a composed problem's code goes in
        self.forward_body, self.init_body, self.param = [], [], None
        model = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Model"), None)
        for fn in (model.body if model else []):
            if isinstance(fn, ast.FunctionDef) and fn.name == "forward" and len(fn.args.args) > 1:
                self.forward_at, self.param = fn.body[0].lineno - 1, fn.args.args[1].arg
                self.forward_body = [ast.unparse(s) for s in fn.body if not isinstance(s, (ast.Return, ast.Expr))]
            elif isinstance(fn, ast.FunctionDef) and fn.name == "__init__":
                self.init_at = fn.body[-1].end_lineno
                self.init_body = [ast.unparse(s) for s in fn.body
                                  if not isinstance(s, ast.Expr) and "super" not in ast.unparse(s)]

    def compose(self, other: Mutator) -> str:
        """This problem with `other`'s constructor and forward statements fused in (a fused-op task)."""
        if self.forward_at is None or self.init_at is None or other.param is None:
            return self.code
        rename = re.compile(r"\b%s\b" % re.escape(other.param))
        forward = ["        " + line for stmt in other.forward_body
                   for line in rename.sub(self.param, stmt).splitlines()]
        init = ["        " + line for stmt in other.init_body for line in stmt.splitlines()]
        lines = list(self.lines)
        lines[self.forward_at:self.forward_at] = forward
        lines[self.init_at:self.init_at] = init
        return "\n".join(lines)

    def mutate(self, rng: random.Random, others: list[Mutator]) -> str:
        code = self.code
        if rng.random() < 0.3:
            code = self.compose(rng.choice(others))
        if rng.random() < 0.3:
            code = _DOCSTRING.sub("", code)
        if rng.random() < 0.5:
            code = _TORCH_UNARY.sub(lambda m: f"torch.{rng.choice(UNARY_TORCH)}(", code)
            code = _F_UNARY.sub(lambda m: f"F.{rng.choice(UNARY_F)}(", code)
            code = _NN_MODULE.sub(lambda m: f"nn.{rng.choice(MODULES)}(", code)
        if rng.random() < 0.3:
            code = _ARITH.sub(lambda m: f" {rng.choice('+-*/')} ", code)
        if rng.random() < 0.5:
            code = _RETURN.sub(lambda m: self._insert_ops(m, rng), code, count=1)
        if rng.random() < 0.7:
            code = _NUMBER.sub(lambda m: str(max(1, int(m.group()) * rng.choice((1, 2, 4)) // rng.choice((1, 2)))),
                               code)
        if self.rename_re is not None and rng.random() < 0.7:
            fresh = {n: f"{n[:2]}{rng.randrange(10**6)}" if rng.random() < 0.5 else f"v{rng.randrange(10**6)}"
                     for n in self.names}
            code = self.rename_re.sub(lambda m: fresh[m.group()], code)
        return code

    @staticmethod
    def _insert_ops(m: re.Match, rng: random.Random) -> str:
        indent, var = m.group(1), m.group(2)
        lines = []
        for _ in range(rng.randint(1, 3)):
            kind = rng.random()
            if kind < 0.5:
                lines.append(f"{indent}{var} = torch.{rng.choice(UNARY_TORCH)}({var})")
            elif kind < 0.8:
                lines.append(f"{indent}{var} = {var} {rng.choice('+-*/')} {rng.choice(('0.5', '2.0', var))}")
            else:
                lines.append(f"{indent}{var} = torch.clamp({var}, min={rng.choice(('-1.0', '0.0'))}, max=1.0)")
        return "\n".join(lines) + f"\n{indent}return {var}"


def make_candidates(problems: list[Task], n: int, seed: int) -> list[Task]:
    rng = random.Random(seed)
    mutators = [Mutator(p.code) for p in problems]
    return [Task(id=f"cand/{i:06d}", name=f"cand_{i}", code=rng.choice(mutators).mutate(rng, mutators))
            for i in range(n)]


# -- one-score passes (each on `workers` processes) -------------------------------------------------
_REFS: ReferenceSet | None = None


def _parity_chunk(codes: list[str]) -> list[tuple]:
    gc.disable()
    out = []
    for code in codes:
        try:
            out.append(_REFS.parity.best(code))
        except (SyntaxError, ValueError, RecursionError):
            out.append(None)
    return out


def _strong_chunk(codes: list[str]) -> list[tuple]:
    gc.disable()
    out = []
    for code in codes:
        try:
            out.append(_REFS.strong.best(normalize(code)))
        except (SyntaxError, ValueError, RecursionError):
            out.append(None)
    return out


def cpu_seconds() -> float:
    """CPU time of this process and of its reaped children (the pool workers)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def timed_pass(fn, codes: list[str], workers: int) -> tuple[float, float, list]:
    chunks = [codes[i:i + 500] for i in range(0, len(codes), 500)]
    gc.collect()
    gc.freeze()
    t0, c0 = time.perf_counter(), cpu_seconds()
    with multiprocessing.get_context("fork").Pool(workers) as pool:
        results = [r for rows in pool.imap(fn, chunks) for r in rows]
    elapsed = time.perf_counter() - t0
    gc.unfreeze()
    return elapsed, cpu_seconds() - c0, results


def report(name: str, wall: float, cpu: float, n: int) -> None:
    print(f"{name:<22} wall {wall:7.1f} s  {n / wall:7.0f} candidates/s   CPU {cpu:7.1f} s "
          f"({cpu / n * 1e3:.2f} ms/candidate)", flush=True)


def main() -> int:
    global _REFS
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--verify", type=int, default=1000, help="candidates checked against brute force (parity)")
    args = ap.parse_args()

    problems = load_problems("v0.1", (1, 2, 3))
    t0 = time.perf_counter()
    candidates = make_candidates(problems, args.n, args.seed)
    t_gen = time.perf_counter() - t0
    codes = [c.code for c in candidates]
    print(f"{len(problems)} references, {len(candidates)} candidates generated in {t_gen:.1f} s, "
          f"{len(set(codes))} distinct sources; {args.workers} worker processes, {os.cpu_count()} CPUs")

    t0 = time.perf_counter()
    _REFS = ReferenceSet(problems)
    print(f"reference indexes built in {time.perf_counter() - t0:.2f} s")

    print(f"load average before: {os.getloadavg()[0]:.2f}", flush=True)
    t_parity, c_parity, parity = timed_pass(_parity_chunk, codes, args.workers)
    report("parity", t_parity, c_parity, len(codes))
    t_strong, c_strong, strong = timed_pass(_strong_chunk, codes, args.workers)
    report("strong", t_strong, c_strong, len(codes))
    t0, c0 = time.perf_counter(), cpu_seconds()
    rows = check_against(candidates, _REFS, workers=args.workers)
    report("both (check_against)", time.perf_counter() - t0, cpu_seconds() - c0, len(codes))
    print(f"load average after: {os.getloadavg()[0]:.2f}; peak RSS of a worker "
          f"{resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024:.0f} MiB")

    errors = sum(r is None for r in parity)
    flagged_p = sum(r is not None and r[0] > 0.9 for r in parity)
    flagged_s = sum(r is not None and r[0] >= 0.9 for r in strong)
    print(f"unparsable {errors}; flagged by parity {flagged_p}, by strong {flagged_s}, "
          f"by either {sum(r['flagged'] for r in rows)} of {len(rows)}")
    agree = all(r.get("error") is not None if p is None else (r["parity_max"], r["strong_max"]) == (p[0], s[0])
                for r, p, s in zip(rows, parity, strong))
    print(f"check_against agrees with the one-score passes: {agree}")

    rng = random.Random(args.seed + 1)
    sample = rng.sample(range(len(codes)), min(args.verify, len(codes)))
    gc.disable()
    t0 = time.perf_counter()
    brute = [_REFS.parity.brute_force_max(codes[i]) if parity[i] is not None else None for i in sample]
    t_brute = time.perf_counter() - t0
    mismatches = sum(brute[k] != parity[i] for k, i in enumerate(sample))
    print(f"parity pruned == brute force on {len(sample)} random candidates: {mismatches == 0} "
          f"({mismatches} mismatches; brute force {t_brute / len(sample) * 1e3:.1f} ms/candidate on 1 process)")
    small = sample[:200]
    t0 = time.perf_counter()
    brute_s = [_REFS.strong.brute_force_max(codes[i]) if strong[i] is not None else None for i in small]
    t_brute_s = time.perf_counter() - t0
    mismatches_s = sum(brute_s[k] != strong[i] for k, i in enumerate(small))
    print(f"strong pruned == brute force on {len(small)} random candidates: {mismatches_s == 0} "
          f"({mismatches_s} mismatches; brute force {t_brute_s / len(small) * 1e3:.1f} ms/candidate on 1 process)")
    return 0 if mismatches == 0 and mismatches_s == 0 and agree else 1


if __name__ == "__main__":
    sys.exit(main())

"""Metrics over verdicts (contract, "Metrics"): pass rate, faster-than rates, geomean speedups, fast_p.

Pure functions over verdict dicts (contract schema). The problem set is `expected` when given:
a problem without a verdict counts as failed and verdicts for problems outside it are ignored.
Without `expected` it is the problems the verdicts name. Per problem:

- several verdicts for one (level, problem_id): the last one counts; verdicts without a level or
  problem_id (e.g. from `eval one`) are each their own problem;
- a failed problem (not `correct`, or missing) is not faster, and counts as speedup 1.0 in
  `geomean_all_*` (so failing cannot raise it);
- a correct problem without a speedup (not timed) counts as correct but not faster, as 1.0 in
  `geomean_all_*`, and is left out of `geomean_correct_*`;
- `geomean_correct_*` is None when no correct problem has a speedup; every rate is None when n is 0.

Degenerate problems: a problem whose (last) verdict has a truthy `degenerate` (the audit found that
its check cannot tell a real kernel from a trivial one) is left out of the problem set, unless
`include_degenerate`; a problem without a verdict is never known to be degenerate, so it stays in.
Each metrics object M then adds `n_degenerate_excluded` (how many of its scope's problems were left
out; 0 with `include_degenerate`) to the contract's keys, and `n` counts only the problems kept.
A scope keeps its `levelL` key when all its problems were left out (n 0, rates None).

Verdicts of several timing modes, or of several precisions (`precision`, "strict" when absent:
fp32 with TF32 off, or "kernelbench": torch's defaults), are never mixed: ValueError, one line.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

FAST_P = ("0", "0.5", "0.8", "1", "1.5", "2")  # thresholds p of fast_p, as they appear in the JSON


@dataclass(frozen=True)
class ProblemResult:
    """One problem's outcome; a speedup is None when the problem failed or was not timed."""

    level: int | None
    problem_id: int | None
    correct: bool
    speedup_vs_eager: float | None = None
    speedup_vs_compile: float | None = None
    degenerate: str | None = None  # why the problem's check cannot tell a real kernel from a trivial one

    def speedup(self, baseline: str) -> float | None:
        return getattr(self, f"speedup_vs_{baseline}")


def timing_mode_of(verdicts: list[dict]) -> str | None:
    """The one timing mode the verdicts were timed in (None if none says); ValueError if several."""
    modes = sorted({v["timing_mode"] for v in verdicts if v.get("timing_mode")})
    if len(modes) > 1:
        raise ValueError(f"verdicts mix timing modes ({', '.join(modes)}); compute metrics for one mode at a time")
    return modes[0] if modes else None


def precision_of(verdicts: list[dict]) -> str | None:
    """The one precision of the verdicts ("strict" where absent; None if no verdict); ValueError if several."""
    precisions = sorted({v.get("precision") or "strict" for v in verdicts})
    if len(precisions) > 1:
        raise ValueError(f"verdicts mix precisions ({', '.join(precisions)});"
                         " compute metrics for one precision at a time")
    return precisions[0] if precisions else None


def problem_results(verdicts: list[dict], expected: list[tuple[int, int]] | None = None,
                    include_degenerate: bool = False) -> list[ProblemResult]:
    """One result per problem of the problem set, degenerate problems left out unless include_degenerate."""
    results = _all_results(verdicts, expected)
    return results if include_degenerate else [r for r in results if not r.degenerate]


def _all_results(verdicts: list[dict], expected: list[tuple[int, int]] | None) -> list[ProblemResult]:
    timing_mode_of(verdicts)
    precision_of(verdicts)
    latest: dict[tuple, ProblemResult] = {}
    for row, v in enumerate(verdicts):
        result = _result(v)
        if result.level is None or result.problem_id is None:
            latest[("row", row)] = result
        else:
            latest[(result.level, result.problem_id)] = result
    if expected is None:
        return list(latest.values())
    keys = dict.fromkeys((int(level), int(pid)) for level, pid in expected)
    return [latest.get(key) or ProblemResult(key[0], key[1], correct=False) for key in keys]


def summarize(results: list[ProblemResult], n_degenerate_excluded: int = 0) -> dict:
    """The contract's metrics object M over a list of problem results, plus `n_degenerate_excluded`."""
    n = len(results)
    correct = [r for r in results if r.correct]
    metrics = {"n": n, "pass_rate": _rate(len(correct), n)}
    for baseline in ("compile", "eager"):
        metrics[f"faster_than_{baseline}_rate"] = _rate(_count_faster(correct, baseline, 1.0), n)
    for baseline in ("compile", "eager"):
        timed = [r.speedup(baseline) for r in correct if r.speedup(baseline) is not None]
        metrics[f"geomean_correct_vs_{baseline}"] = _geomean(timed)
        metrics[f"geomean_all_vs_{baseline}"] = _geomean([r.speedup(baseline) or 1.0 for r in results])
    for baseline in ("eager", "compile"):
        metrics[f"fast_p_vs_{baseline}"] = {p: _rate(_count_faster(correct, baseline, float(p)), n) for p in FAST_P}
    metrics["n_degenerate_excluded"] = n_degenerate_excluded
    return metrics


def compute_metrics(verdicts: list[dict], expected: list[tuple[int, int]] | None = None,
                    include_degenerate: bool = False) -> dict:
    """`{"overall": M, "level1": M, ...}`, a key per level of the problem set (degenerate problems included).

    Degenerate problems are left out of every M unless include_degenerate (module docstring);
    ValueError (one line) on mixed timing modes or precisions.
    """
    results = _all_results(verdicts, expected)

    def scope(selected: list[ProblemResult]) -> dict:
        kept = selected if include_degenerate else [r for r in selected if not r.degenerate]
        return summarize(kept, n_degenerate_excluded=len(selected) - len(kept))

    metrics = {"overall": scope(results)}
    for level in sorted({r.level for r in results if r.level is not None}):
        metrics[f"level{level}"] = scope([r for r in results if r.level == level])
    return metrics


def _result(verdict: dict) -> ProblemResult:
    level, pid = verdict.get("level"), verdict.get("problem_id")
    correct = bool(verdict.get("correct"))
    return ProblemResult(
        level=None if level is None else int(level),
        problem_id=None if pid is None else int(pid),
        correct=correct,
        speedup_vs_eager=_speedup(verdict, "eager") if correct else None,
        speedup_vs_compile=_speedup(verdict, "compile") if correct else None,
        degenerate=_degenerate(verdict),
    )


def _degenerate(verdict: dict) -> str | None:
    """The verdict's degenerate reason as one line ("degenerate" when it is truthy but not text); None if falsy."""
    reason = verdict.get("degenerate")
    if not reason:
        return None
    return " ".join(reason.split()) if isinstance(reason, str) and reason.strip() else "degenerate"


def _speedup(verdict: dict, baseline: str) -> float | None:
    """The verdict's speedup, else derived from its times; None unless a finite positive number."""
    speedup = verdict.get(f"speedup_vs_{baseline}")
    if speedup is None:
        t_ms, t_ref_ms = verdict.get("t_candidate_ms"), verdict.get(f"t_{baseline}_ms")
        speedup = t_ref_ms / t_ms if t_ms and t_ref_ms else None
    if speedup is None or not math.isfinite(speedup) or speedup <= 0:
        return None
    return float(speedup)


def _count_faster(correct: list[ProblemResult], baseline: str, p: float) -> int:
    return sum(1 for r in correct if r.speedup(baseline) is not None and r.speedup(baseline) > p)


def _rate(count: int, n: int) -> float | None:
    return count / n if n else None


def _geomean(values: list[float]) -> float | None:
    return math.exp(math.fsum(math.log(x) for x in values) / len(values)) if values else None

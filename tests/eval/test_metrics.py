"""Metrics over verdicts: every expected number below is computed by hand in the comments."""

from __future__ import annotations

import pytest

from cudagym.eval.metrics import compute_metrics, precision_of, problem_results, timing_mode_of

# the contract's keys of M, and the one key cudagym adds
M_KEYS = {"n", "pass_rate", "faster_than_compile_rate", "faster_than_eager_rate", "geomean_correct_vs_compile",
          "geomean_all_vs_compile", "geomean_correct_vs_eager", "geomean_all_vs_eager", "fast_p_vs_eager",
          "fast_p_vs_compile"}
ADDED_KEYS = {"n_degenerate_excluded"}
P_KEYS = ["0", "0.5", "0.8", "1", "1.5", "2"]


def verdict(level, problem_id, correct, vs_compile=None, vs_eager=None, mode="strict", **extra) -> dict:
    return {"level": level, "problem_id": problem_id, "name": f"{problem_id}_p", "kb_version": "v0.1",
            "status": "pass" if correct else "incorrect", "correct": correct, "reason": None if correct else "x",
            "flags": [], "t_candidate_ms": None, "t_eager_ms": None, "t_compile_ms": None,
            "speedup_vs_eager": vs_eager, "speedup_vs_compile": vs_compile, "reward": 1 if correct else -1,
            "timing_mode": mode, "env": {}, **extra}


# Problem set: L1/1..4, L2/1..2 (n = 6).
#   L1/1 correct, 4.0x vs compile, 4.0x vs eager
#   L1/2 correct but slower: 0.5x vs compile, 0.8x vs eager (both exactly at a fast_p threshold)
#   L1/3 first correct at 8x, then re-run and incorrect (with a stray speedup): the last one counts -> failed
#   L1/4 missing -> failed
#   L2/1 correct, exactly 1.0x vs compile, exactly 1.5x vs eager
#   L2/2 correct, not timed (no speedups)
VERDICTS = [
    verdict(1, 1, True, 4.0, 4.0),
    verdict(1, 3, True, 8.0, 8.0),
    verdict(1, 2, True, 0.5, 0.8),
    verdict(2, 1, True, 1.0, 1.5),
    verdict(2, 2, True),
    verdict(1, 3, False, 10.0, 10.0),
]
EXPECTED = [(1, 1), (1, 2), (1, 3), (1, 4), (2, 1), (2, 2)]


def test_overall_by_hand():
    m = compute_metrics(VERDICTS, EXPECTED)["overall"]
    assert set(m) == M_KEYS | ADDED_KEYS
    assert m["n"] == 6 and m["n_degenerate_excluded"] == 0
    # correct: L1/1, L1/2, L2/1, L2/2 -> 4/6
    assert m["pass_rate"] == pytest.approx(4 / 6)
    # faster than compile (speedup > 1): only L1/1 (L2/1 is exactly 1.0) -> 1/6
    assert m["faster_than_compile_rate"] == pytest.approx(1 / 6)
    # faster than eager: L1/1 (4.0), L2/1 (1.5); L1/2 is 0.8 -> 2/6
    assert m["faster_than_eager_rate"] == pytest.approx(2 / 6)
    # geomean_correct vs compile over correct, timed: 4.0 * 0.5 * 1.0 = 2 -> 2 ** (1/3)
    assert m["geomean_correct_vs_compile"] == pytest.approx(2 ** (1 / 3))
    # geomean_all vs compile: 4.0, 0.5, 1 (failed L1/3), 1 (missing L1/4), 1.0, 1 (untimed L2/2) -> 2 ** (1/6)
    assert m["geomean_all_vs_compile"] == pytest.approx(2 ** (1 / 6))
    # vs eager: correct, timed 4.0 * 0.8 * 1.5 = 4.8 -> 4.8 ** (1/3); all: 4.8 ** (1/6)
    assert m["geomean_correct_vs_eager"] == pytest.approx(4.8 ** (1 / 3))
    assert m["geomean_all_vs_eager"] == pytest.approx(4.8 ** (1 / 6))


def test_fast_p_strictly_greater_than_p():
    m = compute_metrics(VERDICTS, EXPECTED)["overall"]
    assert list(m["fast_p_vs_compile"]) == P_KEYS and list(m["fast_p_vs_eager"]) == P_KEYS
    # vs compile, correct timed speedups 4.0, 0.5, 1.0 (untimed L2/2 never counts):
    #   >0: 3   >0.5: 2 (0.5 excluded)   >0.8: 2   >1: 1 (1.0 excluded)   >1.5: 1   >2: 1
    assert m["fast_p_vs_compile"] == pytest.approx({"0": 3 / 6, "0.5": 2 / 6, "0.8": 2 / 6, "1": 1 / 6,
                                                    "1.5": 1 / 6, "2": 1 / 6})
    # vs eager, 4.0, 0.8, 1.5: >0: 3  >0.5: 3  >0.8: 2 (0.8 excluded)  >1: 2  >1.5: 1 (1.5 excluded)  >2: 1
    assert m["fast_p_vs_eager"] == pytest.approx({"0": 3 / 6, "0.5": 3 / 6, "0.8": 2 / 6, "1": 2 / 6,
                                                  "1.5": 1 / 6, "2": 1 / 6})


def test_per_level_split():
    metrics = compute_metrics(VERDICTS, EXPECTED)
    assert list(metrics) == ["overall", "level1", "level2"]
    l1, l2 = metrics["level1"], metrics["level2"]
    # level 1: L1/1 .. L1/4, correct L1/1 and L1/2
    assert l1["n"] == 4
    assert l1["pass_rate"] == pytest.approx(2 / 4)
    assert l1["faster_than_compile_rate"] == pytest.approx(1 / 4)
    assert l1["faster_than_eager_rate"] == pytest.approx(1 / 4)
    assert l1["geomean_correct_vs_compile"] == pytest.approx((4.0 * 0.5) ** (1 / 2))
    assert l1["geomean_all_vs_compile"] == pytest.approx((4.0 * 0.5) ** (1 / 4))
    assert l1["geomean_correct_vs_eager"] == pytest.approx((4.0 * 0.8) ** (1 / 2))
    assert l1["geomean_all_vs_eager"] == pytest.approx((4.0 * 0.8) ** (1 / 4))
    # level 2: both correct; vs compile only 1.0 (not faster); vs eager 1.5 (faster); L2/2 untimed
    assert l2["n"] == 2
    assert l2["pass_rate"] == 1.0
    assert l2["faster_than_compile_rate"] == 0.0
    assert l2["faster_than_eager_rate"] == pytest.approx(1 / 2)
    assert l2["geomean_correct_vs_compile"] == pytest.approx(1.0)
    assert l2["geomean_correct_vs_eager"] == pytest.approx(1.5)
    assert l2["geomean_all_vs_eager"] == pytest.approx(1.5 ** (1 / 2))
    # the untimed correct problem is correct but not in fast_0: 1/2, below pass_rate 1.0
    assert l2["fast_p_vs_eager"]["0"] == pytest.approx(1 / 2)


def test_fast_0_equals_pass_rate_when_every_correct_problem_is_timed():
    verdicts = [verdict(1, 1, True, 0.3, 0.2), verdict(1, 2, True, 3.0, 2.0), verdict(1, 3, False)]
    m = compute_metrics(verdicts)["overall"]
    assert m["pass_rate"] == pytest.approx(2 / 3)
    assert m["fast_p_vs_compile"]["0"] == m["pass_rate"]
    assert m["fast_p_vs_eager"]["0"] == m["pass_rate"]


def test_without_expected_the_verdicts_are_the_problem_set():
    metrics = compute_metrics(VERDICTS)
    # L1/1, L1/3 (last: failed), L1/2, L2/1, L2/2: 5 problems, nothing missing
    assert metrics["overall"]["n"] == 5
    assert metrics["overall"]["pass_rate"] == pytest.approx(4 / 5)
    assert metrics["level1"]["n"] == 3


def test_verdicts_outside_expected_are_ignored_and_expected_levels_get_keys():
    metrics = compute_metrics(VERDICTS, expected=[(1, 1), (3, 7)])
    assert list(metrics) == ["overall", "level1", "level3"]
    # L1/1 correct at 4.0x; L3/7 missing -> pass 1/2, geomean_all vs compile sqrt(4.0 * 1) = 2
    assert metrics["overall"]["n"] == 2
    assert metrics["overall"]["pass_rate"] == 0.5
    assert metrics["overall"]["geomean_all_vs_compile"] == pytest.approx(2.0)
    assert metrics["level3"]["pass_rate"] == 0.0


def test_no_correct_problem_gives_null_geomean_correct():
    m = compute_metrics([verdict(1, 1, False, 3.0, 3.0), verdict(1, 2, True)])["overall"]
    assert m["geomean_correct_vs_compile"] is None
    assert m["geomean_correct_vs_eager"] is None
    # failed (1.0) and untimed (1.0): geomean_all is exactly 1; neither is faster
    assert m["geomean_all_vs_compile"] == 1.0
    assert m["faster_than_compile_rate"] == 0.0
    assert m["pass_rate"] == 0.5


def test_speedup_is_derived_from_times_when_absent():
    v = verdict(1, 1, True, t_candidate_ms=0.5, t_eager_ms=2.0, t_compile_ms=1.0)
    m = compute_metrics([v])["overall"]
    # 2.0 / 0.5 = 4 vs eager, 1.0 / 0.5 = 2 vs compile
    assert m["geomean_correct_vs_eager"] == pytest.approx(4.0)
    assert m["geomean_correct_vs_compile"] == pytest.approx(2.0)


def test_verdicts_without_problem_id_are_separate_problems():
    a, b = verdict(None, None, True, 2.0, 2.0), verdict(None, None, False)
    metrics = compute_metrics([a, b])
    assert list(metrics) == ["overall"]
    assert metrics["overall"]["n"] == 2


def test_empty():
    m = compute_metrics([])["overall"]
    assert m["n"] == 0
    assert m["pass_rate"] is None and m["geomean_all_vs_compile"] is None
    assert compute_metrics([], expected=[(1, 1)])["overall"]["pass_rate"] == 0.0


def test_mixed_timing_modes_raise_one_line():
    verdicts = [verdict(1, 1, True, 2.0, 2.0), verdict(1, 2, True, 2.0, 2.0, mode="paper")]
    with pytest.raises(ValueError, match="paper, strict") as info:
        compute_metrics(verdicts)
    assert "\n" not in str(info.value)
    assert timing_mode_of(verdicts[:1]) == "strict"


ZEROS = "its check accepts zeros (atol=0.01, rtol=0.01)"


def test_degenerate_problems_are_left_out_by_default_and_counted_on_request():
    # L1/1 correct 4.0x; L1/2 degenerate and correct at 9.0x (a trivial kernel could score that);
    # L1/3 degenerate and failed; L2/1 correct 1.0x; L2/2 missing (no verdict: never known degenerate)
    verdicts = [verdict(1, 1, True, 4.0, 4.0), verdict(1, 2, True, 9.0, 9.0, degenerate=ZEROS),
                verdict(1, 3, False, degenerate="passthrough"), verdict(2, 1, True, 1.0, 1.0)]
    expected = [(1, 1), (1, 2), (1, 3), (2, 1), (2, 2)]
    metrics = compute_metrics(verdicts, expected)
    overall, l1, l2 = metrics["overall"], metrics["level1"], metrics["level2"]
    # left out: L1/2, L1/3 -> n 3 (L1/1, L2/1, L2/2), correct L1/1 and L2/1 -> 2/3
    assert overall["n"] == 3 and overall["n_degenerate_excluded"] == 2
    assert overall["pass_rate"] == pytest.approx(2 / 3)
    # geomean_all vs compile: 4.0 * 1.0 * 1 (missing) -> 4 ** (1/3); the 9x of L1/2 is not in it
    assert overall["geomean_all_vs_compile"] == pytest.approx(4 ** (1 / 3))
    assert l1["n"] == 1 and l1["n_degenerate_excluded"] == 2 and l1["pass_rate"] == 1.0
    assert l2["n"] == 2 and l2["n_degenerate_excluded"] == 0
    counted = compute_metrics(verdicts, expected, include_degenerate=True)
    # all five: correct L1/1, L1/2, L2/1 -> 3/5; geomean_all (4 * 9 * 1 * 1 * 1) ** (1/5)
    assert counted["overall"]["n"] == 5 and counted["overall"]["n_degenerate_excluded"] == 0
    assert counted["overall"]["pass_rate"] == pytest.approx(3 / 5)
    assert counted["overall"]["geomean_all_vs_compile"] == pytest.approx(36 ** (1 / 5))
    assert counted["level1"]["n_degenerate_excluded"] == 0


def test_a_level_of_only_degenerate_problems_keeps_its_key_with_n_zero():
    metrics = compute_metrics([verdict(1, 1, True, 2.0, 2.0), verdict(3, 5, True, 2.0, 2.0, degenerate=ZEROS)])
    assert list(metrics) == ["overall", "level1", "level3"]
    assert metrics["level3"]["n"] == 0 and metrics["level3"]["n_degenerate_excluded"] == 1
    assert metrics["level3"]["pass_rate"] is None
    assert metrics["overall"]["n"] == 1 and metrics["overall"]["n_degenerate_excluded"] == 1


def test_the_last_verdict_decides_whether_a_problem_is_degenerate():
    # re-run after the audit changed its mind: the last verdict has no degenerate reason -> counted
    verdicts = [verdict(1, 1, True, 2.0, 2.0, degenerate=ZEROS), verdict(1, 1, True, 2.0, 2.0, degenerate=None)]
    assert compute_metrics(verdicts)["overall"]["n"] == 1
    assert compute_metrics(verdicts[::-1])["overall"]["n"] == 0


def test_problem_results_leave_out_degenerate_problems_unless_asked():
    verdicts = [verdict(1, 1, True, 2.0, 2.0), verdict(1, 2, True, 2.0, 2.0, degenerate=ZEROS)]
    assert [r.problem_id for r in problem_results(verdicts)] == [1]
    results = problem_results(verdicts, include_degenerate=True)
    assert [(r.problem_id, r.degenerate) for r in results] == [(1, None), (2, ZEROS)]


def test_mixed_precisions_raise_one_line_and_missing_precision_is_strict():
    strict, kb = verdict(1, 1, True, 2.0, 2.0), verdict(1, 2, True, 2.0, 2.0, precision="kernelbench")
    with pytest.raises(ValueError, match="kernelbench, strict") as info:
        compute_metrics([strict, kb])
    assert "\n" not in str(info.value)
    with pytest.raises(ValueError, match="precisions"):
        problem_results([strict, kb], include_degenerate=True)
    # no "precision" key counts as strict: together with an explicit strict verdict it is one precision
    assert compute_metrics([strict, verdict(1, 2, True, 2.0, 2.0, precision="strict")])["overall"]["n"] == 2
    assert precision_of([strict]) == "strict" and precision_of([kb]) == "kernelbench" and precision_of([]) is None

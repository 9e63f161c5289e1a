"""The leaderboard in the terminal and as HTML, over a real store; numbers computed by hand below."""

from __future__ import annotations

import io
import re

import pytest
from rich.console import Console

from cudagym.eval import leaderboard
from cudagym.eval.metrics import ProblemResult
from cudagym.eval.store import Store


def verdict(problem_id: int, correct: bool, vs_compile=None, vs_eager=None, mode="strict") -> dict:
    return {"level": 1, "problem_id": problem_id, "name": f"{problem_id}_p", "kb_version": "v0.1",
            "status": "pass" if correct else "incorrect", "correct": correct, "flags": [],
            "speedup_vs_compile": vs_compile, "speedup_vs_eager": vs_eager, "timing_mode": mode}


@pytest.fixture
def store(tmp_path, monkeypatch):
    # KernelBench v0.1 level 1 stands in as problems 1..5 here.
    monkeypatch.setattr(leaderboard, "expected_problems",
                        lambda kb_version, levels: [(1, pid) for pid in range(1, 6)] if levels == [1] else [])
    with Store(tmp_path / "lb.duckdb") as store:
        # "fastkern" on L1/1..5: 1 correct at 8x vs compile and 3x vs eager, 2 correct but slower vs compile
        # (0.5x) yet faster than eager (1.2x), 3 incorrect, 4 missing, 5 correct but not timed.
        #   n 5, pass 3/5 = 60.0%, faster than compile 1/5 = 20.0%, fast_1 vs eager 2/5 = 40.0%
        #   geomean all vs compile (8 * 0.5 * 1 * 1 * 1) ** (1/5) = 4 ** 0.2 = 1.3195 -> 1.32x
        #   geomean correct vs compile (8 * 0.5) ** (1/2) = 2.00x
        store.add_submission("fastkern", "/subs/fastkern", "strict", levels=[1], kb_version="v0.1")
        for v in [verdict(1, True, 8.0, 3.0), verdict(2, True, 0.5, 1.2), verdict(3, False), verdict(5, True)]:
            store.add_verdict("fastkern", v)
        # "paperrun" in paper mode, no levels recorded: L1/1 correct at 3x vs compile -> pass 100.0%, 3.00x
        store.add_submission("paperrun", "/subs/paperrun", "paper")
        store.add_verdict("paperrun", verdict(1, True, 3.0, 3.0, mode="paper"))
        yield store


def test_show_prints_each_submission_and_its_numbers(store):
    out = io.StringIO()
    leaderboard.show(store, Console(file=out, width=250, color_system=None))
    text = out.getvalue()
    assert "fastkern" in text and "paperrun" in text
    assert "timing mode: strict" in text and "timing mode: paper" in text
    rows = [[cell.strip() for cell in line.split("│")[1:-1]] for line in text.splitlines() if "│" in line]
    # columns: scope, n, pass, faster than compile, geomean all vs compile, geomean correct vs compile, fast_1 vs eager
    assert ["overall", "5", "60.0%", "20.0%", "1.32x", "2.00x", "40.0%"] in rows
    assert ["level1", "5", "60.0%", "20.0%", "1.32x", "2.00x", "40.0%"] in rows
    assert ["overall", "1", "100.0%", "100.0%", "3.00x", "3.00x", "100.0%"] in rows  # paperrun
    assert text.index("timing mode: strict") < text.index("fastkern") < text.index("timing mode: paper")
    assert "only problems with a verdict are counted" in text  # paperrun has no recorded levels


def test_submission_with_two_timing_modes_gets_one_entry_per_mode(store):
    store.add_verdict("fastkern", verdict(4, True, 2.0, 2.0, mode="paper"))
    entries = [e for e in leaderboard.build_entries(store) if e.submission["name"] == "fastkern"]
    assert sorted(e.timing_mode for e in entries) == ["paper", "strict"]
    paper = next(e for e in entries if e.timing_mode == "paper")
    # paper: only L1/4 correct of the five problems -> 1/5
    assert paper.metrics["overall"]["pass_rate"] == pytest.approx(1 / 5)
    leaderboard.show(store, Console(file=io.StringIO()))  # does not raise on mixed modes


def test_write_html_has_the_table_values_and_an_svg(store, tmp_path):
    store.add_submission("<b>odd</b>", "/subs/odd", "strict")
    path = leaderboard.write_html(store, tmp_path / "site")
    assert path == tmp_path / "site" / "index.html"
    page = path.read_text()
    for value in ["60.0%", "20.0%", "1.32x", "2.00x", "40.0%", "100.0%", "3.00x"]:
        assert f"<td>{value}</td>" in page, value
    assert page.count("<svg") == 3
    assert "&lt;b&gt;odd&lt;/b&gt;" in page and "<b>odd</b>" not in page
    assert "<script" not in page and "<link" not in page and "src=" not in page


def test_speedup_svg_draws_correct_timed_problems_and_the_one_line():
    results = [ProblemResult(1, 1, True, 3.0, 8.0), ProblemResult(2, 2, True, 1.2, 0.5),
               ProblemResult(1, 3, False), ProblemResult(3, 4, True)]
    svg = leaderboard.speedup_svg(results)
    assert svg.count("</circle>") == 2  # one point per correct, timed problem
    assert "L1/1: 8x" in svg and "L2/2: 0.5x" in svg
    assert 'class="one"' in svg
    assert "2 of 4 problems" in svg
    # on the log axis, 8x sits above the 1.0 line and 0.5x below it (SVG y grows downwards)
    y_one = float(re.search(r'class="one"[^>]*y1="([\d.]+)"', svg).group(1))
    ys = dict(re.findall(r'cy="([\d.]+)" r="3"[^>]*><title>(L\d/\d)', svg)[i][::-1] for i in range(2))
    assert float(ys["L1/1"]) < y_one < float(ys["L2/2"])


def test_speedup_svg_without_points():
    svg = leaderboard.speedup_svg([ProblemResult(1, 1, False)])
    assert "<svg" in svg and "</circle>" not in svg

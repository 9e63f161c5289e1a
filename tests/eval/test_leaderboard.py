"""The leaderboard in the terminal and as HTML, over a real store; numbers computed by hand below."""

from __future__ import annotations

import html
import io
import json
import re

import pytest
from rich.console import Console

from cudagym import cli
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
    # self-contained: one inline script (table sorting), nothing fetched
    assert page.count("<script") == 1 and "<script>" in page
    assert "<link" not in page and "src=" not in page and "@import" not in page
    assert set(re.findall(r"https?://[^\s\"'<>]+", page)) == {"http://www.w3.org/2000/svg"}


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



# -- per-problem rows, degenerate problems, SOL, comparisons ------------------------------------------
H200 = {"gpu": "NVIDIA H200", "torch": "2.11.0", "cuda": "13.0"}
MATMUL_COST = {"flops": 2 * 1024**3, "bytes": 3 * 1024**2 * 4}  # SOL on the H200: 0.032052 ms
ZEROS = "its check accepts zeros (atol=0.01, rtol=0.01)"


def full(problem_id, status, mode="strict", t_ms=None, t_eager=2.0, t_compile=1.6, precision="strict", **extra):
    correct = status == "pass"
    v = {"level": 1, "problem_id": problem_id, "name": f"{problem_id}_Problem", "kb_version": "v0.1",
         "status": status, "correct": correct, "reason": None if correct else extra.pop("reason", "x"),
         "flags": extra.pop("flags", []), "t_candidate_ms": t_ms, "t_eager_ms": t_eager, "t_compile_ms": t_compile,
         "speedup_vs_eager": t_eager / t_ms if correct and t_ms else None,
         "speedup_vs_compile": t_compile / t_ms if correct and t_ms else None,
         "reward": extra.pop("reward", 3 if correct else -1), "timing_mode": mode, "precision": precision,
         "degenerate": None, "cost": MATMUL_COST, "env": H200, "timing": {}}
    v.update(extra)
    return v


@pytest.fixture
def rich_store(tmp_path, monkeypatch):
    # KernelBench v0.1 level 1 stands in as problems 1..4 here.
    monkeypatch.setattr(leaderboard, "expected_problems", lambda kb_version, levels: [(1, pid) for pid in range(1, 5)])
    with Store(tmp_path / "rich.duckdb") as store:
        # "mine", strict: L1/1 pass at 0.5 ms (eager 2.0 -> 4.00x, compile 1.6 -> 3.20x, 15.6x SOL),
        # L1/2 rejected with a flag, L1/3 degenerate pass at 0.1 ms (16.00x vs compile), L1/4 missing.
        store.add_submission("mine", "/subs/mine", "strict", levels=[1], kb_version="v0.1")
        for v in [full(1, "pass", t_ms=0.5),
                  full(2, "rejected", reason="timed output differs from the checked one on rep 3",
                       flags=["timed_output_mismatch"],
                       timing={"flag_details": {"timed_output_mismatch": ["rep 3: max abs err 1.5"]}}),
                  full(3, "pass", t_ms=0.1, degenerate=ZEROS)]:
            store.add_verdict("mine", v)
        # "mine", paper: the same kernels timed the paper's way: L1/1 0.4 ms (eager 1.8, compile 1.2 -> 3.00x)
        store.add_submission("mine", "/subs/mine", "paper", levels=[1], kb_version="v0.1")
        for v in [full(1, "pass", "paper", t_ms=0.4, t_eager=1.8, t_compile=1.2),
                  full(2, "rejected", "paper", flags=["timed_output_mismatch"]),
                  full(3, "pass", "paper", t_ms=0.1, degenerate=ZEROS)]:
            store.add_verdict("mine", v)
        # "other", strict: L1/1 pass at 0.8 ms (2.00x vs compile), L1/2 incorrect; no verdict for L1/3 or L1/4
        store.add_submission("other", "/subs/other", "strict", levels=[1], kb_version="v0.1")
        store.add_verdict("other", full(1, "pass", t_ms=0.8, reward=3))
        store.add_verdict("other", full(2, "incorrect", reason="max abs err 3.2 > atol + rtol |ref|"))
        yield store


def entry(entries, key):
    return next(e for e in entries if e.key == key)


def row_html(page: str, anchor: str, problem_id: int) -> str:
    """The <tr> of L1/problem_id in the per-problem table of the entry section `anchor`."""
    section = page[page.index(f'<section id="{anchor}"'):]
    section = section[:section.index("</section>")]
    table = section[section.index('<table class="sortable problems">'):]
    return next(tr for tr in re.findall(r"<tr[^>]*>.*?</tr>", table) if cells(tr)[:2] == ["1", str(problem_id)])


def cells(tr: str) -> list[str]:
    return [html.unescape(re.sub(r"<[^>]+>", "", td)).strip() for td in re.findall(r"<td[^>]*>.*?</td>", tr)]


def test_degenerate_problems_are_left_out_of_the_metrics_by_default(rich_store):
    entries = leaderboard.build_entries(rich_store)
    assert [e.key for e in entries] == ["mine@strict@strict", "other@strict@strict", "mine@paper@strict"]
    mine = entry(entries, "mine@strict@strict").metrics["overall"]
    # L1/3 left out: n 3 (L1/1 pass, L1/2 rejected, L1/4 missing) -> pass 1/3, geomean_all vs compile 3.2 ** (1/3)
    assert mine["n"] == 3 and mine["n_degenerate_excluded"] == 1
    assert mine["pass_rate"] == pytest.approx(1 / 3)
    assert mine["geomean_all_vs_compile"] == pytest.approx(3.2 ** (1 / 3))
    # "other" has no verdict for L1/3, but mine's verdict says L1/3 is degenerate: left out there too
    other = entry(entries, "other@strict@strict").metrics["overall"]
    assert other["n"] == 3 and other["n_degenerate_excluded"] == 1
    counted = entry(leaderboard.build_entries(rich_store, include_degenerate=True), "mine@strict@strict")
    # counted: n 4, pass 2/4, geomean_all (3.2 * 16 * 1 * 1) ** (1/4)
    assert counted.metrics["overall"]["n"] == 4 and counted.metrics["overall"]["n_degenerate_excluded"] == 0
    assert counted.metrics["overall"]["pass_rate"] == pytest.approx(2 / 4)
    assert counted.metrics["overall"]["geomean_all_vs_compile"] == pytest.approx((3.2 * 16) ** (1 / 4))
    # the plot follows the metrics: 1 timed point by default, 2 when counted
    assert len([r for r in entry(entries, "mine@strict@strict").results if r.speedup_vs_compile]) == 1
    assert len([r for r in counted.results if r.speedup_vs_compile]) == 2


def test_html_marks_degenerate_rows_and_says_how_many_were_left_out(rich_store, tmp_path):
    page = leaderboard.write_html(rich_store, tmp_path / "site").read_text()
    assert "1 degenerate problem left out (--include-degenerate to count them)" in page
    tr = row_html(page, "e-mine-strict-strict", 3)
    assert 'class="st-pass degen"' in tr
    assert f'<span class="badge" title="{html.escape(ZEROS)}">degenerate</span>' in tr  # the badge's tooltip
    assert cells(tr)[-1] == f"not counted: {ZEROS}"  # and the reason as visible text
    counted = leaderboard.write_html(rich_store, tmp_path / "site2", include_degenerate=True).read_text()
    assert "1 degenerate problem counted in the metrics" in counted
    assert cells(row_html(counted, "e-mine-strict-strict", 3))[-1] == f"counted: {ZEROS}"


def test_per_problem_rows_have_status_reason_flags_times_speedups_reward_and_sol(rich_store, tmp_path):
    page = leaderboard.write_html(rich_store, tmp_path / "site").read_text()
    # columns: L, id, name, status, reason, flags, eager ms, compile ms, candidate ms, vs eager, vs compile,
    # reward, SOL ms, x SOL, degenerate
    assert cells(row_html(page, "e-mine-strict-strict", 1)) == [
        "1", "1", "1_Problem", "pass", "", "", "2", "1.6", "0.5", "4.00x", "3.20x", "3", "0.0321", "15.6x", ""]
    rejected = row_html(page, "e-mine-strict-strict", 2)
    assert cells(rejected)[:6] == ["1", "2", "2_Problem", "rejected",
                                   "timed output differs from the checked one on rep 3", "timed_output_mismatch"]
    assert cells(rejected)[8:12] == ["-", "-", "-", "-1"]  # not timed, no speedup, reward -1
    assert re.search(r'<span class="flag" title="rep 3: max abs err 1.5">timed_<wbr>output_<wbr>mismatch</span>',
                     rejected)  # what fired, in the tooltip
    missing = cells(row_html(page, "e-mine-strict-strict", 4))
    assert missing[:4] == ["1", "4", "", "missing"] and missing[4].startswith("no verdict stored")
    # numbers sort as numbers: the raw value rides along in data-v
    assert 'data-v="0.5">0.5<' in row_html(page, "e-mine-strict-strict", 1)


def test_strict_and_paper_of_one_submission_are_shown_side_by_side(rich_store, tmp_path):
    page = leaderboard.write_html(rich_store, tmp_path / "site").read_text()
    assert page.count('class="compare"') == 1  # only "mine" has both modes
    section = page[page.index("mine: strict vs paper timing (precision strict)"):]
    section = section[:section.index("</section>")]
    assert "A: mine@strict@strict" in section and "B: mine@paper@strict" in section
    # metric rows of both: strict pass 1/3 = 33.3% (3.20x ** (1/3) = 1.47x), paper 1/3 (3.00x ** (1/3) = 1.44x)
    metric_rows = [cells(tr.replace("<th", "<td").replace("</th>", "</td>"))
                   for tr in re.findall(r'<tr class="side-[ab]">.*?</tr>', section)]
    assert metric_rows[0][:6] == ["overall", "A", "3", "33.3%", "33.3%", "1.47x"]
    assert metric_rows[1][:6] == ["overall", "B", "3", "33.3%", "33.3%", "1.44x"]
    # per problem, status / candidate ms / vs eager / vs compile / x SOL of each, then B / A ms
    tr = next(tr for tr in re.findall(r"<tr[^>]*>.*?</tr>", section) if cells(tr)[:3] == ["1", "1", "1_Problem"])
    assert cells(tr) == ["1", "1", "1_Problem", "pass", "0.5", "4.00x", "3.20x", "15.6x",
                         "pass", "0.4", "4.50x", "3.00x", "12.5x", "0.80"]


def test_compare_any_two_entries_from_the_cli(rich_store, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # rich's terminal width
    db = tmp_path / "rich.duckdb"
    rich_store.close()
    out = tmp_path / "site"
    assert cli.main(["leaderboard", "html", "--out", str(out), "--db", str(db), "--compare", "mine,other"]) == 0
    page = (out / "index.html").read_text()
    section = page[page.index("mine@strict@strict vs other@strict@strict"):]
    section = section[:section.index("</section>")]
    tr = next(tr for tr in re.findall(r"<tr[^>]*>.*?</tr>", section) if cells(tr)[:3] == ["1", "1", "1_Problem"])
    assert cells(tr)[3:5] == ["pass", "0.5"] and cells(tr)[8:10] == ["pass", "0.8"] and cells(tr)[-1] == "1.60"
    assert page.count('class="compare"') == 2  # the asked one, and mine's strict vs paper
    capsys.readouterr()
    assert cli.main(["leaderboard", "show", "--db", str(db), "--compare", "mine@paper,other"]) == 0
    text = capsys.readouterr().out
    assert "compare: A = mine@paper@strict, B = other@strict@strict" in text
    row = next(line for line in text.splitlines() if "1_Problem" in line)
    assert "0.4" in row and "0.8" in row and "2.00" in row  # B / A ms = 0.8 / 0.4
    assert "1 degenerate problem left out (--include-degenerate to count them)" in text


def test_bad_compare_is_a_one_line_error(rich_store, tmp_path, capsys):
    db = tmp_path / "rich.duckdb"
    rich_store.close()
    for spec in ("mine", "mine,nobody", "mine@strict,mine@strict@strict"):
        assert cli.main(["leaderboard", "html", "--out", str(tmp_path / "x"), "--db", str(db), "--compare", spec]) == 1
        err = capsys.readouterr().err
        assert err.startswith("cudagym: error:") and err.count("\n") == 1, err


def test_resolve_entry_names(rich_store):
    rich_store.add_verdict("mine", full(1, "pass", "paper", t_ms=0.3, precision="kernelbench"))
    entries = leaderboard.build_entries(rich_store)
    assert leaderboard.resolve_entry(entries, "mine").key == "mine@strict@strict"  # strict when left out
    assert leaderboard.resolve_entry(entries, "mine@paper").key == "mine@paper@strict"
    assert leaderboard.resolve_entry(entries, "mine@paper@kernelbench").key == "mine@paper@kernelbench"
    with pytest.raises(ValueError, match="no leaderboard entry 'mine@fast'"):
        leaderboard.resolve_entry(entries, "mine@fast")
    # precisions are separate entries, never mixed in one metric
    kb = entry(entries, "mine@paper@kernelbench")  # L1/1 pass; L1/2, L1/4 missing; L1/3 degenerate (known)
    assert kb.metrics["overall"]["n"] == 3 and kb.metrics["overall"]["pass_rate"] == pytest.approx(1 / 3)
    assert entry(entries, "mine@paper@strict").metrics["overall"]["geomean_all_vs_compile"] == pytest.approx(
        3.0 ** (1 / 3))


def test_leaderboard_metrics_cli_include_degenerate(tmp_path, capsys):
    path = tmp_path / "verdicts.jsonl"
    path.write_text("\n".join(json.dumps(v) for v in [full(1, "pass", t_ms=0.5), full(2, "pass", t_ms=0.1,
                                                                                    degenerate=ZEROS)]))
    assert cli.main(["leaderboard", "metrics", str(path), "--json"]) == 0
    left_out = json.loads(capsys.readouterr().out)["overall"]
    assert left_out["n"] == 1 and left_out["n_degenerate_excluded"] == 1
    assert cli.main(["leaderboard", "metrics", str(path), "--json", "--include-degenerate"]) == 0
    counted = json.loads(capsys.readouterr().out)["overall"]
    assert counted["n"] == 2 and counted["n_degenerate_excluded"] == 0
    assert cli.main(["leaderboard", "metrics", str(path)]) == 0
    assert "1 degenerate problem left out (--include-degenerate to count them)" in capsys.readouterr().out
    path.write_text("\n".join(json.dumps(v) for v in [full(1, "pass", t_ms=0.5),
                                                       full(2, "pass", t_ms=0.1, precision="kernelbench")]))
    assert cli.main(["leaderboard", "metrics", str(path), "--json"]) == 1
    assert "mix precisions" in capsys.readouterr().err


def test_problem_names_link_to_the_agent_trajectory_pages_beside_the_submission(tmp_path, monkeypatch):
    # An agent's submission folder holds trajectories/level{L}_{id}.html (cudagym.agent.pages) for the
    # problems it tried, the missing ones included; the page copies them and links each name to its page.
    monkeypatch.setattr(leaderboard, "expected_problems", lambda kb_version, levels: [(1, pid) for pid in range(1, 4)])
    submission = tmp_path / "agent-submission"
    pages = submission / leaderboard.TRAJECTORY_PAGES
    pages.mkdir(parents=True)
    for pid in (1, 3):  # problem 2 has no page; problem 3 has no verdict (missing) but a failed rollout's page
        (pages / leaderboard.trajectory_page(1, pid)).write_text(f"<html>trajectory of problem {pid}</html>")
    with Store(tmp_path / "lb.duckdb") as store:
        store.add_submission("agent one", str(submission), "strict", levels=[1], kb_version="v0.1")
        store.add_submission("by hand", str(tmp_path / "no-pages"), "strict", levels=[1], kb_version="v0.1")
        for name in ("agent one", "by hand"):
            store.add_verdict(name, full(1, "pass", t_ms=0.5))
            store.add_verdict(name, full(2, "incorrect"))
        site = tmp_path / "site"
        page = leaderboard.write_html(store, site).read_text()
    links = {pid: re.findall(r'<a href="([^"]+)" title="the agent', row_html(page, "e-agent-one-strict-strict", pid))
             for pid in (1, 2, 3)}
    assert links == {1: ["trajectories/agent-one/level1_1.html"], 2: [], 3: ["trajectories/agent-one/level1_3.html"]}
    for pid in (1, 3):
        assert (site / links[pid][0]).read_text() == f"<html>trajectory of problem {pid}</html>"
    assert cells(row_html(page, "e-agent-one-strict-strict", 1))[2] == "1_Problem"  # the link keeps the name
    by_hand = "".join(row_html(page, "e-by-hand-strict-strict", pid) for pid in (1, 2, 3))
    assert 'title="the agent' not in by_hand and not (site / "trajectories" / "by-hand").exists()

"""The leaderboard: metrics of every stored submission, in the terminal (rich) or as one static HTML page.

Metrics come from `compute_metrics`, one timing mode at a time (a submission whose verdicts span two
modes gets an entry per mode). When the store knows the KernelBench version and levels a submission
was run on, its problem set is those problems, so a problem without a verdict counts as failed;
otherwise only the problems with a verdict are counted, and the entry says so.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table
from rich.text import Text

from cudagym.eval.metrics import ProblemResult, compute_metrics, problem_results
from cudagym.eval.store import Store

# (header, path into a metrics object M, kind); the terminal shows the first ones, the page all of them
COLUMNS = (
    ("n", ("n",), "count"),
    ("pass", ("pass_rate",), "rate"),
    ("faster than compile", ("faster_than_compile_rate",), "rate"),
    ("geomean all vs compile", ("geomean_all_vs_compile",), "speedup"),
    ("geomean correct vs compile", ("geomean_correct_vs_compile",), "speedup"),
    ("fast_1 vs eager", ("fast_p_vs_eager", "1"), "rate"),
)
PAGE_COLUMNS = COLUMNS + (
    ("faster than eager", ("faster_than_eager_rate",), "rate"),
    ("geomean all vs eager", ("geomean_all_vs_eager",), "speedup"),
    ("geomean correct vs eager", ("geomean_correct_vs_eager",), "speedup"),
)
LEVEL_COLORS = {1: "#1f77b4", 2: "#ff7f0e", 3: "#2ca02c", 4: "#d62728"}


@dataclass(frozen=True)
class Entry:
    """One submission's metrics in one timing mode."""

    submission: dict  # as Store.submissions() returns it
    timing_mode: str
    metrics: dict  # compute_metrics' result
    results: list[ProblemResult]
    note: str | None = None  # why problems without a verdict are not counted, if they are not

    @property
    def title(self) -> str:
        s = self.submission
        levels = ",".join(map(str, s["levels"])) if s.get("levels") else "?"
        return f"{s['name']}  ({s.get('kb_version') or 'task set'}, levels {levels}, {self.timing_mode})"


def expected_problems(kb_version: str, levels: list[int]) -> list[tuple[int, int]]:
    """(level, problem_id) of the KernelBench problems of a version and levels."""
    from cudagym.kernelbench import load_problems

    return [(task.level, task.problem_id) for task in load_problems(version=kb_version, levels=tuple(levels))]


def build_entries(store: Store) -> list[Entry]:
    """Every (submission, timing mode): strict mode first, then best overall geomean_all_vs_compile first."""
    entries = []
    for submission in store.submissions():
        expected, note = _problem_set(submission)
        verdicts = store.verdicts(submission["name"])
        if submission.get("kb_version"):
            verdicts = [v for v in verdicts if v.get("kb_version") == submission["kb_version"]]
        by_mode: dict[str, list[dict]] = {submission["timing_mode"]: []} if not verdicts else {}
        for verdict in verdicts:
            by_mode.setdefault(verdict.get("timing_mode") or submission["timing_mode"], []).append(verdict)
        for mode, group in by_mode.items():
            entries.append(Entry(submission, mode, compute_metrics(group, expected), problem_results(group, expected),
                                 note))
    return sorted(entries, key=lambda e: (e.timing_mode != "strict", e.timing_mode,
                                          -(e.metrics["overall"]["geomean_all_vs_compile"] or 0)))


def show(store: Store, console: Console | None = None) -> None:
    """Print a table per submission (overall and per level), grouped by timing mode."""
    console = console or Console()
    entries = build_entries(store)
    if not entries:
        console.print("no submissions in the store")
    mode = None
    for entry in entries:
        if entry.timing_mode != mode:
            mode = entry.timing_mode
            console.rule(Text(f"timing mode: {mode}"))
        table = Table(title=Text(entry.title))
        table.add_column("")
        for header, _, _ in COLUMNS:
            table.add_column(header, justify="right")
        for scope, metrics in entry.metrics.items():
            table.add_row(scope, *(_format(_get(metrics, path), kind) for _, path, kind in COLUMNS))
        console.print(table)
        if entry.note:
            console.print(Text(entry.note, style="dim"))


def write_html(store: Store, out_dir: str | Path) -> Path:
    """Write a self-contained `index.html` (tables and inline SVG plots) into out_dir; return its path."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "index.html"
    path.write_text(render_html(build_entries(store)))
    return path


def render_html(entries: list[Entry]) -> str:
    body = [] if entries else ["<p>No submissions in the store.</p>"]
    mode = None
    for entry in entries:
        if entry.timing_mode != mode:
            mode = entry.timing_mode
            body.append(f"<h2>Timing mode: {html.escape(mode)}</h2>")
        body.append(f"<section><h3>{html.escape(entry.title)}</h3>")
        if entry.note:
            body.append(f"<p class=note>{html.escape(entry.note)}</p>")
        body.append(_html_table(entry.metrics))
        body.append(speedup_svg(entry.results))
        body.append("</section>")
    return _PAGE.format(body="\n".join(body))


def speedup_svg(results: list[ProblemResult], width: int = 640, height: int = 260) -> str:
    """Sorted speedups vs torch.compile of the correct, timed problems, on a log axis, with 1.0 marked."""
    points = sorted(((r.speedup_vs_compile, r.level, r.problem_id) for r in results if r.speedup_vs_compile),
                    key=lambda point: point[0])
    caption = (f"{len(points)} of {len(results)} problems correct and timed, sorted by speedup vs torch.compile;"
               " failed and untimed problems are not drawn")
    left, right, top, bottom = 56, 16, 16, 36
    plot_w, plot_h = width - left - right, height - top - bottom
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img">',
             f"<title>{html.escape(caption)}</title>",
             f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#999"/>']
    lo = math.log10(min([p[0] for p in points] + [1.0]) / 1.25)
    hi = math.log10(max([p[0] for p in points] + [1.0]) * 1.25)

    def y(speedup: float) -> float:
        return top + plot_h * (hi - math.log10(speedup)) / (hi - lo)

    for tick in _log_ticks(lo, hi):
        parts.append(f'<line x1="{left - 4}" x2="{left}" y1="{y(tick):.1f}" y2="{y(tick):.1f}" stroke="#999"/>'
                     f'<text x="{left - 6}" y="{y(tick) + 4:.1f}" text-anchor="end" font-size="11">{tick:g}x</text>')
    parts.append(f'<line class="one" x1="{left}" x2="{left + plot_w}" y1="{y(1.0):.1f}" y2="{y(1.0):.1f}"'
                 ' stroke="#444" stroke-dasharray="4 3"/>'
                 f'<text x="{left + plot_w - 4}" y="{y(1.0) - 4:.1f}" text-anchor="end" font-size="11">'
                 "1.0x = torch.compile</text>")
    for i, (speedup, level, problem_id) in enumerate(points):
        x = left + plot_w * (i + 0.5) / len(points)
        color = LEVEL_COLORS.get(level, "#777")
        parts.append(f'<circle cx="{x:.1f}" cy="{y(speedup):.1f}" r="3" fill="{color}">'
                     f"<title>L{level}/{problem_id}: {speedup:.3g}x</title></circle>")
    if not points:
        parts.append(f'<text x="{left + plot_w / 2}" y="{top + plot_h / 2}" text-anchor="middle" font-size="13">'
                     "no correct, timed problem</text>")
    legend = sorted({level for _, level, _ in points}, key=lambda level: (level is None, level))
    for i, level in enumerate(legend):
        x = left + 70 * i
        parts.append(f'<circle cx="{x + 5}" cy="{height - 12}" r="4" fill="{LEVEL_COLORS.get(level, "#777")}"/>'
                     f'<text x="{x + 13}" y="{height - 8}" font-size="11">level {level}</text>')
    parts.append("</svg>")
    return f"<figure>{''.join(parts)}<figcaption>{html.escape(caption)}</figcaption></figure>"


def _problem_set(submission: dict) -> tuple[list[tuple[int, int]] | None, str | None]:
    """The submission's problem set (None: only problems with a verdict), and a note when it is None."""
    if not submission.get("kb_version") and submission.get("levels"):
        # A task set: `eval run` stores a failed verdict for every task without a file, so the
        # verdicts already are the whole problem set.
        return None, None
    if not submission.get("kb_version") or not submission.get("levels"):
        return None, "levels or KernelBench version not recorded: only problems with a verdict are counted"
    try:
        return expected_problems(submission["kb_version"], submission["levels"]), None
    except (ValueError, OSError) as e:
        return None, f"KernelBench problems unavailable ({e}): only problems with a verdict are counted"


def _html_table(metrics: dict) -> str:
    head = "".join(f"<th>{html.escape(header)}</th>" for header, _, _ in PAGE_COLUMNS)
    rows = []
    for scope, m in metrics.items():
        cells = "".join(f"<td>{_format(_get(m, path), kind)}</td>" for _, path, kind in PAGE_COLUMNS)
        rows.append(f"<tr><th>{scope}</th>{cells}</tr>")
    return f"<table><thead><tr><th></th>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def _log_ticks(lo: float, hi: float) -> list[float]:
    """1-2-5 ticks between 10**lo and 10**hi."""
    ticks = []
    for exponent in range(math.floor(lo), math.ceil(hi) + 1):
        ticks += [m * 10.0**exponent for m in (1, 2, 5) if lo <= math.log10(m * 10.0**exponent) <= hi]
    return ticks


def _get(metrics: dict, path: tuple[str, ...]):
    for key in path:
        metrics = metrics[key]
    return metrics


def _format(value, kind: str) -> str:
    if value is None:
        return "-"
    if kind == "count":
        return str(value)
    if kind == "rate":
        return f"{100 * value:.1f}%"
    return f"{value:.2f}x"


_PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>cudagym leaderboard</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em; color: #222; }}
table {{ border-collapse: collapse; margin: 0.5em 0; }}
th, td {{ border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: right; }}
thead th {{ background: #f3f3f3; }}
tbody th {{ text-align: left; }}
.note {{ color: #777; }}
figcaption {{ color: #555; font-size: 0.9em; }}
</style>
</head>
<body>
<h1>cudagym leaderboard</h1>
<p>Metrics over all problems of the selected levels: a missing or failed problem counts as failed, and as
speedup 1.0 in "geomean all". Timing modes are never mixed in one metric.</p>
{body}
</body>
</html>
"""

"""The leaderboard: metrics and per-problem results of every stored submission, in the terminal (rich)
or as one static, self-contained HTML page.

An entry is one (submission, timing mode, precision): verdicts are grouped by their `timing_mode`
(the submission's when absent) and `precision` ("strict" when absent), and metrics never mix
groups (`compute_metrics` refuses). When the store knows the KernelBench version and levels a
submission was run on, its problem set is those problems: a problem without a verdict gets a
"missing" row and counts as failed; otherwise only problems with a verdict are counted, and the
entry says so.

Degenerate problems (the audit found their check cannot tell a real kernel from a trivial one;
the verdict's `degenerate` reason) are shown, marked, in the per-problem table and left out of
the metrics unless `include_degenerate`. A missing problem is marked degenerate when any stored
verdict of that problem (any submission, same KernelBench version) says so, so submissions that
skipped problems are counted over the same set.

Comparisons put two entries side by side per problem: every submission with a strict and a paper
entry of one precision gets one on the page, and `--compare A,B` adds any two (`name`,
`name@mode` or `name@mode@precision`, see `resolve_entry`).
"""

from __future__ import annotations

import html
import math
import re
import shutil
from dataclasses import dataclass, field, replace
from pathlib import Path

from rich.console import Console
from rich.table import Table
from rich.text import Text

from cudagym.eval.metrics import ProblemResult, compute_metrics, problem_results
from cudagym.eval.sol import sol_ms, x_sol
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
    ("degenerate left out", ("n_degenerate_excluded",), "count"),
)
COMPARE_COLUMNS = COLUMNS + tuple(c for c in PAGE_COLUMNS if c[0] in ("geomean all vs eager", "degenerate left out"))
LEVEL_COLORS = {1: "#1f77b4", 2: "#ff7f0e", 3: "#2ca02c", 4: "#d62728"}
MISSING_REASON = "no verdict stored: no file for this problem, or the run has not reached it"
TRAJECTORY_PAGES = "trajectories"  # a submission's folder of agent trajectory pages (cudagym.agent.pages)
REASON_CHARS = 90  # a reason longer than this is cut on the page (the whole of it is in the tooltip)


@dataclass(frozen=True)
class ProblemRow:
    """One problem of an entry, as its (last) verdict says; status "missing" when it has none."""

    level: int | None
    problem_id: int | None
    name: str
    status: str
    reason: str | None = None
    flags: tuple[str, ...] = ()
    flag_details: dict = field(default_factory=dict)  # flag -> what fired (list of lines)
    t_eager_ms: float | None = None
    t_compile_ms: float | None = None
    t_candidate_ms: float | None = None
    speedup_vs_eager: float | None = None
    speedup_vs_compile: float | None = None
    reward: int | None = None
    sol_ms: float | None = None  # speed of light on the verdict's GPU (cudagym.eval.sol)
    degenerate: str | None = None  # the audit's reason, None when the check can tell

    @property
    def key(self) -> tuple:
        return (self.level, self.problem_id)

    @property
    def x_sol(self) -> float | None:
        """t_candidate / SOL (>= 1 for an honest fp32 kernel timed with a flushed L2)."""
        return x_sol(self.t_candidate_ms, self.sol_ms)


@dataclass(frozen=True)
class Entry:
    """One submission's metrics and per-problem rows in one timing mode and precision."""

    submission: dict  # as Store.submissions() returns it
    timing_mode: str
    metrics: dict  # compute_metrics' result
    results: list[ProblemResult]  # the problems the metrics count
    note: str | None = None  # why problems without a verdict are not counted, if they are not
    precision: str = "strict"
    rows: tuple[ProblemRow, ...] = ()  # every problem of the entry, degenerate ones included, by (level, id)
    include_degenerate: bool = False
    env: dict = field(default_factory=dict)  # "gpu" / "torch" / "cuda" -> the values its verdicts name
    trajectories: dict = field(default_factory=dict)  # (level, id) -> href of the agent's trajectory page (HTML)

    @property
    def name(self) -> str:
        return self.submission["name"]

    @property
    def key(self) -> str:
        """`name@mode@precision`, as --compare takes it."""
        return f"{self.name}@{self.timing_mode}@{self.precision}"

    @property
    def title(self) -> str:
        s = self.submission
        levels = ",".join(map(str, s["levels"])) if s.get("levels") else "?"
        return (f"{s['name']}  ({s.get('kb_version') or 'task set'}, levels {levels}, timing {self.timing_mode},"
                f" precision {self.precision})")

    @property
    def n_degenerate(self) -> int:
        return sum(1 for row in self.rows if row.degenerate)

    @property
    def degenerate_note(self) -> str | None:
        n = self.n_degenerate
        if not n:
            return None
        problems = "problem" if n == 1 else "problems"
        if self.include_degenerate:
            return f"{n} degenerate {problems} counted in the metrics (marked in the per-problem table)"
        return f"{n} degenerate {problems} left out (--include-degenerate to count them)"

    @property
    def gpus(self) -> list[str]:
        return self.env.get("gpu", [])

    @property
    def env_line(self) -> str:
        """`GPU NVIDIA H200 · torch 2.11.0 · CUDA 13.0` (every value the verdicts name), or ""."""
        labels = (("gpu", "GPU"), ("torch", "torch"), ("cuda", "CUDA"))
        return " · ".join(f"{label} {', '.join(self.env[key])}" for key, label in labels if self.env.get(key))


@dataclass(frozen=True)
class Comparison:
    """Two entries side by side, per problem and in their metrics."""

    a: Entry
    b: Entry
    title: str

    def pairs(self) -> list[tuple[ProblemRow | None, ProblemRow | None]]:
        """(row of A, row of B) for every problem of either, by (level, problem id)."""
        a = {row.key: row for row in self.a.rows}
        b = {row.key: row for row in self.b.rows}
        keys = sorted(dict.fromkeys(list(a) + list(b)), key=lambda k: tuple((x is None, x or 0) for x in k))
        return [(a.get(key), b.get(key)) for key in keys]


def expected_problems(kb_version: str, levels: list[int]) -> list[tuple[int, int]]:
    """(level, problem_id) of the KernelBench problems of a version and levels."""
    from cudagym.kernelbench import load_problems

    return [(task.level, task.problem_id) for task in load_problems(version=kb_version, levels=tuple(levels))]


def problem_row(verdict: dict) -> ProblemRow:
    """A verdict as a per-problem row (speedups derived from the times when a correct verdict lacks them)."""
    correct = bool(verdict.get("correct"))
    t_ms = _number(verdict.get("t_candidate_ms"))
    times = {base: _number(verdict.get(f"t_{base}_ms")) for base in ("eager", "compile")}
    speedups = {}
    for base, t_ref in times.items():
        speedup = _number(verdict.get(f"speedup_vs_{base}"))
        if speedup is None and correct and t_ms and t_ref:
            speedup = t_ref / t_ms
        speedups[base] = speedup
    env = verdict.get("env") or {}
    timing = verdict.get("timing") or {}
    details = verdict.get("flag_details") or timing.get("flag_details") or {}
    level, pid = verdict.get("level"), verdict.get("problem_id")
    degenerate = verdict.get("degenerate")
    return ProblemRow(
        level=None if level is None else int(level), problem_id=None if pid is None else int(pid),
        name=str(verdict.get("name") or ""), status=str(verdict.get("status") or ("pass" if correct else "?")),
        reason=verdict.get("reason") or None, flags=tuple(str(f) for f in verdict.get("flags") or ()),
        flag_details=details if isinstance(details, dict) else {},
        t_eager_ms=times["eager"], t_compile_ms=times["compile"], t_candidate_ms=t_ms,
        speedup_vs_eager=speedups["eager"], speedup_vs_compile=speedups["compile"],
        reward=verdict.get("reward"),
        sol_ms=sol_ms(verdict.get("cost"), env.get("gpu"), verdict.get("precision") or "strict"),
        degenerate=(str(degenerate) if isinstance(degenerate, str) else "degenerate") if degenerate else None)


def build_entries(store: Store, include_degenerate: bool = False) -> list[Entry]:
    """Every (submission, timing mode, precision): strict first, then best overall geomean_all_vs_compile."""
    submissions = _merged_submissions(store.submissions())
    verdicts = {}
    for submission in submissions:
        rows = store.verdicts(submission["name"])
        if submission.get("kb_version"):
            rows = [v for v in rows if v.get("kb_version") == submission["kb_version"]]
        verdicts[submission["name"]] = rows
    known = _known_problems([v for rows in verdicts.values() for v in rows])
    entries = []
    for submission in submissions:
        expected, note = _problem_set(submission)
        default = (submission.get("timing_mode") or "strict", submission.get("precision") or "strict")
        groups: dict[tuple[str, str], list[dict]] = {default: []} if not verdicts[submission["name"]] else {}
        for verdict in verdicts[submission["name"]]:
            group = (verdict.get("timing_mode") or default[0], verdict.get("precision") or "strict")
            groups.setdefault(group, []).append(verdict)
        for (mode, precision), group in groups.items():
            entries.append(_entry(submission, mode, precision, group, expected, note, known, include_degenerate))
    return sorted(entries, key=lambda e: (e.timing_mode != "strict", e.timing_mode, e.precision != "strict",
                                          e.precision, -(e.metrics["overall"]["geomean_all_vs_compile"] or 0)))


def resolve_entry(entries: list[Entry], spec: str) -> Entry:
    """The entry `spec` names: `name@mode@precision`, `name@mode` or `name`; ValueError (one line) if none or several.

    With the precision (or mode) left out, the strict one is taken when there is one, else the only one.
    """
    spec = spec.strip()
    candidates: list[tuple[str, str | None, str | None]] = [(spec, None, None)]
    parts = spec.split("@")
    if len(parts) >= 2:
        candidates.append(("@".join(parts[:-1]), parts[-1], None))
    if len(parts) >= 3:
        candidates.append(("@".join(parts[:-2]), parts[-2], parts[-1]))
    for name, mode, precision in candidates:
        found = [e for e in entries if e.name == name and mode in (None, e.timing_mode)
                 and precision in (None, e.precision)]
        if len(found) > 1:  # what was left out defaults to strict
            preferred = [e for e in found if (mode is not None or e.timing_mode == "strict")
                         and (precision is not None or e.precision == "strict")]
            found = preferred if len(preferred) == 1 else found
        if len(found) == 1:
            return found[0]
        if found:
            raise ValueError(f"{spec!r} names several leaderboard entries ({', '.join(e.key for e in found)});"
                             " say which as name@mode@precision")
    keys = ", ".join(e.key for e in entries) or "none"
    raise ValueError(f"no leaderboard entry {spec!r} (entries: {keys})")


def parse_compare(text: str) -> tuple[str, str]:
    """`A,B` -> (A, B); ValueError (one line) unless there are exactly two non-empty names."""
    parts = [p.strip() for p in text.split(",")]
    if len(parts) != 2 or not all(parts):
        raise ValueError(f"--compare takes two entries, A,B (name, name@mode or name@mode@precision), not {text!r}")
    return parts[0], parts[1]


def auto_comparisons(entries: list[Entry]) -> list[Comparison]:
    """Strict vs paper timing of every submission that has both, one per precision."""
    by_key = {(e.name, e.timing_mode, e.precision): e for e in entries}
    out = []
    for e in entries:
        paper = by_key.get((e.name, "paper", e.precision))
        if e.timing_mode == "strict" and paper is not None:
            out.append(Comparison(e, paper, f"{e.name}: strict vs paper timing (precision {e.precision})"))
    return out


def comparisons(entries: list[Entry], compare: str | None = None, auto: bool = True) -> list[Comparison]:
    """The --compare pair (first), then the automatic strict-vs-paper ones not already asked for."""
    out = []
    if compare:
        a, b = (resolve_entry(entries, spec) for spec in parse_compare(compare))
        if a is b:
            raise ValueError(f"--compare names the same entry twice ({a.key})")
        out.append(Comparison(a, b, f"{a.key} vs {b.key}"))
    if auto:
        asked = {(c.a.key, c.b.key) for c in out} | {(c.b.key, c.a.key) for c in out}
        out += [c for c in auto_comparisons(entries) if (c.a.key, c.b.key) not in asked]
    return out


# -- terminal -----------------------------------------------------------------------------------------
def show(store: Store, console: Console | None = None, include_degenerate: bool = False,
         compare: str | None = None) -> None:
    """Print a table per entry (overall and per level), grouped by timing mode and precision; then --compare."""
    console = console or Console()
    entries = build_entries(store, include_degenerate)
    pair = comparisons(entries, compare, auto=False) if compare else []  # bad --compare: fail before printing
    if not entries:
        console.print("no submissions in the store")
    group = None
    for entry in entries:
        if (entry.timing_mode, entry.precision) != group:
            group = (entry.timing_mode, entry.precision)
            console.rule(Text(f"timing mode: {entry.timing_mode} · precision: {entry.precision}"))
        table = Table(title=Text(entry.title))
        table.add_column("")
        for header, _, _ in COLUMNS:
            table.add_column(header, justify="right")
        for scope, metrics in entry.metrics.items():
            table.add_row(scope, *(_format(_get(metrics, path), kind) for _, path, kind in COLUMNS))
        console.print(table)
        for note in (entry.note, entry.degenerate_note):
            if note:
                console.print(Text(note, style="dim"))
    for comparison in pair:
        _show_comparison(comparison, console)


def _show_comparison(c: Comparison, console: Console) -> None:
    console.rule(Text(f"compare: A = {c.a.key}, B = {c.b.key}"))
    metrics = Table(title=Text("metrics"))
    metrics.add_column("scope")
    metrics.add_column("")
    for header, _, _ in COLUMNS + (PAGE_COLUMNS[-1],):
        metrics.add_column(header, justify="right")
    for scope in dict.fromkeys(list(c.a.metrics) + list(c.b.metrics)):
        for label, entry in (("A", c.a), ("B", c.b)):
            if scope in entry.metrics:
                m = entry.metrics[scope]
                metrics.add_row(scope, label, *(_format(_get(m, p), k) for _, p, k in COLUMNS + (PAGE_COLUMNS[-1],)))
    console.print(metrics)
    table = Table(title=Text("per problem (ms: candidate median; x: speedup)"))
    for header in ("L", "id", "name", "A status", "A ms", "A vs eager", "A vs compile",
                   "B status", "B ms", "B vs eager", "B vs compile", "B/A ms"):
        text = header in ("name", "A status", "B status")
        table.add_column(header, justify="left" if text else "right", overflow="fold", no_wrap=not text)
    for a, b in c.pairs():
        row = a or b
        cells = [str(row.level), str(row.problem_id), row.name + (" [degenerate]" if row.degenerate else "")]
        for side in (a, b):
            cells += ["-", "-", "-", "-"] if side is None else [side.status, _ms(side.t_candidate_ms),
                                                                _x(side.speedup_vs_eager), _x(side.speedup_vs_compile)]
        cells.append(_ratio_text(a, b))
        table.add_row(*cells)
    console.print(table)


# -- HTML ---------------------------------------------------------------------------------------------
def trajectory_page(level: int, problem_id: int) -> str:
    """The file name of a problem's trajectory page in a submission's `trajectories/` folder."""
    return f"level{level}_{problem_id}.html"


def write_html(store: Store, out_dir: str | Path, include_degenerate: bool = False, compare: str | None = None) -> Path:
    """Write a self-contained `index.html` (tables, inline SVG plots) into out_dir; return its path.

    A submission written by `cudagym agent rollout` holds `trajectories/level{L}_{id}.html`: those pages
    are copied to out_dir/trajectories/<submission>/ and each problem's name links to its page."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    entries = [replace(e, trajectories=_copy_trajectory_pages(e, out_dir)) for e in build_entries(store, include_degenerate)]
    pairs = comparisons(entries, compare)
    path = out_dir / "index.html"
    path.write_text(render_html(entries, pairs))
    return path


def _copy_trajectory_pages(entry: Entry, out_dir: Path) -> dict:
    """Copy the pages beside the entry's submission (if any) into out_dir; (level, id) -> relative href."""
    source = Path(entry.submission.get("path") or "") / TRAJECTORY_PAGES
    if not entry.submission.get("path") or not source.is_dir():
        return {}
    target = out_dir / TRAJECTORY_PAGES / _slug(entry.name)
    links = {}
    for row in entry.rows:
        if row.level is None or row.problem_id is None:
            continue
        page = source / trajectory_page(row.level, row.problem_id)
        if page.is_file():
            target.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(page, target / page.name)
            links[row.key] = f"{TRAJECTORY_PAGES}/{_slug(entry.name)}/{page.name}"
    return links


def render_html(entries: list[Entry], pairs: list[Comparison] = ()) -> str:
    anchors = _anchors(entries)
    body = [] if entries else ["<p>No submissions in the store.</p>"]
    if entries:
        body.append(_contents(entries, pairs, anchors))
        body.append('<h2 id="overview">Overview</h2>')
        body.append(_overview_table(entries, anchors))
    if pairs:
        body.append('<h2 id="comparisons">Side by side</h2>')
        for i, c in enumerate(pairs):
            body.append(_comparison_html(c, f"cmp-{i}", anchors))
    group = None
    for entry in entries:
        if (entry.timing_mode, entry.precision) != group:
            group = (entry.timing_mode, entry.precision)
            body.append(f"<h2>Timing mode: {_e(entry.timing_mode)} · precision: {_e(entry.precision)}</h2>")
        body.append(_entry_html(entry, anchors[entry.key]))
    body.append(_LEGEND)
    return _PAGE.format(body="\n".join(body), script=_SCRIPT)


def _entry_html(entry: Entry, anchor: str) -> str:
    parts = [f'<section id="{anchor}"><h3>{_e(entry.title)}</h3>',
             f'<p class="sub"><code>{_e(entry.key)}</code>{" · " + _e(entry.env_line) if entry.env_line else ""}</p>']
    for note, cls in ((entry.note, "note"), (entry.degenerate_note, "note degen-note")):
        if note:
            parts.append(f'<p class="{cls}">{_e(note)}</p>')
    parts.append(_html_table(entry.metrics))
    parts.append(speedup_svg(entry.results))
    parts.append(f"<details open><summary>Per-problem results ({len(entry.rows)} problems;"
                 " click a column to sort)</summary>")
    if entry.trajectories:
        parts.append(f'<p class="sub">{len(entry.trajectories)} problem names link to the agent\'s trajectory.</p>')
    parts.append(problem_table(entry.rows, entry.include_degenerate, entry.trajectories))
    parts.append("</details></section>")
    return "\n".join(parts)


_TEXT_HEADERS = ("name", "status", "reason", "flags", "degenerate")
_TEXT_TH = ' class="txt"'
PROBLEM_HEADERS = (
    ("L", "level"), ("id", "problem id"), ("name", "problem name"), ("status", "verdict status"),
    ("reason", "why it is not a pass (hover for all of it)"), ("flags", "hack checks that fired (hover for details)"),
    ("eager ms", "PyTorch eager reference, median"), ("compile ms", "torch.compile reference, median"),
    ("candidate ms", "the submission's kernel, median"), ("vs eager", "eager ms / candidate ms"),
    ("vs compile", "compile ms / candidate ms"), ("reward", "milestone reward: -1, 1, 2, 3"),
    ("SOL ms", "speed of light: max(FLOPs / peak fp32, bytes / peak bandwidth)"),
    ("x SOL", "candidate ms / SOL ms: 1 is the speed of light"),
    ("degenerate", "the audit: the check cannot tell a real kernel from a trivial one"),
)


def problem_table(rows: list[ProblemRow] | tuple[ProblemRow, ...], include_degenerate: bool = False,
                  links: dict | None = None) -> str:
    """The per-problem table (sortable by clicking a header); `links`: (level, id) -> href for the name."""
    head = "".join(f'<th title="{_e(tip)}"{_TEXT_TH if h in _TEXT_HEADERS else ""}>{_e(h)}</th>'
                   for h, tip in PROBLEM_HEADERS)
    body = []
    for r in rows:
        cls = f"st-{_slug(r.status)}" + (" degen" if r.degenerate else "")
        cells = [_num_td(r.level, str(r.level) if r.level is not None else "-"),
                 _num_td(r.problem_id, str(r.problem_id) if r.problem_id is not None else "-"),
                 f'<td class="name">{_linked((links or {}).get(r.key), _name(r.name))}{_degen_badge(r.degenerate)}</td>',
                 f'<td class="status"><span class="st {_e(_slug(r.status))}">{_e(r.status)}</span></td>',
                 _reason_td(r.reason), _flags_td(r.flags, r.flag_details),
                 _num_td(r.t_eager_ms, _ms(r.t_eager_ms)), _num_td(r.t_compile_ms, _ms(r.t_compile_ms)),
                 _num_td(r.t_candidate_ms, _ms(r.t_candidate_ms)),
                 _num_td(r.speedup_vs_eager, _x(r.speedup_vs_eager), _speed_cls(r.speedup_vs_eager)),
                 _num_td(r.speedup_vs_compile, _x(r.speedup_vs_compile), _speed_cls(r.speedup_vs_compile)),
                 _num_td(r.reward, "-" if r.reward is None else str(r.reward)),
                 _num_td(r.sol_ms, _ms(r.sol_ms)), _num_td(r.x_sol, _x(r.x_sol, digits=3)),
                 _degen_td(r.degenerate, include_degenerate)]
        body.append(f'<tr class="{cls}">{"".join(cells)}</tr>')
    return (f'<div class="scroll"><table class="sortable problems"><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(body)}</tbody></table></div>')


def _comparison_html(c: Comparison, anchor: str, anchors: dict[str, str]) -> str:
    a_link = f'<a href="#{anchors[c.a.key]}"><code>{_e(c.a.key)}</code></a>'
    b_link = f'<a href="#{anchors[c.b.key]}"><code>{_e(c.b.key)}</code></a>'
    parts = [f'<section id="{anchor}" class="compare"><h3>{_e(c.title)}</h3>',
             f"<p class=sub>A = {a_link} · B = {b_link}</p>"]
    if c.a.n_degenerate or c.b.n_degenerate:
        verb = "counted" if c.a.include_degenerate else "left out (--include-degenerate to count them)"
        parts.append(f'<p class="note degen-note">Degenerate problems {verb}: A {c.a.n_degenerate},'
                     f" B {c.b.n_degenerate}</p>")
    # metrics: both rows per scope (the entries' own sections have every column)
    head = "".join(f"<th>{_e(h)}</th>" for h, _, _ in COMPARE_COLUMNS)
    rows = []
    for scope in dict.fromkeys(list(c.a.metrics) + list(c.b.metrics)):
        for label, entry in (("A", c.a), ("B", c.b)):
            if scope in entry.metrics:
                m = entry.metrics[scope]
                cells = "".join(f"<td>{_format(_get(m, path), kind)}</td>" for _, path, kind in COMPARE_COLUMNS)
                rows.append(f'<tr class="side-{label.lower()}"><th>{_e(scope)}</th><th>{label}</th>{cells}</tr>')
    parts.append(f'<div class="row"><table class="metrics"><thead><tr><th>scope</th><th></th>{head}</tr></thead>'
                 f'<tbody>{"".join(rows)}</tbody></table>{compare_svg(c)}</div>')
    # per problem
    side_heads = ("status", "candidate ms", "vs eager", "vs compile", "x SOL")
    group = (f'<tr><th colspan="3"></th><th colspan="{len(side_heads)}" class="side-a">A: {_e(c.a.key)}</th>'
             f'<th colspan="{len(side_heads)}" class="side-b">B: {_e(c.b.key)}</th><th></th></tr>')
    heads = ("L", "id", "name") + side_heads + side_heads + ("B/A ms",)
    cols = "".join(f"<th{_TEXT_TH if h in _TEXT_HEADERS else ''}>{_e(h)}</th>" for h in heads)
    body = []
    for a, b in c.pairs():
        row = a or b
        degenerate = (a and a.degenerate) or (b and b.degenerate)
        cells = [_num_td(row.level, str(row.level)), _num_td(row.problem_id, str(row.problem_id)),
                 f'<td class="name">{_name(row.name)}{_degen_badge(degenerate)}</td>']
        for side, cls in ((a, "side-a"), (b, "side-b")):
            if side is None:
                cells += [f'<td class="{cls} status">-</td>'] + ['<td class="num" data-v="">-</td>'] * 4
                continue
            cells += [f'<td class="{cls} status"><span class="st {_e(_slug(side.status))}"'
                      f' title="{_e(side.reason or "")}">{_e(side.status)}</span></td>',
                      _num_td(side.t_candidate_ms, _ms(side.t_candidate_ms)),
                      _num_td(side.speedup_vs_eager, _x(side.speedup_vs_eager), _speed_cls(side.speedup_vs_eager)),
                      _num_td(side.speedup_vs_compile, _x(side.speedup_vs_compile),
                              _speed_cls(side.speedup_vs_compile)),
                      _num_td(side.x_sol, _x(side.x_sol, digits=3))]
        ratio = (b.t_candidate_ms / a.t_candidate_ms) if a and b and a.t_candidate_ms and b.t_candidate_ms else None
        cells.append(_num_td(ratio, _ratio_text(a, b)))
        body.append(f'<tr class="{"degen" if degenerate else ""}">{"".join(cells)}</tr>')
    parts.append("<details open><summary>Per problem, side by side (click a column to sort)</summary>")
    parts.append(f'<div class="scroll"><table class="sortable problems compare"><thead>{group}<tr>{cols}</tr></thead>'
                 f'<tbody>{"".join(body)}</tbody></table></div></details></section>')
    return "\n".join(parts)


def _overview_table(entries: list[Entry], anchors: dict[str, str]) -> str:
    columns = (("n", ("n",), "count"), ("pass", ("pass_rate",), "rate"),
               ("faster than compile", ("faster_than_compile_rate",), "rate"),
               ("geomean all vs compile", ("geomean_all_vs_compile",), "speedup"),
               ("geomean correct vs compile", ("geomean_correct_vs_compile",), "speedup"),
               ("fast_1 vs eager", ("fast_p_vs_eager", "1"), "rate"),
               ("degenerate left out", ("n_degenerate_excluded",), "count"))
    head = "".join(f"<th>{_e(h)}</th>" for h, _, _ in columns)
    rows = []
    for e in entries:
        m = e.metrics["overall"]
        cells = "".join(_num_td(_get(m, path), _format(_get(m, path), kind)) for _, path, kind in columns)
        rows.append(f'<tr><td class="name"><a href="#{anchors[e.key]}">{_e(e.name)}</a></td>'
                    f"<td>{_e(e.timing_mode)}</td><td>{_e(e.precision)}</td>"
                    f'<td>{_e(", ".join(e.gpus) or "-")}</td>{cells}</tr>')
    return (f'<table class="sortable overview"><thead><tr><th>submission</th><th>timing</th><th>precision</th>'
            f'<th>GPU</th>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'
            '<p class="note">Overall metrics of each entry (click a column to sort); per-level tables below.</p>')


def _contents(entries: list[Entry], pairs: list[Comparison], anchors: dict[str, str]) -> str:
    items = ['<li><a href="#overview">Overview</a></li>']
    for i, c in enumerate(pairs):
        items.append(f'<li><a href="#cmp-{i}">{_e(c.title)}</a></li>')
    items += [f'<li><a href="#{anchors[e.key]}"><code>{_e(e.key)}</code></a></li>' for e in entries]
    return f'<nav><ul>{"".join(items)}</ul></nav>'


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


def compare_svg(c: Comparison, size: int = 300) -> str:
    """Speedup vs torch.compile under A (x) against B (y), log-log, for problems correct and timed in both."""
    points = [(a.speedup_vs_compile, b.speedup_vs_compile, a.level, a.problem_id) for a, b in c.pairs()
              if a and b and a.speedup_vs_compile and b.speedup_vs_compile]
    caption = (f"speedup vs torch.compile, A (x) against B (y): {len(points)} problems correct and timed in both;"
               " above the diagonal B is faster; colour = level as in the plots below")
    pad, plot = 44, size - 60
    values = [v for p in points for v in p[:2]] + [1.0]
    lo, hi = math.log10(min(values) / 1.25), math.log10(max(values) * 1.25)

    def at(speedup: float) -> float:
        return plot * (math.log10(speedup) - lo) / (hi - lo)

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{size}" height="{size}" role="img">',
             f"<title>{html.escape(caption)}</title>",
             f'<rect x="{pad}" y="8" width="{plot}" height="{plot}" fill="none" stroke="#999"/>',
             f'<line class="diag" x1="{pad}" y1="{8 + plot}" x2="{pad + plot}" y2="8" stroke="#444"'
             ' stroke-dasharray="4 3"/>']
    for tick in _log_ticks(lo, hi):
        t = at(tick)
        parts.append(f'<text x="{pad - 4}" y="{8 + plot - t + 4:.1f}" text-anchor="end" font-size="10">{tick:g}x</text>'
                     f'<text x="{pad + t:.1f}" y="{plot + 22}" text-anchor="middle" font-size="10">{tick:g}x</text>')
    parts.append(f'<text x="{pad + plot / 2}" y="{size - 6}" text-anchor="middle" font-size="11">A</text>'
                 f'<text x="10" y="{8 + plot / 2}" font-size="11">B</text>')
    for sa, sb, level, pid in points:
        parts.append(f'<circle cx="{pad + at(sa):.1f}" cy="{8 + plot - at(sb):.1f}" r="3"'
                     f' fill="{LEVEL_COLORS.get(level, "#777")}"><title>L{level}/{pid}: A {sa:.3g}x, B {sb:.3g}x'
                     "</title></circle>")
    parts.append("</svg>")
    return f'<figure class="scatter">{"".join(parts)}<figcaption>{html.escape(caption)}</figcaption></figure>'


# -- helpers ------------------------------------------------------------------------------------------
def _entry(submission: dict, mode: str, precision: str, group: list[dict], expected, note: str | None,
           known: dict, include_degenerate: bool) -> Entry:
    """One entry: the group's verdicts plus a "missing" verdict for every expected problem without one."""
    have = {(int(v["level"]), int(v["problem_id"])) for v in group
            if v.get("level") is not None and v.get("problem_id") is not None}
    kb = submission.get("kb_version") or ""
    missing = [] if expected is None else [
        {"level": level, "problem_id": pid, "kb_version": kb or None, "status": "missing", "correct": False,
         "reason": MISSING_REASON, "flags": [], "reward": -1, "timing_mode": mode, "precision": precision,
         **known.get((kb, level, pid), {})}
        for level, pid in dict.fromkeys((int(level), int(pid)) for level, pid in expected) if (level, pid) not in have]
    verdicts = group + missing
    latest: dict[tuple, dict] = {}
    for i, v in enumerate(verdicts):
        key = (v.get("level"), v.get("problem_id"))
        latest[("row", i) if None in key else (int(key[0]), int(key[1]))] = v
    if expected is not None:
        keys = set(dict.fromkeys((int(level), int(pid)) for level, pid in expected))
        latest = {k: v for k, v in latest.items() if k in keys}
    rows = sorted((problem_row(v) for v in latest.values()),
                  key=lambda r: (r.level is None, r.level or 0, r.problem_id is None, r.problem_id or 0))
    env = {key: sorted({str((v.get("env") or {}).get(key)) for v in group if (v.get("env") or {}).get(key)})
           for key in ("gpu", "torch", "cuda")}
    return Entry(submission, mode, compute_metrics(verdicts, expected, include_degenerate),
                 problem_results(verdicts, expected, include_degenerate), note, precision, tuple(rows),
                 include_degenerate, env)


def _merged_submissions(submissions: list[dict]) -> list[dict]:
    """One dict per submission name (a store may list a name once per mode): levels merged, first one's rest."""
    merged: dict[str, dict] = {}
    for s in submissions:
        if s["name"] not in merged:
            merged[s["name"]] = dict(s)
        elif s.get("levels"):
            old = merged[s["name"]].get("levels") or []
            merged[s["name"]]["levels"] = sorted(set(old) | set(s["levels"]))
    return list(merged.values())


def _known_problems(verdicts: list[dict]) -> dict[tuple, dict]:
    """(kb_version, level, id) -> name, degenerate reason and cost, from any stored verdict of that problem."""
    known: dict[tuple, dict] = {}
    for v in verdicts:
        if v.get("level") is None or v.get("problem_id") is None:
            continue
        info = known.setdefault((v.get("kb_version") or "", int(v["level"]), int(v["problem_id"])), {})
        for key in ("name", "degenerate", "cost", "env"):
            if v.get(key) and not info.get(key):
                info[key] = v[key]
    return known


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


def _anchors(entries: list[Entry]) -> dict[str, str]:
    out: dict[str, str] = {}
    for e in entries:
        base = "e-" + _slug(e.key)
        anchor, i = base, 1
        while anchor in out.values():
            i += 1
            anchor = f"{base}-{i}"
        out[e.key] = anchor
    return out


def _html_table(metrics: dict) -> str:
    head = "".join(f"<th>{html.escape(header)}</th>" for header, _, _ in PAGE_COLUMNS)
    rows = []
    for scope, m in metrics.items():
        cells = "".join(f"<td>{_format(_get(m, path), kind)}</td>" for _, path, kind in PAGE_COLUMNS)
        rows.append(f"<tr><th>{_e(scope)}</th>{cells}</tr>")
    return f'<table class="metrics"><thead><tr><th></th>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'


def _num_td(value, text: str, cls: str = "") -> str:
    raw = "" if value is None or (isinstance(value, float) and not math.isfinite(value)) else f"{value}"
    return f'<td class="num{" " + cls if cls else ""}" data-v="{_e(raw)}">{_e(text)}</td>'


def _reason_td(reason: str | None) -> str:
    if not reason:
        return "<td></td>"
    short = reason if len(reason) <= REASON_CHARS else reason[:REASON_CHARS - 1].rstrip() + "…"
    return f'<td class="reason" title="{_e(reason)}">{_e(short)}</td>'


def _flags_td(flags: tuple[str, ...], details: dict) -> str:
    spans = []
    for flag in flags:
        detail = details.get(flag)
        tip = "; ".join(map(str, detail)) if isinstance(detail, (list, tuple)) else str(detail or "")
        spans.append(f'<span class="flag" title="{_e(tip)}">{_name(flag)}</span>')
    return f'<td class="flags">{" ".join(spans)}</td>'


def _degen_badge(reason: str | None) -> str:
    return f' <span class="badge" title="{_e(reason)}">degenerate</span>' if reason else ""


def _degen_td(reason: str | None, counted: bool) -> str:
    if not reason:
        return "<td></td>"
    state = "counted" if counted else "not counted"
    return f'<td class="degen-reason" title="{_e(reason)}"><em>{state}:</em> {_e(reason)}</td>'


def _speed_cls(speedup: float | None) -> str:
    if speedup is None:
        return ""
    return "fast" if speedup > 1.0 else "slow"


def _ratio_text(a: ProblemRow | None, b: ProblemRow | None) -> str:
    if not (a and b and a.t_candidate_ms and b.t_candidate_ms):
        return "-"
    return f"{b.t_candidate_ms / a.t_candidate_ms:.2f}"


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]+", "-", text).strip("-") or "x"


def _number(value) -> float | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def _ms(value: float | None) -> str:
    if value is None:
        return "-"
    if value >= 100:
        return f"{value:.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.3g}"


def _x(value: float | None, digits: int = 0) -> str:
    if value is None:
        return "-"
    if digits:
        return f"{value:.{digits}g}x"
    return f"{value:.2f}x" if value < 100 else f"{value:.0f}x"


def _linked(href: str | None, inner: str) -> str:
    return f'<a href="{_e(href)}" title="the agent\'s trajectory">{inner}</a>' if href else inner


def _name(name: str) -> str:
    """A problem name, escaped, that may wrap after its underscores."""
    return _e(name).replace("_", "_<wbr>")


def _e(text) -> str:
    return html.escape(str(text), quote=True)


def _log_ticks(lo: float, hi: float) -> list[float]:
    """1-2-5 ticks between 10**lo and 10**hi."""
    ticks = []
    for exponent in range(math.floor(lo), math.ceil(hi) + 1):
        ticks += [m * 10.0**exponent for m in (1, 2, 5) if lo <= math.log10(m * 10.0**exponent) <= hi]
    return ticks


def _get(metrics: dict, path: tuple[str, ...]):
    for key in path:
        metrics = metrics.get(key) if isinstance(metrics, dict) else None
    return metrics


def _format(value, kind: str) -> str:
    if value is None:
        return "-"
    if kind == "count":
        return str(value)
    if kind == "rate":
        return f"{100 * value:.1f}%"
    return f"{value:.2f}x"


_LEGEND = """<h2 id="columns">Columns</h2>
<dl class="legend">
<dt>status, reason, flags</dt><dd>The verdict: <code>pass</code>, <code>incorrect</code>, <code>compile_error</code>,
<code>runtime_error</code>, <code>timeout</code>, <code>rejected</code> (a hack check fired; the flags say which, hover
for what fired), or <code>missing</code> (no verdict stored; counts as failed).</dd>
<dt>eager ms, compile ms, candidate ms</dt><dd>Medians of the PyTorch eager reference, the torch.compile reference
and the candidate, in the entry's timing mode.</dd>
<dt>vs eager, vs compile</dt><dd>Reference time over candidate time (above 1: the candidate is faster), for correct
candidates only.</dd>
<dt>reward</dt><dd>Milestone reward: -1 not correct, 1 correct, 2 also &gt;5% faster than eager, 3 also &gt;5% faster
than torch.compile.</dd>
<dt>SOL ms, x SOL</dt><dd>Speed of light: max(FLOPs / peak fp32 FLOP/s, bytes / peak DRAM bandwidth) of the problem
on the verdict's GPU; x SOL = candidate ms / SOL ms (1 is the speed of light; blank for an unknown GPU or a problem
without a measured cost).</dd>
<dt>degenerate</dt><dd>The audit found that the problem's correctness check cannot tell a real kernel from a trivial
one (e.g. it accepts zeros); such problems are left out of the metrics unless the page was built with
<code>--include-degenerate</code>.</dd>
</dl>"""

_SCRIPT = """<script>
for (const table of document.querySelectorAll("table.sortable")) {
  const heads = table.tHead.rows[table.tHead.rows.length - 1].cells;
  Array.from(heads).forEach((th, i) => th.addEventListener("click", () => {
    const asc = th.dataset.dir !== "asc";
    for (const h of heads) delete h.dataset.dir;
    th.dataset.dir = asc ? "asc" : "desc";
    const value = row => {
      const c = row.cells[i];
      return c.dataset.v !== undefined ? c.dataset.v : c.textContent.trim();
    };
    const rows = Array.from(table.tBodies[0].rows).sort((a, b) => {
      const x = value(a), y = value(b);
      if (x === "" || y === "") return (x === "") - (y === "");
      const d = isNaN(x) || isNaN(y) ? x.localeCompare(y) : x - y;
      return asc ? d : -d;
    });
    table.tBodies[0].append(...rows);
  }));
}
</script>"""

_PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>cudagym leaderboard</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 1.5em; color: #222; max-width: 1600px; }}
h2 {{ border-bottom: 2px solid #ddd; padding-bottom: 0.2em; margin-top: 1.6em; }}
h3 {{ margin-bottom: 0.2em; }}
section {{ margin-bottom: 2.5em; }}
table {{ border-collapse: collapse; margin: 0.5em 0; font-size: 0.9em; }}
th, td {{ border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: right; }}
table.problems th, table.problems td {{ padding: 0.2em 0.45em; }}
thead th {{ background: #f3f3f3; }}
tbody th {{ text-align: left; }}
table.sortable thead tr:last-child th {{ cursor: pointer; }}
table.sortable th[data-dir="asc"]::after {{ content: " \\25B2"; }}
table.sortable th[data-dir="desc"]::after {{ content: " \\25BC"; }}
table.problems {{ font-size: 0.85em; }}
table.problems td {{ white-space: nowrap; }}
table.problems td.name {{ white-space: normal; min-width: 10em; max-width: 14em; }}
table.problems td.flags {{ white-space: normal; max-width: 10em; }}
table.compare td.name {{ max-width: 22em; }}
div.scroll {{ overflow-x: auto; }}
table.problems tbody tr:nth-child(even) {{ background: #fafafa; }}
td.name, td.reason, td.flags, td.degen-reason, td.status, th.txt {{ text-align: left; }}
table.overview td:nth-child(-n+4) {{ text-align: left; white-space: nowrap; }}
table.metrics thead th, table.overview thead th {{ max-width: 7.5em; }}
table.problems thead th {{ max-width: 6em; }}
div.row {{ display: flex; gap: 2em; align-items: flex-start; flex-wrap: wrap; }}
td.reason {{ max-width: 11em; overflow: hidden; text-overflow: ellipsis; color: #555; }}
table.problems td.degen-reason {{ white-space: normal; min-width: 9em; max-width: 12em; color: #8a5a00;
                                  font-size: 0.9em; }}
td.fast {{ color: #176b2c; font-weight: 600; }}
td.slow {{ color: #a33; }}
.st {{ padding: 0 0.4em; border-radius: 3px; font-size: 0.9em; }}
.st.pass {{ background: #d8f0dc; }}
.st.incorrect, .st.runtime_error, .st.compile_error, .st.timeout {{ background: #fde2c8; }}
.st.rejected {{ background: #f8d0d0; font-weight: 600; }}
.st.missing {{ background: #eee; color: #777; }}
.flag {{ background: #f8d0d0; color: #7a1010; border-radius: 3px; padding: 0 0.35em; font-size: 0.85em;
        font-family: ui-monospace, monospace; }}
.badge {{ background: #ffe9a8; color: #6b4a00; border-radius: 3px; padding: 0 0.35em; font-size: 0.8em; cursor: help; }}
tr.degen td {{ background: #fffaeb; }}
tr.degen td.name {{ font-style: italic; }}
.side-a {{ background: #eef4fb; }}
.side-b {{ background: #fbf1ea; }}
.note {{ color: #777; }}
.degen-note {{ color: #8a5a00; }}
.sub {{ color: #555; margin-top: 0; }}
nav ul {{ columns: 2; padding-left: 1.2em; }}
figure {{ margin: 0.5em 0; }}
figure.scatter {{ display: inline-block; }}
figure.scatter figcaption {{ max-width: 300px; }}
figcaption {{ color: #555; font-size: 0.9em; max-width: 640px; }}
summary {{ cursor: pointer; font-weight: 600; margin: 0.4em 0; }}
dl.legend dt {{ font-weight: 600; margin-top: 0.5em; }}
dl.legend dd {{ margin-left: 1.5em; color: #444; max-width: 60em; }}
</style>
</head>
<body>
<h1>cudagym leaderboard</h1>
<p>Metrics over all problems of the selected levels: a missing or failed problem counts as failed, and as
speedup 1.0 in "geomean all". Timing modes and precisions are never mixed in one metric; problems whose check
cannot tell a real kernel from a trivial one (degenerate) are left out unless the page says otherwise.
<code>strict</code> timing flushes L2 and synchronises the device around every rep; <code>paper</code> is CUDA Agent's
profiler method (no flush), for comparison with published numbers.</p>
{body}
{script}
</body>
</html>
"""

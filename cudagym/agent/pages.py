"""One self-contained HTML page per trajectory, beside the submission it produced.

`cudagym agent rollout` writes OUT/submission/trajectories/level{L}_{id}.html for the best rollout of
every problem (correct or not: a failed problem's page says why it failed). The leaderboard's HTML
(cudagym.eval.leaderboard.write_html) copies the pages it finds beside a submission and links each
problem's name to its page; the file naming is the leaderboard's (`trajectory_page`), so eval never
imports the agent.

A page: the rollout's header (task, model, status, stop reason, turns, tokens, reward), every message
in order with its tool calls and each call's result (long texts cut at `MAX_CHARS` with a note), and
the final verdict.
"""

from __future__ import annotations

import json
from html import escape
from pathlib import Path

from cudagym.agent.store import TrajectoryStore
from cudagym.eval.leaderboard import TRAJECTORY_PAGES, trajectory_page

MAX_CHARS = 20_000  # per message or tool output: a 50 MB print must not make a 50 MB page


def write_trajectory_pages(store: TrajectoryStore, best: dict[tuple[int, int], dict], submission: Path) -> int:
    """SUBMISSION/trajectories/level{L}_{id}.html for each (level, problem id) -> rollout row; the count."""
    folder = submission / TRAJECTORY_PAGES
    folder.mkdir(parents=True, exist_ok=True)
    for (level, pid), row in sorted(best.items()):
        rid = row["rollout_id"]
        page = render_trajectory(row, store.messages(rid), store.tool_calls(rid))
        (folder / trajectory_page(level, pid)).write_text(page)
    return len(best)


def render_trajectory(row: dict, messages: list[dict], calls: list[dict]) -> str:
    results = {c["call_id"]: c for c in calls}
    verdict = row.get("verdict") or {}
    tokens = (row.get("prompt_tokens") or 0) + (row.get("completion_tokens") or 0)
    facts = [("task", row.get("task_name") or row.get("task_id")), ("model", row.get("model")),
             ("status", row.get("status")), ("stop", row.get("stop_reason")), ("turns", row.get("turns")),
             ("tokens", tokens), ("wall s", _round(row.get("wall_s"))), ("reward", row.get("reward"))]
    parts = [f"<h1>{_e(row.get('task_name') or row['rollout_id'])}</h1>",
             "<p class=facts>" + " · ".join(f"<b>{_e(k)}</b> {_e(v)}" for k, v in facts if v is not None) + "</p>"]
    if row.get("detail"):
        parts.append(f"<p class=detail>{_e(row['detail'])}</p>")
    for m in messages:
        role = m.get("role") or "?"
        label = f"[{m.get('turn')}] {role}" + (f" ({m['tool_call_id']})" if m.get("tool_call_id") else "")
        parts.append(f'<div class="msg {_e(role)}"><div class=role>{_e(label)}</div>')
        if (m.get("content") or "").strip():
            parts.append(_pre(m["content"]))
        for tc in m.get("tool_calls") or ():
            fn = tc.get("function") or {}
            call = results.get(tc.get("id")) or {}
            mark = "" if call.get("valid", True) else " <span class=bad>invalid</span>"
            parts.append(f"<div class=call>&rarr; <b>{_e(fn.get('name'))}</b>{mark}{_arguments(fn.get('arguments'))}</div>")
        parts.append("</div>")
    parts.append("<h2>Final verdict</h2>")
    summary = " · ".join(f"{k} {verdict[k]}" for k in ("status", "reward", "speedup_vs_compile") if verdict.get(k) is not None)
    parts.append(f"<p>{_e(summary or 'none')}</p>")
    if verdict.get("reason"):
        parts.append(_pre(verdict["reason"]))
    parts.append(f"<details><summary>verdict JSON</summary>{_pre(json.dumps(verdict, indent=1, default=str))}</details>")
    return _PAGE.format(title=_e(row["rollout_id"]), body="\n".join(parts))


def _arguments(raw: str | None) -> str:
    """A call's JSON arguments one per line, strings as written (a kernel reads as code, not as JSON)."""
    try:
        args = json.loads(raw or "{}")
    except ValueError:
        args = None
    if not isinstance(args, dict):
        return _pre(raw or "")
    return "".join(f"<div class=arg>{_e(k)}:</div>{_pre(v if isinstance(v, str) else json.dumps(v))}"
                   for k, v in args.items())


def _pre(text: str) -> str:
    text = str(text)
    note = f"\n[... {len(text) - MAX_CHARS} more characters not shown]" if len(text) > MAX_CHARS else ""
    return f"<pre>{_e(text[:MAX_CHARS] + note)}</pre>"


def _round(value):
    return None if value is None else round(float(value), 1)


def _e(text) -> str:
    return escape(str(text))


_PAGE = """<!doctype html><html><head><meta charset="utf-8"><title>trajectory {title}</title><style>
body{{font:14px system-ui,sans-serif;max-width:1100px;margin:1em auto;padding:0 1em;color:#222}}
pre{{white-space:pre-wrap;word-break:break-word;background:#f6f6f6;padding:.5em;margin:.3em 0;font-size:12px}}
.msg{{border-left:4px solid #ccc;padding-left:.6em;margin:.8em 0}} .msg.assistant{{border-color:#4a7}}
.msg.tool{{border-color:#47a}} .msg.user,.msg.system{{border-color:#aaa}} .role{{color:#666;font-size:12px}}
.bad{{color:#b00}} .arg{{color:#666;font-size:12px}} .facts b{{color:#555}} .detail{{color:#a50}}
</style></head><body>
{body}
</body></html>
"""

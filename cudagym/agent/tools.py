"""The agent's tools: a registry of named functions with their OpenAI function-tool schemas.

Each tool is `fn(env, args) -> ToolResult`, registered with `@tool(name, description, parameters)`.
`call_tool` checks the arguments against the schema (required, types, unknown keys) before the
function runs, so a tool only ever sees well-formed arguments. The file tools (read, write, edit,
glob, grep) run in the environment's process, but only on paths `workdir.resolve` admits: inside
the workdir, no `..`, no symlink leading out. `bash` runs in the sandbox (cudagym.tasks.sandbox);
`verify` and `profile` ask the judge (KernelEnv.judge).
"""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from cudagym.agent.workdir import (CONTROL_DIR, WorkdirError, chown_new, is_protected, read_inside, resolve,
                                   write_inside)

if TYPE_CHECKING:
    from cudagym.agent.environment import KernelEnv

TRUNCATION_NOTE = "\n[cudagym: output truncated: {dropped} of {total} characters cut from the middle]\n"
MAX_LISTED = 500  # glob paths / grep lines listed at most
MAX_GREP_FILE_BYTES = 2 * 2**20  # bigger files are not searched
MAX_TEXT_FILE_BYTES = 8 * 2**20  # read_file / edit_file refuse bigger files (the environment's memory)
JSON_TYPES = {"string": str, "integer": int, "number": (int, float), "boolean": bool, "object": dict}


@dataclass
class ToolResult:
    output: str  # the text the model sees (already truncated to max_output_chars)
    ok: bool = True  # False: the call failed or its arguments were invalid (message in output)
    data: dict | None = None  # structured result: a verify/profile verdict as a dict, a shell's exit and events
    elapsed_s: float = 0.0  # wall time of the tool call
    build_s: float = 0.0  # part of elapsed_s spent compiling


def error(message: str) -> ToolResult:
    return ToolResult(output=f"error: {message}", ok=False)


def truncate(text: str, limit: int, total: int | None = None) -> str:
    """`text` cut to at most `limit` characters, the note included: its head and its tail, with a note
    saying how much went. `total`: the real size when the text is already a head and tail."""
    total = max(total or 0, len(text))
    if total <= limit:
        return text
    budget = max(0, limit - len(TRUNCATION_NOTE.format(dropped=total, total=total)))  # the note fits in `limit` too
    head = budget * 2 // 3
    tail = budget - head
    return text[:head] + TRUNCATION_NOTE.format(dropped=total - head - tail, total=total) + (text[-tail:] if tail else "")


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict  # JSON schema of the arguments (an object)
    run: Callable[["KernelEnv", dict], ToolResult]

    def schema(self) -> dict:
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": self.parameters}}


TOOLS: dict[str, Tool] = {}


def tool(name: str, description: str, properties: dict, required: tuple[str, ...] = ()):
    """Register a tool under its stable name."""

    def register(fn: Callable[["KernelEnv", dict], ToolResult]) -> Callable:
        parameters = {"type": "object", "properties": properties, "required": list(required),
                      "additionalProperties": False}
        TOOLS[name] = Tool(name, description, parameters, fn)
        return fn

    return register


def check_arguments(t: Tool, args: dict) -> str | None:
    """One line saying what is wrong with `args` for tool `t`, or None."""
    props = t.parameters["properties"]
    unknown = sorted(set(args) - set(props))
    if unknown:
        return f"{t.name} takes no argument {', '.join(unknown)} (it takes: {', '.join(props) or 'none'})"
    missing = [k for k in t.parameters["required"] if k not in args]
    if missing:
        return f"{t.name} needs {', '.join(missing)}"
    for key, value in args.items():
        want = props[key]["type"]
        if not isinstance(value, JSON_TYPES[want]) or (want in ("integer", "number") and isinstance(value, bool)):
            return f"{t.name}: {key} must be of type {want}, got {type(value).__name__}"
    return None


def call_tool(env: "KernelEnv", name: str, args: dict) -> ToolResult:
    t = TOOLS.get(name)
    if t is None:
        return error(f"unknown tool {name!r} (tools: {', '.join(TOOLS)})")
    problem = check_arguments(t, args)
    if problem:
        return error(problem)
    try:
        return t.run(env, args)
    except WorkdirError as e:
        return error(str(e))
    except (OSError, UnicodeError) as e:
        return error(f"{name}: {e}")


# -- the shell ---------------------------------------------------------------------------------------
@tool("bash", "Run a bash command in the workdir, in a sandbox: no network, writes only inside the workdir, "
      "no root, time/memory/process limits; background processes end with the call. Output is stdout and "
      "stderr together, truncated if long.",
      {"command": {"type": "string", "description": "the bash command"},
       "timeout": {"type": "number", "description": "seconds (default and maximum: the environment's bash timeout)"}},
      required=("command",))
def bash(env: "KernelEnv", args: dict) -> ToolResult:
    return env.run_shell(args["command"], args.get("timeout"))


# -- files -------------------------------------------------------------------------------------------
@tool("read_file", "Read a text file of the workdir, with line numbers.",
      {"path": {"type": "string", "description": "path relative to the workdir"},
       "offset": {"type": "integer", "description": "first line to show, from 1 (default 1)"},
       "limit": {"type": "integer", "description": "lines to show (default 2000)"}},
      required=("path",))
def read_file(env: "KernelEnv", args: dict) -> ToolResult:
    path = resolve(env.workdir, args["path"], must_exist=True)
    if not path.is_file():
        return error(f"{args['path']}: not a file")
    offset, limit = args.get("offset", 1), args.get("limit", 2000)
    if offset < 1 or limit < 1:
        return error("offset and limit must be at least 1")
    too_big = _too_big(path, args["path"])
    if too_big:
        return too_big
    lines = read_inside(env.workdir.resolve(), path).decode(errors="replace").splitlines()
    shown = lines[offset - 1:offset - 1 + limit]
    text = "".join(f"{offset + i:6d}\t{line}\n" for i, line in enumerate(shown))
    if offset - 1 + limit < len(lines):
        text += f"[{len(lines) - (offset - 1 + limit)} more lines: read on with offset={offset + limit}]\n"
    if not lines:
        text = "(empty file)\n"
    elif not shown:
        text = f"(the file has {len(lines)} lines; offset {offset} is past its end)\n"
    return ToolResult(output=text)


def _too_big(path: Path, given: str) -> ToolResult | None:
    size = path.stat().st_size
    if size > MAX_TEXT_FILE_BYTES:
        return error(f"{given} has {size >> 20} MiB, more than the file tools take ({MAX_TEXT_FILE_BYTES >> 20} MiB): "
                     "look at it with bash (head, sed -n, grep)")
    return None


def _writable(env: "KernelEnv", given: str) -> Path:
    path = resolve(env.workdir, given)
    if is_protected(env.workdir, path):
        raise WorkdirError(f"{given}: protected (model.py, SKILL.md, verify, profile and {CONTROL_DIR}/ cannot be changed)")
    if path.is_dir():
        raise WorkdirError(f"{given}: a directory")
    return path


@tool("write_file", "Create or replace a file of the workdir with the given content.",
      {"path": {"type": "string", "description": "path relative to the workdir"},
       "content": {"type": "string", "description": "the whole new content"}},
      required=("path", "content"))
def write_file(env: "KernelEnv", args: dict) -> ToolResult:
    path = _writable(env, args["path"])
    existed = path.exists()
    path.parent.mkdir(parents=True, exist_ok=True)
    write_inside(env.workdir.resolve(), path, args["content"])
    chown_new(env.workdir, path, *env.ids)
    n = args["content"].count("\n") + (0 if args["content"].endswith("\n") or not args["content"] else 1)
    return ToolResult(output=f"{'replaced' if existed else 'created'} {args['path']} ({n} lines)")


@tool("edit_file", "Replace the one exact occurrence of `old` in a file with `new` (`old` must occur exactly once).",
      {"path": {"type": "string", "description": "path relative to the workdir"},
       "old": {"type": "string", "description": "the exact text to replace (include enough context to be unique)"},
       "new": {"type": "string", "description": "the replacement"}},
      required=("path", "old", "new"))
def edit_file(env: "KernelEnv", args: dict) -> ToolResult:
    path = _writable(env, args["path"])
    if not path.is_file():
        return error(f"{args['path']}: no such file")
    old, new = args["old"], args["new"]
    if not old:
        return error("old is empty: give the exact text to replace")
    too_big = _too_big(path, args["path"])
    if too_big:
        return too_big
    root = env.workdir.resolve()
    text = read_inside(root, path).decode(errors="replace")
    count = text.count(old)
    if count == 0:
        return error(f"old text not found in {args['path']} (it must match exactly, whitespace included)")
    if count > 1:
        return error(f"old text occurs {count} times in {args['path']}: include more context so it occurs once")
    write_inside(root, path, text.replace(old, new, 1))
    line = text[:text.index(old)].count("\n") + 1
    return ToolResult(output=f"edited {args['path']} at line {line}")


def _walk(root: Path, start: Path):
    """Files under `start` (paths relative to root), symlinks neither followed nor listed, the
    environment's own folder left out."""
    if start.is_file():
        yield start.relative_to(root).as_posix()
        return
    for dirpath, dirnames, filenames in os.walk(start):
        rel_dir = Path(dirpath).relative_to(root)
        dirnames[:] = sorted(d for d in dirnames if not os.path.islink(os.path.join(dirpath, d))
                             and not (rel_dir == Path(".") and d == CONTROL_DIR))
        for name in sorted(filenames):
            if not os.path.islink(os.path.join(dirpath, name)):
                yield (rel_dir / name).as_posix()


def _matches(rel: str, pattern: str) -> bool:
    """Glob matching on workdir-relative paths; `**/` also matches no folder at all."""
    return fnmatch.fnmatchcase(rel, pattern) or (pattern.startswith("**/") and fnmatch.fnmatchcase(rel, pattern[3:]))


@tool("glob", "List the workdir's files whose path matches a glob pattern (e.g. `kernels/*.cu`, `**/*.py`).",
      {"pattern": {"type": "string", "description": "glob pattern, relative to the workdir"}},
      required=("pattern",))
def glob(env: "KernelEnv", args: dict) -> ToolResult:
    pattern = args["pattern"].strip()
    if not pattern or os.path.isabs(pattern) or ".." in Path(pattern).parts:
        return error("a relative pattern without '..' is expected")
    root = env.workdir.resolve()
    found = [rel for rel in _walk(root, root) if _matches(rel, pattern)]
    if not found:
        return ToolResult(output=f"no files match {pattern}")
    more = f"\n[{len(found) - MAX_LISTED} more]" if len(found) > MAX_LISTED else ""
    return ToolResult(output="\n".join(found[:MAX_LISTED]) + more)


@tool("grep", "Search the workdir's text files for a regular expression; prints path:line: text.",
      {"pattern": {"type": "string", "description": "a Python regular expression"},
       "path": {"type": "string", "description": "file or folder to search (default: the whole workdir)"},
       "include": {"type": "string", "description": "only files whose path matches this glob (e.g. `*.cu`)"}},
      required=("pattern",))
def grep(env: "KernelEnv", args: dict) -> ToolResult:
    try:
        regex = re.compile(args["pattern"])
    except re.error as e:
        return error(f"bad regular expression: {e}")
    root = env.workdir.resolve()
    start = resolve(env.workdir, args.get("path", "."), must_exist=True)
    include = args.get("include")
    hits = []
    for rel in _walk(root, start):
        if include and not (_matches(rel, include) or fnmatch.fnmatchcase(Path(rel).name, include)):
            continue
        try:  # a FIFO or device is skipped, never waited on; so is a file past the bound
            data = read_inside(root, root / rel, MAX_GREP_FILE_BYTES)
        except WorkdirError:
            continue
        if b"\0" in data[:4096]:
            continue  # binary
        for n, line in enumerate(data.decode(errors="replace").splitlines(), 1):
            if regex.search(line):
                hits.append(f"{rel}:{n}: {line[:500]}")
                if len(hits) > MAX_LISTED:
                    break
        if len(hits) > MAX_LISTED:
            break
    if not hits:
        return ToolResult(output=f"no matches for {args['pattern']}")
    more = f"\n[stopped after {MAX_LISTED} matches]" if len(hits) > MAX_LISTED else ""
    return ToolResult(output="\n".join(hits[:MAX_LISTED]) + more)


# -- the judge ---------------------------------------------------------------------------------------
@tool("verify", "Check model_new.py (with kernels/) through the judge: build, correctness on secret inputs, "
      "the op policy. Same as ./verify.", {})
def verify(env: "KernelEnv", args: dict) -> ToolResult:
    return env.judge(timed=False)


@tool("profile", "Check and time model_new.py (with kernels/) through the judge: its time vs eager PyTorch and "
      "torch.compile, and the reward it would earn. Same as ./profile.", {})
def profile(env: "KernelEnv", args: dict) -> ToolResult:
    return env.judge(timed=True)

"""The pool module and the import graph of cudagym.eval: no module imports one that imports it back."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "cudagym"


def cudagym_modules() -> dict[str, tuple[Path, bool]]:
    """Dotted name -> (file, is a package __init__), for every module of the package."""
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        modules[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return modules


def imports_of(name: str, path: Path, is_package: bool, modules: dict) -> set[str]:
    """The cudagym modules a module imports anywhere in its body (lazy imports in functions included)."""
    package = name if is_package else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name in modules)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from . import x, from ..tasks import y
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            for alias in node.names:
                if f"{base}.{alias.name}" in modules:  # from cudagym.eval import batch: the submodule
                    found.add(f"{base}.{alias.name}")
                elif base in modules:
                    found.add(base)
    return found - {name}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle_runs_through_cudagym_eval():
    modules = cudagym_modules()
    graph = {name: imports_of(name, path, is_package, modules) for name, (path, is_package) in modules.items()}
    assert "cudagym.eval.pool" in graph["cudagym.eval.ray_runner"]  # the walk sees what it should
    assert "cudagym.eval.ray_runner" in graph["cudagym.eval.batch"]  # lazy (in open_pool), seen too
    through_eval = [c for c in cycles(graph) if any(m.startswith(("cudagym.eval", "cudagym.tasks")) for m in c)]
    assert through_eval == []


def test_no_import_cycle_runs_through_cudagym_synth():
    """synth's layers import one way (seeds <- labels, render <- crawl <- compose <- llm <- build):
    compose once imported crawl, crawl compose (lazily) and llm compose (compose llm for a type)."""
    modules = cudagym_modules()
    graph = {name: imports_of(name, path, is_package, modules) for name, (path, is_package) in modules.items()}
    assert {"cudagym.synth.crawl", "cudagym.synth.render"} <= graph["cudagym.synth.compose"]
    assert "cudagym.synth.crawl" in graph["cudagym.synth.build"]  # lazy (in crawl_stage), seen too
    assert [c for c in cycles(graph) if any(m.startswith("cudagym.synth") for m in c)] == []


def test_the_cycle_finder_finds_a_lazy_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_batch_keeps_the_names_its_users_import():
    from cudagym.eval import batch, pool, ray_runner

    for name in ("Worker", "Job", "LocalPool", "machine_env", "progress_bar", "DRAIN_S"):
        assert getattr(batch, name) is getattr(pool, name)
    assert ray_runner.Worker is pool.Worker

"""cudagym's own contamination score: invariant to renaming, reformatting, docstrings and sizes.

The paper's score (`parity`) ignores every identifier, so it cannot tell `relu` from `sigmoid`,
and it collapses when a docstring is deleted. This score first *normalises* a source, then compares
two views of it:

**Normalisation** (`normalize`): parse with `ast` (formatting and comments vanish); drop docstrings
(every bare string statement) and imports; resolve import aliases to dotted module paths (`F` ->
`torch.nn.functional`); alpha-rename by first occurrence in source order, per namespace: module
globals `_g0, _g1, ...`, each function's locals and parameters `_l0, ...` (restarting in every
function, so per-scope and global renamings normalise alike), attributes stored on `self` and
helper method names `_a0, ...`; keyword arguments of calls to module-local callables follow the
callee's parameters. A method's first parameter becomes `self`. Names the format fixes (`Model`,
`forward`, `get_inputs`, `get_init_inputs`, dunders) and free names (`torch.relu`, `len`, `x.view`)
are kept. Every number becomes `_N`; `super(Model, self)` becomes `super()`. `ast.unparse` of the
result is the canonical text; its tokens are the canonical token stream.

**Views**
- *Token shingles*: 5-token shingles of the canonical stream as a multiset (the k-th repeat of a
  shingle is its own element, so `repeat x13` differs from `repeat x16`); `jaccard = |A & B| / |A | B|`.
- *Operators*: the `forward` of `Model` as its sequence of operator calls in evaluation order
  (calls through `self.<attr>` resolved to the module constructed in `__init__`, torch /
  functional / Tensor-method calls and arithmetic operators, all named by a canonical op name, so
  `nn.ReLU()` module, `F.relu`, `torch.relu` and `x.relu()` are all `relu` and `x + y` is `add`),
  (`x.T` is `transpose`), plus the multiset of `torch.nn` constructors anywhere in the module,
  each keyed by its op name and the names of its keyword arguments (`conv2d(groups)` for a
  depthwise convolution; values are ignored).
  `ops = min(2 * LCS(seq_a, seq_b) / (|seq_a| + |seq_b|), jaccard(ctor_a, ctor_b))` (an empty pair
  counts 1).

`strong = round(max(jaccard_tokens, ops), 4)`. A renamed / reformatted / docstring-stripped /
constant-resized copy normalises to the same text, so both views are exactly 1. `ops` also catches
a copy restyled between module and functional calls; `jaccard_tokens` one with a statement added.

**Threshold** `STRONG_THRESHOLD = 0.9` (flag when `strong >= 0.9`). Over the 31,125 pairs of
distinct KernelBench v0.1 L1-3 problems the score is mostly far below it (see benchmarks/NOTES.md
and the dedup tests for the measured distribution); the pairs at or above it are problems that
differ only in sizes or in a constructor flag (e.g. the square / asymmetric convolution variants),
which are the same computation for a kernel writer, so flagging a candidate that matches them is
intended. Copies score 1.0, so the threshold leaves room for small edits.

`StrongIndex` scores many candidates against fixed references exactly (equal to scoring every
pair): token Jaccard for all references at once through an inverted index, then the exact LCS
only for references whose operator-view upper bound (bag-of-ops intersection for the LCS, the exact
constructor Jaccard) can still reach the best score.
"""

from __future__ import annotations

import ast
import builtins
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

STRONG_THRESHOLD = 0.9
SHINGLE = 5
KEEP_NAMES = frozenset({"Model", "forward", "get_inputs", "get_init_inputs", "self"})
NUMBER = "_N"
_TOKEN = re.compile(r"[A-Za-z_][\w.]*|\d+|\S")
_BUILTINS = frozenset(dir(builtins))
_NON_OPS = frozenset({"size", "dim", "numel", "item", "init"})  # tensor metadata, super().__init__()
_TRANSPOSE_ATTRS = frozenset({"T", "mT", "H", "mH"})
_BINOP = {ast.Add: "add", ast.Sub: "sub", ast.Mult: "mul", ast.Div: "div", ast.FloorDiv: "floordiv", ast.Mod: "remainder",
          ast.Pow: "pow", ast.MatMult: "matmul", ast.BitAnd: "bitwiseand", ast.BitOr: "bitwiseor", ast.BitXor: "bitwisexor",
          ast.LShift: "lshift", ast.RShift: "rshift"}
_UNARY = {ast.USub: "neg", ast.Invert: "bitwisenot", ast.Not: "logicalnot"}
_COMPARE = {ast.Lt: "lt", ast.LtE: "le", ast.Gt: "gt", ast.GtE: "ge", ast.Eq: "eq", ast.NotEq: "ne"}
_OP_ALIAS = {"truediv": "div", "divide": "div", "multiply": "mul", "subtract": "sub", "negative": "neg",
             "greater": "gt", "less": "lt", "absolute": "abs", "arctan": "atan", "clip": "clamp"}
_FUNCS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)


@dataclass(frozen=True)
class Normalized:
    """A source after normalisation, and the views the score compares."""

    text: str  # canonical source (ast.unparse of the normalised tree)
    tokens: tuple[str, ...]
    ops: tuple[str, ...]  # forward's operator sequence
    ctor: dict  # torch.nn constructor name -> count

    @property
    def shingles(self) -> list[tuple]:
        """The token shingles as a set-ready list: the k-th repeat of a shingle is (shingle, k)."""
        return multiset_shingles(self.tokens)


def multiset_shingles(tokens: Sequence[str], k: int = SHINGLE) -> list[tuple]:
    grams = [tuple(tokens[i:i + k]) for i in range(max(1, len(tokens) - k + 1))] if tokens else []
    seen: Counter = Counter()
    out = []
    for g in grams:
        out.append((g, seen[g]))
        seen[g] += 1
    return out


def normalize(code: str | ast.Module) -> Normalized:
    """Normalise a source (or a parsed module, which is modified in place). SyntaxError propagates."""
    tree = ast.parse(code) if isinstance(code, str) else code
    _Renamer(tree).run()
    text = ast.unparse(tree)
    ops, ctor = _operators(tree)
    return Normalized(text, tuple(_TOKEN.findall(text)), tuple(ops), dict(ctor))


def strong_score(code_a: str, code_b: str) -> float:
    """The strong similarity of two sources (SyntaxError on bad source)."""
    return similarity(normalize(code_a), normalize(code_b))


def similarity(a: Normalized, b: Normalized) -> float:
    return round(max(token_jaccard(a, b), op_similarity(a, b)), 4)


def token_jaccard(a: Normalized, b: Normalized) -> float:
    sa, sb = set(a.shingles), set(b.shingles)
    union = len(sa | sb)
    return len(sa & sb) / union if union else 1.0


def op_similarity(a: Normalized, b: Normalized) -> float:
    return min(lcs_ratio(a.ops, b.ops), multiset_jaccard(a.ctor, b.ctor))


def lcs_ratio(a: Sequence, b: Sequence) -> float:
    if not a and not b:
        return 1.0
    return 2 * lcs_length(a, b) / (len(a) + len(b))


def lcs_length(a: Sequence, b: Sequence) -> int:
    if len(a) < len(b):
        a, b = b, a
    prev = [0] * (len(b) + 1)
    for x in a:
        cur = [0]
        for j, y in enumerate(b):
            cur.append(prev[j] + 1 if x == y else max(prev[j + 1], cur[j]))
        prev = cur
    return prev[-1]


def multiset_jaccard(a: dict, b: dict) -> float:
    if not a and not b:
        return 1.0
    inter = sum(min(v, b.get(k, 0)) for k, v in a.items())
    union = sum(a.values()) + sum(b.values()) - inter
    return inter / union


class StrongIndex:
    """Reference sources normalised once; `best(code)` = the exact maximum strong score over them.

    `best` returns (score, index): ties on the score go to the higher token Jaccard, then to the
    lower index (so a copy matches its own problem before a KernelBench twin that differs only in
    sizes); index None when the maximum is 0. Identical to `brute_force_max`.
    """

    def __init__(self, references: Sequence[str | Normalized]) -> None:
        self.refs = [r if isinstance(r, Normalized) else normalize(r) for r in references]
        n = len(self.refs)
        self._shingle_ids: dict[tuple, int] = {}
        postings: list[list[int]] = []
        self._n_shingles = np.zeros(n)
        for i, ref in enumerate(self.refs):
            elements = set(ref.shingles)
            self._n_shingles[i] = len(elements)
            for e in elements:
                sid = self._shingle_ids.setdefault(e, len(postings))
                if sid == len(postings):
                    postings.append([])
                postings[sid].append(i)
        self._postings = [np.array(p, dtype=np.intp) for p in postings]
        self._op_ids = {op: k for k, op in enumerate(sorted({op for r in self.refs for op in r.ops}))}
        self._op_counts = np.zeros((n, max(1, len(self._op_ids))))
        for i, ref in enumerate(self.refs):
            for op, c in Counter(ref.ops).items():
                self._op_counts[i, self._op_ids[op]] = c
        self._op_len = np.array([len(r.ops) for r in self.refs], dtype=np.float64)
        self._ctor_ids = {c: k for k, c in enumerate(sorted({c for r in self.refs for c in r.ctor}))}
        self._ctor = np.zeros((n, max(1, len(self._ctor_ids))))
        for i, ref in enumerate(self.refs):
            for c, v in ref.ctor.items():
                self._ctor[i, self._ctor_ids[c]] = v
        self._ctor_total = self._ctor.sum(axis=1)
        self.exact_computed = 0  # LCS computations (the rest were pruned)

    def jaccards(self, n: Normalized) -> np.ndarray:
        """Exact token-shingle Jaccard against every reference."""
        elements = set(n.shingles)
        hits = [self._postings[sid] for e in elements if (sid := self._shingle_ids.get(e)) is not None]
        inter = np.bincount(np.concatenate(hits), minlength=len(self.refs)) if hits else np.zeros(len(self.refs))
        union = len(elements) + self._n_shingles - inter
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(union > 0, inter / np.where(union > 0, union, 1), 1.0)

    def op_bounds(self, n: Normalized) -> np.ndarray:
        """Upper bounds of `op_similarity` against every reference (the constructor part is exact)."""
        refs = len(self.refs)
        counts = Counter(n.ops)
        known = [(self._op_ids[op], c) for op, c in counts.items() if op in self._op_ids]
        common = (np.minimum(self._op_counts[:, [k for k, _ in known]], [c for _, c in known]).sum(axis=1)
                  if known else np.zeros(refs))
        length = self._op_len + len(n.ops)
        lcs = np.where(length > 0, 2 * common / np.where(length > 0, length, 1), 1.0)
        known = [(self._ctor_ids[c], v) for c, v in n.ctor.items() if c in self._ctor_ids]
        inter = (np.minimum(self._ctor[:, [k for k, _ in known]], [v for _, v in known]).sum(axis=1)
                 if known else np.zeros(refs))
        union = self._ctor_total + sum(n.ctor.values()) - inter
        ctor = np.where(union > 0, inter / np.where(union > 0, union, 1), 1.0)
        return np.minimum(lcs, ctor)

    def best(self, code: str | ast.Module | Normalized) -> tuple[float, int | None]:
        n = code if isinstance(code, Normalized) else normalize(code)
        jac = self.jaccards(n)
        bound = self.op_bounds(n)
        best = round(float(jac.max()), 4) if len(jac) else 0.0
        slack = 0.5e-4 + 1e-9  # scores are rounded to 4 places
        strong = {}  # reference -> exact unrounded strong score, where it may reach the best
        for i in np.argsort(-bound, kind="stable").tolist():
            if bound[i] < best - slack:
                break
            if bound[i] <= jac[i]:
                continue
            self.exact_computed += 1
            value = max(float(jac[i]), op_similarity(n, self.refs[i]))
            strong[i] = value
            best = max(best, round(value, 4))
        if best <= 0:
            return 0.0, None
        for i in np.flatnonzero(jac >= best - slack).tolist():
            strong.setdefault(i, float(jac[i]))
        ties = [i for i, v in strong.items() if round(v, 4) == best]
        return best, min(ties, key=lambda i: (-jac[i], i))

    def brute_force_max(self, code: str | ast.Module | Normalized) -> tuple[float, int | None]:
        """Every reference scored exactly, pair by pair; the reference result `best` must equal."""
        n = code if isinstance(code, Normalized) else normalize(code)
        scored = [(similarity(n, r), token_jaccard(n, r)) for r in self.refs]
        top = max((s for s, _ in scored), default=0.0)
        if top <= 0:
            return 0.0, None
        return top, min((i for i, (s, _) in enumerate(scored) if s == top), key=lambda i: (-scored[i][1], i))


# -- normalisation ----------------------------------------------------------------------------------
class _Scope:
    """A function's (or lambda's) local names, numbered by first occurrence."""

    def __init__(self, bound: set[str], parent: _Scope | None) -> None:
        self.bound, self.parent = bound, parent
        self.names: dict[str, str] = {}

    def local(self, name: str) -> str:
        new = self.names.get(name)
        if new is None:
            new = self.names[name] = name if _fixed(name) else f"_l{sum(not _fixed(n) for n in self.names)}"
        return new


class _Renamer:
    """Rewrites a module in place into its normal form (see the module docstring)."""

    def __init__(self, tree: ast.Module) -> None:
        self.tree = tree
        self.aliases = _aliases(tree)
        self.module_bound = _module_bound(tree) - set(self.aliases)
        self.attr_names = _attribute_names(tree)
        self.params = _callable_params(tree)  # module-local callable -> parameter names (self dropped)
        self.globals: dict[str, str] = {}
        self.attrs: dict[str, str] = {}

    def run(self) -> None:
        self._visit(self.tree, None)

    # name resolution
    def _lookup(self, name: str, scope: _Scope | None) -> str:
        while scope is not None:
            if name in scope.names or name in scope.bound:
                return scope.local(name)
            scope = scope.parent
        if _fixed(name):
            return name
        if name in self.module_bound:
            return self.globals.setdefault(name, f"_g{len(self.globals)}")
        return self.aliases.get(name, name)

    def _attr(self, name: str) -> str:
        if _fixed(name) or name not in self.attr_names:
            return name
        return self.attrs.setdefault(name, f"_a{len(self.attrs)}")

    def _is_local(self, name: str, scope: _Scope | None) -> bool:
        while scope is not None:
            if name in scope.names or name in scope.bound:
                return True
            scope = scope.parent
        return False

    # rewriting; every visit returns the node to put in its place
    def _visit(self, node: ast.AST, scope: _Scope | None) -> ast.AST:
        kind = type(node)
        if kind is ast.Name:
            node.id = self._lookup(node.id, scope)
            return node
        if kind is ast.Constant:
            if isinstance(node.value, (int, float, complex)) and not isinstance(node.value, bool):
                return ast.Name(id=NUMBER, ctx=ast.Load())
            return node
        if kind is ast.Attribute:
            node.value = self._visit(node.value, scope)
            if _is_self(node.value):
                node.attr = self._attr(node.attr)
            return node
        if kind is ast.Call:
            return self._visit_call(node, scope)
        if kind in (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda):
            return self._visit_function(node, scope, method=False)
        if kind is ast.ClassDef:
            return self._visit_class(node, scope)
        self._visit_fields(node, scope)
        return node

    def _visit_fields(self, node: ast.AST, scope: _Scope | None, only: str | None = None) -> None:
        for field, value in ast.iter_fields(node):
            if only is not None and field != only:
                continue
            if isinstance(value, list):
                if value and isinstance(value[0], ast.stmt):
                    value = [s for s in value if not _is_docstring(s) and not isinstance(s, (ast.Import, ast.ImportFrom))]
                    if not value and field == "body":
                        value = [ast.Pass()]
                setattr(node, field, [self._visit(v, scope) if isinstance(v, ast.AST) else v for v in value])
            elif isinstance(value, ast.AST):
                setattr(node, field, self._visit(value, scope))

    def _visit_call(self, node: ast.Call, scope: _Scope | None) -> ast.AST:
        callee = node.func
        params = None
        if isinstance(callee, ast.Name) and not self._is_local(callee.id, scope):
            params = self.params.get(callee.id)
        if isinstance(callee, ast.Name) and callee.id == "super":
            node.args = []
        self._visit_fields(node, scope)
        if params is not None:
            for kw in node.keywords:
                if kw.arg in params:
                    kw.arg = f"_l{params.index(kw.arg)}"
        return node

    def _visit_function(self, node: ast.AST, scope: _Scope | None, method: bool) -> ast.AST:
        self._visit_fields(node.args, scope)  # defaults and annotations: the enclosing scope
        if not isinstance(node, ast.Lambda):
            node.decorator_list = [self._visit(d, scope) for d in node.decorator_list]
            node.returns = None
            if not method:
                node.name = self._lookup(node.name, scope)
        inner = _Scope(_stored_names(node), scope)
        params = _all_args(node.args)
        if method and params and params[0].arg != "self":
            inner.names[params[0].arg] = "self"
        for a in params:
            a.arg = inner.local(a.arg)
            a.annotation = None
        if isinstance(node, ast.Lambda):
            node.body = self._visit(node.body, inner)
        else:
            self._visit_fields(node, inner, only="body")
        return node

    def _visit_class(self, node: ast.ClassDef, scope: _Scope | None) -> ast.AST:
        node.name = self._lookup(node.name, scope)
        node.bases = [self._visit(b, scope) for b in node.bases]
        node.keywords = [self._visit(k, scope) for k in node.keywords]
        node.decorator_list = [self._visit(d, scope) for d in node.decorator_list]
        body = []
        for stmt in node.body:
            if _is_docstring(stmt) or isinstance(stmt, (ast.Import, ast.ImportFrom)):
                continue
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                stmt.name = self._attr(stmt.name)
                body.append(self._visit_function(stmt, scope, method=True))
                continue
            for sub in ast.walk(stmt):  # class attributes live in the attribute namespace
                if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Store):
                    sub.id = self._attr(sub.id)
            body.append(self._visit(stmt, scope))
        node.body = body or [ast.Pass()]
        return node


def _stored_names(func: ast.AST) -> set[str]:
    """Names a function binds locally: parameters and stores, not inside nested functions."""
    names = {a.arg for a in _all_args(func.args)}
    declared: set[str] = set()
    stack = list(func.body) if isinstance(func.body, list) else [func.body]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Global, ast.Nonlocal)):
            declared.update(node.names)
        elif isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            names.add(node.id)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            names.add(node.name)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
            continue  # its body is its own scope
        elif isinstance(node, ast.Lambda):
            continue
        stack.extend(ast.iter_child_nodes(node))
    return names - declared


def _module_bound(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    stack = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
            continue
        if isinstance(node, ast.Lambda):
            continue
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            names.add(node.id)
        stack.extend(ast.iter_child_nodes(node))
    return names


def _attribute_names(tree: ast.Module) -> set[str]:
    """Attributes stored on `self`, helper method names and class attributes (format names kept)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and not isinstance(node.ctx, ast.Load) and _is_self(node.value):
            names.add(node.attr)
        elif isinstance(node, ast.ClassDef):
            for stmt in node.body:
                if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    names.add(stmt.name)
                    params = _all_args(stmt.args)
                    if params and params[0].arg != "self":  # `def forward(this, x)`: this.attr = ...
                        first = params[0].arg
                        for sub in ast.walk(stmt):
                            if (isinstance(sub, ast.Attribute) and not isinstance(sub.ctx, ast.Load)
                                    and isinstance(sub.value, ast.Name) and sub.value.id == first):
                                names.add(sub.attr)
                elif not _is_docstring(stmt):
                    names.update(sub.id for sub in ast.walk(stmt)
                                 if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Store))
    return {n for n in names if not _fixed(n)}


def _callable_params(tree: ast.Module) -> dict[str, list[str]]:
    params = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            params[node.name] = [a.arg for a in _all_args(node.args)]
        elif isinstance(node, ast.ClassDef):
            for stmt in node.body:
                if isinstance(stmt, ast.FunctionDef) and stmt.name == "__init__":
                    params[node.name] = [a.arg for a in _all_args(stmt.args)][1:]
    return params


def _aliases(tree: ast.Module) -> dict[str, str]:
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.asname:
                    out[a.asname] = a.name
                else:
                    root = a.name.split(".")[0]
                    out[root] = root
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for a in node.names:
                if a.name != "*":
                    out[a.asname or a.name] = f"{node.module}.{a.name}"
    return out


def _all_args(args: ast.arguments) -> list[ast.arg]:
    out = [*args.posonlyargs, *args.args]
    if args.vararg:
        out.append(args.vararg)
    out.extend(args.kwonlyargs)
    if args.kwarg:
        out.append(args.kwarg)
    return out


def _is_docstring(stmt: ast.AST) -> bool:
    return isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str)


def _is_self(node: ast.AST) -> bool:
    return isinstance(node, ast.Name) and node.id == "self"


def _fixed(name: str) -> bool:
    return name in KEEP_NAMES or (name.startswith("__") and name.endswith("__"))


# -- operators --------------------------------------------------------------------------------------
def canonical_op(name: str) -> str:
    """`torch.nn.functional.leaky_relu`, `nn.LeakyReLU`, `x.leaky_relu_` -> `leakyrelu`."""
    last = name.rsplit(".", 1)[-1].lower().strip("_").replace("_", "")
    return _OP_ALIAS.get(last, last)


def _dotted(node: ast.AST) -> str | None:
    """`a.b.c` for a chain of attributes on a name, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def _operators(tree: ast.Module) -> tuple[list[str], Counter]:
    """(forward's operator sequence, torch.nn constructor multiset) of a normalised module."""
    ctor: Counter = Counter()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = _dotted(node.func)
            if name and name.startswith("torch.nn.") and name.rsplit(".", 1)[-1][:1].isupper():
                keywords = ",".join(sorted(k.arg for k in node.keywords if k.arg))
                ctor[f"{canonical_op(name)}({keywords})"] += 1
    model = None
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "Model":
            model = node
    methods = [s for s in (model.body if model else tree.body) if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))]
    forward = next((m for m in methods if m.name == "forward"), None)
    if forward is None:
        return [], ctor
    modules: dict[str, str] = {}  # self attribute -> op of the module stored there
    for m in methods:
        for node in ast.walk(m):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
                for target in node.targets:
                    if isinstance(target, ast.Attribute) and _is_self(target.value):
                        name = _dotted(node.value.func)
                        modules[target.attr] = canonical_op(name) if name else "call"
    ops: list[str] = []
    for stmt in forward.body:
        _emit(stmt, modules, ops)
    return ops, ctor


def _emit(node: ast.AST, modules: dict[str, str], out: list[str]) -> None:
    """Append the operators `node` runs, in evaluation order."""
    kind = type(node)
    if kind is ast.Call:
        func = node.func
        if isinstance(func, ast.Attribute):
            _emit(func.value, modules, out)
        for a in node.args:
            _emit(a, modules, out)
        for k in node.keywords:
            _emit(k.value, modules, out)
        op = _call_op(func, modules)
        if op and op not in _NON_OPS:
            out.append(op)
    elif kind is ast.BinOp:
        _emit(node.left, modules, out)
        _emit(node.right, modules, out)
        out.append(_BINOP.get(type(node.op), "binop"))
    elif kind is ast.AugAssign:
        _emit(node.value, modules, out)
        out.append(_BINOP.get(type(node.op), "binop"))
    elif kind is ast.UnaryOp:
        _emit(node.operand, modules, out)
        if not (isinstance(node.operand, ast.Name) and node.operand.id == NUMBER) and type(node.op) in _UNARY:
            out.append(_UNARY[type(node.op)])
    elif kind is ast.Attribute:
        _emit(node.value, modules, out)
        if node.attr in _TRANSPOSE_ATTRS:
            out.append("transpose")
    elif kind is ast.Compare:
        _emit(node.left, modules, out)
        for op, right in zip(node.ops, node.comparators):
            _emit(right, modules, out)
            if type(op) in _COMPARE:
                out.append(_COMPARE[type(op)])
    else:
        for child in ast.iter_child_nodes(node):
            _emit(child, modules, out)


def _call_op(func: ast.AST, modules: dict[str, str]) -> str | None:
    if isinstance(func, ast.Attribute) and _is_self(func.value):
        return modules.get(func.attr, "call")  # a module built in __init__, or a helper method
    name = _dotted(func)
    if name is None:
        return canonical_op(func.attr) if isinstance(func, ast.Attribute) else "call"
    root = name.split(".", 1)[0]
    if "." not in name:
        if name in _BUILTINS:
            return None
        return name if name.startswith("_g") else "call"  # a module-local callable, or a local value
    if root in ("_l", "self") or root.startswith("_l") or root.startswith("_g"):
        return canonical_op(name)  # a method on a local value (a tensor)
    return canonical_op(name)

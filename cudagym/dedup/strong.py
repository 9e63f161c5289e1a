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
  `nn.ReLU()` module, `F.relu`, `torch.relu` and `x.relu()` are all `relu`, `x + y` is `add` and
  `x.T` is `transpose`), plus the multiset of `torch.nn` constructors anywhere in the module,
  each keyed by its op name and the names of its keyword arguments (`conv2d(groups)` for a
  depthwise convolution; values are ignored).
  `ops = min(2 * LCS(seq_a, seq_b) / (|seq_a| + |seq_b|), jaccard(ctor_a, ctor_b))` (an empty pair
  counts 1).

`strong = round(max(jaccard_tokens, ops), 4)`. A renamed / reformatted / docstring-stripped /
constant-resized copy normalises to the same text, so both views are exactly 1. `ops` also catches
a copy restyled between module and functional calls; `jaccard_tokens` one with a statement added.

**Threshold** `STRONG_THRESHOLD = 0.9` (flag when `strong >= 0.9`). Measured on KernelBench v0.1
L1-3 (250 problems): a mutated copy of every problem (every identifier renamed, reformatted,
docstrings stripped, integer constants doubled) scores exactly 1.0; over the 31,125 pairs of
distinct problems the median is 0.17, the 90th percentile 0.35, the 99th 0.66, and the largest
score below 1.0 is 0.886. The 76 pairs (0.24%) at 1.0 are problems that differ only in sizes or
constructor argument values (the matmul shape variants, square / asymmetric convolution variants,
LSTM h_n / c_n, DenseNet121 / 201, the two identical Gemm_Scale_BatchNorm), the same computation
for a kernel writer, so flagging a candidate that matches them is intended. 0.9 sits in the empty
gap between 0.886 and 1.0 and leaves room for small edits to a copy.

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
_RESULT_LIMIT = 200_000  # memoised candidate results kept before the table is cleared
_TOKEN = re.compile(r"[A-Za-z_][\w.]*|\d+|\S")
_BUILTINS = frozenset(dir(builtins))
_NON_OPS = frozenset({"size", "dim", "numel", "item", "init"})  # tensor metadata, super().__init__()
_TRANSPOSE_ATTRS = frozenset({"T", "mT", "H", "mH"})
_BINOP = {ast.Add: "add", ast.Sub: "sub", ast.Mult: "mul", ast.Div: "div", ast.FloorDiv: "floordiv",
          ast.Mod: "remainder", ast.Pow: "pow", ast.MatMult: "matmul", ast.BitAnd: "bitwiseand",
          ast.BitOr: "bitwiseor", ast.BitXor: "bitwisexor", ast.LShift: "lshift", ast.RShift: "rshift"}
_IMPORTS = (ast.Import, ast.ImportFrom)
_UNARY = {ast.USub: "neg", ast.Invert: "bitwisenot", ast.Not: "logicalnot"}
_COMPARE = {ast.Lt: "lt", ast.LtE: "le", ast.Gt: "gt", ast.GtE: "ge", ast.Eq: "eq", ast.NotEq: "ne"}
_OP_ALIAS = {"truediv": "div", "divide": "div", "multiply": "mul", "subtract": "sub", "negative": "neg",
             "greater": "gt", "less": "lt", "absolute": "abs", "arctan": "atan", "clip": "clamp"}


@dataclass(frozen=True)
class Normalized:
    """A source after normalisation, and the views the score compares."""

    text: str  # canonical source (ast.unparse of the normalised tree)
    tokens: tuple[str, ...]
    ops: tuple[str, ...]  # forward's operator sequence
    ctor: dict  # torch.nn constructor key -> count
    shingles: tuple  # multiset_shingles(tokens): distinct elements, the k-th repeat of a shingle is (shingle, k)


def multiset_shingles(tokens: Sequence[str], k: int = SHINGLE) -> tuple:
    """`k`-token shingles as set elements that keep multiplicity: (shingle, how many times it came before)."""
    if len(tokens) < k:
        return ((tuple(tokens), 0),) if tokens else ()
    seen: dict[tuple, int] = {}
    out = []
    for gram in zip(*(tokens[i:] for i in range(k))):
        count = seen.get(gram, 0)
        seen[gram] = count + 1
        out.append((gram, count))
    return tuple(out)


def normalize(code: str | ast.Module) -> Normalized:
    """Normalise a source (or a parsed module, which is modified in place). SyntaxError propagates."""
    tree = ast.parse(code) if isinstance(code, str) else code
    renamer = _Renamer(tree)
    renamer.run()
    text = ast.unparse(tree)
    ops = _operators(tree, renamer.modules)
    tokens = tuple(_TOKEN.findall(text))
    return Normalized(text, tokens, tuple(ops), dict(renamer.ctor), multiset_shingles(tokens))


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
            self._n_shingles[i] = len(ref.shingles)
            for e in ref.shingles:
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
        self._results: dict[str, tuple[float, int | None]] = {}  # normalised text -> result
        self.exact_computed = 0  # LCS computations (the rest were pruned)

    def jaccards(self, n: Normalized) -> np.ndarray:
        """Exact token-shingle Jaccard against every reference."""
        elements = n.shingles  # distinct by construction
        ids = self._shingle_ids
        hits = [self._postings[sid] for e in elements if (sid := ids.get(e)) is not None]
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
        hit = self._results.get(n.text)
        if hit is not None:
            return hit
        if len(self._results) >= _RESULT_LIMIT:
            self._results.clear()
        result = self._results[n.text] = self._best(n)
        return result

    def _best(self, n: Normalized) -> tuple[float, int | None]:
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
_FIELDS: dict[type, tuple[str, ...]] = {}


def _fields(node: ast.AST) -> tuple[str, ...]:
    fields = _FIELDS.get(type(node))
    if fields is None:
        fields = _FIELDS[type(node)] = type(node)._fields
    return fields


def _children(node: ast.AST) -> list[ast.AST]:
    """`ast.iter_child_nodes`, as a list (faster)."""
    out = []
    for f in _fields(node):
        v = getattr(node, f, None)
        if isinstance(v, ast.AST):
            out.append(v)
        elif isinstance(v, list):
            out.extend(x for x in v if isinstance(x, ast.AST))
    return out


class _Scope:
    """A function's (or lambda's) local names, numbered by first occurrence."""

    def __init__(self, bound: set[str], parent: _Scope | None) -> None:
        self.bound, self.parent = bound, parent
        self.names: dict[str, str] = {}
        self._count = 0

    def local(self, name: str) -> str:
        new = self.names.get(name)
        if new is None:
            if _fixed(name):
                new = name
            else:
                new, self._count = f"_l{self._count}", self._count + 1
            self.names[name] = new
        return new


class _Frame:
    """What the collection pass learns about one function: its local and declared-global names."""

    __slots__ = ("bound", "declared", "self_name")

    def __init__(self, bound: set[str], self_name: str | None) -> None:
        self.bound, self.declared, self.self_name = bound, set(), self_name


class _Renamer:
    """Rewrites a module in place into its normal form (see the module docstring), and records the
    `torch.nn` constructors it meets and the modules stored on `Model`'s attributes."""

    def __init__(self, tree: ast.Module) -> None:
        self.tree = tree
        self.aliases: dict[str, str] = {}
        self.module_bound: set[str] = set()
        self.attr_names: set[str] = set()
        self.params: dict[str, list[str]] = {}  # module-local callable -> parameter names (self dropped)
        self.frames: dict[int, _Frame] = {}  # id(function node) -> its frame
        self._collect_body(tree.body, None, in_class=False)
        self.module_bound -= set(self.aliases)
        self.attr_names = {n for n in self.attr_names if not _fixed(n)}
        self.globals: dict[str, str] = {}
        self.attrs: dict[str, str] = {}
        self.ctor: Counter = Counter()
        self.modules: dict[str, str] = {}  # Model attribute (renamed) -> op of the module stored there
        self._class: str | None = None

    def run(self) -> None:
        self._visit_fields(self.tree, None)

    # collection: one pass over the original tree
    def _collect_body(self, body: list, frame: _Frame | None, in_class: bool) -> None:
        for stmt in body:
            self._collect(stmt, frame, in_class)

    def _bind(self, name: str, frame: _Frame | None, in_class: bool) -> None:
        if in_class:
            self.attr_names.add(name)
        elif frame is None:
            self.module_bound.add(name)
        else:
            frame.bound.add(name)

    def _collect(self, node: ast.AST, frame: _Frame | None, in_class: bool) -> None:
        kind = type(node)
        if kind is ast.Name:
            if type(node.ctx) is not ast.Load:
                self._bind(node.id, frame, in_class)
            return
        if kind is ast.Attribute:
            if type(node.ctx) is not ast.Load and isinstance(node.value, ast.Name) and (
                    node.value.id == "self" or (frame is not None and node.value.id == frame.self_name)):
                self.attr_names.add(node.attr)
            self._collect(node.value, frame, in_class)
            return
        if kind in (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda):
            args = _all_args(node.args)
            for child in (*node.args.defaults, *(d for d in node.args.kw_defaults if d is not None)):
                self._collect(child, frame, in_class)
            inner = _Frame({a.arg for a in args}, args[0].arg if in_class and args else None)
            self.frames[id(node)] = inner
            if kind is ast.Lambda:
                self._collect(node.body, inner, False)
                return
            for d in node.decorator_list:
                self._collect(d, frame, in_class)
            self._bind(node.name, frame, in_class)
            if frame is None and not in_class:
                self.params[node.name] = [a.arg for a in args]
            self._collect_body(node.body, inner, in_class=False)
            return
        if kind is ast.ClassDef:
            for child in (*node.bases, *node.keywords, *node.decorator_list):
                self._collect(child, frame, in_class)
            self._bind(node.name, frame, in_class)
            if frame is None and not in_class:
                for stmt in node.body:
                    if isinstance(stmt, ast.FunctionDef) and stmt.name == "__init__":
                        self.params[node.name] = [a.arg for a in _all_args(stmt.args)][1:]
            self._collect_body([s for s in node.body if not _is_docstring(s)], frame, in_class=True)
            return
        if kind in (ast.Import, ast.ImportFrom):
            self.aliases.update(_aliases(node))
            return
        if kind in (ast.Global, ast.Nonlocal):
            if frame is not None:
                frame.declared.update(node.names)
            return
        if kind is ast.ExceptHandler and node.name:
            self._bind(node.name, frame, in_class)
        for child in _children(node):
            self._collect(child, frame, in_class)

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
        if name not in self.attr_names:
            return name
        return self.attrs.setdefault(name, f"_a{len(self.attrs)}")

    @staticmethod
    def _is_local(name: str, scope: _Scope | None) -> bool:
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
            value = node.value
            if isinstance(value, (int, float, complex)) and not isinstance(value, bool):
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
        if kind is ast.Assign and self._class == "Model" and type(node.value) is ast.Call:
            for target in node.targets:
                if isinstance(target, ast.Attribute) and _is_self(target.value):
                    name = _dotted(node.value.func)
                    self.modules[target.attr] = canonical_op(name) if name else "call"
        return node

    def _visit_fields(self, node: ast.AST, scope: _Scope | None, only: str | None = None) -> None:
        for field in ((only,) if only else _fields(node)):
            value = getattr(node, field, None)
            if isinstance(value, list):
                if value and isinstance(value[0], ast.stmt):
                    value = [s for s in value if not _is_docstring(s) and not isinstance(s, _IMPORTS)]
                    if not value and field == "body":
                        value = [ast.Pass()]
                setattr(node, field, [self._visit(v, scope) if isinstance(v, ast.AST) else v for v in value])
            elif isinstance(value, ast.AST):
                setattr(node, field, self._visit(value, scope))

    def _visit_call(self, node: ast.Call, scope: _Scope | None) -> ast.AST:
        callee = node.func
        params = None
        if type(callee) is ast.Name:
            if not self._is_local(callee.id, scope):
                params = self.params.get(callee.id)
            if callee.id == "super":
                node.args = []
        self._visit_fields(node, scope)
        if params is not None:
            for kw in node.keywords:
                if kw.arg in params:
                    kw.arg = f"_l{params.index(kw.arg)}"
        name = _dotted(node.func)
        if name and name.startswith("torch.nn.") and name.rsplit(".", 1)[-1][:1].isupper():
            keywords = ",".join(sorted(k.arg for k in node.keywords if k.arg))
            self.ctor[f"{canonical_op(name)}({keywords})"] += 1
        return node

    def _visit_function(self, node: ast.AST, scope: _Scope | None, method: bool) -> ast.AST:
        params = _all_args(node.args)
        for a in params:
            a.annotation = None  # annotations are dropped
        self._visit_fields(node.args, scope)  # defaults: the enclosing scope
        if not isinstance(node, ast.Lambda):
            node.decorator_list = [self._visit(d, scope) for d in node.decorator_list]
            node.returns = None
            if not method:
                node.name = self._lookup(node.name, scope)
        frame = self.frames.get(id(node)) or _Frame({a.arg for a in params}, None)
        inner = _Scope(frame.bound - frame.declared, scope)
        if method and params and params[0].arg != "self":
            inner.names[params[0].arg] = "self"
        for a in params:
            a.arg = inner.local(a.arg)
        if isinstance(node, ast.Lambda):
            node.body = self._visit(node.body, inner)
        else:
            self._visit_fields(node, inner, only="body")
        return node

    def _visit_class(self, node: ast.ClassDef, scope: _Scope | None) -> ast.AST:
        outer, self._class = self._class, node.name
        node.name = self._lookup(node.name, scope)
        node.bases = [self._visit(b, scope) for b in node.bases]
        node.keywords = [self._visit(k, scope) for k in node.keywords]
        node.decorator_list = [self._visit(d, scope) for d in node.decorator_list]
        body = []
        for stmt in node.body:
            if _is_docstring(stmt) or isinstance(stmt, _IMPORTS):
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
        self._class = outer
        return node


def _aliases(node: ast.Import | ast.ImportFrom) -> dict[str, str]:
    out = {}
    if isinstance(node, ast.Import):
        for a in node.names:
            if a.asname:
                out[a.asname] = a.name
            else:
                root = a.name.split(".")[0]
                out[root] = root
    elif node.module and not node.level:
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


def _operators(tree: ast.Module, modules: dict[str, str]) -> list[str]:
    """The operator sequence of `Model.forward` in a normalised module (empty without one)."""
    model = None
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "Model":
            model = node
    body = model.body if model is not None else tree.body
    forward = next((m for m in body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef)) and m.name == "forward"),
                   None)
    ops: list[str] = []
    if forward is not None:
        for stmt in forward.body:
            _emit(stmt, modules, ops)
    return ops


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
    """The op a call runs; None for a builtin (len, range, ...)."""
    if isinstance(func, ast.Attribute) and _is_self(func.value):
        return modules.get(func.attr, "call")  # a module built in __init__, or a helper method
    name = _dotted(func)
    if name is None:  # a method of an expression result (`x.view(...).permute(...)`), or `(f)(x)`
        return canonical_op(func.attr) if isinstance(func, ast.Attribute) else "call"
    if "." in name:  # torch.relu, torch.nn.functional.gelu, _l0.view (a tensor method)
        return canonical_op(name)
    if name in _BUILTINS:
        return None
    return name if name.startswith("_g") else "call"  # a module-local callable, or a callable value

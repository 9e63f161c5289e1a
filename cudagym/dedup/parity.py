"""The paper-parity decontamination score: `PythonASTSimilarity` on the `Model` class.

CUDA Agent drops a synthesized task when its `PythonASTSimilarity` to any KernelBench problem
exceeds 0.9. That metric is Relari's `continuous-eval` `PythonASTSimilarity` (adapted from Pedro
Salazar Paredes' `python-ast-comparison`). This module reimplements its scoring exactly and makes
it fast for many candidates against a fixed reference set. The definition:

- **Root.** The last top-level `class Model` of the source (the whole module when there is none).
- **Significant subtrees.** Every node under the root (the root included) whose type is one of
  `Import, FunctionDef, If, ClassDef, While, For, comprehension, Return` (nested ones count again).
- **Node match** `m(a, b)` between two AST nodes: 0 if their types differ or they have different
  numbers of child nodes (`ast.iter_child_nodes`, which includes `Load`/`Store` contexts and
  operator nodes); 1 if both are leaves; else `1 + ` the maximum-weight one-to-one assignment of
  `m` over their children (children may be reordered). Identifier names, attribute names and
  constant values are fields, not nodes, so they never count: `torch.relu(x)` matches
  `torch.sigmoid(y)` fully. `m(a, a)` is the node count of `a`.
- **Program score.** With `w(t)` = 0.3 for `Import`, 1.2 for `FunctionDef`, 0.5 for `If`, else 1:
  `W = sum over the maximum assignment of significant subtrees (a, b) of m(a, b) * w(type)` (the
  assignment maximises the unweighted `m`; pairs of different types score 0 so this equals the
  per-type optimum), `D(P) = sum over significant subtrees s of P of w(type(s)) * |s|`, and
  `similarity = round(2 * W / (D(A) + D(B)), 4)`. As in the reference implementation, a program
  with fewer than two significant subtrees scores 0 against everything.

Known weaknesses (why `cudagym.dedup.strong` exists), measured on KernelBench v0.1 L1-3:
identifiers are ignored, so 208 of the 31,125 pairs of distinct problems score above 0.9 (89 of
them 1.0, e.g. 19_ReLU and 21_Sigmoid); the strict child-count rule means deleting one docstring
zeroes the whole enclosing class and function, so a renamed, docstring-stripped copy scores 0.33
at the median and only 2 of 250 such copies exceed 0.9.

Batch scoring (`ParityIndex`) gives results identical to scoring every pair (`brute_force_max`):
node structures are interned so `m` is memoised across all pairs, and references are pruned with
an exact upper bound (a matched pair maps nodes injectively and type-preservingly, so
`m(a, b) <= sum_t min(count_a(t), count_b(t))` over node types `t`; summed per
(subtree type, child count) group it bounds `W`), visiting references by descending bound and
stopping once the bound cannot reach the best score found.
"""

from __future__ import annotations

import ast
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

SIGNIFICANT = (ast.Import, ast.FunctionDef, ast.If, ast.ClassDef, ast.While, ast.For, ast.comprehension, ast.Return)
ROOT_WEIGHT = {"Import": 0.3, "FunctionDef": 1.2, "If": 0.5}
ROOT_CLASS = "Model"
_MEMO_LIMIT = 2_000_000  # memoised node-pair matches kept before the table is cleared
_RESULT_LIMIT = 200_000  # memoised candidate results kept before the table is cleared


@dataclass(frozen=True)
class ParityFeatures:
    """One program's significant subtrees, as interned structure ids of one `Structures` table."""

    roots: tuple[int, ...]  # the significant subtrees (their order carries no meaning)
    denominator: float  # sum of w(type) * node count over the significant subtrees
    groups: dict  # (type, child count) -> root ids of that group
    bag: dict  # (type, child count, node type) -> count of that node type over the group's roots


class Structures:
    """Interned node structures (type and children, nothing else) and the memoised node match.

    One table serves every program scored against each other; ids are only meaningful within it.
    """

    def __init__(self) -> None:
        self._ids: dict[tuple, int] = {}
        self._kinds: dict[str, int] = {}
        self._type_kind: dict[type, int] = {}
        self.kind_weight: list[float] = []  # w(type) by kind id
        self.kind: list[int] = []
        self.children: list[tuple[int, ...]] = []
        self.size: list[int] = []
        self._memo: dict[tuple[int, int], int] = {}

    def kind_id(self, name: str) -> int:
        kind = self._kinds.get(name)
        if kind is None:
            kind = self._kinds[name] = len(self._kinds)
            self.kind_weight.append(ROOT_WEIGHT.get(name, 1.0))
        return kind

    def intern(self, node: ast.AST, preorder: list[int], significant: list[tuple]) -> int:
        """The structure id of `node`. Appends the kind of every node of its subtree to `preorder`
        (pre-order) and (start, end, id, type name) of each significant subtree to `significant`."""
        kind = self._type_kind.get(type(node))
        if kind is None:
            kind = self._type_kind[type(node)] = self.kind_id(type(node).__name__)
        start = len(preorder)
        preorder.append(kind)
        child_ids = []
        for field in node._fields:
            value = getattr(node, field, None)
            if isinstance(value, ast.AST):
                child_ids.append(self.intern(value, preorder, significant))
            elif isinstance(value, list):
                for item in value:
                    if isinstance(item, ast.AST):
                        child_ids.append(self.intern(item, preorder, significant))
        key = (kind, tuple(child_ids))
        sid = self._ids.get(key)
        if sid is None:
            sid = self._ids[key] = len(self.kind)
            self.kind.append(kind)
            self.children.append(key[1])
            self.size.append(1 + sum(self.size[c] for c in child_ids))
        if isinstance(node, SIGNIFICANT):
            significant.append((start, len(preorder), sid, type(node).__name__))
        return sid

    def match(self, a: int, b: int) -> int:
        """m(a, b): matched nodes of the best reordering-allowed top-down matching."""
        if a == b:
            return self.size[a]
        if self.kind[a] != self.kind[b]:
            return 0
        ca, cb = self.children[a], self.children[b]
        if len(ca) != len(cb):
            return 0
        key = (a, b) if a < b else (b, a)
        m = self._memo.get(key)
        if m is None:
            if len(ca) == 1:
                m = 1 + self.match(ca[0], cb[0])
            else:
                m = 1 + max_assignment([[self.match(x, y) for y in cb] for x in ca])
            if len(self._memo) >= _MEMO_LIMIT:
                self._memo.clear()
            self._memo[key] = m
        return m

    def features(self, code: str | ast.AST) -> ParityFeatures:
        """Features of a source (or a parsed module); SyntaxError / RecursionError propagate."""
        tree = ast.parse(code) if isinstance(code, str) else code
        root = model_class(tree) or tree
        preorder: list[int] = []
        significant: list[tuple] = []
        self.intern(root, preorder, significant)
        roots, groups, bag = [], {}, Counter()
        denominator = 0.0
        for start, end, sid, name in significant:
            group = (self.kind[sid], len(self.children[sid]))
            roots.append(sid)
            groups.setdefault(group, []).append(sid)
            denominator += ROOT_WEIGHT.get(name, 1.0) * self.size[sid]
            for kind, count in Counter(preorder[start:end]).items():
                bag[(*group, kind)] += count
        return ParityFeatures(tuple(roots), denominator, {g: tuple(r) for g, r in groups.items()}, dict(bag))

    def similarity(self, a: ParityFeatures, b: ParityFeatures) -> float:
        """The exact PythonASTSimilarity of two programs' features (both from this table)."""
        if len(a.roots) <= 1 or len(b.roots) <= 1:
            return 0.0
        matched = 0.0
        for group, ra in a.groups.items():
            rb = b.groups.get(group)
            if rb:
                best = max_assignment([[self.match(x, y) for y in rb] for x in ra])
                matched += best * self.kind_weight[group[0]]
        return round(2 * matched / (a.denominator + b.denominator), 4)


def model_class(tree: ast.Module) -> ast.ClassDef | None:
    """The last top-level `class Model` (the one Python binds), or None."""
    found = None
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == ROOT_CLASS:
            found = node
    return found


def parity_score(code_a: str, code_b: str) -> float:
    """PythonASTSimilarity of two sources' Model classes (SyntaxError on bad source)."""
    table = Structures()
    return table.similarity(table.features(code_a), table.features(code_b))


class ParityIndex:
    """Reference programs prepared once; `best(code)` = the exact maximum score over them.

    `best` returns (score, index of the best reference) with ties to the lowest index and index
    None when the maximum is 0 (nothing in common), the same as `brute_force_max`.
    """

    def __init__(self, references: Sequence[str]) -> None:
        self.table = Structures()
        self.refs = [self.table.features(code) for code in references]
        cols: dict[tuple, int] = {}
        for f in self.refs:
            for key in f.bag:
                cols.setdefault(key, len(cols))
        self._cols = cols
        self._bag = np.zeros((len(self.refs), max(1, len(cols))), dtype=np.float64)
        for i, f in enumerate(self.refs):
            for key, count in f.bag.items():
                self._bag[i, cols[key]] = count
        self._col_weight = np.zeros(self._bag.shape[1])
        for key, c in cols.items():
            self._col_weight[c] = self.table.kind_weight[key[0]]
        self._denominator = np.array([f.denominator for f in self.refs])
        self._scorable = np.array([len(f.roots) > 1 for f in self.refs])
        self._results: dict[tuple[int, ...], tuple[float, int | None]] = {}
        self.exact_computed = 0  # pairs scored exactly (the rest were pruned or memoised)

    def upper_bounds(self, f: ParityFeatures) -> np.ndarray:
        """An upper bound of the score against each reference (unrounded)."""
        bounds = np.zeros(len(self.refs))
        if len(f.roots) <= 1:
            return bounds
        keys = [(self._cols[k], v) for k, v in f.bag.items() if k in self._cols]
        if not keys:
            return bounds
        cols = np.fromiter((c for c, _ in keys), dtype=np.intp, count=len(keys))
        counts = np.fromiter((v for _, v in keys), dtype=np.float64, count=len(keys))
        matched = np.minimum(self._bag[:, cols], counts) @ self._col_weight[cols]
        bounds = 2 * matched / (self._denominator + f.denominator)
        bounds[~self._scorable] = 0.0
        return bounds

    def best(self, code: str | ast.AST) -> tuple[float, int | None]:
        f = self.table.features(code)
        key = tuple(sorted(f.roots))
        hit = self._results.get(key)
        if hit is not None:
            return hit
        bounds = self.upper_bounds(f)
        best, best_i = 0.0, None
        slack = 0.5e-4 + 1e-9  # a score is rounded to 4 places: x >= best - 0.00005 may round up to best
        for i in np.argsort(-bounds, kind="stable").tolist():
            if bounds[i] < best - slack or bounds[i] == 0.0:
                break
            s = self.table.similarity(f, self.refs[i])
            self.exact_computed += 1
            if s > best or (s == best and s > 0 and (best_i is None or i < best_i)):
                best, best_i = s, i
        if len(self._results) >= _RESULT_LIMIT:
            self._results.clear()
        self._results[key] = (best, best_i)
        return best, best_i

    def brute_force_max(self, code: str | ast.AST) -> tuple[float, int | None]:
        """Every reference scored exactly; the reference result `best` must equal."""
        f = self.table.features(code)
        scores = [self.table.similarity(f, r) for r in self.refs]
        top = max(scores, default=0.0)
        return (top, scores.index(top)) if top > 0 else (0.0, None)


# -- assignment -------------------------------------------------------------------------------------
def max_assignment(w: list[list[int]]) -> int:
    """Maximum total weight of a one-to-one assignment of rows to columns (rectangular allowed)."""
    n, m = len(w), len(w[0]) if w else 0
    if n == 0 or m == 0:
        return 0
    if n == 1:
        return max(w[0])
    if m == 1:
        return max(row[0] for row in w)
    # Exact shortcut: the sum of row maxima bounds the optimum; distinct argmax columns attain it.
    best_cols = [max(range(m), key=row.__getitem__) for row in w]
    if len(set(best_cols)) == n:
        return sum(row[c] for row, c in zip(w, best_cols))
    if n == 2 and m == 2:
        return max(w[0][0] + w[1][1], w[0][1] + w[1][0])
    return _hungarian_max(w)


def _hungarian_max(w: list[list[int]]) -> int:
    """O(n^2 m) Hungarian algorithm (shortest augmenting paths with potentials), maximising."""
    transpose = len(w) > len(w[0])
    if transpose:
        w = [list(col) for col in zip(*w)]
    n, m = len(w), len(w[0])
    top = max(max(row) for row in w)
    cost = [[top - x for x in row] for row in w]  # minimise cost, rows n <= columns m
    inf = float("inf")
    u, v = [0] * (n + 1), [0] * (m + 1)
    owner, way = [0] * (m + 1), [0] * (m + 1)
    for i in range(1, n + 1):
        owner[0] = i
        j0 = 0
        minv = [inf] * (m + 1)
        used = [False] * (m + 1)
        while True:
            used[j0] = True
            i0, delta, j1 = owner[j0], inf, 0
            row = cost[i0 - 1]
            for j in range(1, m + 1):
                if not used[j]:
                    cur = row[j - 1] - u[i0] - v[j]
                    if cur < minv[j]:
                        minv[j], way[j] = cur, j0
                    if minv[j] < delta:
                        delta, j1 = minv[j], j
            for j in range(m + 1):
                if used[j]:
                    u[owner[j]] += delta
                    v[j] -= delta
                else:
                    minv[j] -= delta
            j0 = j1
            if owner[j0] == 0:
                break
        while j0:
            j1 = way[j0]
            owner[j0] = owner[j1]
            j0 = j1
    return sum(w[owner[j] - 1][j - 1] for j in range(1, m + 1) if owner[j])

"""cudagym.dedup.strong: normalisation invariances, the score's distribution on KernelBench, the batch index.

`mutate_copy` (used by test_decontaminate too) is the adversary the strong check must survive: every
identifier renamed (Model's attributes, locals, parameters, `self`, helpers), docstrings and
comments stripped and added, reformatted, every integer constant at module level and in
get_inputs / get_init_inputs doubled.
"""

from __future__ import annotations

import ast
import random
import string

import pytest

from cudagym.dedup.strong import (STRONG_THRESHOLD, StrongIndex, canonical_op, lcs_length, multiset_jaccard, normalize,
                                  similarity, strong_score, token_jaccard)
from cudagym.kernelbench import load_problems

FIXED = {"Model", "forward", "get_inputs", "get_init_inputs"}


def _params(args: ast.arguments) -> list[ast.arg]:
    return [*args.posonlyargs, *args.args, *filter(None, [args.vararg]), *args.kwonlyargs, *filter(None, [args.kwarg])]


def _is_docstring(stmt: ast.AST) -> bool:
    return isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str)


def mutate_copy(code: str, seed: int = 0) -> str:
    """A renamed, docstring-stripped, constant-resized, reformatted and commented copy of `code`."""
    rng = random.Random(seed)
    tree = ast.parse(code)
    imported = {(a.asname or a.name).split(".")[0] for n in ast.walk(tree)
                if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}
    names, attrs = set(), set()
    callables = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    for n in ast.walk(tree):
        if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load):
            names.add(n.id)
        elif isinstance(n, ast.arg):
            names.add(n.arg)
        elif isinstance(n, (ast.FunctionDef, ast.ClassDef)):
            names.add(n.name)
        elif (isinstance(n, ast.Attribute) and not isinstance(n.ctx, ast.Load) and isinstance(n.value, ast.Name)
              and n.value.id == "self"):
            attrs.add(n.attr)
        if isinstance(n, ast.ClassDef):  # methods and class attributes are reached through self
            for stmt in n.body:
                if isinstance(stmt, ast.FunctionDef):
                    attrs.add(stmt.name)
                elif isinstance(stmt, (ast.Assign, ast.AnnAssign)):
                    attrs.update(t.id for t in ast.walk(stmt)
                                 if isinstance(t, ast.Name) and isinstance(t.ctx, ast.Store))
    attrs = {a for a in attrs if a not in FIXED and not a.startswith("__")}
    names = {x for x in names - imported - FIXED - attrs - {"self"} if not x.startswith("__")}

    def fresh() -> str:
        return "".join(rng.choice(string.ascii_lowercase) for _ in range(6)) + str(rng.randrange(1000))

    name_map = {x: fresh() for x in sorted(names)}
    attr_map = {x: fresh() for x in sorted(attrs)}
    for n in ast.walk(tree):
        if isinstance(n, ast.ClassDef):
            for stmt in n.body:
                if isinstance(stmt, (ast.Assign, ast.AnnAssign)):
                    for t in ast.walk(stmt):
                        if isinstance(t, ast.Name) and isinstance(t.ctx, ast.Store):
                            t.id = attr_map.get(t.id, t.id)
    for n in ast.walk(tree):
        for field in ("body", "orelse", "finalbody"):
            body = getattr(n, field, None)
            if isinstance(body, list) and body and isinstance(body[0], ast.stmt):
                body[:] = [s for s in body if not _is_docstring(s)] or ([ast.Pass()] if field == "body" else [])
        if isinstance(n, ast.Name):
            n.id = "this" if n.id == "self" else name_map.get(n.id, n.id)
        elif isinstance(n, ast.arg):
            n.arg = "this" if n.arg == "self" else name_map.get(n.arg, n.arg)
        elif isinstance(n, ast.Attribute):
            if isinstance(n.value, ast.Name) and n.value.id in ("self", "this"):
                n.attr = attr_map.get(n.attr, n.attr)
        elif isinstance(n, (ast.FunctionDef, ast.ClassDef)):
            n.name = attr_map.get(n.name, name_map.get(n.name, n.name))
        elif isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in callables:
            for kw in n.keywords:
                kw.arg = name_map.get(kw.arg, kw.arg)
    for stmt in tree.body:  # resize: module level and get_inputs / get_init_inputs
        if isinstance(stmt, ast.ClassDef) or (isinstance(stmt, ast.FunctionDef)
                                              and stmt.name not in ("get_inputs", "get_init_inputs")):
            continue
        for n in ast.walk(stmt):
            if isinstance(n, ast.Constant) and type(n.value) is int:
                n.value *= 2
    lines = ['"""A fused operator (docstring added by the mutation)."""', "# reformatted copy"]
    for i, line in enumerate(ast.unparse(tree).splitlines()):
        stripped = line.lstrip(" ")
        line = "  " * ((len(line) - len(stripped)) // 4) + stripped  # two-space indentation
        if stripped and i % 3 == 0 and not stripped.endswith(":"):
            line += "  # note"
        lines.append(line)
        if i % 4 == 0:
            lines.append("")
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def problems(kernelbench_path):
    return load_problems("v0.1", (1, 2, 3), path=kernelbench_path)


@pytest.fixture(scope="module")
def normalized(problems):
    return [normalize(p.code) for p in problems]


def test_mutated_copies_of_every_problem_normalise_identically(problems, normalized):
    for k, (problem, norm) in enumerate(zip(problems, normalized)):
        copy = mutate_copy(problem.code, seed=k)
        compile(copy, problem.name, "exec")
        assert copy != problem.code
        mutated = normalize(copy)
        assert mutated.text == norm.text, problem.id
        assert (mutated.ops, mutated.ctor) == (norm.ops, norm.ctor)
        assert similarity(norm, mutated) == 1.0


def test_normal_form_is_canonical():
    a = '''
import torch
import torch.nn as nn
import torch.nn.functional as F

class Model(nn.Module):
    """Doc."""
    def __init__(self, dim):
        super(Model, self).__init__()
        self.fc = nn.Linear(dim, dim)  # a comment

    def forward(self, x):
        """Doc."""
        y = self.fc(x)
        return F.gelu(y) * 0.5

batch = 16
dim = 1024

def get_inputs():
    return [torch.randn(batch, dim)]

def get_init_inputs():
    return [dim]
'''
    b = '''
import torch
from torch import nn
import torch.nn.functional as fn
class Model(nn.Module):
  def __init__(me, size):
    super().__init__()
    me.layer = nn.Linear(size, size)
  def forward(me, inp):
    out = me.layer(inp)
    return fn.gelu(out) * 0.25
N = 8
D = 4096
def get_inputs():
  return [torch.randn(N, D)]
def get_init_inputs():
  return [D]
'''
    na, nb = normalize(a), normalize(b)
    assert na.text == nb.text
    assert "super().__init__()" in na.text and "torch.nn.functional.gelu" in na.text
    assert "Doc" not in na.text and "comment" not in na.text and "1024" not in na.text
    assert na.ops == ("linear", "gelu", "mul")
    assert na.ctor == {"linear()": 1}
    assert strong_score(a, b) == 1.0


def test_per_scope_renaming_is_invariant():
    base = "import torch\ndef f(x):\n    y = x + 1\n    return y\ndef g(x):\n    return x * 2\n"
    per_scope = "import torch\ndef f(a):\n    b = a + 1\n    return b\ndef g(c):\n    return c * 2\n"
    assert normalize(base).text == normalize(per_scope).text


def test_operator_view_equates_module_and_functional_style():
    module = '''
import torch
import torch.nn as nn
class Model(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3)
        self.act = nn.ReLU()
    def forward(self, x):
        return self.act(self.conv(x)) + x
'''
    functional = '''
import torch
import torch.nn as nn
import torch.nn.functional as F
class Model(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3)
        self.act = nn.ReLU()
    def forward(self, x):
        y = self.conv(x)
        y = F.relu(y)
        return y + x
'''
    a, b = normalize(module), normalize(functional)
    assert a.ops == b.ops == ("conv2d", "relu", "add")
    assert token_jaccard(a, b) < STRONG_THRESHOLD <= similarity(a, b)


def test_different_operators_score_low():
    head = "import torch\nclass Model(torch.nn.Module):\n    def forward(self, x):\n"
    relu = head + "        return torch.relu(x)\n"
    other = head + "        return torch.sigmoid(x) * x\n"
    assert strong_score(relu, other) < 0.6


def test_canonical_op_names():
    assert canonical_op("torch.nn.functional.leaky_relu") == canonical_op("torch.nn.LeakyReLU") == "leakyrelu"
    assert canonical_op("relu_") == "relu"
    assert canonical_op("torch.true_divide") != canonical_op("torch.mul")


def test_lcs_and_multiset_jaccard():
    rng = random.Random(0)

    def slow(a, b):
        if not a or not b:
            return 0
        if a[-1] == b[-1]:
            return slow(a[:-1], b[:-1]) + 1
        return max(slow(a[:-1], b), slow(a, b[:-1]))

    for _ in range(200):
        a = [rng.choice("abc") for _ in range(rng.randint(0, 7))]
        b = [rng.choice("abc") for _ in range(rng.randint(0, 7))]
        assert lcs_length(a, b) == slow(a, b)
    assert multiset_jaccard({"a": 2, "b": 1}, {"a": 1}) == 1 / 3
    assert multiset_jaccard({}, {}) == 1.0


def test_distinct_kernelbench_problems_mostly_score_low(problems, normalized):
    """Pairs of different problems: the median is far below the threshold, and every pair at or
    above it is the same computation up to sizes (identical operator views)."""
    rng = random.Random(0)
    sample = rng.sample(range(len(problems)), 40)
    scores = []
    for i in sample:
        for j in range(len(problems)):
            if j == i:
                continue
            s = similarity(normalized[i], normalized[j])
            scores.append(s)
            if s >= STRONG_THRESHOLD:
                assert (normalized[i].ops, normalized[i].ctor) == (normalized[j].ops, normalized[j].ctor) or \
                    token_jaccard(normalized[i], normalized[j]) >= STRONG_THRESHOLD, (problems[i].id, problems[j].id)
    scores.sort()
    assert scores[len(scores) // 2] < 0.3
    assert sum(s >= STRONG_THRESHOLD for s in scores) / len(scores) < 0.01


def test_index_equals_brute_force(problems, normalized):
    rng = random.Random(1)
    refs = rng.sample(range(len(problems)), 80)
    index = StrongIndex([normalized[i] for i in refs])
    candidates = [mutate_copy(problems[i].code, seed=i) for i in rng.sample(range(len(problems)), 25)]
    candidates += [problems[i].code.replace("return ", "return 0.5 * ", 1)
                   for i in rng.sample(range(len(problems)), 15)]
    for code in candidates:
        assert index.best(code) == index.brute_force_max(code)
    assert index.exact_computed < 40 * 80 / 4  # the operator-view LCS ran for few references


def test_index_prefers_the_exact_problem_among_size_twins(problems, normalized):
    index = StrongIndex(normalized)
    names = [p.name for p in problems]
    for name in ("6_Matmul_with_large_K_dimension_", "2_Standard_matrix_multiplication_"):
        k = names.index(name)
        score, match = index.best(mutate_copy(problems[k].code, seed=3))
        assert (score, match) == (1.0, k)

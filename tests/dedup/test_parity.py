"""cudagym.dedup.parity: PythonASTSimilarity as continuous-eval defines it; batch == brute force.

`reference_similarity` below is an independent, deliberately naive transcription of the public
metric (AST nodes compared directly, no interning or memo, networkx for the assignments); the fast
implementation must agree with it exactly.
"""

from __future__ import annotations

import ast
import itertools
import random

import networkx as nx
import pytest

from cudagym.dedup.parity import ParityIndex, Structures, max_assignment, parity_score
from cudagym.kernelbench import load_problems

SIGNIFICANT = (ast.Import, ast.FunctionDef, ast.If, ast.ClassDef, ast.While, ast.For, ast.comprehension, ast.Return)
WEIGHT = {ast.Import: 0.3, ast.FunctionDef: 1.2, ast.If: 0.5}


def _matching(matrix: list[list[int]]) -> list[tuple[int, int]]:
    graph = nx.Graph()
    for i, row in enumerate(matrix):
        for j, value in enumerate(row):
            if value > 0:
                graph.add_edge(("a", i), ("b", j), weight=value)
    pairs = []
    for u, v in nx.max_weight_matching(graph):
        i, j = (u[1], v[1]) if u[0] == "a" else (v[1], u[1])
        pairs.append((i, j))
    return pairs


def _compare(a: ast.AST, b: ast.AST) -> int:
    ca, cb = list(ast.iter_child_nodes(a)), list(ast.iter_child_nodes(b))
    if type(a) is type(b) and not ca and not cb:
        return 1
    if type(a) is not type(b) or len(ca) != len(cb):
        return 0
    matrix = [[_compare(x, y) for y in cb] for x in ca]
    return 1 + sum(matrix[i][j] for i, j in _matching(matrix))


def _root(code: str) -> ast.AST:
    tree = ast.parse(code)
    classes = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Model"]
    return classes[-1] if classes else tree


def reference_similarity(code_a: str, code_b: str) -> float:
    sa = [n for n in ast.walk(_root(code_a)) if isinstance(n, SIGNIFICANT)]
    sb = [n for n in ast.walk(_root(code_b)) if isinstance(n, SIGNIFICANT)]
    if len(sa) <= 1 or len(sb) <= 1:
        return 0.0
    matrix = [[_compare(x, y) for y in sb] for x in sa]
    matched = sum(matrix[i][j] * (WEIGHT.get(type(sa[i]), 1) + WEIGHT.get(type(sb[j]), 1)) / 2
                  for i, j in _matching(matrix))
    total = sum(WEIGHT.get(type(n), 1) * len(list(ast.walk(n))) for n in (*sa, *sb))
    return round(2 * matched / total, 4)


@pytest.fixture(scope="module")
def problems(kernelbench_path):
    return load_problems("v0.1", (1, 2, 3), path=kernelbench_path)


@pytest.fixture(scope="module")
def index(problems):
    return ParityIndex([p.code for p in problems])


def _variant(code: str, rng: random.Random) -> str:
    """A cheap structural edit: an extra statement before the first return, or a stripped docstring."""
    if rng.random() < 0.5:
        return code.replace("        return ", "        x = 0\n        return ", 1)
    tree = ast.parse(code)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and len(body) > 1 and isinstance(body[0], ast.Expr):
            del body[0]
    return ast.unparse(tree)


def test_matches_the_reference_metric(problems):
    rng = random.Random(0)
    pairs = [tuple(rng.sample(range(len(problems)), 2)) for _ in range(60)]
    for i, j in pairs:
        a, b = problems[i].code, problems[j].code
        assert parity_score(a, b) == reference_similarity(a, b), (problems[i].id, problems[j].id)
    for k in rng.sample(range(len(problems)), 20):
        a = problems[k].code
        b = _variant(a, rng)
        assert parity_score(a, b) == reference_similarity(a, b), problems[k].id


def test_every_problem_matches_itself(problems, index):
    table = index.table
    for k, problem in enumerate(problems):
        score, match = index.best(problem.code)
        assert score == 1.0, problem.id
        # ties (identical structure, e.g. ReLU and Sigmoid) go to the lowest index
        assert match <= k and table.similarity(index.refs[match], index.refs[k]) == 1.0


def test_pruned_batch_equals_brute_force(problems, index):
    rng = random.Random(2)
    sample = [_variant(problems[k].code, rng) for k in rng.sample(range(len(problems)), 80)]
    sample += [problems[k].code for k in rng.sample(range(len(problems)), 10)]
    fresh = ParityIndex([p.code for p in problems])  # no memo from other tests
    for code in sample:
        assert fresh.best(code) == fresh.brute_force_max(code)
    assert fresh.exact_computed < len(sample) * len(problems) / 5


def test_upper_bound_is_an_upper_bound(problems, index):
    rng = random.Random(3)
    for k in rng.sample(range(len(problems)), 15):
        f = index.table.features(_variant(problems[k].code, rng))
        bounds = index.upper_bounds(f)
        for i, ref in enumerate(index.refs):
            assert index.table.similarity(f, ref) <= round(bounds[i], 4) + 1e-9


def test_known_weaknesses_of_the_paper_metric(problems):
    """Identifiers are ignored (different problems score 1.0); docstrings break whole subtrees."""
    by_name = {p.name: p.code for p in problems}
    assert parity_score(by_name["19_ReLU"], by_name["21_Sigmoid"]) == 1.0
    stripped = []
    for p in problems:
        tree = ast.parse(p.code)
        for node in ast.walk(tree):
            body = getattr(node, "body", None)
            if isinstance(body, list):
                body[:] = [s for s in body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))] \
                    or [ast.Pass()]
        stripped.append(parity_score(p.code, ast.unparse(tree)))
    assert sorted(stripped)[len(stripped) // 2] < 0.6  # the median docstring-stripped copy is not caught


def test_programs_with_fewer_than_two_significant_subtrees_score_zero():
    assert parity_score("x = 1\n", "x = 1\n") == 0.0
    assert parity_score("def f():\n    pass\n", "def f():\n    pass\n") == 0.0  # one FunctionDef
    two = "def f():\n    return 1\n"
    assert parity_score(two, two) == 1.0


def test_identifiers_and_constants_do_not_count():
    a = "import torch\nclass Model:\n    def forward(self, x):\n        return torch.relu(x + 1)\n"
    b = "import torch\nclass Model:\n    def forward(self, inp):\n        return torch.tanh(inp + 7)\n"
    assert parity_score(a, b) == 1.0


def test_max_assignment_is_optimal():
    rng = random.Random(4)
    for _ in range(300):
        n, m = rng.randint(1, 5), rng.randint(1, 5)
        w = [[rng.choice((0, 0, 1, 2, 3, 7)) for _ in range(m)] for _ in range(n)]
        best = max(sum(w[i][j] for i, j in zip(rows, cols))
                   for rows in itertools.permutations(range(n), min(n, m))
                   for cols in itertools.permutations(range(m), min(n, m)))
        assert max_assignment(w) == best, w


def test_structures_share_identical_subtrees():
    table = Structures()
    fa = table.features("class Model:\n    def forward(self, x):\n        return x\n")
    fb = table.features("class Model:\n    def forward(self, y):\n        return y\n")
    assert fa.roots == fb.roots

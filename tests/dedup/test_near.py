"""cudagym.dedup.near: exact and near duplicates on a synthetic set whose clusters are known."""

from __future__ import annotations

import ast

import numpy as np
import pytest
from test_strong import mutate_copy  # the same adversarial copy as the strong-score tests

from cudagym.dedup import near
from cudagym.dedup.near import (NEAR_THRESHOLD, MinHasher, NearCache, NearDedup, candidate_pairs, find_duplicates,
                                fingerprint, jaccard)
from cudagym.kernelbench import load_problems
from cudagym.tasks import Task


def _with_extra_statement(code: str) -> str:
    """The same task with one more statement at the top of Model.forward (a near duplicate)."""
    tree = ast.parse(code)
    model = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Model"][-1]
    forward = next(n for n in model.body if isinstance(n, ast.FunctionDef) and n.name == "forward")
    forward.body.insert(0, ast.parse("scratch = None").body[0])
    return ast.unparse(tree)


@pytest.fixture(scope="module")
def synthetic(kernelbench_path):
    """12 groups: an L2 problem (id gNN-0), a renamed/resized copy (gNN-1, exact duplicate) and an
    edited copy (gNN-2, near duplicate); plus 6 singletons (sNN). Group bases are pairwise far apart."""
    problems = load_problems("v0.1", (2,), path=kernelbench_path)
    shingles = [fingerprint(p.code)[1] for p in problems]
    bases: list[int] = []
    for k, p in enumerate(problems):
        near = fingerprint(_with_extra_statement(p.code))[1]
        if not NEAR_THRESHOLD + 0.02 <= jaccard(shingles[k], near) < 1:
            continue
        if all(jaccard(shingles[k], shingles[b]) < NEAR_THRESHOLD - 0.1 for b in bases):
            bases.append(k)
        if len(bases) == 18:
            break
    assert len(bases) == 18
    tasks = []
    for g, k in enumerate(bases[:12]):
        code = problems[k].code
        tasks += [Task(id=f"g{g:02d}-2", name="near", code=_with_extra_statement(code)),
                  Task(id=f"g{g:02d}-0", name="original", code=code),
                  Task(id=f"g{g:02d}-1", name="copy", code=mutate_copy(code, seed=g))]
    tasks += [Task(id=f"s{i:02d}", name="single", code=problems[k].code) for i, k in enumerate(bases[12:])]
    return tasks


def test_clusters_keep_the_lowest_id(synthetic):
    dropped = find_duplicates(synthetic)
    expected = {}
    for g in range(12):
        expected[f"g{g:02d}-1"] = (f"g{g:02d}-0", "exact_duplicate")
        expected[f"g{g:02d}-2"] = (f"g{g:02d}-0", "near_duplicate")
    assert dropped == expected


def test_pipeline_step(synthetic):
    rejected = []
    step = NearDedup(rejects=lambda task, reason: rejected.append((task.id, reason)))
    kept = list(step.run(synthetic))
    assert [t.id for t in kept] == [t.id for t in synthetic if t.id.endswith("-0") or t.id.startswith("s")]
    assert dict(step.stats) == {"in": 42, "kept": 18, "dropped_exact_duplicate": 12, "dropped_near_duplicate": 12}
    assert all(t.provenance["dedup_duplicates"] == (2 if t.id.startswith("g") else 0) for t in kept)
    assert len(rejected) == 24
    assert [t.id for t in NearDedup().run(reversed(synthetic))] == [t.id for t in reversed(kept)]  # order-free


def test_a_cache_kept_across_a_growing_set_gives_the_same_answer_and_works_out_only_the_new(synthetic, monkeypatch):
    """A build dedups all its candidates after every round: with a NearCache, each call fingerprints only the
    sources it has not seen, and answers as a call without it."""
    fingerprinted = []
    monkeypatch.setattr(near, "fingerprint", lambda code: fingerprinted.append(code) or fingerprint(code))
    cache = NearCache()
    first, grown = synthetic[:21], synthetic  # a round's candidates, then the next round's added
    assert find_duplicates(first, cache=cache) == find_duplicates(first)
    fingerprinted.clear()
    cached = find_duplicates(grown, cache=cache)
    assert fingerprinted == [t.code for t in grown[21:]]  # the next round's, not the first's again
    assert cached == find_duplicates(grown)
    fingerprinted.clear()
    find_duplicates(grown, cache=cache)
    assert fingerprinted == []
    assert len(cache.fingerprints) == len({t.code for t in grown})


def test_exact_duplicate_of_a_near_duplicate_points_to_the_cluster_keeper(synthetic):
    g0 = [t for t in synthetic if t.id.startswith("g00")]
    near = next(t for t in g0 if t.id.endswith("-2"))
    extra = Task(id="g00-3", name="copy of near", code=mutate_copy(near.code, seed=9))
    dropped = find_duplicates([*g0, extra])
    assert dropped["g00-3"] == ("g00-0", "exact_duplicate")


def test_unparsable_tasks_are_kept_apart():
    tasks = [Task(id="a", name="a", code="def (:"), Task(id="b", name="b", code="def (:"),
             Task(id="c", name="c", code="class Model:\n    pass\n")]
    assert find_duplicates(tasks) == {"b": ("a", "exact_duplicate")}


def test_minhash_estimates_jaccard(synthetic):
    hasher = MinHasher(num_perm=256, seed=1)
    codes = [t.code for t in synthetic]
    elements = [fingerprint(c)[1] for c in codes]
    for i, j in [(0, 1), (0, 3), (3, 4), (5, 9), (1, 36)]:
        sa, sb = hasher.signature(elements[i]), hasher.signature(elements[j])
        assert abs(float(np.mean(sa == sb)) - jaccard(elements[i], elements[j])) < 0.12


def test_candidate_pairs_share_a_band():
    hasher = MinHasher(num_perm=16, seed=0)
    a = hasher.signature({(("x",), 0), (("y",), 0)})
    b = a.copy()
    c = hasher.signature({(("z",), 0)})
    assert candidate_pairs([a, b, c], bands=4) == {(0, 1)}


def test_bad_configuration():
    with pytest.raises(ValueError):
        find_duplicates([], num_perm=100, bands=16)
    with pytest.raises(ValueError):
        NearDedup(threshold=0)
    with pytest.raises(ValueError, match="not unique"):
        list(NearDedup().run([Task(id="a", name="a", code="x = 1"), Task(id="a", name="a", code="y = 2")]))

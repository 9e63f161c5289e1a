"""Deduplication within a task set: exact duplicates, then near duplicates; one task per cluster.

- **Exact**: tasks whose normalised source (`cudagym.dedup.strong.normalize`: no docstrings or
  comments, canonical formatting, identifiers alpha-renamed, numbers replaced) has the same sha256.
  Renamed, reformatted or resized copies are exact duplicates here.
- **Near**: MinHash over the normalised token shingles (5-token shingles as a multiset, so
  `Jaccard` is the multiset Jaccard the strong score uses) with `num_perm` = 128 seeded 64-bit
  hash functions (splitmix64 of the shingle's blake2b hash XOR a seed); LSH with 16 bands of 8 rows
  proposes candidate pairs (a pair at Jaccard 0.85 is proposed with probability 0.994, at 0.9 with
  0.9999); every candidate is verified with the exact Jaccard, and pairs at `>= threshold` (0.85)
  are edges of a graph whose connected components (networkx) are the clusters.
- **Kept**: the lowest id of each cluster (deterministic); the others are dropped. Clusters are
  transitive (A~B and B~C put A, B, C together even if A and C are further apart).

`NearDedup.run` is the pipeline step (it needs the whole set before it can yield); kept tasks carry
`dedup_duplicates` (how many tasks were dropped in their favour) in their provenance.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence

import networkx as nx
import numpy as np

from cudagym.dedup.strong import multiset_shingles, normalize
from cudagym.tasks import Task, sha256_text

NEAR_THRESHOLD = 0.85
NUM_PERM = 128
BANDS = 16
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


def fingerprint(code: str) -> tuple[str, set]:
    """(sha256 of the normalised source, its multiset-shingle elements); for a source that does not
    parse, the raw text's sha256 and whitespace-token shingles."""
    try:
        n = normalize(code)
    except (SyntaxError, ValueError, RecursionError):
        return sha256_text(code), set(multiset_shingles(code.split()))
    return sha256_text(n.text), set(n.shingles)


class MinHasher:
    """MinHash signatures: `num_perm` seeded hash functions, each the splitmix64 finaliser of
    (64-bit blake2b element hash XOR a random 64-bit seed); a signature holds each function's minimum."""

    def __init__(self, num_perm: int = NUM_PERM, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.seeds = rng.integers(0, np.iinfo(np.uint64).max, size=num_perm, dtype=np.uint64, endpoint=True)[:, None]

    def signature(self, elements: Iterable) -> np.ndarray:
        hashes = np.fromiter((_hash64(e) for e in elements), dtype=np.uint64)
        if hashes.size == 0:
            return np.full(self.seeds.shape[0], np.iinfo(np.uint64).max, dtype=np.uint64)
        z = hashes[None, :] ^ self.seeds  # uint64 arithmetic wraps modulo 2^64, as splitmix64 intends
        z = (z ^ (z >> np.uint64(30))) * _MIX1
        z = (z ^ (z >> np.uint64(27))) * _MIX2
        z ^= z >> np.uint64(31)
        return z.min(axis=1)


def _hash64(element: tuple) -> int:
    grams, k = element
    data = "\x1f".join(grams).encode() + b"\x1e" + str(k).encode()
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def candidate_pairs(signatures: Sequence[np.ndarray], bands: int = BANDS) -> set[tuple[int, int]]:
    """Index pairs (i < j) that share at least one LSH band."""
    pairs: set[tuple[int, int]] = set()
    if not signatures:
        return pairs
    rows = len(signatures[0]) // bands
    for band in range(bands):
        buckets: dict[bytes, list[int]] = defaultdict(list)
        for i, sig in enumerate(signatures):
            buckets[sig[band * rows:(band + 1) * rows].tobytes()].append(i)
        for members in buckets.values():
            pairs.update(itertools.combinations(members, 2))
    return pairs


def jaccard(a: set, b: set) -> float:
    union = len(a | b)
    return len(a & b) / union if union else 1.0


@dataclasses.dataclass
class NearCache:
    """What `find_duplicates` works out per task and per pair, kept for its next call on a set that grows
    (a dataset build dedups all its candidates after each round): each source's fingerprint (by the code's
    sha256), each normalised source's MinHash signature, and each verified pair's Jaccard. The answer is
    the same with or without it; without it, the build's 2,129 candidates of session 29 took 5.7 s of one
    core per call (fingerprints 2.1 s, signatures 0.6 s, 31,753 pair checks 1.6 s), twice a round."""

    fingerprints: dict[str, tuple[str, set]] = dataclasses.field(default_factory=dict)
    signatures: dict[tuple[str, int, int], np.ndarray] = dataclasses.field(default_factory=dict)
    similarity: dict[tuple[str, str], float] = dataclasses.field(default_factory=dict)

    def fingerprint(self, code: str) -> tuple[str, set]:
        sha = sha256_text(code)
        if sha not in self.fingerprints:
            self.fingerprints[sha] = fingerprint(code)
        return self.fingerprints[sha]

    def signature(self, hasher: "MinHasher", key: str, elements: set, num_perm: int, seed: int) -> np.ndarray:
        if (key, num_perm, seed) not in self.signatures:
            self.signatures[(key, num_perm, seed)] = hasher.signature(elements)
        return self.signatures[(key, num_perm, seed)]

    def jaccard(self, key_a: str, a: set, key_b: str, b: set) -> float:
        pair = (key_a, key_b) if key_a < key_b else (key_b, key_a)
        if pair not in self.similarity:
            self.similarity[pair] = jaccard(a, b)
        return self.similarity[pair]


def find_duplicates(tasks: Sequence[Task], threshold: float = NEAR_THRESHOLD, num_perm: int = NUM_PERM,
                    bands: int = BANDS, seed: int = 0, cache: NearCache | None = None) -> dict[str, tuple[str, str]]:
    """{dropped task id: (kept representative id, "exact_duplicate" | "near_duplicate")}. `cache`: what an
    earlier call on (some of) these tasks worked out, reused, and this call's added to it."""
    if num_perm % bands:
        raise ValueError(f"num_perm ({num_perm}) must be a multiple of bands ({bands})")
    cache = cache if cache is not None else NearCache()
    dropped: dict[str, tuple[str, str]] = {}
    by_key: dict[str, list[Task]] = defaultdict(list)
    key_of: dict[str, str] = {}
    elements_of: dict[str, set] = {}
    for task in tasks:
        key_of[task.id], elements_of[task.id] = cache.fingerprint(task.code)
        by_key[key_of[task.id]].append(task)
    survivors = []
    for group in by_key.values():
        keep = min(group, key=lambda t: t.id)
        survivors.append(keep)
        dropped.update({t.id: (keep.id, "exact_duplicate") for t in group if t is not keep})
    survivors.sort(key=lambda t: t.id)
    hasher = MinHasher(num_perm, seed)
    keys = [key_of[t.id] for t in survivors]
    elements = [elements_of[t.id] for t in survivors]
    signatures = [cache.signature(hasher, k, e, num_perm, seed) for k, e in zip(keys, elements)]
    graph = nx.Graph()
    graph.add_nodes_from(range(len(survivors)))
    graph.add_edges_from((i, j) for i, j in candidate_pairs(signatures, bands)
                         if cache.jaccard(keys[i], elements[i], keys[j], elements[j]) >= threshold)
    for component in nx.connected_components(graph):
        keep = min(component)  # survivors are sorted by id: the lowest id
        dropped.update({survivors[i].id: (survivors[keep].id, "near_duplicate") for i in component if i != keep})
    # a task dropped as an exact duplicate of a near duplicate is represented by the cluster's keeper
    for task_id, (rep, reason) in list(dropped.items()):
        if rep in dropped:
            dropped[task_id] = (dropped[rep][0], reason)
    return dropped


class NearDedup:
    """Pipeline step: keep one task (the lowest id) per cluster of exact or near duplicates.

    stats: `in`, `kept`, `dropped_exact_duplicate`, `dropped_near_duplicate`. Yields kept tasks in
    input order; `rejects(task, reason)` sees every drop.
    """

    name = "near_dedup"

    def __init__(self, threshold: float = NEAR_THRESHOLD, num_perm: int = NUM_PERM, bands: int = BANDS, seed: int = 0,
                 rejects: Callable[[Task, str], None] | None = None) -> None:
        if not 0 < threshold <= 1:
            raise ValueError(f"threshold must be in (0, 1], got {threshold}")
        self.threshold, self.num_perm, self.bands, self.seed = threshold, num_perm, bands, seed
        self.rejects = rejects
        self.stats: Counter = Counter()

    def run(self, tasks: Iterable[Task]) -> Iterator[Task]:
        tasks = list(tasks)
        ids = Counter(t.id for t in tasks)
        if len(ids) != len(tasks):
            raise ValueError(f"task ids are not unique: {sorted(i for i, n in ids.items() if n > 1)[:3]}")
        self.stats["in"] += len(tasks)
        dropped = find_duplicates(tasks, self.threshold, self.num_perm, self.bands, self.seed)
        duplicates = Counter(rep for rep, _ in dropped.values())
        for task in tasks:
            if task.id in dropped:
                reason = dropped[task.id][1]
                self.stats[f"dropped_{reason}"] += 1
                if self.rejects:
                    self.rejects(task, reason)
                continue
            self.stats["kept"] += 1
            yield dataclasses.replace(task, provenance={**task.provenance, "dedup_duplicates": duplicates[task.id]})



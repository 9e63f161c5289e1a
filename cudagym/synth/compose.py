"""Stage 2 of synth: compose up to five seeds into one fused KernelBench-format task.

A composer (`Composer`: `compose(seeds, k, rng) -> Task | Reject`) is registered by name in
`COMPOSERS`. The `programmatic` composer needs no LLM: it grows a chain of K seeds where each
seed's primary input is the previous seed's output. Shapes connect by *binding*: the next seed's
shape pattern (`Seed.accepts`, e.g. `("B", "C", "_", "_")` for Conv2d) is matched against the
incoming shape, which fixes its symbolic dims (Conv2d's in_channels becomes the previous
out_channels); where x has more dims than the next seed takes, a view is inserted (`x.flatten(k)`;
`x.unsqueeze(-1)` for the opposite case is opt-in). Each candidate step is run on meta tensors to
learn its output shape (CPU for the few seeds without meta kernels); the finished chain is run once
more and its AST labels checked against its seeds. Seeds are drawn with equal weight per seed
family (`ComposeConfig.family_weights`), so the 70 pointwise seeds do not crowd out the convs. The
fused `Model` is written with libcst: seed templates are parsed once and their placeholders
(inputs, dims, module slots) substituted by a CST transformer.

K, the number of composed seeds, follows `ComposeConfig.k_distribution`. Default
(`PAPER_K_DISTRIBUTION`): the split of the torch rows of CUDA-Agent-Ops-6K as released
(`labels.OPS_6K_SOURCES`: K=1 204, K=2 5,026, K=3 457, K=4 168, K=5 74 of its 5,929 torch rows). The
paper's text gives only K=2's 83.77%; an earlier default spread the rest over K=3..5 and gave K=1
none, so a build had no single-operator tasks where the released set has 3.4%.

Labels for the dataset row come from the code's AST only: `ops_from_code` and `data_source_of`.
"""

from __future__ import annotations

import importlib
import logging
import math
import random
from collections import Counter, deque
from dataclasses import dataclass, field, replace
from typing import Callable, Iterable, Iterator, Mapping, Protocol, Sequence

from cudagym.synth.crawl import SeedError, infer_output, single_threaded
from cudagym.synth.labels import OPS_6K_SOURCES, data_source_of, ops_from_code
from cudagym.synth.render import Idents, Step, first_step, name_output, next_step, render_steps
from cudagym.synth.seeds import DOMAIN_ACCEPTS, Seed
from cudagym.tasks import Task, TaskError, sha256_text

log = logging.getLogger(__name__)

_OPS_6K_TORCH_ROWS = sum(n for source, n in OPS_6K_SOURCES.items() if source.startswith("torch#"))
PAPER_K_DISTRIBUTION: Mapping[int, float] = {k: round(OPS_6K_SOURCES[f"torch#{k}"] / _OPS_6K_TORCH_ROWS, 4)
                                             for k in range(1, 6)}
# CUDA-Agent-Ops-6K has 71 transformers rows of 6,000 (1.2%). Half a percent of the seed draws on
# transformers seeds gives 4 of 200 composed tasks (2%, seeds 0-1) whose chain holds one; families
# weighted alike across both packages gave 55% (transformers has 9 of the 21 families).
TRANSFORMERS_SHARE = 0.005


# --------------------------------------------------------------------------------------------
# Composers
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Reject:
    """A composition that did not produce a task."""

    reason: str  # stable code: no_chain, no_seeds, verify_failed, label_mismatch; llm_* (llm.REJECT_REASONS)
    detail: str = ""


class ComposeStopped(TaskError):
    """A composer that cannot go on (its endpoint stopped answering, its call cap is spent, or it was
    interrupted): the round stops unfinished; what was answered stays in the composer's cache."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason  # stable code: endpoint_unreachable, endpoint_down, call_cap, interrupted
        self.progress = ""  # the unfinished round's last progress line, when there is one


class Composer(Protocol):
    def compose(self, seeds: Sequence[Seed], k: int, rng: random.Random) -> Task | Reject: ...


COMPOSERS: dict[str, Callable[..., Composer]] = {}
# Composers whose module has heavy imports (openai, duckdb): registered when first named.
LAZY_COMPOSERS: Mapping[str, str] = {"llm": "cudagym.synth.llm"}


def register_composer(name: str):
    def decorator(factory):
        COMPOSERS[name] = factory
        return factory

    return decorator


@dataclass(frozen=True)
class ComposeConfig:
    composer: str = "programmatic"
    n_tasks: int = 100
    k_distribution: Mapping[int, float] = field(default_factory=lambda: dict(PAPER_K_DISTRIBUTION))
    seed: int = 0
    scale: int = 1  # multiplies every symbolic dim of the composed task (1: CPU-sized)
    allow_glue: bool = True  # insert x.flatten(k) where x has more dims than the next seed takes
    allow_unsqueeze: bool = False  # also x.unsqueeze(-1) where it has fewer (gives size-1 dims)
    family_weights: Mapping[str, float] = field(default_factory=dict)  # Seed.family -> weight; default 1
    # Share of the seed-draw mass on transformers seeds (None: families weighted alike across both
    # packages, which gives transformers seeds 9 of 21 families and makes half the tasks transformers).
    transformers_share: float | None = TRANSFORMERS_SHARE
    final_dtypes: tuple[str, ...] = ("float32", "int64")  # dtypes a task may return
    max_attempts: int = 40  # chains started per compose() call
    max_candidates: int = 60  # seeds probed per chain position
    # Largest tensor (elements): each input, weight and intermediate. `scale` multiplies every dim, so
    # without it a rank-5 input grows with scale**5 (terabytes at 32). None: 2**22 (16 MB of float32)
    # times scale**2, at most 2**28 (1 GB): GPU-sized tasks reach the 1-100 ms window, yet a few of
    # them fit on one GPU at once.
    max_numel: int | None = None
    k_retries: int = 5  # compose() calls per sampled K before the step gives up on it
    # The llm composer's endpoint and limits, a cudagym.synth.llm.LLMConfig (None: LLMConfig() from the
    # env). Not annotated with that class: llm builds on compose, never the other way round.
    llm: object | None = None

    def __post_init__(self):
        if self.composer not in COMPOSERS and self.composer in LAZY_COMPOSERS:
            importlib.import_module(LAZY_COMPOSERS[self.composer])
        if self.composer not in COMPOSERS:
            known = sorted(set(COMPOSERS) | set(LAZY_COMPOSERS))
            raise ValueError(f"unknown composer {self.composer!r}; known: {known}")
        ks = {int(k): float(p) for k, p in dict(self.k_distribution).items()}
        if not ks or any(k < 1 or k > 5 or p < 0 for k, p in ks.items()) or sum(ks.values()) <= 0:
            raise ValueError(f"k_distribution must weight K in 1..5: {self.k_distribution}")
        if self.scale < 1:
            raise ValueError("scale must be >= 1")
        if self.transformers_share is not None and not 0 <= self.transformers_share <= 1:
            raise ValueError(f"transformers_share must be in [0, 1], got {self.transformers_share}")
        if self.max_numel is None:
            object.__setattr__(self, "max_numel", min((1 << 22) * self.scale ** 2, 1 << 28))


def seed_source(seed: Seed) -> str:
    """`transformers` or `torch`: the package a seed comes from."""
    return "transformers" if seed.qualified_name.startswith("transformers") else "torch"


def sample_k(distribution: Mapping[int, float], rng: random.Random) -> int:
    ks = sorted(distribution)
    return rng.choices(ks, weights=[distribution[k] for k in ks])[0]


def _accepts_input(seed: Seed, out_domain: str, out_dtype: str) -> bool:
    primary = seed.primary
    if primary.dtype != "float32" or out_dtype != "float32":
        return False
    return primary.domain == "randn" or out_domain in DOMAIN_ACCEPTS.get(primary.domain, frozenset())


@dataclass(frozen=True)
class _Chain:
    """A chain being grown: its steps, constant names, and what its output is (shape, dtype, domain)."""

    steps: list
    idents: Idents
    shape: tuple
    dtype: str
    domain: str


CPU_PROBE_NUMEL = 1 << 24  # elements (weights and inputs) a CPU shape-inference run may hold above scale 1


@register_composer("programmatic")
class ProgrammaticComposer:
    """Chains seeds whose shapes connect, found by meta-tensor shape inference; no LLM."""

    name = "programmatic"

    def __init__(self, config: ComposeConfig | None = None):
        self.config = config or ComposeConfig()
        self._probes: dict[tuple, tuple | None] = {}
        # Seeds without meta kernels are probed on the CPU: fine at scale 1, minutes and gigabytes at
        # GPU scale, where a chain through such a seed is given up instead.
        self._cpu_probe_numel = CPU_PROBE_NUMEL if self.config.scale > 1 else None

    # -- public ---------------------------------------------------------------------------
    def compose(self, seeds: Sequence[Seed], k: int, rng: random.Random) -> Task | Reject:
        pool = [s for s in seeds if s.ops]
        if not pool:
            return Reject("no_seeds", "no verified seeds")
        with single_threaded():
            for _ in range(self.config.max_attempts):
                chain = self._grow(pool, k, rng)
                if chain is not None:
                    return self._finish(chain)
        return Reject("no_chain", f"no chain of {k} connecting seeds in {self.config.max_attempts} attempts")

    def chain(self, seeds: Sequence[Seed]) -> Task | Reject:
        """Compose exactly these seeds, in this order."""
        with single_threaded():
            chain = self._start(seeds[0], last=len(seeds) == 1)
            for i, seed in enumerate(seeds[1:], 2):
                if chain is None:
                    break
                chain = self._extend(chain, seed, last=i == len(seeds))
            if chain is None:
                return Reject("no_chain", f"{' -> '.join(s.id for s in seeds)}: shapes, dtypes or domains do not connect")
            return self._finish(chain)

    # -- internals ------------------------------------------------------------------------
    def _probe(self, step: Step, idents: Idents) -> tuple | None:
        """(output shape, dtype) of one step fed x of step.x_shape, via meta tensors; None if it fails."""
        key = (step.seed.id, tuple(v for v, _ in step.x_shape), self.config.scale)
        if key not in self._probes:
            code = render_steps([replace(step, glue="")], idents.copy())
            try:
                shape, dtype, _ = infer_output(code, try_meta=step.seed.meta_ok, max_cpu_numel=self._cpu_probe_numel,
                                               max_tensor_numel=self.config.max_numel)
                self._probes[key] = (shape, dtype) if math.prod(shape) <= self.config.max_numel else None
            except (SeedError, Exception):  # noqa: BLE001 - shapes that do not connect
                self._probes[key] = None
        return self._probes[key]

    def _start(self, seed: Seed, last: bool) -> _Chain | None:
        idents = Idents()
        step = first_step(seed, idents, self.config.scale)
        return self._accept(_Chain([], idents, (), "", ""), step, idents, last)

    def _extend(self, chain: _Chain, seed: Seed, last: bool) -> _Chain | None:
        """The chain with `seed` appended, or None when it cannot take the chain's output."""
        if chain.steps[-1].seed.id == seed.id or not _accepts_input(seed, chain.domain, chain.dtype):
            return None
        idents = chain.idents.copy()
        cfg = self.config
        step = next_step(seed, chain.shape, idents, cfg.scale, cfg.allow_glue, cfg.allow_unsqueeze)
        return None if step is None else self._accept(chain, step, idents, last)

    def _accept(self, chain: _Chain, step: Step, idents: Idents, last: bool) -> _Chain | None:
        probe = self._probe(step, idents)
        if probe is None or (not last and not probe[0]):  # a scalar would feed nothing further
            return None
        if last and probe[1] not in self.config.final_dtypes:
            return None
        return _Chain(chain.steps + [step], idents, name_output(step, probe[0]), probe[1], step.seed.out_domain)

    def _weights(self, pool: Sequence[Seed]) -> list[float]:
        """Each family gets `family_weights[family]` (default 1) of the mass, split over its seeds.
        With `transformers_share` set and seeds of both sources in the pool, families are counted per
        source and transformers seeds get that share of the mass, torch seeds the rest."""
        fw = self.config.family_weights
        share = self.config.transformers_share
        sources = [seed_source(s) for s in pool]
        if share is None or len(set(sources)) < 2:
            sizes = Counter(s.family for s in pool)
            return [fw.get(s.family, 1.0) / sizes[s.family] for s in pool]
        sizes = Counter(zip(sources, (s.family for s in pool)))
        mass = Counter()
        for source, family in sizes:
            mass[source] += fw.get(family, 1.0)
        wanted = {"transformers": share, "torch": 1.0 - share}
        return [fw.get(s.family, 1.0) / sizes[(src, s.family)] * wanted[src] / mass[src] if mass[src] else 0.0
                for s, src in zip(pool, sources)]

    def _order(self, pool: Sequence[Seed], weights: Sequence[float], rng: random.Random, n: int) -> list[Seed]:
        """n seeds drawn without replacement with the given weights (Efraimidis-Spirakis keys)."""
        keys = [(rng.random() ** (1.0 / w) if w > 0 else -1.0, i) for i, w in enumerate(weights)]
        return [pool[i] for key, i in sorted(keys, reverse=True)[:n] if key >= 0]

    def _grow(self, pool: Sequence[Seed], k: int, rng: random.Random) -> _Chain | None:
        weights = self._weights(pool)
        chain = self._start(self._order(pool, weights, rng, 1)[0], last=k == 1)
        while chain is not None and len(chain.steps) < k:
            last = len(chain.steps) == k - 1
            for seed in self._order(pool, weights, rng, self.config.max_candidates):
                extended = self._extend(chain, seed, last)
                if extended is not None:
                    chain = extended
                    break
            else:
                return None
        return chain

    def _finish(self, chain: _Chain) -> Task | Reject:
        steps, idents, shape = chain.steps, chain.idents, chain.shape
        seeds = [s.seed for s in steps]
        name = "_".join(s.name for s in seeds)
        doc = " -> ".join(s.name for s in seeds)
        code = render_steps(steps, idents, doc=doc)
        try:
            out_shape, _, _ = infer_output(code, try_meta=all(s.meta_ok for s in seeds),
                                           max_cpu_numel=self._cpu_probe_numel)
        except Exception as e:  # noqa: BLE001
            return Reject("verify_failed", f"{name}: {type(e).__name__}: {str(e)[:200]}")
        if tuple(out_shape) != tuple(v for v, _ in shape):
            return Reject("verify_failed", f"{name}: output {tuple(out_shape)}, expected {tuple(v for v, _ in shape)}")
        ops = ops_from_code(code)
        expected = [op for s in seeds for op in s.ops]
        if ops != expected:
            return Reject("label_mismatch", f"{name}: ops {ops} != seed ops {expected}")
        sha = sha256_text(code)
        provenance = {
            "composer": self.name, "k": len(seeds), "seed_ids": [s.id for s in seeds], "seed_ops": expected,
            "seed_kinds": [s.kind for s in seeds], "glue": [s.glue for s in steps], "ops": ops,
            "data_source": data_source_of(code), "scale": self.config.scale, "output_shape": list(out_shape),
        }
        return Task(id=f"synth/{sha[:12]}", name=name, code=code, level=1 if len(seeds) == 1 else 2,
                    source=f"synth:{self.name}", provenance=provenance)


def make_composer(config: ComposeConfig) -> Composer:
    return COMPOSERS[config.composer](config)


class ComposeStep:
    """Pipeline step: seeds in, `config.n_tasks` composed tasks out (deterministic given config.seed).
    `stats` counts `in` (compose calls), `kept` and `dropped_<reason>`; `rejects` keeps the rejects;
    `composer_stats` the composer's own counters after a run (the llm composer: requests, tokens)."""

    def __init__(self, config: ComposeConfig | None = None, progress: Callable[[str], None] | None = None):
        self.config = config or ComposeConfig()
        self.stats: Counter = Counter()
        self.rejects: list[Reject] = []
        self.composer_stats: Counter = Counter()
        self.progress = progress or log.info  # one line per batch of a batched (llm) composer

    def run(self, seeds: Iterable[Seed]) -> Iterator[Task]:
        seeds = list(seeds)
        composer = make_composer(self.config)
        if hasattr(composer, "compose_batch"):
            yield from self._run_batched(seeds, composer)
            return
        rng = random.Random(self.config.seed)
        seen: set[str] = set()
        kept = 0
        budget = self.config.n_tasks * self.config.k_retries * 2
        while kept < self.config.n_tasks and self.stats["in"] < budget:
            k = sample_k(self.config.k_distribution, rng)
            for _ in range(self.config.k_retries):  # keep K as sampled, so the K mix follows the config
                self.stats["in"] += 1
                result = composer.compose(seeds, k, rng)
                if self._keep(result, k, seen):
                    kept += 1
                    yield result
                    break
        log.info("compose (%s): %s", self.config.composer, dict(self.stats))

    def progress_line(self, composer_stats: Mapping, max_calls: int | None = None) -> str:
        return _progress_line(self.stats, composer_stats, max_calls)

    def _keep(self, result: Task | Reject, k: int, seen: set[str]) -> bool:
        """Count one composition of K seeds: a reject or a duplicate is dropped, a new task kept."""
        if isinstance(result, Reject):
            self.stats[f"dropped_{result.reason}"] += 1
            self.rejects.append(result)
            return False
        if result.sha256 in seen:
            self.stats["dropped_duplicate"] += 1
            return False
        seen.add(result.sha256)
        self.stats["kept"] += 1
        self.stats[f"k{k}"] += 1
        return True

    def _run_batched(self, seeds: list[Seed], composer) -> Iterator[Task]:
        """`run` for a composer with `pick(seeds, k, rng)`, `compose_batch([(seeds, k), ...])` and
        `concurrency` (the llm composer): K and the seeds are drawn here, with the step's rng, then up
        to `concurrency` compositions run at once. Results are taken in request order, so the output
        depends only on config.seed (and the answers). A rejected (or duplicate) K is queued again, up
        to `k_retries` tries, so the K mix follows the config as in `run`."""
        cfg = self.config
        rng = random.Random(cfg.seed)
        seen: set[str] = set()
        kept = 0
        budget = cfg.n_tasks * cfg.k_retries * 2
        again: deque[tuple[int, int]] = deque()  # (K, tries so far) to compose again
        width = max(1, int(getattr(composer, "concurrency", 1)))
        try:
            while kept < cfg.n_tasks and self.stats["in"] < budget:
                slots = [again.popleft() if again else (sample_k(cfg.k_distribution, rng), 0)
                         for _ in range(min(width, cfg.n_tasks - kept, budget - self.stats["in"]))]
                requests = [(composer.pick(seeds, k, rng), k) for k, _ in slots]
                batch = []
                for (k, tries), result in zip(slots, composer.compose_batch(requests)):
                    self.stats["in"] += 1
                    if self._keep(result, k, seen):
                        kept += 1
                        batch.append(result)
                    elif tries + 1 < cfg.k_retries:
                        again.append((k, tries + 1))
                line = self.progress_line(getattr(composer, "stats", {}), getattr(composer, "max_calls", None))
                self.progress(line)
                stopped = getattr(composer, "stopped", None)
                if stopped is not None:  # the round is not finished: nothing of it is stored but the answers
                    error = ComposeStopped(*stopped)
                    error.progress = line
                    raise error
                yield from batch
        finally:
            self.composer_stats = Counter(getattr(composer, "stats", {}))
            if hasattr(composer, "close"):
                composer.close()
        log.info("compose (%s): %s; composer: %s", cfg.composer, dict(self.stats), dict(self.composer_stats))


NOT_SENT_REJECTS = ("llm_endpoint_down", "llm_call_cap", "llm_stopped")  # never asked: not counted as asked
TRANSPORT_REJECTS = ("llm_error", "llm_timeout", "llm_rate_limited")  # asked, no answer came back


def _progress_line(stats: Counter, composer_stats: Mapping, max_calls: int | None) -> str:
    """`asked 8, answered 7, parsed 5, kept 4, rejected llm_no_code 2, llm_error 1; LLM calls 9 of 100`."""
    rejected = {k[len("dropped_"):]: v for k, v in stats.items() if k.startswith("dropped_") and v}
    asked = stats["in"] - sum(rejected.get(r, 0) for r in NOT_SENT_REJECTS)
    answered = asked - sum(rejected.get(r, 0) for r in TRANSPORT_REJECTS)
    parsed = stats["kept"] + rejected.get("duplicate", 0)
    reasons = ", ".join(f"{r} {n}" for r, n in sorted(rejected.items(), key=lambda kv: -kv[1])) or "none"
    calls = composer_stats.get("requests", 0)
    cached = composer_stats.get("cache_hits", 0)
    return (f"asked {asked}, answered {answered}, parsed {parsed}, kept {stats['kept']}, rejected {reasons}; "
            f"LLM calls {calls}{f' of {max_calls}' if max_calls else ''}" + (f", {cached} cached" if cached else ""))


def compose_tasks(seeds: Iterable[Seed], config: ComposeConfig | None = None) -> list[Task]:
    return list(ComposeStep(config).run(seeds))

"""Stage 2 of synth: composing seeds into fused tasks, and AST-derived labels (cudagym/synth/compose.py)."""

from __future__ import annotations

import random
from collections import Counter

import pytest
import torch

from cudagym.synth.compose import (
    COMPOSERS,
    PAPER_K_DISTRIBUTION,
    ComposeConfig,
    ComposeStep,
    ProgrammaticComposer,
    Reject,
    data_source_of,
    ops_from_code,
    sample_k,
)
from cudagym.synth.crawl import crawl_torch, crawl_transformers, exec_task, tensor_numels
from cudagym.tasks import Task


@pytest.fixture(scope="module")
def seeds():
    return crawl_torch()[0]  # cached per process (shared with test_crawl)


@pytest.fixture(scope="module")
def by_id(seeds):
    return {s.id: s for s in seeds}


def _run(task: Task):
    namespace: dict = {}
    exec(compile(task.code, task.id, "exec"), namespace)
    torch.manual_seed(0)
    model = namespace["Model"](*namespace["get_init_inputs"]())
    with torch.no_grad():
        return model(*namespace["get_inputs"]())


@pytest.mark.parametrize("k", [1, 2, 3, 4, 5])
def test_programmatic_compose_k_runs_and_labels_match_seeds(seeds, by_id, k):
    task = ProgrammaticComposer().compose(seeds, k, random.Random(k))
    assert isinstance(task, Task), task
    out = _run(task)
    assert isinstance(out, torch.Tensor)
    assert list(out.shape) == task.provenance["output_shape"]
    chain = [by_id[i] for i in task.provenance["seed_ids"]]
    assert len(chain) == task.provenance["k"] == k
    assert ops_from_code(task.code) == [op for s in chain for op in s.ops]
    assert data_source_of(task.code) == f"torch#{k}"
    assert task.name == "_".join(s.name for s in chain)
    assert task.level == (1 if k == 1 else 2) and task.source == "synth:programmatic"


def test_chain_of_named_seeds(by_id):
    composer = ProgrammaticComposer()
    task = composer.chain([by_id["torch.nn.Conv2d"], by_id["torch.nn.ReLU"], by_id["torch.Tensor.__add__#bias"]])
    assert task.name == "Conv2d_ReLU_BiasAdd"
    assert ops_from_code(task.code) == ["Conv2d", "ReLU", "add"]
    assert "nn.Conv2d(in_channels, out_channels, 3)" in task.code
    assert "nn.Parameter(torch.randn(out_channels, 1, 1))" in task.code  # bias bound to the conv's channels
    assert list(_run(task).shape) == [4, 16, 22, 22]
    # a rank mismatch gets a view as glue, which is not an operator label
    task = composer.chain([by_id["torch.nn.Conv2d"], by_id["torch.nn.AdaptiveAvgPool2d"], by_id["torch.nn.RNNCell"]])
    assert task.provenance["glue"] == ["", "", "flatten(1)"]
    assert "x = x.flatten(1)" in task.code
    assert ops_from_code(task.code) == ["Conv2d", "AdaptiveAvgPool2d", "RNNCell"]
    assert list(_run(task).shape) == [4, 128]
    # Linear takes any leading dims: no glue, it binds in_features to the last dim
    task = composer.chain([by_id["torch.nn.Conv2d"], by_id["torch.nn.Linear"]])
    assert task.provenance["glue"] == ["", ""] and "in_features = 22" in task.code
    assert list(_run(task).shape) == [4, 16, 22, 128]
    # shapes that cannot connect are a Reject, not an exception
    rejected = composer.chain([by_id["torch.nn.Conv2d"], by_id["torch.nn.Embedding"]])
    assert isinstance(rejected, Reject) and rejected.reason == "no_chain"


def test_compose_is_deterministic_by_seed(seeds):
    def run(seed: int) -> list[str]:
        return [t.sha256 for t in ComposeStep(ComposeConfig(n_tasks=12, seed=seed)).run(seeds)]

    first = run(3)
    assert len(first) == 12 and first == run(3)
    assert first != run(4)


def test_gpu_scale_bounds_every_input_and_weight_not_only_intermediates(seeds):
    # `scale` multiplies every dim: a rank-5 input at scale 32 would be 32**5 times its CPU size
    # (terabytes), which the GPU filter can only time out on or run alone on the whole GPU.
    limit = 1 << 24
    tasks = list(ComposeStep(ComposeConfig(n_tasks=60, seed=5, scale=32, max_numel=limit)).run(seeds))
    assert len(tasks) == 60
    for task in tasks:
        numels = tensor_numels(exec_task(task.code))
        assert numels and max(numels) <= limit, (task.name, max(numels))
    # by default the bound grows with the scale (GPU-sized tasks must reach a 1 ms floor), capped at 1 GB
    assert [ComposeConfig(scale=s).max_numel for s in (1, 4, 32)] == [1 << 22, 1 << 26, 1 << 28]


def test_k_distribution_follows_config(seeds):
    rng = random.Random(0)
    counts = Counter(sample_k(PAPER_K_DISTRIBUTION, rng) for _ in range(5000))
    # CUDA-Agent-Ops-6K's torch rows as released: K=1 204, 2 5,026, 3 457, 4 168, 5 74 of 5,929.
    for k, released in {1: 204, 2: 5026, 3: 457, 4: 168, 5: 74}.items():
        assert abs(counts[k] / 5000 - released / 5929) < 0.015, (k, counts[k])
    assert counts[3] > counts[1] > counts[4] > counts[5] > 0
    step = ComposeStep(ComposeConfig(n_tasks=40, seed=7, k_distribution={2: 0.5, 3: 0.5}))
    ks = Counter(t.provenance["k"] for t in step.run(seeds))
    assert set(ks) == {2, 3} and min(ks.values()) >= 10
    assert step.stats["kept"] == 40 and step.stats["in"] >= 40


def test_config_checks():
    assert "programmatic" in COMPOSERS
    with pytest.raises(ValueError):
        ComposeConfig(composer="nope")
    with pytest.raises(ValueError):
        ComposeConfig(k_distribution={6: 1.0})


LABEL_CODE = '''
import torch
import torch.nn as nn
import torch.nn.functional as F
import math


class Model(nn.Module):
    """Applies torch.sigmoid and nn.Conv2d (mentioned only here)."""

    def __init__(self, scale):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 8), nn.GELU())
        self.norm = nn.LayerNorm(8)
        self.unused = nn.Conv2d(3, 3, 3)  # built but never called: no label
        self.bias = nn.Parameter(torch.zeros(8))
        self.scale = scale

    def forward(self, x):
        # torch.relu(x) is commented out
        name = "torch.softmax"
        n = x.shape[0] * 2 + math.sqrt(4)
        x = self.net(x).view(x.shape[0], -1)
        x = torch.tanh(self.norm(x)) + self.bias
        x = self.helper(x) * self.scale
        return -F.gelu(x.cumsum(dim=1)) @ x.t()

    def helper(self, x):
        return x.clamp(min=0.0) > 0.5
'''


def test_ops_from_code_uses_the_ast_only():
    assert ops_from_code(LABEL_CODE) == ["Linear", "GELU", "LayerNorm", "tanh", "add", "clamp", "gt", "mul",
                                         "cumsum", "gelu", "neg", "t", "matmul"]
    assert data_source_of(LABEL_CODE) == "torch#13"
    assert data_source_of("from transformers.activations import NewGELUActivation\n" + LABEL_CODE) == "transformers"


def test_transformers_seeds_compose():
    t_seeds = {s.name: s for s in crawl_transformers()[0]}
    torch_seeds = {s.id: s for s in crawl_torch()[0]}
    task = ProgrammaticComposer().chain([t_seeds["LlamaRMSNorm"], torch_seeds["torch.nn.Linear"]])
    assert isinstance(task, Task), task
    assert data_source_of(task.code) == "transformers"
    assert ops_from_code(task.code) == ["LlamaRMSNorm", "Linear"]
    assert list(_run(task).shape) == task.provenance["output_shape"]


def test_transformers_share_of_the_seed_draws(seeds):
    """Families weigh alike within each package, and transformers seeds get `transformers_share` of the
    mass: with transformers' 9 families beside torch's 13, weighting all alike made half the tasks
    transformers tasks (the paper: 71 of 6,000)."""
    pool = seeds + crawl_transformers()[0]
    is_t = [s.qualified_name.startswith("transformers") for s in pool]
    for share in (0.005, 0.3):
        weights = ProgrammaticComposer(ComposeConfig(transformers_share=share))._weights(pool)
        t_mass = sum(w for w, t in zip(weights, is_t) if t)
        assert t_mass / sum(weights) == pytest.approx(share)
    alike = ProgrammaticComposer(ComposeConfig(transformers_share=None))._weights(pool)
    assert sum(w for w, t in zip(alike, is_t) if t) / sum(alike) > 0.3
    # one package only: the share does not apply
    assert ProgrammaticComposer(ComposeConfig(transformers_share=0.005))._weights(seeds) == \
        ProgrammaticComposer(ComposeConfig(transformers_share=None))._weights(seeds)
    tasks = list(ComposeStep(ComposeConfig(n_tasks=20, seed=0, transformers_share=0.5)).run(pool))
    assert Counter(t.provenance["data_source"] == "transformers" for t in tasks)[True] >= 5
    with pytest.raises(ValueError, match="transformers_share"):
        ComposeConfig(transformers_share=1.5)

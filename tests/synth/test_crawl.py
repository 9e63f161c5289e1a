"""Stage 1 of synth: crawling seed operators from torch and transformers (cudagym/synth/crawl.py)."""

from __future__ import annotations

import re
import sys

import pytest
import torch

from cudagym.synth import crawl
from cudagym.synth.crawl import KINDS, Seed, Skip, crawl_torch, crawl_transformers
from cudagym.synth.render import seed_snippet, seed_task

@pytest.fixture(scope="module")
def torch_crawl() -> tuple[list[Seed], list[Skip]]:
    return crawl_torch()  # cached per process: the compose tests reuse it


@pytest.fixture(scope="module")
def transformers_crawl() -> tuple[list[Seed], list[Skip]]:
    return crawl_transformers()


def _run(task, seed: int = 0):
    namespace: dict = {}
    exec(compile(task.code, task.id, "exec"), namespace)
    torch.manual_seed(seed)
    model = namespace["Model"](*namespace["get_init_inputs"]())
    inputs = namespace["get_inputs"]()
    with torch.no_grad():
        return model(*inputs), inputs


def test_counts_meet_targets(torch_crawl, transformers_crawl):
    seeds, _ = torch_crawl
    assert len(seeds) >= 250
    assert {s.kind for s in seeds} == {"nn_module", "functional", "tensor_op"}
    t_seeds, t_skips = transformers_crawl  # transformers is a core dependency: CI crawls it
    assert len(t_seeds) >= 50
    assert {s.kind for s in t_seeds} == {"transformers_block"}
    assert "import_error" not in {s.reason for s in t_skips}


def test_missing_transformers_is_one_skip_not_a_crash(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # makes `import transformers` fail
    seeds, skips = crawl._crawl_transformers_now()  # the crawl itself, not its cache on disk
    assert seeds == () and len(skips) == 1
    assert skips[0].reason == "import_error" and skips[0].detail


def test_seed_records(torch_crawl, transformers_crawl):
    for seed in torch_crawl[0] + transformers_crawl[0]:
        assert seed.kind in KINDS and seed.qualified_name and seed.name
        assert seed.arity == len(seed.input_ranks) >= 1
        assert seed.output_rank == len(seed.output_shape)
        assert seed_snippet(seed) and seed.ops
        assert all(spec.domain in crawl.DOMAINS for spec in seed.inputs)
    ids = [s.id for s in torch_crawl[0] + transformers_crawl[0]]
    assert len(ids) == len(set(ids))
    # one operator label per torch seed, and no two torch seeds share a label (dedup by label)
    labels = [(s.ops, s.variant) for s in torch_crawl[0]]
    assert all(len(ops) == 1 for ops, _ in labels) and len(labels) == len(set(labels))


def test_seed_families_cover_the_issue_list(torch_crawl):
    by_id = {s.id: s for s in torch_crawl[0]}
    for name in ["torch.nn.Conv1d", "torch.nn.Conv2d", "torch.nn.Conv3d", "torch.nn.MaxPool2d", "torch.nn.Linear",
                 "torch.nn.Bilinear", "torch.nn.LayerNorm", "torch.nn.GroupNorm", "torch.nn.CrossEntropyLoss",
                 "torch.nn.GELU", "torch.matmul", "torch.cumsum", "torch.topk", "torch.gather", "torch.nn.ZeroPad2d",
                 "torch.nn.Upsample", "torch.nn.MultiheadAttention", "torch.nn.LSTMCell", "torch.nn.Embedding",
                 "torch.Tensor.__add__#bias"]:
        assert name in by_id, name
    assert seed_snippet(by_id["torch.nn.Conv2d"]) == "nn.Conv2d(8, 16, 3)"
    index_inputs = [spec for spec in by_id["torch.gather"].inputs if spec.domain == "index"]
    assert index_inputs and index_inputs[0].dtype == "int64"


def test_sampled_seed_tasks_run_on_cpu(torch_crawl, transformers_crawl):
    seeds = torch_crawl[0][::9] + transformers_crawl[0][::6]
    assert len(seeds) >= 50
    for seed in seeds:
        task = seed_task(seed)
        assert "class Model(nn.Module)" in task.code and "def get_init_inputs" in task.code
        out, _ = _run(task)
        assert isinstance(out, torch.Tensor), seed.id
        assert tuple(out.shape) == seed.output_shape, seed.id


def test_scale_multiplies_symbolic_dims(torch_crawl):
    conv = next(s for s in torch_crawl[0] if s.id == "torch.nn.Conv2d")
    small, large = seed_task(conv), seed_task(conv, scale=2)
    _, (x1,) = _run(small)
    out, (x2,) = _run(large)
    assert tuple(x2.shape) == tuple(2 * d for d in x1.shape)
    assert out.shape[1] == 2 * conv.output_shape[1]  # out_channels scaled too; kernel size kept


EXPECTED_SKIPS = {
    "torch.nn.Dropout": "stochastic", "torch.nn.functional.dropout": "stochastic", "torch.nn.RReLU": "stochastic",
    "torch.bernoulli": "stochastic", "torch.nn.functional.gumbel_softmax": "stochastic",
    "torch.nonzero": "data_dependent_shape", "torch.unique": "data_dependent_shape",
    "torch.masked_select": "data_dependent_shape", "torch.Tensor.add_": "inplace", "torch.relu_": "inplace",
    "torch.nn.functional.relu_": "inplace", "torch.nn.Sequential": "container", "torch.nn.LazyLinear": "lazy",
    "torch.fft.rfft": "complex_output", "torch.zeros": "factory", "torch.arccos": "alias",
}


def test_excluded_ops_are_skips_with_reasons(torch_crawl):
    seeds, skips = torch_crawl
    by_name = {s.qualified_name: s for s in skips}
    for name, reason in EXPECTED_SKIPS.items():
        assert by_name[name].reason == reason, name
    assert all(s.reason and re.fullmatch(r"[a-z_]+", s.reason) for s in skips)
    crawled = {s.qualified_name for s in seeds} | set(by_name)
    assert {"torch.nn.Identity", "torch.histogram", "torch.linalg.svd"} <= crawled  # every name is accounted for


def test_no_stochastic_seed(torch_crawl, transformers_crawl):
    stochastic = re.compile(r"(?i)dropout|rand|bernoulli|multinomial|gumbel|rrelu|fractional")
    seeds = torch_crawl[0] + transformers_crawl[0]
    assert not [s.id for s in seeds if stochastic.search(s.qualified_name.rsplit(".", 1)[-1])]
    for seed in seeds[::25]:  # two runs of one model on the same inputs agree
        task = seed_task(seed)
        namespace: dict = {}
        exec(task.code, namespace)
        model = namespace["Model"](*namespace["get_init_inputs"]())
        inputs = namespace["get_inputs"]()
        with torch.no_grad():
            assert torch.equal(model(*inputs), model(*inputs)), seed.id


def test_verify_rejects_a_stochastic_seed():
    seed = Seed("test.dropout", "functional", "F.dropout(x, 0.5)", (crawl.InputSpec("x", crawl.P4),), accepts=crawl.ANY)
    with pytest.raises(crawl.SeedError) as e:
        crawl.verify(seed)
    assert e.value.reason == "stochastic"


BIG_WITHOUT_META = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x):
        return x.sum(1)

def get_inputs():
    return [torch.rand(SIZE, 64)]

def get_init_inputs():
    return []
"""


def test_shape_inference_on_the_cpu_refuses_tasks_too_large_to_run_there():
    small = BIG_WITHOUT_META.replace("SIZE", "4")
    shape, _, used_meta = crawl.infer_output(small, try_meta=False, max_cpu_numel=1000)
    assert shape == (4,) and not used_meta  # ran on the CPU (try_meta=False): 256 elements
    big = BIG_WITHOUT_META.replace("SIZE", "1 << 30")  # 2^36 elements: would need 256 GiB
    with pytest.raises(ValueError, match="too large for shape inference on the CPU"):
        crawl.infer_output(big, try_meta=False, max_cpu_numel=1 << 24)
    assert crawl.task_numel(crawl.exec_task(big)) == 64 << 30


RNN_TASK = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = nn.{cls}(6, 5, {options})

    def forward(self, x):
        out = self.rnn(x)
        return out[0] * 2 + {state}.sum()

def get_inputs():
    return [torch.randn({shape})]

def get_init_inputs():
    return []
"""


@pytest.mark.parametrize("cls,options,shape", [
    ("LSTM", "num_layers=2", "7, 3, 6"),
    ("LSTM", "batch_first=True, bidirectional=True, proj_size=4", "3, 7, 6"),
    ("LSTM", "bidirectional=True", "7, 6"),  # unbatched
    ("GRU", "num_layers=3, batch_first=True", "3, 7, 6"),
    ("GRU", "bidirectional=True", "7, 6"),
    ("RNN", "nonlinearity='relu', bidirectional=True, num_layers=2", "7, 3, 6"),
])
def test_recurrent_layers_on_meta_tensors_give_the_shapes_torch_gives_without_running_step_by_step(cls, options, shape):
    """Shape inference gives an LSTM, GRU or RNN a shapes-only forward on meta tensors (torch's meta
    run goes step by step: 5.5 s an LSTM call in composing); outputs and states as the CPU run's."""
    state = "out[1][1]" if cls == "LSTM" else "out[1]"
    code = RNN_TASK.format(cls=cls, options=options, shape=shape, state=state)
    namespace = crawl.exec_task(code)
    model = namespace["Model"]().to("meta")
    crawl.shapes_only_rnns(model)
    x = torch.randn(*map(int, shape.split(", ")), device="meta")
    meta_out = model.rnn(x)
    cpu_out = namespace["Model"]().rnn(torch.randn(*map(int, shape.split(", "))))
    flat = lambda out: [out[0], *(out[1] if isinstance(out[1], tuple) else (out[1],))]  # noqa: E731
    assert [(t.shape, t.dtype) for t in flat(meta_out)] == [(t.shape, t.dtype) for t in flat(cpu_out)]
    assert all(t.device.type == "meta" for t in flat(meta_out))
    assert crawl.infer_output(code) == (tuple(cpu_out[0].shape), "float32", True)


def test_a_recurrent_layer_given_the_wrong_input_fails_on_meta_as_on_the_cpu():
    for shape in ("7, 3, 5", "7, 3, 2, 6"):  # the wrong feature size; 4D
        code = RNN_TASK.format(cls="LSTM", options="num_layers=1", shape=shape, state="out[1][0]")
        namespace = crawl.exec_task(code)
        errors = []
        for device in ("meta", "cpu"):
            try:
                crawl.run_namespace(namespace, device)
            except Exception as e:  # noqa: BLE001 - the same error from both is the point
                errors.append((type(e), str(e)))
        assert len(errors) == 2 and errors[0] == errors[1]
    model = crawl.exec_task(RNN_TASK.format(cls="LSTM", options="", shape="7, 3, 6", state="out[1][0]"))["Model"]()
    crawl.shapes_only_rnns(model)
    h0 = (torch.zeros(1, 3, 5), torch.zeros(1, 3, 5))
    assert model.rnn(torch.randn(7, 3, 6), h0)[0].shape == (7, 3, 5)  # real tensors and a given state: torch's forward


def test_a_crawl_is_kept_on_disk_per_code_and_versions(tmp_path, monkeypatch):
    """on_disk: the first call crawls and stores, a later one (another process, as each build is) reads the
    file; other versions crawl again, and an unreadable file costs a crawl, never an error."""
    monkeypatch.setenv("CUDAGYM_CACHE", str(tmp_path))
    runs = []

    def crawl_now():
        runs.append(1)
        return (Seed(f"torch.relu{len(runs)}", "function", "torch.relu(x)", ()),), (Skip("torch.x", "internal", "", "torch"),)

    first = crawl.on_disk("torch", crawl_now, {"torch": "2.13.0"})
    assert len(runs) == 1 and first[0][0].qualified_name == "torch.relu1"
    assert crawl.on_disk("torch", crawl_now, {"torch": "2.13.0"}) == first and len(runs) == 1
    (stored,) = (tmp_path / "crawl").iterdir()
    assert crawl.on_disk("torch", crawl_now, {"torch": "2.14.0"})[0][0].qualified_name == "torch.relu2"
    stored.write_bytes(b"not a pickle")
    assert crawl.on_disk("torch", crawl_now, {"torch": "2.13.0"})[0][0].qualified_name == "torch.relu3"
    assert crawl.on_disk("torch", crawl_now, {"torch": "2.13.0"})[0][0].qualified_name == "torch.relu3"
    assert len(runs) == 3
    assert not list((tmp_path / "crawl").glob("*.tmp"))

"""The dataset filter's GPU memory footprint, counted from one eager forward on meta tensors."""

import torch

from cudagym.eval.footprint import forward_bytes
from cudagym.eval.judge import (CONTEXT_BYTES, FILTER_CONTEXT_BYTES, FILTER_FIXED_BYTES, FILTER_MARGIN,
                                FOOTPRINT_FACTORS, footprint_bytes, load_reference, nbytes)

MIB = 2**20


def meta(*shape):
    return torch.randn(*shape, device="meta")


class Chain(torch.nn.Module):
    def forward(self, x):
        y = x * 2           # 4 MiB
        y = torch.relu(y)   # 4 MiB more while the first is alive, then the first is freed
        return y.sum(-1)


def test_peak_counts_what_is_alive_together_not_every_op():
    outputs, peak = forward_bytes(Chain(), [meta(1024, 1024)])
    assert outputs == 1024 * 4
    assert peak == 8 * MIB  # two 4 MiB intermediates at once; a sum over all ops would say 8 MiB + 4 KiB + ...


class ViewOutlivesBase(torch.nn.Module):
    def forward(self, x):
        a = x * 2
        b = a.t()   # a view: a's storage lives on through it
        del a
        c = b + 1
        x.add_(1)   # in place on an input: nothing new
        return c


def test_a_view_keeps_its_base_counted_and_in_place_ops_count_nothing():
    outputs, peak = forward_bytes(ViewOutlivesBase(), [meta(1024, 1024)])
    assert (outputs, peak) == (4 * MIB, 8 * MIB)


class Pieces(torch.nn.Module):
    def forward(self, x):
        y = x + 1                                              # 4 MiB
        parts = list(torch.unsafe_split(y, 256)) + list(y.unbind(0))   # views whose schema says so per list, or not at all
        return torch.stack([p.sum() for p in parts[:4]])


def test_views_returned_as_lists_share_their_base():
    # counted per returned tensor, unbind's 1,024 views of 4 MiB would make a peak of 4 GiB
    assert forward_bytes(Pieces(), [meta(1024, 1024)])[1] < 5 * MIB


def test_attention_with_distinct_key_and_value_is_traced():
    # MultiheadAttention asks torch.equal(key, value), which has no meta kernel: 32 of the 1,311 filtered
    # candidates of session 28's build fell back to factors for it
    with torch.device("meta"):
        attention = torch.nn.MultiheadAttention(64, 4, batch_first=True)
    q, k, v = meta(8, 128, 64), meta(8, 128, 64), meta(8, 128, 64)
    outputs, peak = forward_bytes(attention, [q, k, v])
    assert outputs == 8 * 128 * 64 * 4 + 8 * 128 * 128 * 4  # the output and the averaged weights
    assert peak >= outputs


def test_a_widening_forward_is_charged_more_than_factors_of_its_inputs():
    # 4 MiB of inputs: an evaluation's 14x says 56 MiB; the forward holds two 1 GiB activations at once
    ref = load_reference(WIDEN_REF)
    with torch.device("meta"):
        model = ref.Model()
    outputs, peak = forward_bytes(model, [meta(4096, 256)])
    assert peak == 2 * 4096 * 65536 * 4
    weights, inputs = (256 * 65536 + 65536) * 4, 4096 * 256 * 4
    held = weights + 3 * inputs + 4 * outputs + peak + FILTER_FIXED_BYTES  # a, b and a reference call's copy
    assert footprint_bytes(ref, [], "filter-check") == int(FILTER_MARGIN * held) + FILTER_CONTEXT_BYTES
    assert footprint_bytes(ref, [], "filter-check") > footprint_bytes(ref, [], "eval")
    assert footprint_bytes(ref, [], "filter-probe") < footprint_bytes(ref, [], "filter-check")
    # a check task's compile (judge._check_and_compile): set b and the reference's outputs for it
    compiling = weights + inputs + outputs + peak + FILTER_FIXED_BYTES
    assert footprint_bytes(ref, [], "filter-compile") == int(FILTER_MARGIN * compiling) + FILTER_CONTEXT_BYTES
    # a timing task (pass 2): sets a and b as they are, a call's output and the one before it
    timing = weights + 2 * inputs + 2 * outputs + peak + FILTER_FIXED_BYTES
    assert footprint_bytes(ref, [], "filter-time") == int(FILTER_MARGIN * timing) + FILTER_CONTEXT_BYTES
    assert footprint_bytes(ref, [], "filter-compile") < footprint_bytes(ref, [], "filter-time") < footprint_bytes(ref, [], "filter-check")


def test_an_elementwise_chain_is_charged_less_than_an_evaluation():
    ref = load_reference(ELEMENTWISE_REF)
    assert footprint_bytes(ref, [], "filter-check") < footprint_bytes(ref, [], "eval") - 8 * 64 * MIB


def test_a_forward_meta_tensors_cannot_run_falls_back_to_factors():
    ref = load_reference(DATA_DEPENDENT_REF)
    inputs = nbytes([meta(1 << 20)])
    input_factor, weight_factor = FOOTPRINT_FACTORS["eval"]
    assert footprint_bytes(ref, [], "filter-check") == input_factor * inputs + CONTEXT_BYTES
    assert footprint_bytes(ref, [], "filter-probe") == FOOTPRINT_FACTORS["filter-probe"][0] * inputs + CONTEXT_BYTES


WIDEN_REF = '''
import torch

class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(256, 65536)

    def forward(self, x):
        return torch.nn.functional.gelu(self.up(x)).mean(-1)

def get_inputs():
    return [torch.randn(4096, 256)]

def get_init_inputs():
    return []
'''

ELEMENTWISE_REF = '''
import torch

class Model(torch.nn.Module):
    def forward(self, x):
        return torch.tanh(torch.sigmoid(x) * 3 + 1)

def get_inputs():
    return [torch.randn(64, 1024, 1024)]

def get_init_inputs():
    return []
'''

DATA_DEPENDENT_REF = '''
import torch

class Model(torch.nn.Module):
    def forward(self, x):
        return x[x > 0].sum() * torch.ones(int(x.sum().item()) % 7 + 1)

def get_inputs():
    return [torch.randn(1 << 20)]

def get_init_inputs():
    return []
'''

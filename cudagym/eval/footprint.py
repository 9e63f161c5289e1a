"""What one eager forward allocates, measured on meta tensors: no GPU, no memory, milliseconds.

The GPU memory budget admits a judge by its footprint (`judge.footprint_bytes`). For the reference-only
modes of the dataset filter, factors of the inputs' size are a poor guess both ways: a chain whose Linear
widens its input 64x needs far more than 14x its inputs, and an elementwise chain far less. Charged an
evaluation's 14x the inputs, the filter's checks reserved a median 11.6 GiB on the H100 and kept alive a
median 2.3 GiB (session 28, benchmarks/filter_footprints.py): five judges of sixteen were admitted at once.
So the filter's footprint counts what the forward itself allocates: every op's new output, freed when
the last tensor that shares its storage dies, and the most ever alive at once.
"""

from __future__ import annotations

import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


class _Block:
    """One storage's bytes, shared by the tensors that view it; its end (the last of them gone) is the free."""

    __slots__ = ("count", "n_bytes", "__weakref__")

    def __init__(self, count: "LiveBytes", n_bytes: int):
        self.count, self.n_bytes = count, n_bytes
        count.live += n_bytes
        count.peak = max(count.peak, count.live)

    def __del__(self):
        self.count.live -= self.n_bytes


class LiveBytes(TorchDispatchMode):
    """Counts the bytes of the storages ops create, alive now (`live`) and at most (`peak`). Storages are
    told apart by identity, not by the op schema's alias annotations (`unsafe_split` and `unbind` return
    views their schema does not, or not per tensor, declare): a view shares its base's block, so a view
    that outlives its base keeps the base's bytes counted, and an in-place op's output counts nothing new.
    Storages that existed before (`known`: the weights, the inputs) are not counted: the caller adds them."""

    def __init__(self, known: set[int] = frozenset()):
        super().__init__()
        self.live = self.peak = 0
        self.known = set(known)
        self.blocks: weakref.WeakValueDictionary[int, _Block] = weakref.WeakValueDictionary()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.equal.default:  # no meta kernel; MultiheadAttention asks it of key and value
            return True
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor) or hasattr(t, "_cudagym_block"):
                continue
            key = storage_key(t)
            if key in self.known:
                continue
            block = self.blocks.get(key)
            if block is None:
                block = self.blocks[key] = _Block(self, t.untyped_storage().nbytes())
            t._cudagym_block = block  # the block lives while any tensor on its storage does
        return out


def storage_key(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata


def forward_bytes(model, inputs: list) -> tuple[int, int]:
    """(bytes of the outputs, the most bytes alive at once during the forward, outputs included) for one
    call of `model` on `inputs`, both on the meta device. Raises what the forward raises on meta tensors
    (a data-dependent op, a .item()): the caller falls back to its factors."""
    before = [t for t in list(model.parameters()) + list(model.buffers()) + list(inputs) if isinstance(t, torch.Tensor)]
    count = LiveBytes({storage_key(t) for t in before})
    with torch.no_grad(), torch.device("meta"), count:  # a factory call in the forward lands on meta too
        out = model(*inputs)
    outputs = {storage_key(t): t.untyped_storage().nbytes() for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)}
    return sum(outputs.values()), count.peak

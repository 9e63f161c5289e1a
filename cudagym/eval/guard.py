"""Runtime op policy: which torch/ATen ops ran during the candidate's forward, and from where.

Two stacked modes record every call: a TorchFunctionMode sees the torch functions the candidate's
Python code calls (through any alias: `T.matmul`, `getattr(torch, "mm")`, `x.__matmul__`,
`torch.ops.aten.mm`), a TorchDispatchMode sees every ATen op that actually runs, including those a
C++ extension issues through `at::`. An ATen op that runs while no Python-level torch call is open
came from compiled code. The `strict` policy (CUDA Agent's) allows only allocation, views and
layout copies from Python; from C++ it also allows GEMM (cuBLAS) and convolution (cuDNN). Custom
kernels are not ATen ops and are always allowed. Ops on half/bfloat16 tensors in an fp32 task are
`precision_downcast` under every policy.
"""

from __future__ import annotations

from dataclasses import dataclass, field

ALLOC = {"empty", "empty_like", "empty_strided", "zeros", "zeros_like", "ones", "ones_like", "full", "full_like",
         "new_empty", "new_empty_strided", "new_zeros", "new_ones", "new_full", "scalar_tensor", "tensor", "as_tensor"}
VIEW = {"view", "_unsafe_view", "view_as", "reshape", "reshape_as", "_reshape_alias", "as_strided", "permute",
        "transpose", "transpose_", "t", "unsqueeze", "squeeze", "expand", "expand_as", "slice", "select", "narrow",
        "flatten", "unflatten", "alias", "detach", "split", "split_with_sizes", "chunk", "unbind", "movedim",
        "swapaxes", "__getitem__", "lift_fresh", "_local_scalar_dense", "item"}
LAYOUT = {"contiguous", "clone", "copy_", "_to_copy", "to", "cuda", "cpu", "fill_", "zero_", "__setitem__"}
META = {"size", "stride", "dim", "numel", "data_ptr", "is_contiguous", "element_size", "storage_offset",
        "sym_size", "sym_stride", "sym_numel", "sym_storage_offset", "is_floating_point", "get_device", "type",
        "untyped_storage", "__len__", "__format__", "__repr__", "__hash__", "__bool__", "__index__", "requires_grad_"}
GEMM = {"mm", "bmm", "addmm", "addmv", "mv", "matmul", "linear", "baddbmm", "addbmm", "_addmm_activation", "dot"}
CONV = {"convolution", "_convolution", "conv1d", "conv2d", "conv3d", "cudnn_convolution",
        "cudnn_convolution_transpose", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d",
        "convolution_overrideable", "_convolution_mode", "cudnn_convolution_relu", "cudnn_convolution_add_relu"}

PYTHON_ALLOWED = ALLOC | VIEW | LAYOUT | META
CPP_ALLOWED = PYTHON_ALLOWED | GEMM | CONV
POLICIES = {"strict": (PYTHON_ALLOWED, CPP_ALLOWED), "permissive": (None, None)}
LOW_PRECISION = {"float16", "bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz"}


def short_name(name: str) -> str:
    """'aten::mm.default' / 'torch.Tensor.mm' / 'torch.nn.functional.relu' -> 'mm' / 'relu'."""
    name = name.split("::")[-1].split(".")[0] if "::" in name else name.rsplit(".", 1)[-1]
    return name


@dataclass
class OpRecord:
    python_calls: set = field(default_factory=set)  # torch functions called from Python
    python_aten: set = field(default_factory=set)  # ATen ops under a Python-level call
    cpp_aten: set = field(default_factory=set)  # ATen ops issued by compiled code
    dtypes: set = field(default_factory=set)

    def violations(self, policy: str, task_dtypes: set[str]) -> dict[str, list[str]]:
        py_allowed, cpp_allowed = POLICIES[policy]
        flags: dict[str, list[str]] = {}
        if py_allowed is not None:
            bad = sorted({f"py:{n}" for n in self.python_calls | self.python_aten if short_name(n) not in py_allowed}
                         | {f"c++:{n}" for n in self.cpp_aten
                            if n.startswith("aten::") and short_name(n) not in cpp_allowed})
            if bad:
                flags["forbidden_op"] = bad[:20]
        low = (self.dtypes & LOW_PRECISION) - task_dtypes
        if low:
            flags["precision_downcast"] = sorted(low)
        return flags


def _getter_name(func) -> str:
    import torch

    try:
        name = torch.overrides.resolve_name(func) or getattr(func, "__name__", repr(func))
    except Exception:
        name = getattr(func, "__name__", repr(func))
    if name.endswith(".__get__"):  # property reads (x.shape, x.T): metadata or a view
        return "size"
    return name


def make_guard(record: OpRecord):
    """A context manager that records into `record` while active."""
    import torch
    from torch.overrides import TorchFunctionMode
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    depth = [0]

    class PythonCalls(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if isinstance(func, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
                # ATen ops that compiled code issues (torch::empty_like in an extension) surface here
                # too; they are judged by the C++ policy. Python code naming torch.ops.aten directly
                # is the static checks' to catch.
                return func(*args, **(kwargs or {}))
            record.python_calls.add(_getter_name(func))
            depth[0] += 1
            try:
                return func(*args, **(kwargs or {}))
            finally:
                depth[0] -= 1

    class AtenOps(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = str(func._schema.name) if hasattr(func, "_schema") else str(func)
            (record.python_aten if depth[0] else record.cpp_aten).add(name)
            out = func(*args, **(kwargs or {}))
            for t in tree_flatten((args, kwargs, out))[0]:
                if isinstance(t, torch.Tensor):
                    record.dtypes.add(str(t.dtype).replace("torch.", ""))
            return out

    class Guard:
        def __enter__(self):
            self.modes = [AtenOps(), PythonCalls()]
            for mode in self.modes:
                mode.__enter__()
            return record

        def __exit__(self, *exc):
            for mode in reversed(self.modes):
                mode.__exit__(*exc)

    return Guard()

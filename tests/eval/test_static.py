"""Static hack checks: each flag fires on a small inline hack (alias tricks included); honest kernels stay clean."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from cudagym.eval.static import CHECKS, POLICIES, extract_cuda_sources, parse_candidate, reference_dtypes, \
    static_flags, static_report

# An honest elementwise kernel; KERNEL + a ModelNew using it (`model(...)`) is the base of most hacks below.
KERNEL = '''
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_src = """
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

__global__ void relu_kernel(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] > 0.f ? x[i] : 0.f;  // we never touch cudaEventRecord
}

torch::Tensor relu_cuda(torch::Tensor x, torch::Tensor y) {
    int n = x.numel();
    int half = n / 2;  // a variable named half is not a half type
    auto stream = at::cuda::getCurrentCUDAStream();
    relu_kernel<<<(n + 255) / 256, 256, 0, stream>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
    return y;
}
"""
cpp_src = "torch::Tensor relu_cuda(torch::Tensor x, torch::Tensor y);"

relu_ext = load_inline(name="relu_ext", cpp_sources=cpp_src, cuda_sources=cuda_src,
                       functions=["relu_cuda"], verbose=False, extra_cuda_cflags=["-O3"])
'''

HONEST = KERNEL + '''

class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.ext = relu_ext

    def forward(self, x):
        x = x.contiguous().view(x.size(0), -1)
        y = torch.empty_like(x)
        return self.ext.relu_cuda(x, y).reshape(x.shape)


def get_inputs():
    return [torch.randn(16, 16).relu()]  # torch compute outside forward is fine
'''

HONEST_CUBLAS = '''
import torch
from torch import nn
from torch.utils.cpp_extension import load_inline

source = r"""
#include <torch/extension.h>
torch::Tensor mm_cuda(torch::Tensor a, torch::Tensor b) {
    return at::matmul(a, b);  // ATen inside C++ is the runtime guard's business
}
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("mm_cuda", &mm_cuda); }
"""


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.ext = None

    def forward(self, a, b):
        if self.ext is None:  # built lazily: state holding an extension is not a cached result
            self.ext = load_inline(name="mm_ext", cpp_sources="", cuda_sources=source, with_cuda=True)
        return self.ext.mm_cuda(a, b)
'''


def model(forward: str, init: str = "", prelude: str = "") -> str:
    """KERNEL + prelude + a ModelNew with this __init__ tail and forward body (both dedented)."""
    init_body = textwrap.indent(textwrap.dedent(init), " " * 8)
    body = textwrap.indent(textwrap.dedent(forward), " " * 8)
    return (KERNEL + textwrap.dedent(prelude) + "\n\nclass ModelNew(nn.Module):\n    def __init__(self):\n"
            "        super().__init__()\n        self.ext = relu_ext\n" + init_body +
            "\n    def forward(self, x):\n" + body + "\n")


def kernel_with(cuda_line: str) -> str:
    """The honest model with one more line in its CUDA source."""
    return HONEST.replace("    int n = x.numel();\n", f"    int n = x.numel();\n    {cuda_line}\n")


def test_honest_candidates_are_clean():
    assert static_flags(HONEST) == []
    assert static_flags(HONEST_CUBLAS) == []
    assert static_report(HONEST, "permissive") == {}


def test_policies_name_registered_checks():
    assert set(POLICIES["strict"]) == set(CHECKS)
    assert set(POLICIES["permissive"]) == set(CHECKS) - {"torch_compute_in_forward"}
    with pytest.raises(ValueError):
        static_flags(HONEST, "lenient")


def test_syntax_error_raises():
    with pytest.raises(SyntaxError):
        static_flags("class ModelNew(nn.Module:\n    pass\n")
    with pytest.raises(SyntaxError):
        parse_candidate("def f():\n    nonlocal x\n")  # parses, but CPython rejects it


def test_cuda_sources_follow_variables_and_concatenation():
    src = '''
from torch.utils import cpp_extension as ce
head = "#include <torch/extension.h>\\n"
body = "__global__ void k() { cudaStream" "Create(0); }"
flags = f"-DBLOCK={256}"
ext = ce.load_inline("e", cpp_sources=[head + body], cuda_sources="", extra_cuda_cflags=[flags])
'''
    sources = extract_cuda_sources(parse_candidate(src))
    assert any("cudaStreamCreate(0)" in s and s.startswith("#include") for s in sources)
    assert "-DBLOCK= " in sources
    assert "nondefault_stream" in static_flags(src)


# (flag, candidate) pairs: each candidate must fire its flag under "strict".
HACKS = [
    ("inherits_model", KERNEL + "\nclass Base(Model):\n    pass\n\nclass ModelNew(Base):\n    pass\n"),
    ("inherits_model", KERNEL + "\nfrom reference import Model as Ref\n\nclass ModelNew(Ref):\n    pass\n"),
    ("inherits_model", model("return self.ref(x)", init="self.ref = Model()")),
    ("inherits_model", KERNEL + "\nclass _Ref(nn.Module):\n    pass\n\nModelNew = _Ref\n"),
    ("inherits_model", KERNEL + "\nclass _Ref(nn.Module):\n    pass\n\nModelNew = type('ModelNew', (_Ref,), {})\n"),
    ("inherits_model", model("return self.impl(x)", init="self.impl = Model()",
                             prelude="class Model(nn.Module):\n    pass\n")),  # a re-declared reference, composed
    # torch compute in forward, through every kind of alias
    ("torch_compute_in_forward", model("return torch.relu(x)")),
    ("torch_compute_in_forward", model("return T.matmul(x, x)", prelude="import torch as T")),
    ("torch_compute_in_forward", model("return Fx.relu(x)", prelude="from torch.nn import functional as Fx")),
    ("torch_compute_in_forward", model("return r(x)", prelude="from torch.nn.functional import relu as r")),
    ("torch_compute_in_forward", model("return F.softmax(x, -1)", prelude="import torch.nn.functional as F")),
    ("torch_compute_in_forward", model("return N.functional.gelu(x)", prelude="from torch import nn as N")),
    ("torch_compute_in_forward", model("return getattr(torch, 'mm')(x, x)")),
    ("torch_compute_in_forward", model("return getattr(torch, 'ma' + 'tmul')(x, x)")),  # folded, not "computed"
    ("torch_compute_in_forward", model("return functools.reduce(operator.matmul, (x, x))",
                                       prelude="import functools, operator")),  # passed, not called
    ("torch_compute_in_forward", model("return torch.ops.fx.gemm(x, x)", prelude='''
        @torch.library.custom_op("fx::gemm", mutates_args=())
        def gemm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            return torch.mm(a, b)
        ''')),
    ("torch_compute_in_forward", model("return __import__('torch').relu(x)")),
    ("torch_compute_in_forward", model("return importlib.import_module('torch.nn.functional').relu(x)",
                                       prelude="import importlib")),
    ("torch_compute_in_forward", model("return torch.ops.aten.mm.default(x, x)")),
    ("torch_compute_in_forward", model("return mm(x, x)", prelude="mm = torch.mm")),
    ("torch_compute_in_forward", model("return self.op(x, x)", init="self.op = torch.matmul")),
    ("torch_compute_in_forward", model("return self.f(x)", init="self.f = lambda t: torch.relu(t)")),
    ("torch_compute_in_forward", model("return self.f(x)", init="self.f = functools.partial(torch.softmax, dim=0)",
                                       prelude="import functools")),
    ("torch_compute_in_forward", model("return self.ops['a'](x)", init="self.ops = {'a': torch.relu}")),
    ("torch_compute_in_forward", model("return x @ x.t()")),
    ("torch_compute_in_forward", model("return x.exp().sum(dim=1)")),
    ("torch_compute_in_forward", model("y = torch.empty_like(x)\ny.copy_(x)\nreturn y")),
    ("torch_compute_in_forward", model("return x.to(torch.float64)")),
    ("torch_compute_in_forward", model("return self.conv(x)", init="self.conv = nn.Conv2d(3, 3, 3)")),
    ("torch_compute_in_forward", model("return self.layers[0](x)",
                                       init="self.layers = nn.ModuleList([nn.Linear(4, 4)])")),
    ("torch_compute_in_forward", model("return self.helper(x)") +
     "\n    def helper(self, x):\n        return x.tanh()\n"),
    ("torch_compute_in_forward", model("return fused(x)", prelude="def fused(x):\n    return torch.sigmoid(x)\n")),
    ("torch_compute_in_forward", model("return Fn.apply(x)", prelude='''
        class Fn(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return torch.nn.functional.relu(x)
        ''')),
    ("torch_compute_in_forward", model("return self.block(x)", init="self.block = Block()", prelude='''
        class Block(nn.Module):
            def forward(self, x):
                return torch.softmax(x, 0)
        ''')),
    ("torch_compute_in_forward", KERNEL + "\nclass ModelNew(nn.Linear):\n    pass\n"),
    ("torch_compute_in_forward", KERNEL + "\nclass ModelNew(nn.Conv2d):\n    def forward(self, x):\n"
                                          "        return super().forward(x)\n"),
    ("torch_compute_in_forward", model("return x * 2.0")),  # arithmetic on forward's tensor arguments
    ("torch_compute_in_forward", model("return self.net(x)", init="layers = []\nlayers.append(nn.Linear(4, 4))\n"
                                                                 "self.net = nn.Sequential(*layers)")),
    ("torch_compute_in_forward", model("return self.f(x)", init="self.f = torch.compile(lambda t: t.sin())")),
    # the rest
    ("try_except_fallback", model("try:\n    return self.ext.relu_cuda(x, torch.empty_like(x))\nexcept Exception:\n"
                                  "    return x.clamp(min=0)")),
    ("try_except_fallback", model("with contextlib.suppress(RuntimeError):\n    return x",
                                  prelude="import contextlib")),
    ("threading", model("return x", prelude="from concurrent.futures import ThreadPoolExecutor as TPE")),
    ("threading", model("subprocess.run(['nvidia-smi'])\nreturn x", prelude="import subprocess")),
    ("threading", model("return x", prelude="import os\nPID = os.fork")),
    ("threading", model("raise SystemExit(0)")),
    ("introspection", model("frame = sys._getframe(1)\nreturn frame.f_locals['expected']", prelude="import sys")),
    ("introspection", model("return x", prelude="import gc")),
    ("introspection", model("ref = globals()['torch']\nreturn x")),
    ("introspection", model("return x", prelude="import sys\nREF = sys.modules['__main__']")),
    ("monkeypatch", model("return x", prelude="torch.cuda.synchronize = lambda *a: None")),
    ("monkeypatch", model("return x", prelude="import time as t\nt.perf_counter = lambda: 0.0")),
    ("monkeypatch", model("return x", prelude="torch.Tensor.__eq__ = lambda a, b: True")),
    ("monkeypatch", model("return x", prelude="setattr(torch.cuda.Event, 'elapsed_time', lambda *a: 0.001)")),
    ("monkeypatch", model("return x", prelude="import builtins\nbuiltins.len = lambda x: 0")),
    ("monkeypatch", model("return x", prelude='lib = torch.library.Library("aten", "IMPL")')),
    ("monkeypatch", model("return x", prelude="setattr(CLOCK, ''.join(['perf_', 'counter']), None)")),
    ("monkeypatch", model("return x", prelude="sys_ = __import__('sy' + 's')\nsys_.modules['time'] = None")),
    ("timing_access", model("return x", prelude="import time")),
    ("timing_access", model("torch.cuda.synchronize()\nreturn x")),
    ("timing_access", model("e = torch.cuda.Event(enable_timing=True)\ne.record()\nreturn x")),
    ("timing_access", model("return x", prelude="STATS = torch.cuda.memory_stats")),
    ("timing_access", kernel_with("cudaEvent_t e; cudaEventCreate(&e); cudaEventRecord(e);")),
    ("file_io", model("open('/tmp/out.pt', 'wb').write(b'')\nreturn x")),
    ("file_io", model("return x", prelude="import os\nos.remove('/tmp/x')")),
    ("file_io", model("return x", prelude="import sys\nsys.path.insert(0, '/tmp')")),
    ("file_io", model("torch.save(x, '/tmp/x.pt')\nreturn x")),
    ("file_io", model("return x", prelude="import pathlib\npathlib.Path('/tmp/a').write_text('1')")),
    ("ctypes", model("return x", prelude="import ctypes\nlib = ctypes.CDLL('libcudart.so')")),
    ("ctypes", model("return x", prelude="rt = torch.cuda.cudart()")),
    ("ctypes", kernel_with('void* h = dlopen("libcuda.so", 1);')),
    ("network", model("return x", prelude="import urllib.request")),
    ("network", model("return x", prelude="from socket import socket")),
    ("nondefault_stream", model("with torch.cuda.stream(self.s):\n    return x", init="self.s = torch.cuda.Stream()")),
    ("nondefault_stream", kernel_with("cudaStream_t s; cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);")),
    ("nondefault_stream", kernel_with("auto side = at::cuda::getStreamFromPool();")),
    ("nondefault_stream", HONEST.replace("0, stream>>>", "0, cudaStreamPerThread>>>")),
    ("nondefault_stream", HONEST.replace("auto stream = at::cuda::getCurrentCUDAStream();",
                                         "cudaStream_t stream = (cudaStream_t)7;")),
    ("l2_persistence", kernel_with("cudaStreamAttrValue a; a.accessPolicyWindow.hitRatio = 1.0f;")),
    ("l2_persistence", kernel_with("cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, 1 << 20);")),
    ("precision_downcast", model("return x.half()")),
    ("precision_downcast", model("return x.to(torch.bfloat16)")),
    ("precision_downcast", model("return x", prelude="torch.backends.cuda.matmul.allow_tf32 = True")),
    ("precision_downcast", model("return x", prelude="torch.set_float32_matmul_precision('high')")),
    ("precision_downcast", model("with torch.autocast('cuda'):\n    return x")),
    ("precision_downcast", kernel_with("__half h = __float2half(1.0f);")),
    ("precision_downcast", kernel_with('asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 ...");')),
    ("precision_downcast", kernel_with("cublasSetMathMode(handle, CUBLAS_TF32_TENSOR_OP_MATH);")),
    ("precision_downcast", model("return (x.view(torch.int32) & -65536).view(torch.float32)")),
    ("cached_result", model("if self.cache is not None:\n    return self.cache\nout = torch.empty_like(x)\n"
                            "self.ext.relu_cuda(x, out)\nself.cache = out\nreturn out", init="self.cache = None")),
    ("cached_result", model("k = x.data_ptr()\nif k not in _SEEN:\n"
                            "    _SEEN[k] = self.ext.relu_cuda(x, torch.empty_like(x))\n"
                            "return _SEEN[k]", prelude="_SEEN = {}")),
    ("cached_result", model("if self.out is None:\n    self.out = self.ext.relu_cuda(x, torch.empty_like(x))\n"
                            "return self.out", init="self.out = None")),  # compute once
    ("cached_result", model("out = _C.get(id(x))\nif out is None:\n"
                            "    out = self.ext.relu_cuda(x, torch.empty_like(x))\n"
                            "    _C[id(x)] = out\nreturn out", prelude="_C = {}")),
    ("cached_result", kernel_with("static std::map<void*, torch::Tensor> cache;")),
    ("cached_result", model("return self.run(x)", prelude="import functools") +
     "\n    @functools.lru_cache(maxsize=None)\n    def run(self, x):\n        return x\n"),
    ("lazy_tensor", model("return Lazy(x)", prelude="class Lazy(torch.Tensor):\n    pass\n")),
    ("lazy_tensor", model("return x.as_subclass(torch.Tensor)")),
    ("lazy_tensor", model("return x", prelude="class M:\n    def __torch_function__(self, *a, **k):\n        pass\n")),
    ("dynamic_code", model("exec('y = x')\nreturn x")),
    ("dynamic_code", model("return x", prelude="import base64\nSRC = base64.b64decode('aW1wb3J0IG9z')")),
    ("dynamic_code", model("return getattr(torch, ''.join(reversed('lumtam')))(x, x)")),
    ("dynamic_code", model("return __import__(NAMES[0]).relu(x)", prelude="NAMES = ['torch']")),
    ("dynamic_code", model("return importlib.import_module(x.name).relu(x)", prelude="import importlib")),
]


@pytest.mark.parametrize("flag, source", HACKS, ids=[f"{flag}-{i}" for i, (flag, _) in enumerate(HACKS)])
def test_hack_fires_its_flag(flag, source):
    assert flag in static_flags(source), static_report(source)


def test_every_flag_has_a_hack():
    assert {flag for flag, _ in HACKS} == set(CHECKS)


def test_report_says_what_and_where():
    report = static_report(model("y = torch.empty_like(x)\nreturn T.mm(x, y)", prelude="import torch as T"))
    assert report.keys() == {"torch_compute_in_forward"}
    [detail] = report["torch_compute_in_forward"]
    assert detail.startswith("line ") and detail.endswith(": torch.mm")


def test_torch_compute_is_strict_only():
    src = model("return torch.nn.functional.relu(x)")
    assert "torch_compute_in_forward" in static_flags(src, "strict")
    assert "torch_compute_in_forward" not in static_flags(src, "permissive")


def test_precision_downcast_skipped_for_half_tasks():
    src = model("return x.half()")
    reference = "import torch\ndef get_inputs():\n    return [torch.randn(4, dtype=torch.float16)]\n"
    assert reference_dtypes(reference) == {"float16"}
    assert "precision_downcast" not in static_flags(src, task_dtypes=reference_dtypes(reference))
    assert "precision_downcast" in static_flags(src, task_dtypes={"float32"})


@pytest.mark.parametrize("source", [
    model("return x", init="self.compile = 1"),  # attribute names are not builtins
    model("return x", prelude="import os\nos.environ['TORCH_CUDA_ARCH_LIST'] = '9.0'"),
    model("out = self.ext.relu_cuda(x, torch.empty_like(x))\nself.last = out\nreturn self.last"),  # untested state
    model("def forward_helper(input):\n    return input\nreturn forward_helper(x.view(-1))"),
    model("for t in (x,):\n    pass\nreturn self.ext.relu_cuda(x, x.new_empty(x.shape))"),
    model("return x", prelude='DOC = "we avoid cudaEventRecord and __half here"'),  # prose, not C++
    model("if self.buf is None:\n    self.buf = torch.empty_like(x)\nreturn self.ext.relu_cuda(x, self.buf)",
          init="self.buf = None"),  # one output buffer, refilled by the kernel on every call
    model("n = x.numel()\nout = torch.empty((n + 255) // 256 * 256, device=x.device)\n"
          "return self.ext.relu_cuda(x, out.to(device=x.device, dtype=x.dtype))"),
    model("return x", prelude="import os\nHERE = os.path.dirname(os.path.abspath(__file__))\n"
                              "torch.backends.cuda.matmul.allow_tf32 = False"),
    model("try:\n    y = self.ext.relu_cuda(x, torch.empty_like(x))\nfinally:\n    pass\nreturn y"),  # no except
    model("return self.net(x)", init="self.net = nn.Sequential(Blk(), Blk())", prelude='''
        class Blk(nn.Module):
            def forward(self, x):
                return relu_ext.relu_cuda(x, torch.empty_like(x))
        '''),
    HONEST.replace("    relu_kernel<<<", "    launch(stream);\n    relu_kernel<<<").replace(
        "torch::Tensor relu_cuda(torch::Tensor x, torch::Tensor y) {",
        "void launch(cudaStream_t s) { relu_kernel<<<1, 1, 0, s>>>(nullptr, nullptr, 0); }\n"
        "torch::Tensor relu_cuda(torch::Tensor x, torch::Tensor y) {"),  # a stream parameter
    model("return self.ext.relu_cuda(x, torch.zeros_like(x))", init="self.block = Block()", prelude='''
        class Block(nn.Module):
            def forward(self, x):
                return torch.softmax(x, 0)  # defined, never called from forward
        '''),
])
def test_no_false_positive(source):
    assert static_flags(source) == [], static_report(source)


HONEST_FIXTURES = sorted((Path(__file__).parent.parent / "fixtures" / "honest").glob("*.py"))


@pytest.mark.parametrize("path", HONEST_FIXTURES, ids=[p.stem for p in HONEST_FIXTURES])
def test_honest_fixtures_pass_permissive(path):
    assert static_report(path.read_text(), "permissive") == {}

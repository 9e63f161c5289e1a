"""Static hack checks: named checks over a candidate's source, with strict and permissive presets.

The second layer after the runtime guard (which records dispatched ops in the sandboxed child). A
check is a small function registered by name, `(module, source, cuda_sources) -> details`; it fires
when it returns any detail. Python is read with libcst, through one shared name resolver (`_Index`)
that follows aliases: `import torch as T`, `from torch.nn import functional as F`, `mm = torch.mm`,
`self.op = torch.mm`, `getattr(torch, "mm")`, `__import__("torch")`, `importlib.import_module(...)`,
`sys.modules["torch"]`. C++/CUDA is read with regexes over `cuda_sources`: every string handed to a
cpp_extension loader (following variables, joining concatenations and f-string pieces) plus any
string literal that looks like C++, with comments stripped.

Flag names are stable; they appear in verdicts' `flags`. POLICIES["strict"] runs all of them,
POLICIES["permissive"] all but torch_compute_in_forward.

    inherits_model            ModelNew derives from, instantiates or imports the reference Model
    torch_compute_in_forward  forward (and what it calls) computes with torch / F / aten / Tensor methods,
                              `@`, arithmetic on its tensor arguments, dtype casts, nn submodules
    try_except_fallback       try/except or contextlib.suppress (fall back to torch when the kernel fails)
    threading                 threads, processes, asyncio, subprocess, signals (std::thread in C++)
    introspection             frames, gc, inspect, globals()/locals(), sys.modules, __builtins__
    monkeypatch               assigning/setattr on library modules and classes, builtins, aten overrides
    timing_access             timers, CUDA events, synchronize, profiler, memory stats (cudaEvent*, clock64)
    file_io                   open, os file ops, shutil, sys.path, torch.save/load, importlib.reload, fopen
    ctypes                    ctypes, cffi, torch.cuda.cudart, dlopen
    network                   socket, urllib, requests, http
    nondefault_stream         side streams in Python or CUDA, launches on a stream that is not the current one
    l2_persistence            persisting-L2 access policy windows
    precision_downcast        fp16/bf16/tf32 in an fp32 task (skipped when the task's own dtypes are half)
    cached_result             results kept across calls (forward returns state from behind a test on it;
                              lru_cache)
    lazy_tensor               Tensor subclasses, __torch_function__/__torch_dispatch__, as_subclass
    dynamic_code              exec/eval/compile, computed imports and getattr names, decoded payloads

Known limits (the runtime guard covers them): names are resolved file-wide, not per scope (a name
bound to several things resolves to all of them, so checks err towards firing); what a function of
the file returns is not followed (`self.f = make_op()`); arithmetic on locals is not flagged
(`(n + 255) // 256` and `y * 2` on a local tensor look alike); ATen calls inside C++ (`at::matmul`) are not flagged.
"""

from __future__ import annotations

import builtins
import fnmatch
import functools
import re
from collections.abc import Callable, Mapping

import libcst as cst
import libcst.matchers as m
from libcst.metadata import CodeRange, MetadataWrapper, PositionProvider

Check = Callable[[cst.Module, str, list[str]], list[str]]
CHECKS: dict[str, Check] = {}


def check(name: str) -> Callable[[Check], Check]:
    """Register a check under its stable flag name."""

    def register(fn: Check) -> Check:
        CHECKS[name] = fn
        return fn

    return register


# ---------------------------------------------------------------------------------------------
# What counts as torch compute in forward. Allocation, views and metadata are allowed; everything
# else in the torch namespace is compute. For methods on values of unknown type (`x.exp()`), a list
# of Tensor compute methods is used instead (a value could be a list or a dict).

ALLOCATION = {"empty", "empty_like", "empty_strided", "zeros", "zeros_like", "ones", "ones_like", "full",
              "full_like", "new_empty", "new_empty_strided", "new_zeros", "new_ones", "new_full", "tensor",
              "as_tensor", "zero_", "fill_"}
VIEWS = {"view", "view_as", "reshape", "reshape_as", "permute", "transpose", "t", "contiguous", "unsqueeze",
         "squeeze", "expand", "expand_as", "flatten", "unflatten", "narrow", "select", "as_strided", "movedim",
         "moveaxis", "swapaxes", "swapdims", "chunk", "split", "tensor_split", "unbind", "broadcast_to",
         "view_as_real", "view_as_complex", "detach", "alias"}
METADATA = {"size", "shape", "stride", "dim", "ndim", "ndimension", "numel", "nelement", "element_size",
            "data_ptr", "storage_offset", "is_contiguous", "is_cuda", "device", "dtype", "get_device", "to", "cuda",
            "cpu", "item", "is_floating_point", "is_complex", "is_tensor", "no_grad", "inference_mode",
            "enable_grad", "set_grad_enabled", "is_grad_enabled", "finfo", "iinfo", "get_default_dtype",
            "result_type", "promote_types", "can_cast", "broadcast_shapes", "untyped_storage", "nbytes",
            "itemsize", "requires_grad_", "record_stream", "_assert"}
ALLOWED = ALLOCATION | VIEWS | METADATA  # `.to(...)` is allowed only without a dtype (a cast is compute)

TENSOR_COMPUTE = set("""
abs absolute acos acosh add addbmm addcdiv addcmul addmm addmv addr all allclose amax amin aminmax angle any
argmax argmin argsort argwhere asin asinh atan atan2 atanh baddbmm bernoulli bincount bitwise_and bitwise_not
bitwise_or bitwise_xor bmm ceil cholesky clamp clamp_max clamp_min clip clone copy cos cosh count_nonzero cross
cummax cummin cumprod cumsum deg2rad det diag diag_embed diagflat diff digamma dist div divide dot eq equal erf
erfc erfinv exp exp2 expm1 exponential flip fliplr flipud floor floor_divide fmax fmin fmod frac gather gcd ge
ger greater gt hardshrink heaviside histc hypot index_add index_copy index_fill index_put index_reduce
index_select inner inverse isclose isfinite isinf isnan kthvalue lcm ldexp le lerp lgamma log log10 log1p log2
log_softmax logaddexp logcumsumexp logdet logical_and logical_not logical_or logical_xor logit logsumexp lt
masked_fill masked_scatter masked_select matmul matrix_exp matrix_power max maximum mean median min minimum mm
mode msort mul multinomial multiply mv nan_to_num nanmean nanmedian nansum ne neg negative nonzero norm normal
not_equal outer pinverse pow prod put reciprocal relu remainder renorm repeat repeat_interleave roll rot90
round rsqrt scatter scatter_add scatter_reduce sgn sigmoid sign sin sinc sinh softmax sort sqrt square std sub
subtract sum tan tanh tensordot tile topk trace tril triu true_divide trunc unique var vdot where xlogy numpy
half bfloat16 double float int long short bool byte char
""".split())  # the last line: dtype casts launch a conversion kernel too

TORCH_COMPUTE_NAMESPACES = ("torch.nn.functional", "torch.functional", "torch.special", "torch.linalg", "torch.fft",
                            "torch.sparse", "torch.nested", "torch._C._nn", "torch._C._VariableFunctions",
                            "torch._C._special", "torch._C._linalg", "torch._C._fft")
NN_NOT_COMPUTE = {"Module", "Parameter", "Buffer", "ModuleList", "ModuleDict", "ParameterList", "ParameterDict",
                  "Sequential", "Identity"}  # containers: calling one runs its children, which are resolved
NN_CONTAINERS = {"Sequential", "ModuleList", "ModuleDict"}
TORCH_DTYPES = {"float16", "half", "bfloat16", "float32", "float", "float64", "double", "int8", "uint8", "int16",
                "short", "int32", "int", "int64", "long", "bool", "complex64", "complex128", "float8_e4m3fn",
                "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu"}
TORCH_NON_CALLABLES = TORCH_DTYPES | {
    "cuda", "nn", "ops", "utils", "backends", "autograd", "jit", "distributed", "library", "fx", "cpu", "mps", "xpu",
    "version", "testing", "profiler", "amp", "overrides", "onnx", "export", "compiler", "hub", "ao", "func", "random",
    "multiprocessing", "types", "storage", "futures", "package", "special", "linalg", "fft", "sparse", "nested",
    "functional", "inf", "nan", "pi", "e", "newaxis", "strided", "sparse_coo", "sparse_csr", "jagged",
    "contiguous_format", "channels_last", "channels_last_3d", "preserve_format", "cfloat", "cdouble", "complex32",
    "uint16", "uint32", "uint64", "qint8", "quint8", "qint32"}
INT_DTYPES = {"int8", "uint8", "int16", "short", "int32", "int", "int64", "long", "uint16", "uint32", "uint64"}
LOW_PRECISION_DTYPES = {"float16", "half", "bfloat16"}
CANONICAL_DTYPE = {"half": "float16", "float": "float32", "double": "float64", "short": "int16", "int": "int32",
                   "long": "int64"}
COMPUTE_LIBRARIES = {"transformers", "timm", "torchvision", "torchaudio", "scipy", "jax", "tensorflow",
                     "flash_attn", "xformers", "apex"}  # calling any of these in forward is library compute
ARITHMETIC = (cst.Add, cst.Subtract, cst.Multiply, cst.Divide, cst.FloorDivide, cst.Modulo, cst.Power,
              cst.BitAnd, cst.BitOr, cst.BitXor, cst.LeftShift, cst.RightShift, cst.AddAssign, cst.SubtractAssign,
              cst.MultiplyAssign, cst.DivideAssign, cst.FloorDivideAssign, cst.ModuloAssign, cst.PowerAssign,
              cst.Minus, cst.BitInvert)
TORCH_WRAPPERS = {"torch.compile", "torch.jit.script", "torch.jit.trace", "torch.fx.symbolic_trace",
                  "torch.func.functional_call", "torch.vmap", "torch.func.vmap"}
EXTENSION_LOADERS = {"torch.utils.cpp_extension.load_inline", "torch.utils.cpp_extension.load",
                     "cupy.RawKernel", "cupy.RawModule"}

# ---------------------------------------------------------------------------------------------
# Module names per flag. A pattern matches a qualified name and everything under it ("os.spawn*" too).

THREADING = ("threading", "_thread", "multiprocessing", "torch.multiprocessing", "concurrent.futures", "asyncio",
             "subprocess", "signal", "os.fork", "os.forkpty", "os.system", "os.popen", "os.spawn*", "os.exec*",
             "os.posix_spawn*", "os.register_at_fork", "os.kill", "os._exit", "os.abort", "sys.exit", "builtins.exit",
             "builtins.quit", "builtins.SystemExit", "builtins.KeyboardInterrupt")  # ...and ending the process
INTROSPECTION = ("gc", "inspect", "traceback", "sys._getframe", "sys._current_frames", "sys.settrace",
                 "sys.setprofile", "sys.gettrace", "sys.getprofile", "sys.modules", "sys.exc_info",
                 "builtins.globals", "builtins.locals", "ctypes.pythonapi",
                 # Asking whether an op recorder or profiler is active is how a kernel behaves only when watched.
                 "torch._C._*dispatch*", "torch._C._*mode*", "torch._C._*profiler*", "torch._C._autograd*",
                 "torch._C._len_torch_*", "torch.overrides._*", "torch.utils._python_dispatch*",
                 "torch._C._get_tracing_state", "torch.autograd.profiler._*")
FRAME_ATTRS = {"f_back", "f_locals", "f_globals", "f_builtins", "f_code", "tb_frame", "tb_next", "gi_frame",
               "cr_frame", "ag_frame", "__closure__", "__globals__", "__code__", "__subclasses__", "__mro__",
               "__bases__"}
TIMING = ("time", "timeit", "datetime", "cProfile", "profile", "resource", "torch.cuda.Event",
          "torch.cuda.synchronize", "torch.cuda.Stream.synchronize", "torch.profiler", "torch.autograd.profiler",
          "torch.cuda.profiler", "torch.cuda.memory*", "torch.cuda.max_memory*", "torch.cuda.reset_*",
          "torch.cuda.mem_get_info", "torch.utils.benchmark")
FILE_IO = ("builtins.open", "io.open", "io.FileIO", "codecs.open", "os.*", "shutil", "tempfile", "glob", "fcntl",
           "mmap", "fileinput", "linecache", "sqlite3", "zipfile", "tarfile", "sys.path", "torch.save",
           "torch.load", "torch.jit.save", "torch.jit.load", "pickle.load", "pickle.dump", "numpy.save*",
           "numpy.load", "numpy.fromfile", "numpy.memmap", "importlib.reload")
OS_NOT_FILE_IO = THREADING + ("os.path", "os.environ", "os.getenv", "os.putenv", "os.cpu_count", "os.getpid",
                              "os.sep", "os.name", "os.linesep", "os.pathsep", "os.fspath", "os.PathLike")
FILE_IO_METHODS = {"write_text", "write_bytes", "read_text", "read_bytes", "unlink", "touch", "symlink_to",
                   "hardlink_to"}  # pathlib.Path methods; distinctive enough to match on any receiver
CTYPES = ("ctypes", "_ctypes", "cffi", "torch.cuda.cudart", "cuda.cudart", "cuda.bindings", "cuda.cuda",
          "torch.ops.load_library", "torch.classes.load_library")
NETWORK = ("socket", "urllib", "urllib3", "requests", "http", "httpx", "aiohttp", "ftplib", "smtplib",
           "telnetlib", "xmlrpc", "websocket", "websockets", "ssl", "grpc", "zmq", "paramiko")
STREAMS = ("torch.cuda.Stream", "torch.cuda.stream", "torch.cuda.set_stream", "torch.cuda.ExternalStream",
           "torch.cuda.StreamContext", "torch.Stream", "torch.cuda.streams")
LOW_PRECISION = ("torch.float16", "torch.half", "torch.bfloat16", "torch.float8_*", "torch.autocast",
                 "torch.amp", "torch.cuda.amp", "torch.cpu.amp")
TF32_SWITCHES = ("torch.backends.*allow_tf32", "torch.backends.*reduced_precision_reduction",
                 "torch.backends.*fp32_precision")
MEMO_DECORATORS = ("functools.lru_cache", "functools.cache", "functools.cached_property")
SUBCLASS_HOOKS = {"__torch_function__", "__torch_dispatch__", "_make_subclass", "_make_wrapper_subclass",
                  "as_subclass"}
SUBCLASS_MODULES = ("torch.overrides", "torch.utils._python_dispatch", "torch._subclasses",
                    "torch._C._disabled_torch_function_impl")
TENSOR_CLASSES = {"torch.Tensor", "torch._C.TensorBase", "torch._C._TensorBase", "torch.nn.Parameter",
                  "torch.nn.parameter.Parameter"}
DYNAMIC_CODE = ("builtins.exec", "builtins.eval", "builtins.compile", "builtins.bytes.fromhex", "marshal",
                "pickle.loads", "dill", "base64", "binascii", "zlib", "lzma", "bz2", "gzip", "codecs.decode",
                "types.FunctionType", "types.CodeType", "runpy", "importlib.util", "importlib.machinery", "code",
                "*<dynamic>*")
MONKEYPATCH = ("unittest.mock", "mock")
GLOBAL_WRITES_OK = {"os.environ"}  # e.g. TORCH_CUDA_ARCH_LIST before load_inline
MUTATORS = {"append", "extend", "insert", "update", "setdefault", "add", "__setitem__"}

# CUDA / C++ regexes (run on comment-stripped sources).
TIMING_CUDA = (r"\bcudaEvent\w+", r"\bcuEvent\w+", r"\bclock64\s*\(", r"\bclock\s*\(\s*\)", r"%globaltimer\w*",
               r"%clock(64)?\b", r"std::chrono", r"\bclock_gettime\b", r"\bgettimeofday\b",
               r"\bcudaProfiler(Start|Stop)\b")
STREAMS_CUDA = (r"\bcudaStreamCreate\w*", r"\bcuStreamCreate\w*", r"\bcudaStreamNonBlocking\b",
                r"\bgetStreamFromPool\b", r"\bgetStreamFromExternal\b", r"\bcudaStreamPerThread\b",
                r"\bCUDA_API_PER_THREAD_DEFAULT_STREAM\b", r"default-stream[ =]per-thread",
                r"\bsetCurrentCUDAStream\b", r"\bCUDAStreamGuard\b")
L2_CUDA = (r"\bcudaAccessPolicyWindow\b", r"\baccessPolicyWindow\b", r"\bcudaLimitPersistingL2CacheSize\b",
           r"\bCU_LIMIT_PERSISTING_L2_CACHE_SIZE\b", r"\bcuda(Stream|Launch)AttributeAccessPolicyWindow\b",
           r"\bhitRatio\b", r"\bcudaAccessPropertyPersisting\b", r"\bcudaCtxResetPersistingL2Cache\b",
           r"access_property::persisting")
PRECISION_CUDA = (r"\b__half2?\b", r"\bhalf2\b", r"\b__nv_bfloat162?\b", r"\bnv_bfloat162?\b",
                  r"\b__float2half\w*", r"\b__half2float\b", r"\b__float2bfloat16\w*", r"\b__float_to_tf32\b",
                  r"wmma::fragment<[^;>]*\b(half|__half|__nv_bfloat16|precision::tf32)\b",
                  r"wmma::precision::tf32", r"\bmma\.sync\S*\.(f16|bf16|tf32)\b", r"\.tf32\b",
                  r"\bCUBLAS_TF32_TENSOR_OP_MATH\b", r"\bCUBLAS_TENSOR_OP_MATH\b", r"\bCUBLAS_COMPUTE_32F_FAST_\w+",
                  r"\bCUBLAS_COMPUTE_16F\b", r"\bcublasSetMathMode\s*\([^;]*(TENSOR_OP|TF32)", r"\bCUDA_R_16B?F\b",
                  r"\b(at|c10|torch)::(kHalf|kBFloat16|kFloat16|Half|BFloat16)\b", r"\.half\(\)",
                  r"\bsetAllowTF32\w*\(\s*true", r"\bsetFloat32MatmulPrecision\b")
THREADING_CUDA = (r"\bstd::thread\b", r"\bstd::async\b", r"\bpthread_create\b", r"\bfork\s*\(\s*\)")
FILE_IO_CUDA = (r"\bfopen\b", r"\bstd::[io]?fstream\b", r"\bfreopen\b")
CTYPES_CUDA = (r"\bdlopen\b", r"\bdlsym\b", r"<dlfcn\.h>")
NETWORK_CUDA = (r"<sys/socket\.h>", r"<netinet/", r"<arpa/inet\.h>", r"\bcurl_easy_\w+")
CACHE_CUDA = (r"\bstatic\s+std::(unordered_)?map\s*<[^;]*\b(torch|at)::Tensor",
              r"\bstatic\s+(torch|at)::Tensor\b")  # tensors kept across calls in host code
MONKEYPATCH_CUDA = (r"\bTORCH_LIBRARY_(IMPL|FRAGMENT)\s*\(\s*aten\b",)

C_LIKE = re.compile(r"__global__|__device__|#include|<<<|torch::Tensor|at::Tensor|PYBIND11_MODULE|TORCH_LIBRARY")
LAUNCH = re.compile(r"<<<(.*?)>>>", re.S)
COMMENTS = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
BUILTIN_NAMES = set(dir(builtins))


# ---------------------------------------------------------------------------------------------
# Public API.


def static_flags(source: str, policy: str = "strict", task_dtypes: set[str] | None = None,
                 extra_cuda_sources: list[str] = ()) -> list[str]:
    """Sorted names of the checks of `policy` that fire on a candidate; SyntaxError if it does not parse."""
    return sorted(static_report(source, policy, task_dtypes, extra_cuda_sources))


def static_report(source: str, policy: str = "strict", task_dtypes: set[str] | None = None,
                  extra_cuda_sources: list[str] = ()) -> dict[str, list[str]]:
    """Flag name -> details (what fired, where) for the checks of `policy` that fire.

    `task_dtypes` are the dtypes the reference uses (see `reference_dtypes`); when they include a
    half type, `precision_downcast` is skipped: the task itself is low precision.
    `extra_cuda_sources`: C++/CUDA files the candidate builds from (an agent's kernels/), read by the
    C++ checks like the strings it hands to a loader.
    """
    if policy not in POLICIES:
        raise ValueError(f"unknown static policy {policy!r}; known: {sorted(POLICIES)}")
    module = parse_candidate(source)
    cuda_sources = extract_cuda_sources(module) + list(extra_cuda_sources)
    names = POLICIES[policy]
    if task_dtypes and {CANONICAL_DTYPE.get(d, d) for d in task_dtypes} & LOW_PRECISION_DTYPES:
        names = [n for n in names if n != "precision_downcast"]
    report = {}
    for name in names:
        details = CHECKS[name](module, source, cuda_sources)
        if details:
            report[name] = list(dict.fromkeys(details))
    return report


def parse_candidate(source: str) -> cst.Module:
    """The libcst module of `source`; SyntaxError (with CPython's message) if it is not valid Python."""
    compile(source, "<candidate>", "exec", dont_inherit=True)  # compiles only; nothing runs
    try:
        return cst.parse_module(source)
    except cst.ParserSyntaxError as e:  # CPython accepts it but this libcst does not
        raise SyntaxError(str(e)) from e


def extract_cuda_sources(module: cst.Module) -> list[str]:
    """C++/CUDA text: strings given to a cpp_extension loader (following variables), and C++-looking literals."""
    return _index(module).cuda_sources


def reference_dtypes(source: str) -> set[str]:
    """Canonical names of the torch dtypes a reference task mentions (`torch.float16`, `.half()`, ...)."""
    index = _index(parse_candidate(source))
    found = set()
    for _, names in index.refs:
        for q in names:
            parts = q.split(".")
            if len(parts) == 2 and parts[0] == "torch" and parts[1] in TORCH_DTYPES:
                found.add(CANONICAL_DTYPE.get(parts[1], parts[1]))
    for call in index.method_calls({"half", "bfloat16"}):
        found.add("float16" if call.func.attr.value == "half" else "bfloat16")
    return found


# ---------------------------------------------------------------------------------------------
# The checks.


@check("inherits_model")
def inherits_model(module: cst.Module, source: str, cuda_sources: list[str]) -> list[str]:
    """ModelNew reusing the reference Model: its forward is the reference's torch computation."""
    index = _index(module)
    chain = index.chain("ModelNew")
    out = [f"{cls.name.value} derives from {_code(base.value)}" for cls in chain
           for base in cls.bases if _dotted(base.value) and _dotted(base.value).split(".")[-1] == "Model"]
    if "ModelNew" in index.values and "ModelNew" not in index.classes:  # `ModelNew = _Ref` / `type(...)`
        out.append("ModelNew is bound to another class, not defined by a class statement")
    out += [f"line {index.line(n)}: ModelNew uses Model" for cls in chain for n in index.inside(cls.body, cst.Name)
            if n.value == "Model"]
    for node, names in index.refs:
        outside = isinstance(node, cst.Name) and node.value == "Model" and "Model" not in index.classes
        imported = any(q.split(".")[-1] == "Model" and not q.startswith(("<file>", "torch")) for q in names)
        if outside or imported:
            out.append(f"line {index.line(node)}: uses Model from outside the candidate")
    return out


@check("torch_compute_in_forward")
def torch_compute_in_forward(module: cst.Module, source: str, cuda_sources: list[str]) -> list[str]:
    """forward (or what it calls) doing the work with torch instead of the candidate's kernel."""
    index = _index(module)
    out = [f"ModelNew inherits forward from {q}" for q in index.external_bases("ModelNew")
           if _nn_class(q) and not index.method(index.chain("ModelNew"), "forward")]
    for fn, owner in index.forward_closure:
        nodes = [n for n in index.inside(fn, cst.Call, cst.BinaryOperation, cst.AugAssign)
                 if isinstance(n, cst.Call) or isinstance(n.operator, (cst.MatrixMultiply, cst.MatrixMultiplyAssign))]
        for node in nodes:
            why = "@ operator" if not isinstance(node, cst.Call) else _torch_call(index, node, owner)
            if why:
                out.append(f"line {index.line(node)}: {why}")
        for node in index.inside(fn, cst.Name, cst.Attribute):  # passed, not called: `reduce(operator.matmul, ...)`
            out += [f"line {index.line(node)}: {q}" for q in index.ref_map.get(node, ()) if _names_torch_op(q)]
    forward = index.method(index.chain("ModelNew"), "forward")
    if forward:
        out += [f"line {index.line(node)}: {_code(node)}" for node in _tensor_arithmetic(index, forward)]
    return out


@check("try_except_fallback")
def try_except_fallback(module: cst.Module, source: str, cuda_sources: list[str]) -> list[str]:
    """try/except around the kernel, the classic fall-back-to-torch when the kernel fails."""
    index = _index(module)
    out = [f"line {index.line(t)}: try/except" for t in index.of(cst.Try, cst.TryStar) if t.handlers]
    return out + _uses(index, ("contextlib.suppress",))


@check("threading")
def threading(module: cst.Module, source: str, cuda_sources: list[str]) -> list[str]:
    """Threads or processes that keep working (or wait) outside the timed region, or end the worker early."""
    return _uses(_index(module), THREADING) + _cuda(cuda_sources, THREADING_CUDA)


@check("introspection")
def introspection(module: cst.Module, source: str, cuda_sources: list[str]) -> list[str]:
    """Reaching into the harness: frames, gc, caller globals, sys.modules, builtins."""
    index = _index(module)
    out = _uses(index, INTROSPECTION)
    out += [f"line {index.line(a)}: .{a.attr.value}" for a in index.of(cst.Attribute)
            if a.attr.value in FRAME_ATTRS or (a.attr.value == "__dict__" and _is_library(index.resolve(a.value)))]
    out += [f"line {index.line(node)}: builtins" for node, names in index.refs if "builtins" in names]
    for call in index.calls_to("builtins.vars"):
        if not call.args or _is_library(index.resolve(call.args[0].value)):
            out.append(f"line {index.line(call)}: {_code(call)}")
    return out


@check("monkeypatch")
def monkeypatch(module: cst.Module, source: str, cuda_sources: list[str]) -> list[str]:
    """Rebinding library attributes (timers, sync, Tensor ops, builtins) changes what the harness sees."""
    index = _index(module)
    out = [f"line {index.line(node)}: sets {q}" for node, q, value in index.library_writes
           if not (_matches(q, TF32_SWITCHES) and _precise_setting(value))]  # TF32 off is the harness's own setting
    out += [f"line {index.line(t)}: sets .{t.attr.value}" for t in index.targets
            if isinstance(t, cst.Attribute) and t.attr.value in {"__dict__", "__code__", "__defaults__"}]
    for call in index.calls_to("torch.library.*"):
        if any((_literal(a.value, index.values) or "").startswith("aten") for a in call.args):
            out.append(f"line {index.line(call)}: overrides aten ops")
    return out + _uses(index, MONKEYPATCH) + _cuda(cuda_sources, MONKEYPATCH_CUDA)


@check("timing_access")
def timing_access(module: cst.Module, source: str, cuda_sources: list[str]) -> list[str]:
    """A kernel has no business reading timers, events or memory stats: it can detect the benchmark."""
    return _uses(_index(module), TIMING) + _cuda(cuda_sources, TIMING_CUDA)


@check("file_io")
def file_io(module: cst.Module, source: str, cuda_sources: list[str]) -> list[str]:
    """Files persist results across runs or read the expected outputs (load_inline's build dir is fine)."""
    index = _index(module)
    out = _uses(index, FILE_IO, exclude=OS_NOT_FILE_IO)
    out += [f"line {index.line(c)}: .{c.func.attr.value}()" for c in index.method_calls(FILE_IO_METHODS)]
    return out + _cuda(cuda_sources, FILE_IO_CUDA)


@check("ctypes")
def ctypes(module: cst.Module, source: str, cuda_sources: list[str]) -> list[str]:
    """Foreign calls reach the driver or the harness's memory behind torch's back."""
    return _uses(_index(module), CTYPES) + _cuda(cuda_sources, CTYPES_CUDA)


@check("network")
def network(module: cst.Module, source: str, cuda_sources: list[str]) -> list[str]:
    """Network access fetches answers or leaks the task."""
    return _uses(_index(module), NETWORK) + _cuda(cuda_sources, NETWORK_CUDA)


@check("nondefault_stream")
def nondefault_stream(module: cst.Module, source: str, cuda_sources: list[str]) -> list[str]:
    """Work on a side stream escapes events recorded on the current stream."""
    out = _uses(_index(module), STREAMS) + _cuda(cuda_sources, STREAMS_CUDA)
    for src in map(_strip_comments, cuda_sources):
        for launch in LAUNCH.finditer(src):
            args = _split_top_level(launch.group(1))
            if len(args) >= 4 and not _is_current_stream(args[3].strip(), src):
                out.append(f"CUDA: launch on stream {args[3].strip()!r}")
    return out


@check("l2_persistence")
def l2_persistence(module: cst.Module, source: str, cuda_sources: list[str]) -> list[str]:
    """Persisting-L2 windows keep the working set cached across timed reps, defeating the L2 flush."""
    return _cuda(cuda_sources, L2_CUDA)


@check("precision_downcast")
def precision_downcast(module: cst.Module, source: str, cuda_sources: list[str]) -> list[str]:
    """fp16/bf16/tf32 arithmetic in an fp32 task: faster by being less exact, within a loose tolerance."""
    index = _index(module)
    out = _uses(index, LOW_PRECISION)
    out += [f"line {index.line(c)}: .{c.func.attr.value}()" for c in index.method_calls({"half", "bfloat16"})]
    out += [f"line {index.line(node)}: sets {q}" for node, q, value in index.library_writes
            if _matches(q, TF32_SWITCHES) and not _precise_setting(value)]
    out += [f"line {index.line(c)}: {_code(c)} reinterprets float bits" for c in index.method_calls({"view"})
            if any(q.startswith("torch.") and q.rsplit(".", 1)[-1] in INT_DTYPES for a in c.args
                   for q in index.resolve(a.value))]  # mantissa masking: bf16 without a half type
    out += [f"line {index.line(c)}: {_code(c)}" for c in index.calls_to("torch.set_float32_matmul_precision")
            if not (c.args and _literal(c.args[0].value, index.values) == "highest")]
    return out + _cuda(cuda_sources, PRECISION_CUDA)


@check("cached_result")
def cached_result(module: cst.Module, source: str, cuda_sources: list[str]) -> list[str]:
    """Results memoised across calls: state written in forward, tested, and returned on later calls."""
    index = _index(module)
    out = [f"line {index.line(node)}: {q}" for node, names in index.refs for q in names
           if _matches(q, MEMO_DECORATORS)]
    cached = _memoised_state(index)
    out += [f"forward tests and returns state it wrote: {', '.join(sorted(cached))}"] if cached else []
    return out + _cuda(cuda_sources, CACHE_CUDA)


@check("lazy_tensor")
def lazy_tensor(module: cst.Module, source: str, cuda_sources: list[str]) -> list[str]:
    """Tensor subclasses and torch_function hooks can defer or fake the computation the checker compares."""
    index = _index(module)
    out = [f"{cls.name.value} subclasses {q}" for cls in index.classes.values() for base in cls.bases
           for q in index.resolve(base.value) if q in TENSOR_CLASSES]
    out += [f"line {index.line(n)}: {n.value}" for n in index.of(cst.Name) if n.value in SUBCLASS_HOOKS]
    out += [f"line {index.line(t)}: sets .__class__" for t in index.targets
            if isinstance(t, cst.Attribute) and t.attr.value == "__class__"]
    return out + _uses(index, SUBCLASS_MODULES)


@check("dynamic_code")
def dynamic_code(module: cst.Module, source: str, cuda_sources: list[str]) -> list[str]:
    """Code built at run time (exec, eval, computed imports, decoded payloads) hides what runs."""
    return _uses(_index(module), DYNAMIC_CODE)


POLICIES: dict[str, list[str]] = {
    "strict": ["inherits_model", "torch_compute_in_forward", "try_except_fallback", "threading", "introspection",
               "monkeypatch", "timing_access", "file_io", "ctypes", "network", "nondefault_stream",
               "l2_persistence", "precision_downcast", "cached_result", "lazy_tensor", "dynamic_code"],
    "permissive": ["inherits_model", "try_except_fallback", "threading", "introspection", "monkeypatch",
                   "timing_access", "file_io", "ctypes", "network", "nondefault_stream", "l2_persistence",
                   "precision_downcast", "cached_result", "lazy_tensor", "dynamic_code"],
}


# ---------------------------------------------------------------------------------------------
# Name resolution.


@functools.lru_cache(maxsize=8)
def _index(module: cst.Module) -> _Index:
    return _Index(module)


class _Index:
    """Names, classes and references of one parsed candidate, built once and shared by the checks.

    `resolve(expr)` gives the set of qualified names an expression may denote. Markers: `<file>.X`
    is a class or function defined in the candidate, `X()` an instance of class X, `<extension>` a
    module built by a cpp_extension loader, `<dynamic>` an attribute or import with a computed name.
    """

    def __init__(self, module: cst.Module):
        self.module = module
        sites = _BindingSites()
        module.visit(sites)
        self._nodes, self._strings = sites.nodes, sites.strings
        self.classes, self.functions, self.targets = sites.classes, sites.functions, sites.targets
        self.lambdas = {node: f"<lambda{i}>" for i, node in enumerate(self.of(cst.Lambda))}
        self.functions.update({name: node for node, name in self.lambdas.items()})  # `self.f = lambda t: ...`
        self.params, self.star_modules, self.values = sites.params, sites.star_modules, sites.values
        self.bindings: dict[str, set[str]] = {k: set(v) for k, v in sites.fixed.items()}
        self._memo: dict[cst.CSTNode, frozenset[str]] | None = None  # off while bindings still change
        self._inside: dict[cst.CSTNode, list[cst.CSTNode]] = {}
        for _ in range(4):  # aliases of aliases; capped, since `x = x.y` grows without end
            changed = False
            for key, value in sites.pairs:
                new = self.resolve(value) - self.bindings.get(key, set())
                if new:
                    self.bindings.setdefault(key, set()).update(new)
                    changed = True
            if not changed:
                break
        self._memo = {}
        self.module_state = {n for n, values in sites.module_values.items() if not any(map(self.resolve, values))}
        refs = _RefCollector(self)
        module.visit(refs)
        self.refs: list[tuple[cst.CSTNode, frozenset[str]]] = refs.found + sites.import_refs

    def line(self, node: cst.CSTNode) -> int:
        return self._positions[node].start.line if node in self._positions else 0

    @functools.cached_property
    def _positions(self) -> Mapping[cst.CSTNode, CodeRange]:
        return MetadataWrapper(self.module, unsafe_skip_copy=True).resolve(PositionProvider)  # only when flagging

    def resolve(self, expr: cst.CSTNode) -> frozenset[str]:
        if self._memo is not None and expr in self._memo:
            return self._memo[expr]
        names = frozenset(self._resolve(expr))
        if self._memo is not None:
            self._memo[expr] = names
        return names

    def _resolve(self, expr: cst.CSTNode) -> set[str]:
        if isinstance(expr, cst.Name):
            n = expr.value
            if n == "__builtins__":
                return {"builtins"}
            if n in self.bindings:
                return set(self.bindings[n])
            if n in self.params or n in ("None", "True", "False", "Ellipsis"):
                return set()
            if n in BUILTIN_NAMES:
                return {f"builtins.{n}"}
            return {f"{mod}.{n}" for mod in self.star_modules}
        if isinstance(expr, cst.Attribute):
            key = _dotted(expr)
            if key in self.bindings:
                return set(self.bindings[key])
            return {f"{q}.{expr.attr.value}" for q in self.resolve(expr.value)}
        if isinstance(expr, cst.Call):
            return self._resolve_call(expr)
        if isinstance(expr, cst.Subscript):
            names = set(self.resolve(expr.value))
            sub = expr.slice[0].slice
            key = _literal(sub.value, self.values) if isinstance(sub, cst.Index) else None
            for q in list(names):
                if q == "sys.modules" and key:
                    names.add(key)
                elif q.endswith(".__dict__") and key:
                    names.add(f"{q[:-len('.__dict__')]}.{key}")
            return names
        if isinstance(expr, cst.Lambda):
            return {f"<file>.{self.lambdas[expr]}"}
        if isinstance(expr, cst.IfExp):
            return self.resolve(expr.body) | self.resolve(expr.orelse)
        if isinstance(expr, cst.BooleanOperation):
            return self.resolve(expr.left) | self.resolve(expr.right)
        if isinstance(expr, (cst.List, cst.Tuple, cst.Set)):
            return set().union(*(self.resolve(e.value) for e in expr.elements))
        if isinstance(expr, (cst.ListComp, cst.GeneratorExp, cst.SetComp)):
            return set(self.resolve(expr.elt))
        if isinstance(expr, cst.DictComp):
            return set(self.resolve(expr.value))
        if isinstance(expr, cst.Dict):
            return set().union(*(self.resolve(e.value) for e in expr.elements if isinstance(e, cst.DictElement)))
        return set()

    def _resolve_call(self, call: cst.Call) -> set[str]:
        out = set()
        args = call.args
        for q in self.resolve(call.func):
            last = q.rsplit(".", 1)[-1]
            if q == "builtins.getattr" and len(args) >= 2:
                attr = _literal(args[1].value, self.values) or "<dynamic>"
                out |= {f"{base}.{attr}" for base in self.resolve(args[0].value)}
            elif q in ("builtins.__import__", "importlib.import_module") and args:
                name = _literal(args[0].value, self.values)
                whole = q == "importlib.import_module" or any(a.keyword and a.keyword.value == "fromlist" for a in args)
                out.add("<dynamic>" if not name else name if whole else name.split(".")[0])
            elif q == "functools.partial" and args:
                out |= self.resolve(args[0].value)
            elif q in EXTENSION_LOADERS:
                out.add("<extension>")
            elif q in TORCH_WRAPPERS:  # torch.compile(fn): calling the result runs torch
                out.add(f"{q}()")
            elif q.split(".")[0] in COMPUTE_LIBRARIES and "()" not in q:  # `AutoModel.from_config(...)`
                out.add(f"{q}()")
            elif last[:1].isupper() and "()" not in q:  # a class: the call makes an instance
                out.add(f"{q}()")
                if last in NN_CONTAINERS and q.startswith("torch.nn"):  # its children, for calls through it
                    out |= set().union(*(self.resolve(a.value) for a in args))
        return out

    def calls_to(self, pattern: str) -> list[cst.Call]:
        """Calls whose callee resolves to a name matching the glob `pattern`."""
        return [c for c in self.of(cst.Call) if any(_matches(q, (pattern,)) for q in self.resolve(c.func))]

    def of(self, *types: type) -> list:
        """Every node of these types in the file, in source order."""
        return [n for n in self._nodes if isinstance(n, types)]

    def inside(self, node: cst.CSTNode, *types: type) -> list:
        """`node` and its descendants of these types, in source order (one traversal per node, cached)."""
        if node not in self._inside:
            collector = _Descendants()
            node.visit(collector)
            self._inside[node] = collector.nodes
        return [n for n in self._inside[node] if isinstance(n, types)]

    def method_calls(self, names: set[str]) -> list[cst.Call]:
        return [c for c in self.of(cst.Call) if isinstance(c.func, cst.Attribute) and c.func.attr.value in names]

    def chain(self, name: str) -> list[cst.ClassDef]:
        """Class `name` and its bases defined in the file, nearest first."""
        out, todo = [], [name]
        if name not in self.classes:  # `ModelNew = _Impl`
            todo = [q[len("<file>."):] for q in self.bindings.get(name, ()) if q.startswith("<file>.")]
        while todo:
            cls = self.classes.get(todo.pop(0))
            if cls is None or cls in out:
                continue
            out.append(cls)
            todo += [q[len("<file>."):] for b in cls.bases for q in self.resolve(b.value) if q.startswith("<file>.")]
        return out

    def external_bases(self, name: str) -> set[str]:
        return {q for cls in self.chain(name) for b in cls.bases for q in self.resolve(b.value)
                if not q.startswith("<file>.")}

    @staticmethod
    def method(chain: list[cst.ClassDef], name: str) -> cst.FunctionDef | None:
        for cls in chain:
            for stmt in cls.body.body:
                if isinstance(stmt, cst.FunctionDef) and stmt.name.value == name:
                    return stmt
        return None

    @functools.cached_property
    def forward_closure(self) -> list[tuple[cst.FunctionDef | cst.Lambda, str | None]]:
        """ModelNew.forward and every function of the file it calls, transitively, with the owning class."""
        start = [(self.method(self.chain("ModelNew"), n), "ModelNew") for n in ("forward", "__call__")]
        todo, seen, out = [(fn, owner) for fn, owner in start if fn], set(), []
        while todo:
            fn, owner = todo.pop()
            if fn in seen:
                continue
            seen.add(fn)
            out.append((fn, owner))
            for call in self.inside(fn, cst.Call):
                todo += self._callees(call, owner)
        return out

    def _callees(self, call: cst.Call, owner: str | None) -> list[tuple[cst.FunctionDef, str | None]]:
        out = []
        func = call.func
        if owner and isinstance(func, cst.Attribute):
            chain = self.chain(owner)
            if m.matches(func.value, m.Name("self")):
                out.append((self.method(chain, func.attr.value), owner))
            elif m.matches(func.value, m.Call(func=m.Name("super"))):
                out.append((self.method(chain[1:], func.attr.value), owner))
        for q in self.resolve(func):
            if q.removesuffix(".default") in self.custom_ops:  # a custom op whose body is Python in this file
                out.append((self.custom_ops[q.removesuffix(".default")], None))
            if not q.startswith("<file>."):
                continue
            head, *rest = q[len("<file>."):].split(".")
            name = head.removesuffix("()")
            if name in self.functions and not rest and head == name:
                out.append((self.functions[name], None))
            elif name in self.classes:
                if head.endswith("()"):
                    wanted = rest[:1] or ["forward", "__call__"]
                else:
                    wanted = ["forward"] if rest == ["apply"] else rest[:1] or ["__init__"]
                out += [(self.method(self.chain(name), w), name) for w in wanted]
        return [(fn, o) for fn, o in out if fn is not None]

    @functools.cached_property
    def ref_map(self) -> dict[cst.CSTNode, frozenset[str]]:
        return dict(self.refs)

    @functools.cached_property
    def custom_ops(self) -> dict[str, cst.FunctionDef]:
        """`torch.ops.ns.name` -> the file's Python function registered for it (torch.library decorators)."""
        out = {}
        for fn in self.of(cst.FunctionDef):
            for dec in fn.decorators:
                call = dec.decorator
                if isinstance(call, cst.Call) and call.args and any(
                        _matches(q, ("torch.library.custom_op", "torch.library.impl", "torch.library.register_kernel"))
                        for q in self.resolve(call.func)):
                    name = _literal(call.args[0].value, self.values) or ""
                    out[f"torch.ops.{name.replace('::', '.')}"] = fn
        return out

    @functools.cached_property
    def library_writes(self) -> list[tuple[cst.CSTNode, str, cst.BaseExpression | None]]:
        """(node, qualified name, value) for every assignment or setattr on a module or library class."""
        out = []
        values = {}
        for assign in self.of(cst.Assign, cst.AugAssign, cst.AnnAssign):
            for t in [t.target for t in assign.targets] if isinstance(assign, cst.Assign) else [assign.target]:
                values[t] = assign.value
        for t in self.targets:
            if isinstance(t, (cst.Attribute, cst.Subscript)):
                for q in self.resolve(t.value):
                    if _is_library({q}) and q not in GLOBAL_WRITES_OK:
                        attr = f".{t.attr.value}" if isinstance(t, cst.Attribute) else "[...]"
                        out.append((t, f"{q}{attr}", values.get(t)))
        for call in self.calls_to("builtins.setattr") + self.calls_to("builtins.delattr"):
            if call.args:
                attr = _literal(call.args[1].value, self.values) if len(call.args) > 1 else None
                value = call.args[2].value if len(call.args) > 2 else None
                target = call.args[0].value
                names = self.resolve(target) or ({"<unknown>"} if not m.matches(target, m.Name("self")) else set())
                out += [(call, f"{q}.{attr or '<dynamic>'}", value) for q in names
                        if _is_library({q}) or (attr is None and q == "<unknown>")]  # a computed name: hiding
        return out

    @functools.cached_property
    def cuda_sources(self) -> list[str]:
        texts = []
        for call in self.of(cst.Call):
            if self.resolve(call.func) & EXTENSION_LOADERS:
                for arg in call.args:
                    texts += self._strings_in(arg.value, set())
        texts += [s for s in map(_join_str, self._strings) if s and C_LIKE.search(s)]
        return list(dict.fromkeys(t for t in texts if t.strip()))

    @functools.cached_property
    def extension_functions(self) -> set[str]:
        """Names the compiled extensions export (functions=[...] and m.def("name", ...))."""
        names = {s for s in self.cuda_sources if s.isidentifier()}
        for src in self.cuda_sources:
            names |= set(re.findall(r"\.def\(\s*\"(\w+)\"", src))
        return names

    def _strings_in(self, expr: cst.CSTNode, seen: set[int]) -> list[str]:
        """The string values in an expression, following names to what was assigned to them."""
        if isinstance(expr, cst.Name):
            out = []
            for value in self.values.get(expr.value, []):
                if id(value) not in seen:
                    seen.add(id(value))
                    out += self._strings_in(value, seen)
            return out
        text = _join_str(expr, self.values)
        if text is not None:
            return [text]
        return [s for child in expr.children for s in self._strings_in(child, seen)]


class _BindingSites(cst.CSTVisitor):
    """Collects where names are bound (imports, defs, assignments as key -> value pairs), and every node."""

    STRINGS = (cst.SimpleString, cst.ConcatenatedString, cst.FormattedString)

    def __init__(self):
        self.nodes: list[cst.CSTNode] = []  # in source order
        self.strings: list[cst.BaseExpression] = []  # outermost string literals (concatenations whole)
        self._in_string = 0
        self.fixed: dict[str, set[str]] = {}
        self.pairs: list[tuple[str, cst.BaseExpression]] = []
        self.values: dict[str, list[cst.BaseExpression]] = {}
        self.module_values: dict[str, list[cst.BaseExpression]] = {}
        self.classes: dict[str, cst.ClassDef] = {}
        self.functions: dict[str, cst.FunctionDef] = {}
        self.targets: list[cst.BaseExpression] = []
        self.params: set[str] = set()
        self.star_modules: list[str] = []
        self.import_refs: list[tuple[cst.CSTNode, frozenset[str]]] = []
        self.depth = 0

    def on_visit(self, node: cst.CSTNode) -> bool:
        self.nodes.append(node)
        if isinstance(node, self.STRINGS):
            if not self._in_string:
                self.strings.append(node)
            self._in_string += 1
        return super().on_visit(node)

    def on_leave(self, original_node: cst.CSTNode) -> None:
        if isinstance(original_node, self.STRINGS):
            self._in_string -= 1
        super().on_leave(original_node)

    def _fix(self, name: str, qualname: str) -> None:
        self.fixed.setdefault(name, set()).add(qualname)

    def visit_Import(self, node: cst.Import) -> None:
        for alias in node.names:
            dotted = _dotted(alias.name)
            if alias.asname:
                self._fix(alias.asname.name.value, dotted)
            else:
                self._fix(dotted.split(".")[0], dotted.split(".")[0])
            self.import_refs.append((node, frozenset({dotted})))

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        mod = "." * len(node.relative) + (_dotted(node.module) or "")
        if isinstance(node.names, cst.ImportStar):
            self.star_modules.append(mod)
            self.import_refs.append((node, frozenset({mod})))
            return
        for alias in node.names:
            qualname = f"{mod}{'' if mod.endswith('.') else '.'}{alias.name.value}"
            self._fix(alias.asname.name.value if alias.asname else alias.name.value, qualname)
            self.import_refs.append((node, frozenset({qualname})))

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        if self.depth == 0:
            self.functions[node.name.value] = node
        self._fix(node.name.value, f"<file>.{node.name.value}")
        p = node.params
        for param in [*p.posonly_params, *p.params, *p.kwonly_params, p.star_arg, p.star_kwarg]:
            if isinstance(param, cst.Param):
                self.params.add(param.name.value)
        self.depth += 1

    def leave_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.depth -= 1

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self.classes[node.name.value] = node
        self._fix(node.name.value, f"<file>.{node.name.value}")
        self.depth += 1

    def leave_ClassDef(self, node: cst.ClassDef) -> None:
        self.depth -= 1

    def visit_Assign(self, node: cst.Assign) -> None:
        for t in node.targets:
            self._bind(t.target, node.value)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        self._bind(node.target, node.value)

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        self.targets.append(node.target)
        if isinstance(node.target, cst.Name):  # `src += "..."`: one more piece of that string
            self.values.setdefault(node.target.value, []).append(node.value)

    def visit_Del(self, node: cst.Del) -> None:
        self._bind(node.target, None)

    def visit_NamedExpr(self, node: cst.NamedExpr) -> None:
        self._bind(node.target, node.value)

    def visit_For(self, node: cst.For) -> None:
        self._bind(node.target, node.iter)  # an element resolves like its container

    def visit_CompFor(self, node: cst.CompFor) -> None:
        self._bind(node.target, node.iter)

    def visit_WithItem(self, node: cst.WithItem) -> None:
        if node.asname:
            self._bind(node.asname.name, node.item)

    def visit_Call(self, node: cst.Call) -> None:
        key = _dotted(node.func.value) if isinstance(node.func, cst.Attribute) else None
        if key and node.func.attr.value in ("append", "extend", "insert") and node.args:
            self.pairs.append((key, node.args[-1].value))  # `layers.append(nn.Linear(...))`: an element

    def _bind(self, target: cst.BaseExpression, value: cst.BaseExpression | None) -> None:
        if isinstance(target, (cst.Tuple, cst.List)):
            same_shape = isinstance(value, (cst.Tuple, cst.List)) and len(value.elements) == len(target.elements)
            for i, el in enumerate(target.elements):
                self._bind(el.value, value.elements[i].value if same_shape else None)
            return
        self.targets.append(target)
        key = _dotted(target)
        if key is None or value is None:
            return
        self.pairs.append((key, value))
        self.values.setdefault(key, []).append(value)
        if self.depth == 0 and "." not in key:
            self.module_values.setdefault(key, []).append(value)


class _Descendants(cst.CSTVisitor):
    def __init__(self):
        self.nodes: list[cst.CSTNode] = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        self.nodes.append(node)
        return True


class _RefCollector(cst.CSTVisitor):
    """Every maximal name / attribute chain (and getattr-like call) in the file, with its resolution."""

    def __init__(self, index: _Index):
        self.index = index
        self.found: list[tuple[cst.CSTNode, frozenset[str]]] = []

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        self.found.append((node, self.index.resolve(node)))
        base = node.value
        while isinstance(base, cst.Attribute):
            base = base.value
        if not isinstance(base, cst.Name):
            base.visit(self)
        return False  # the chain is recorded whole; `.attr` names are not references

    def visit_Name(self, node: cst.Name) -> None:
        self.found.append((node, self.index.resolve(node)))

    def visit_Call(self, node: cst.Call) -> None:
        names = self.index.resolve(node)
        if names:
            self.found.append((node, names))

    def visit_Arg(self, node: cst.Arg) -> bool:
        node.value.visit(self)  # the keyword in `f(name=...)` is not a reference
        return False

    def visit_Import(self, node: cst.Import) -> bool:
        return False

    def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
        return False


# ---------------------------------------------------------------------------------------------
# Helpers.


def _torch_call(index: _Index, call: cst.Call, owner: str | None) -> str | None:
    """Why this call in forward is torch compute, or None."""
    for q in sorted(index.resolve(call.func)):
        if _is_torch_function(q) or _nn_call(q) or q.split(".")[0] in COMPUTE_LIBRARIES or q[:-2] in TORCH_WRAPPERS:
            return q
    func = call.func
    if owner and m.matches(func, m.Attribute(value=m.Call(func=m.Name("super")))):
        bases = [q for q in index.external_bases(owner) if _nn_class(q)]
        return f"super().{func.attr.value} of {bases[0]}" if bases else None
    if isinstance(func, cst.Attribute):
        receiver, name = func.value, func.attr.value
    elif m.matches(func, m.Call(func=m.Name("getattr"))) and len(func.args) >= 2 and _literal(func.args[1].value):
        receiver, name = func.args[0].value, _literal(func.args[1].value, index.values)
    else:
        return None
    if m.matches(receiver, m.Name("self")) or name in index.extension_functions:
        return None
    if not all("()" in q and "<file>" not in q for q in index.resolve(receiver)):
        return None  # a module, an extension, or the candidate's own object
    if _normalize(name) in TENSOR_COMPUTE:
        return f".{name}()"
    if name == "to" and _casts(index, call):
        return ".to(dtype)"
    return None


def _tensor_arithmetic(index: _Index, forward: cst.FunctionDef) -> list[cst.CSTNode]:
    """Python arithmetic in forward on its tensor arguments or on nn.Parameters (`x * s`, `out + self.bias`).

    Only operands known to be tensors count: forward's own parameters (KernelBench passes tensors) and
    attributes holding a Parameter; `(n + 255) // 256` on a local size stays allowed.
    """
    params = {p.name.value for p in index.inside(forward.params, cst.Param)} - {"self"}

    def tensor(expr: cst.BaseExpression) -> bool:
        if isinstance(expr, cst.Name) and expr.value in params:
            return True
        return any(q.startswith("torch.") and q.endswith("()") and "Parameter" in q for q in index.resolve(expr))

    out = []
    for node in index.inside(forward, cst.BinaryOperation, cst.AugAssign, cst.UnaryOperation):
        op = node.operator
        operands = [node.expression] if isinstance(node, cst.UnaryOperation) else \
            [node.target, node.value] if isinstance(node, cst.AugAssign) else [node.left, node.right]
        if isinstance(op, ARITHMETIC) and any(map(tensor, operands)):
            out.append(node)
    return out


def _is_torch_function(q: str) -> bool:
    """torch.X / torch.nn.functional.X / torch.ops.aten.X / torch.Tensor.X, other than allowed ones."""
    if "()" in q or "<" in q:
        return False
    parts = q.split(".")
    if parts[0] == "operator":
        return _normalize(parts[-1]) in TENSOR_COMPUTE
    if parts[0] != "torch" or len(parts) < 2:
        return False
    if q.startswith("torch.ops.aten.") and len(parts) > 3:
        return parts[3] not in ALLOWED
    if any(q.startswith(ns + ".") for ns in TORCH_COMPUTE_NAMESPACES):
        return parts[-1] not in ALLOWED
    if len(parts) == 3 and parts[1] == "Tensor":
        return parts[2] not in ALLOWED and _normalize(parts[2]) not in ALLOWED
    return len(parts) == 2 and parts[1] not in ALLOWED and not parts[1][:1].isupper()


def _names_torch_op(q: str) -> bool:
    """A torch compute function named as a value (not a dtype, constant or submodule)."""
    last = q.rsplit(".", 1)[-1]
    return _is_torch_function(q) and last not in TORCH_NON_CALLABLES and not last.startswith("_")


def _nn_class(q: str) -> str | None:
    """The torch.nn module class (not a container or Parameter) that `q` names or is an instance of."""
    plain = q.replace("()", "")
    if not plain.startswith("torch.nn."):
        return None
    for part in plain.split(".")[2:]:
        if part[:1].isupper():
            return None if part in NN_NOT_COMPUTE else part
    return None


def _nn_call(q: str) -> bool:
    """Calling an nn module instance (`self.conv(x)`, `.forward(x)`) or nn.X.forward(self, x)."""
    cls = _nn_class(q)
    if not cls:
        return False
    tail = q.split(cls, 1)[1]
    return tail in ("()", "().forward", "().__call__", ".forward", ".__call__", "()._conv_forward")


def _casts(index: _Index, call: cst.Call) -> bool:
    """`.to(...)` given a dtype (positional torch.X or dtype=...): a conversion kernel."""
    for arg in call.args:
        if arg.keyword and arg.keyword.value == "dtype" and not m.matches(arg.value, m.Attribute(attr=m.Name("dtype"))):
            return True  # `dtype=x.dtype` keeps the dtype
        if any(q.startswith("torch.") and q.split(".")[-1] in TORCH_DTYPES for q in index.resolve(arg.value)):
            return True
    return False


def _normalize(name: str) -> str:
    """Tensor method name without in-place `_` or dunder: `relu_` -> relu, `__rmatmul__` -> matmul."""
    if name.startswith("__") and name.endswith("__"):
        name = name[2:-2]
        if name[:1] in "ri" and name[1:] in TENSOR_COMPUTE:
            name = name[1:]
        return name
    return name[:-1] if name.endswith("_") and not name.startswith("_") else name


def _uses(index: _Index, patterns: tuple[str, ...], exclude: tuple[str, ...] = ()) -> list[str]:
    """'line N: qualname' for every reference (or import) matching `patterns` and not `exclude`."""
    out = []
    for node, names in index.refs:
        for q in names:
            plain = q.replace("()", "")
            if _matches(plain, patterns) and not _matches(plain, exclude):
                out.append(f"line {index.line(node)}: {plain}")
                break
    return out


def _matches(q: str, patterns: tuple[str, ...]) -> bool:
    return bool(patterns) and _pattern_regex(patterns).match(q) is not None


@functools.lru_cache(maxsize=None)
def _pattern_regex(patterns: tuple[str, ...]) -> re.Pattern:
    """A pattern matches the name itself and anything under it."""
    return re.compile("|".join(f"(?:{fnmatch.translate(p)})|(?:{fnmatch.translate(p + '.*')})" for p in patterns))


def _cuda(sources: list[str], patterns: tuple[str, ...]) -> list[str]:
    regex = _cuda_regex(patterns)
    return [f"CUDA: {hit.group(0)}" for src in sources for hit in regex.finditer(_strip_comments(src))]


@functools.lru_cache(maxsize=None)
def _cuda_regex(patterns: tuple[str, ...]) -> re.Pattern:
    return re.compile("|".join(f"(?:{p})" for p in patterns))


@functools.lru_cache(maxsize=256)
def _strip_comments(src: str) -> str:
    return COMMENTS.sub(" ", src)


def _split_top_level(text: str) -> list[str]:
    """Split launch arguments on commas outside parentheses and brackets."""
    parts, depth, current = [], 0, ""
    for ch in text:
        depth += ch in "([{"
        depth -= ch in ")]}"
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    return parts + [current]


def _is_current_stream(expr: str, src: str) -> bool:
    """0, nullptr, getCurrentCUDAStream(), or a variable only ever initialised from it (or a parameter)."""
    if expr in ("0", "0u", "nullptr", "NULL", "cudaStreamLegacy") or re.search(r"get(Current|Default)CUDAStream", expr):
        return True
    name = re.fullmatch(r"(\w+)(?:\.stream\(\))?", expr)
    if not name:
        return False
    inits = re.findall(rf"\b{name.group(1)}\s*(?:=(?!=)|\()\s*([^;]*)", src)
    return all(re.search(r"get(Current|Default)CUDAStream", init) for init in inits)


def _is_library(names: frozenset[str] | set[str]) -> bool:
    """A module or library class, maybe imported by a computed name (not a value, the candidate's own class,
    or an extension)."""
    return any(q and "()" not in q and not q.startswith(("<file>", "<extension>", "<unknown>")) for q in names)


def _precise_setting(value: cst.BaseExpression | None) -> bool:
    return m.matches(value, m.Name("False")) or (value is not None and _literal(value) in ("ieee", "highest"))


def _memoised_state(index: _Index) -> set[str]:
    """State (self.x, Class.x, module globals) that forward returns from behind a test on that state.

    Two shapes: an early return (`if self.cache is not None: return self.cache`, `if k in _SEEN:
    return _SEEN[k]`), and compute-once (`if self.out is None: self.out = kernel(x)` then `return
    self.out`). A buffer allocated once but refilled by a kernel call on every call is not a cache,
    nor is state that only holds modules or extensions (a lazily built kernel).
    """
    fns = [fn for fn, _ in index.forward_closure]
    local = _local_names(index, fns)
    writes = [w for fn in fns for w in _state_writes(index, fn, local)]
    modules = {k for k, _, _ in writes} - {k for k, value, _ in writes if value is None or not index.resolve(value)}
    written = {k for k, _, _ in writes} - modules
    if not written:
        return set()
    aliases: dict[str, set[str]] = {}  # local = <expression reading state>
    for fn in fns:
        for assign in index.inside(fn, cst.Assign):
            if len(assign.targets) == 1 and isinstance(assign.targets[0].target, cst.Name):
                key = assign.targets[0].target.value
                aliases.setdefault(key, set()).update(_state_reads(index, assign.value, local))

    def reads(expr: cst.CSTNode) -> set[str]:
        names = {n.value for n in index.inside(expr, cst.Name)}
        return (_state_reads(index, expr, local).union(*(aliases.get(n, set()) for n in names))) & written

    guarded = [n for fn in fns for n in index.inside(fn, cst.If, cst.IfExp) if reads(n.test)]
    early = {k for g in guarded for r in index.inside(g, cst.Return) if r.value is not None for k in reads(r.value)}
    early |= {k for g in guarded if isinstance(g, cst.IfExp) for k in reads(g.body) | reads(g.orelse)}
    inside = {n for g in guarded for n in index.inside(g, cst.Assign, cst.AugAssign, cst.AnnAssign, cst.Call)}
    returned = {k for fn in fns for r in index.inside(fn, cst.Return) if r.value is not None for k in reads(r.value)}
    refilled = {k for fn in fns for c in index.inside(fn, cst.Call) if c not in inside for a in c.args
                for k in reads(a.value)}
    once = {k for k in returned - refilled if all(node in inside for key, _, node in writes if key == k)}
    return early | once


def _local_names(index: _Index, fns: list[cst.FunctionDef]) -> set[str]:
    """Names assigned (or parameters) inside `fns` and not declared global."""
    names = {p.name.value for fn in fns for p in index.inside(fn.params, cst.Param)}
    names |= {t.target.value for fn in fns for t in index.inside(fn, cst.AssignTarget)
              if isinstance(t.target, cst.Name)}
    declared = {n.name.value for fn in fns for g in index.inside(fn, cst.Global) for n in g.names}
    return names - declared


def _state_key(index: _Index, expr: cst.CSTNode, local: set[str]) -> str | None:
    """`self.x` / `ModelNew.x` / a module-level name, for an expression rooted in one."""
    attrs = []
    while isinstance(expr, (cst.Attribute, cst.Subscript)):
        if isinstance(expr, cst.Attribute):
            attrs.append(expr.attr.value)
        expr = expr.value
    if not isinstance(expr, cst.Name):
        return None
    if attrs and (expr.value == "self" or expr.value in index.classes):
        return f"{expr.value}.{attrs[-1]}"
    return expr.value if expr.value in index.module_state and expr.value not in local else None


def _state_reads(index: _Index, node: cst.CSTNode, local: set[str]) -> set[str]:
    found = index.inside(node, cst.Attribute, cst.Subscript, cst.Name)
    return {k for k in (_state_key(index, n, local) for n in found) if k}


def _state_writes(index: _Index, fn: cst.FunctionDef, local: set[str]
                  ) -> list[tuple[str, cst.CSTNode | None, cst.CSTNode]]:
    """(state key, assigned value or None for a mutation, the writing node) for each state write in `fn`."""
    out = []
    for node in index.inside(fn, cst.Assign, cst.AugAssign, cst.AnnAssign):
        targets = [t.target for t in node.targets] if isinstance(node, cst.Assign) else [node.target]
        for t in targets:
            key = _state_key(index, t, local)
            if key:
                whole = isinstance(node, cst.Assign) and not isinstance(t, cst.Subscript)
                out.append((key, node.value if whole else None, node))
    for call in index.inside(fn, cst.Call):
        key = _state_key(index, call.func.value, local) if isinstance(call.func, cst.Attribute) else None
        if key and call.func.attr.value in MUTATORS:
            out.append((key, None, call))
    for call in index.inside(fn, cst.Call):  # setattr(self, "name", value)
        if m.matches(call, m.Call(func=m.Name("setattr"), args=[m.Arg(m.Name("self")), m.Arg(), m.ZeroOrMore()])) \
                and _literal(call.args[1].value):
            out.append((f"self.{_literal(call.args[1].value)}", None, call))
    return out


def _dotted(node: cst.CSTNode | None) -> str | None:
    """'a.b.c' for a Name or an Attribute chain of Names, else None."""
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        base = _dotted(node.value)
        return f"{base}.{node.attr.value}" if base else None
    return None


def _literal(node: cst.CSTNode, values: dict[str, list] | None = None, depth: int = 0) -> str | None:
    """A string known before running: literals, `+` of literals, a name assigned one literal once, else None.

    Folding `"ma" + "tmul"` lets the checks see the real name instead of stopping at "computed".
    """
    if depth > 8:
        return None
    if isinstance(node, (cst.SimpleString, cst.ConcatenatedString)):
        value = node.evaluated_value
        return value if isinstance(value, str) else None
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Add):
        left, right = _literal(node.left, values, depth + 1), _literal(node.right, values, depth + 1)
        return None if left is None or right is None else left + right
    if isinstance(node, cst.Name) and values and len(values.get(node.value, [])) == 1:
        return _literal(values[node.value][0], values, depth + 1)
    return None


def _join_str(node: cst.CSTNode, values: dict[str, list] | None = None, depth: int = 0) -> str | None:
    """A string expression's text: literals, implicit and `+` concatenation (following names), f-string text."""
    if depth > 8:
        return None
    if isinstance(node, cst.SimpleString):
        value = node.evaluated_value
        return value.decode("latin-1") if isinstance(value, bytes) else value
    if isinstance(node, cst.FormattedString):
        return "".join(p.value if isinstance(p, cst.FormattedStringText) else " " for p in node.parts)
    if isinstance(node, cst.ConcatenatedString):
        return (_join_str(node.left) or "") + (_join_str(node.right) or "")
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Add):
        left, right = _join_str(node.left, values, depth + 1), _join_str(node.right, values, depth + 1)
        return None if left is None or right is None else left + right
    if isinstance(node, cst.Name) and values and values.get(node.value):
        return _join_str(values[node.value][0], values, depth + 1)  # the first assignment; `+=` pieces aside
    return None


def _code(node: cst.CSTNode) -> str:
    return cst.Module([]).code_for_node(node)

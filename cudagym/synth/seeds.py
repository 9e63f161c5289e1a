"""What a seed operator is: its symbolic dims, input domains and templates (`Seed`, `InputSpec`,
`Skip`). Data only, below every other synth module: `crawl` finds and verifies seeds, `render`
writes their KernelBench tasks (`render.seed_task`, `render.seed_snippet`), `compose` chains them.

Shapes are written with symbolic dims (`DIMS`: "B" batch, "C" channels, ...), so that a task can be
scaled (`render.seed_task(seed, scale=...)`) and the composer can re-bind a seed to the shape it is fed.
Shape patterns (`Seed.accepts`) may hold "_" (any size) and one "..." (any number of dims).
"""

from __future__ import annotations

from dataclasses import dataclass

KINDS = ("nn_module", "functional", "tensor_op", "transformers_block")

# Symbolic dims: symbol -> (identifier in rendered tasks, size at scale 1). Scaling multiplies
# every symbolic dim; literal ints (kernel sizes, heads, ...) stay as written.
DIMS: dict[str, tuple[str, int]] = {
    "B": ("batch_size", 4),
    "C": ("in_channels", 8),
    "O": ("out_channels", 16),
    "D": ("depth", 6),
    "H": ("height", 24),
    "W": ("width", 24),
    "L": ("length", 100),
    "S": ("seq_len", 12),
    "E": ("embed_dim", 32),
    "I": ("in_features", 64),
    "J": ("out_features", 128),
    "M": ("dim_m", 48),
    "K": ("dim_k", 40),
    "N": ("dim_n", 56),
    "V": ("num_embeddings", 1000),
    "Q": ("num_classes", 10),
}

# Input value domains -> the expression get_inputs() uses (SHAPE: the dims, TUPLE: them as a tuple,
# HIGH: index bound).
DOMAINS: dict[str, str] = {
    "randn": "torch.randn(SHAPE)",
    "positive": "torch.rand(SHAPE) + 0.1",
    "probability": "torch.rand(SHAPE).clamp(0.01, 0.99)",
    "unit": "torch.rand(SHAPE) * 1.8 - 0.9",
    "gt1": "torch.rand(SHAPE) + 1.5",
    "binary": "torch.randint(0, 2, TUPLE).float()",
    "sign": "torch.randint(0, 2, TUPLE).float() * 2 - 1",
    "logprob": "torch.randn(SHAPE).log_softmax(dim=-1)",
    "sorted": "torch.randn(SHAPE).sort(dim=-1).values",
    "spd": "(lambda a: a @ a.mT + a.shape[-1] * torch.eye(a.shape[-1]))(torch.randn(SHAPE))",
    "index": "torch.randint(0, HIGH, TUPLE)",
    "perm": "torch.randperm(HIGH)[:SHAPE]",
    "bool": "torch.rand(SHAPE) > 0.5",
}
DOMAIN_DTYPES = {"index": "int64", "perm": "int64", "bool": "bool"}
# Which output domains a primary-input domain accepts ("randn" accepts any float).
DOMAIN_ACCEPTS: dict[str, frozenset[str]] = {
    "positive": frozenset({"positive", "probability"}),
    "probability": frozenset({"probability"}),
    "unit": frozenset({"unit", "probability"}),
    "gt1": frozenset(),
    "logprob": frozenset({"logprob"}),
}

LIKE_X = ("@x",)  # an input shaped like the primary input x
ANY = ("...",)  # any rank
R2 = ("_", "_", "...")  # rank >= 2 (ops along dim 1)
P2 = ("B", "I")
P3 = ("B", "C", "L")
P4 = ("B", "C", "H", "W")
P5 = ("B", "C", "D", "H", "W")
SEQ = ("B", "S", "E")


@dataclass(frozen=True)
class InputSpec:
    """One tensor a seed consumes: a get_inputs() tensor or (param=True) an nn.Parameter."""

    name: str  # placeholder in the seed's templates ("x" is the primary input)
    shape: tuple  # dim symbols, ints, small expressions ("4*C"), or LIKE_X
    domain: str = "randn"
    high: str | int | None = None  # upper bound for index/perm domains (a dim symbol or int)
    param: bool = False

    @property
    def dtype(self) -> str:
        return DOMAIN_DTYPES.get(self.domain, "float32")


@dataclass(frozen=True)
class Seed:
    """A verified seed operator, with the templates that build it.

    Templates are Python expressions over placeholders: `x` and the other input names, dim
    symbols (`C`, `O`, ...), `self.op` (and other `self.<name>`) for module slots, `cfg` for the
    config expression. `render.render_steps` substitutes them with libcst.
    """

    qualified_name: str
    kind: str
    call: str  # forward expression
    inputs: tuple[InputSpec, ...]  # inputs[0] is the primary input x
    accepts: tuple = ()  # shape pattern for x when composing; () -> inputs[0].shape
    modules: tuple[tuple[str, str], ...] = ()  # (slot, constructor template)
    config: str = ""  # transformers config expression, bound to `cfg` in __init__
    imports: tuple[str, ...] = ()
    out_domain: str = "real"
    family: str = ""
    name: str = ""  # display name for task names ("Conv2d", "BiasAdd", "LogSoftmax")
    variant: str = ""
    # Facts recorded by verification (at scale 1):
    ops: tuple[str, ...] = ()  # labels ops_from_code derives from the seed's task
    output_shape: tuple[int, ...] = ()
    output_dtype: str = "float32"
    meta_ok: bool = True  # shape inference on meta tensors works (else the composer runs it on CPU)

    @property
    def id(self) -> str:
        return f"{self.qualified_name}#{self.variant}" if self.variant else self.qualified_name

    @property
    def primary(self) -> InputSpec:
        return self.inputs[0]

    @property
    def pattern(self) -> tuple:
        return self.accepts or self.primary.shape

    @property
    def input_specs(self) -> tuple[InputSpec, ...]:
        """The tensors get_inputs() makes for this seed (params excluded)."""
        return tuple(spec for spec in self.inputs if not spec.param)

    @property
    def arity(self) -> int:
        return len(self.input_specs)

    @property
    def input_ranks(self) -> tuple[int, ...]:
        return tuple(len(self.primary.shape if s.shape == LIKE_X else s.shape) for s in self.input_specs)

    @property
    def output_rank(self) -> int:
        return len(self.output_shape)


@dataclass(frozen=True)
class Skip:
    """A crawled name that did not become a seed."""

    qualified_name: str
    reason: str  # stable code: stochastic, inplace, data_dependent_shape, no_rule, failed_cpu, ...
    detail: str = ""
    source: str = "torch"

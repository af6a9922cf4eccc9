"""The spec model: frozen dataclasses that every later stage reads, never the raw TOML."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from specgen.expr import Expr

# a spec's dtypes: the floating ones (every family's kernels compute float64 in float64; the
# default; the quantized linears' specs list 16- and 32-bit ones only),
# and the integer ones and bool, which only the pointwise and reduce families take (an integer
# result's own type; docs/op-contract.md, "Dtypes")
DTYPES = ("float16", "bfloat16", "float32", "float64")
DEFAULT_DTYPES = DTYPES
INTEGER_DTYPES = ("bool", "uint8", "int8", "int16", "int32", "int64")
INTEGER_FAMILIES = ("pointwise", "reduce")
INDEXING = ("auto", "int32", "int64")
# what torch.autocast does to an op's inputs (specgen/runtime/autocast.py): nothing, as for
# add or amax; the autocast dtype, as for torch's matmuls; float32, as for its norms and losses
AUTOCAST = ("none", "lower", "float32")


@dataclass(frozen=True)
class TensorArg:
    name: str
    optional: bool = False
    low: float = -3.0               # the value range property tests draw from
    high: float = 3.0
    dims: tuple[str, ...] = ()      # named dims, for families whose operands have fixed ranks
    # the dtypes this tensor takes where they are not the op's (a quantized weight's uint8, its
    # float32 scales); empty: the op's dtypes, and the family's rule for mixing them
    dtypes: tuple[str, ...] = ()

    kind = "tensor"


@dataclass(frozen=True)
class ScalarArg:
    name: str
    type: str                       # float | int | bool | shape (a list of ints) | dtype
    default: Union[float, int, bool, tuple[int, ...], None] = None
    optional: bool = False          # may be None (the default); the family says what None means
    range: tuple[float, float] | None = None   # float and int: where tests draw values

    @property
    def kind(self) -> str:
        return self.type


@dataclass(frozen=True)
class ChoiceArg:
    """A string picked from fixed values; kernels see it as a constexpr, so branches compile away."""

    name: str
    values: tuple[str, ...]
    default: Union[str, None] = None

    kind = "choice"

    @property
    def constexpr(self) -> str:
        return self.name.upper()


Arg = Union[TensorArg, ScalarArg, ChoiceArg]


@dataclass(frozen=True)
class Output:
    name: str
    expr: Expr


@dataclass(frozen=True)
class Source:
    """Where a spec came from: its path relative to the project root, and a hash of its text."""

    path: str
    sha256: str
    text: str


@dataclass(frozen=True)
class OpSpec:
    name: str
    family: str
    doc: str
    reference: str
    args: tuple[Arg, ...]
    dtypes: tuple[str, ...]
    indexing: str
    source: Source
    body: object                    # the family's own frozen dataclass
    autocast: str = "none"          # one of AUTOCAST
    # a torch operator (aten::rms_norm) whose autocast the policy follows: the op takes it only
    # where the running torch autocasts that operator ("" for always)
    autocast_follows: str = ""
    # the ops this spec derives (a row-wise backward), made at the spec stage (Family.derive)
    derived: tuple[OpSpec, ...] = ()

    @property
    def tensors(self) -> tuple[TensorArg, ...]:
        return tuple(a for a in self.args if isinstance(a, TensorArg))

    @property
    def choices(self) -> tuple[ChoiceArg, ...]:
        return tuple(a for a in self.args if isinstance(a, ChoiceArg))

"""Plan pieces every family shares: names, signatures and metadata of the generated module."""

from __future__ import annotations

import ast
import keyword
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Sequence

from specgen import kernel_lib, reduce_lib
from specgen.errors import Where
from specgen.families.contract import PUBLIC_FUNCTION_NAMES
from specgen.model import INTEGER_DTYPES
from specgen.expr import FUNCTIONS, Symbol
from specgen.model import ChoiceArg, OpSpec, TensorArg
from specgen.table import Table, parse_list

if TYPE_CHECKING:
    from specgen.families.contract import Family

NAME_RE = re.compile(r"^[a-z][a-z0-9_]*$")

# what every generated module imports: a function argument of the same name would shadow it
IMPORTS = frozenset({"tl", "triton", "torch", "rt", "math", "F", "ref", "reference", "triton_op",
                     "generated", "specgen"})
# the jit helpers of kernel_lib and reduce_lib, which modules import by name (a family's own
# imports, such as reduce's `reduction` module, are in its GENERATED_NAMES)
LIBRARY_HELPERS = frozenset(
    node.name for library in (kernel_lib, reduce_lib)
    for node in ast.parse(Path(library.__file__).read_text(encoding="utf-8")).body
    if isinstance(node, ast.FunctionDef))
# names generated code uses for itself; an argument or output with one of them would shadow it
RESERVED = IMPORTS | LIBRARY_HELPERS | frozenset({
    "pid", "tile", "num_tiles", "tiles_m", "tiles_n", "tile_m", "tile_n", "rest", "rows", "cols",
    "mask", "offsets", "numel", "size_m", "size_n", "shape", "space", "grid", "cap", "tensors",
    "device", "result_dtype", "scalars", "constexprs", "strides", "outer", "index_64",
    "meta",
}) | frozenset(FUNCTIONS)
# module-level names of every generated module (its imports, the kernel_lib helpers it may import),
# which the op's own function must not shadow (a family's own, such as its runtime module's import
# and the reduce family's reduce_lib helpers, are its generated_names or checks: parse.py checks an
# op's name against its family's)
OP_RESERVED = IMPORTS | frozenset(
    node.name for node in ast.parse(Path(kernel_lib.__file__).read_text(encoding="utf-8")).body
    if isinstance(node, ast.FunctionDef))


def symbols_of(spec_args: Iterable, host: Iterable[str] = ()) -> dict[str, Symbol]:
    """The names an expression may read among the arguments: tensors, float/int/bool scalars,
    choices; shape arguments and those named in ``host`` (a row-wise dim, keepdim, dtype),
    which shape the launch on the host, as "host" (an expression reading one is an error that
    says so)."""
    host = set(host)
    symbols = {}
    for arg in spec_args:
        if arg.kind == "shape" or arg.name in host:
            symbols[arg.name] = Symbol(arg.name, "host")
        elif arg.kind in ("tensor", "choice", "bool"):
            symbols[arg.name] = Symbol(arg.name, arg.kind, getattr(arg, "values", ()))
        else:
            symbols[arg.name] = Symbol(arg.name, "scalar")
    return symbols


def scalar_args(spec_args: Iterable) -> list:
    """The float, int, bool and choice arguments: values an expression reads (not a dtype or a
    shape, which shape the launch on the host)."""
    return [a for a in spec_args if a.kind in ("float", "int", "bool", "choice")]


def unread(args: Iterable, exprs: Iterable, readers: str,
           also: Iterable[str] = ()) -> tuple[tuple[str, str], ...]:
    """Those of ``args`` none of ``exprs`` (None: an absent one) reads, nor ``also`` names, each
    with ``readers``, for a family's ``unread_args``."""
    read = set(also).union(*(e.names for e in exprs if e is not None))
    return tuple((arg.name, readers) for arg in args if arg.name not in read)


def check_name(name: str, where: Where, what: str) -> None:
    """Op, argument and output names become Python identifiers in the generated module."""
    if not NAME_RE.fullmatch(name):  # fullmatch: `$` would let a final newline through
        raise where.error(f"{what} name '{name}' must be lower-case letters, digits and '_', "
                          f"starting with a letter")
    reserved = OP_RESERVED if what == "op" else RESERVED
    if keyword.iskeyword(name) or name in reserved or re.fullmatch(r"(size|i)_\d+", name):
        raise where.error(f"{what} name '{name}' is reserved; choose another")


def check_generated_names(where: Where, op: str, family: Family,
                          args: Iterable[tuple[str, tuple[str, ...]]],
                          body: Iterable[tuple[str, tuple[str, ...]]],
                          derived_from: Sequence[str]) -> None:
    """No declared name (an argument, or an output or step of the body; each with its key path
    under ``where``) may be the op's name, or one the family's generated code binds for itself
    (its ``generated_names``, where an entry ending in ``_`` stands for its numbered forms, its
    ``generated_prefixes``, and the compiled public function's ``PUBLIC_FUNCTION_NAMES``), or
    extend a name the code derives names from (``derived_from``: tensors, outputs and steps give
    ``x_ptr``, ``x_row``, ``x_stride_0``, ...). Any of these would shadow or be shadowed in the
    generated module: wrong results, or a module that does not import."""
    generated = family.generated_names | PUBLIC_FUNCTION_NAMES
    prefixes = family.generated_prefixes
    for name, path in (*args, *body):
        key = where
        for part in path:
            key = key.child(part)
        if name == op:
            raise key.error(f"'{name}' is the op's name, which its generated function takes; "
                            f"choose another")
        numbered = re.sub(r"_\d+$", "_", name)
        if name in generated or numbered in generated or name.startswith(prefixes):
            raise key.error(f"'{name}' is a name the {family.name} family's generated code uses "
                            f"for itself; choose another")
        suffixes = family.derived_suffixes or ("",)
        for base in derived_from:
            if base != name and name.startswith(tuple(f"{base}_{s}" for s in suffixes)):
                raise key.error(f"'{name}' extends '{base}', from which generated code derives "
                                f"its names ({base}_ptr, {base}_row, ...); choose another")


def int_list(table: Table, key: str, default: tuple[int, ...], valid, expected: str) -> tuple[int, ...]:
    """``key = [ints]`` (or one int), each passing ``valid``; ``expected`` names the rule."""
    raw = table.pop_any(key)
    if raw is None:
        return default
    where = table.where.child(key)
    values = parse_list(raw, int, where)
    for value in values:
        if not valid(value):
            raise where.error(f"expected {expected}, got {value}")
    return values


# the most elements a Triton block holds (TRITON_MAX_TENSOR_NUMEL in triton/language, whose module
# moves between versions), and the most warps a program runs: larger values build, then fail at
# the first launch
MAX_TILE = 1 << 20
MAX_WARPS = 32


def power_of_two_list(table: Table, key: str, default: tuple[int, ...],
                      most: int = MAX_TILE) -> tuple[int, ...]:
    return int_list(table, key, default, lambda v: 0 < v <= most and not v & (v - 1),
                    f"powers of two up to {most}")


def warps_list(table: Table, default: tuple[int, ...]) -> tuple[int, ...]:
    """``num_warps = [...]``: powers of two up to ``MAX_WARPS``."""
    return power_of_two_list(table, "num_warps", default, MAX_WARPS)


def tile_pairs(table: Table, key: str, default: tuple[tuple[int, int], ...],
               axes: str) -> tuple[tuple[int, int], ...]:
    """``key = [[a, b], ...]``: pairs of powers of two, ``axes`` naming what a and b tile, of
    at most ``MAX_TILE`` elements a tile."""
    raw = table.pop_any(key)
    if raw is None:
        return default
    where = table.where.child(key)
    tiles = []
    for item in parse_list(raw, list, where):
        pair = parse_list(item, int, where)
        if len(pair) != 2 or any(v <= 0 or v & (v - 1) for v in pair) or \
                pair[0] * pair[1] > MAX_TILE:
            raise where.error(f"expected [{axes}] pairs of powers of two, at most {MAX_TILE} "
                              f"elements a tile, got {item}")
        tiles.append((pair[0], pair[1]))
    return tuple(tiles)


def integer_math(dtypes: Sequence[str]) -> bool:
    """Whether kernels of an op taking ``dtypes`` may compute in an integer type."""
    return any(d in INTEGER_DTYPES for d in dtypes)


@dataclass(frozen=True)
class ArgPlan:
    name: str
    kind: str
    default_code: str | None        # Python source of the default, None when required
    constexpr: str = ""
    values: tuple[str, ...] = ()

    @property
    def param(self) -> str:
        return self.name if self.default_code is None else f"{self.name}={self.default_code}"


def arg_plans(spec: OpSpec) -> tuple[ArgPlan, ...]:
    plans = []
    for arg in spec.args:
        if isinstance(arg, TensorArg):
            plans.append(ArgPlan(arg.name, "tensor", "None" if arg.optional else None))
        elif isinstance(arg, ChoiceArg):
            default = None if arg.default is None else repr(arg.default)
            plans.append(ArgPlan(arg.name, "choice", default, arg.constexpr, arg.values))
        elif arg.optional:
            plans.append(ArgPlan(arg.name, arg.type, "None"))
        elif arg.type == "dtype":
            plans.append(ArgPlan(arg.name, arg.type, f"torch.{arg.default}"))
        else:
            default = None if arg.default is None else repr(arg.default)
            plans.append(ArgPlan(arg.name, arg.type, default))
    return tuple(plans)


def arg_info_code(spec: OpSpec, promoted: tuple[str, ...] = ()) -> tuple[str, ...]:
    """``rt.ArgInfo(...)`` source for each argument (the registry entry the tests read)."""
    infos = []
    for arg in spec.args:
        if isinstance(arg, TensorArg):
            fields = [f'"{arg.name}"', '"tensor"']
            if arg.optional:
                fields.append("optional=True")
            if (arg.low, arg.high) != (-3.0, 3.0):
                fields += [f"low={arg.low!r}", f"high={arg.high!r}"]
            if arg.dims:
                fields.append(f"dims={arg.dims!r}")
            if arg.name in promoted:
                fields.append("promotes=True")
            if arg.dtypes:
                fields.append("dtypes=(" + "".join(f"torch.{d}, " for d in arg.dtypes) + ")")
        elif isinstance(arg, ChoiceArg):
            fields = [f'"{arg.name}"', '"choice"', f"default={arg.default!r}",
                      f"choices={arg.values!r}", f"constexpr={arg.constexpr!r}"]
        else:
            default = f"torch.{arg.default}" if arg.type == "dtype" and arg.default else \
                repr(arg.default)
            fields = [f'"{arg.name}"', f'"{arg.type}"', f"default={default}"]
            if arg.optional:
                fields.append("optional=True")
            if arg.range is not None:
                fields.append(f"range={arg.range!r}")
        infos.append(f"rt.ArgInfo({', '.join(fields)})")
    return tuple(infos)


@dataclass(frozen=True)
class CommonPlan:
    """What every generated module states the same way: identity, metadata, signatures."""

    name: str
    family: str
    doc: str
    reference: str
    spec_path: str
    spec_sha256: str
    dtypes: tuple[str, ...]
    indexing: str
    args: tuple[ArgPlan, ...]
    arg_infos: tuple[str, ...]
    output_names: tuple[str, ...]
    autocast: str                   # the spec's policy under torch.autocast (model.AUTOCAST)
    autocast_follows: str           # the torch operator whose autocast it follows, or ""
    uncast: tuple[str, ...]         # tensors the autocast policy leaves as they are

    @property
    def reference_imports(self) -> tuple[str, ...]:
        """The imports the reference expression needs besides torch."""
        names = {n.id for n in ast.walk(ast.parse(self.reference, mode="eval"))
                 if isinstance(n, ast.Name)}
        return tuple(line for name, line in (("math", "import math"),
                                              ("F", "import torch.nn.functional as F"),
                                              ("ref", "from specgen import references as ref"))
                     if name in names)

    @property
    def dtypes_code(self) -> str:
        return "(" + ", ".join(f"torch.{d}" for d in self.dtypes) + ",)"

    @property
    def kernel(self) -> str:
        return f"_{self.name}"

    @property
    def scalars(self) -> tuple[ArgPlan, ...]:
        return tuple(a for a in self.args if a.kind in ("float", "int", "bool"))

    @property
    def value_ints(self) -> tuple[str, ...]:
        """The int arguments the kernels compute with (expression values; a family whose ints
        shape the launch or are compared as integers says so)."""
        return tuple(a.name for a in self.args if a.kind == "int")

    @property
    def integer_math(self) -> bool:
        """Whether the kernels may compute in an integer type (the spec lists one: pointwise,
        reduce). Their integer literals and int arguments then take INT_MATH (the templates'
        ``int_math``): int64 for integer data, as torch computes ``x * 4 + k`` of an int64
        ``x`` exactly and of a bool one in int64 (an output of fewer bits wraps as torch's),
        and the math's type for float data."""
        return integer_math(self.dtypes)

    @property
    def uses_int_math(self) -> bool:
        """Whether the kernels read INT_MATH: their int arguments, or an integer literal in a
        spec expression (``expression_codes``)."""
        return bool(self.typed_ints) or any("INT_MATH" in code for code in self.expression_codes)

    @property
    def expression_codes(self) -> tuple[str, ...]:
        """The emitted code of the spec's expressions (a family with them says so)."""
        return ()

    @property
    def float_ints(self) -> tuple[str, ...]:
        """The int arguments the kernels compute with in floats (their int32 products would
        overflow, k ** 3 at k = 2000): all of them, where the math is never an integer type."""
        return () if self.integer_math else self.value_ints

    @property
    def typed_ints(self) -> tuple[str, ...]:
        """The int arguments the kernels take to INT_MATH (``integer_math``)."""
        return self.value_ints if self.integer_math else ()

    @property
    def float_args(self) -> tuple[str, ...]:
        """The scalar arguments kernels take to the math's type first (the templates'
        ``float_scalars``): the float ones, and ``float_ints``."""
        return tuple(a.name for a in self.args if a.kind == "float" or a.name in self.float_ints)

    @property
    def float64_math(self) -> bool:
        """Whether the kernels may compute in float64: the spec lists float64 (its plan names
        the tensor that sets the math's type: ``compute_of``, or the kernels set it)."""
        return "float64" in self.dtypes

    def float64_scalar(self, name: str) -> bool:
        """Whether the kernels declare the scalar argument ``name`` float64 (the templates'
        ``scalar_param``): a float one, where the math may be float64."""
        kind = next(a.kind for a in self.args if a.name == name)
        return kind == "float" and self.float64_math

    @property
    def choices(self) -> tuple[ArgPlan, ...]:
        return tuple(a for a in self.args if a.kind == "choice")

    @property
    def signature_no_out(self) -> str:
        return ", ".join(a.param for a in self.args)

    @property
    def differentiable(self) -> bool:
        """Whether the op has a gradient (argmax and argmin have none)."""
        return True


def common_plan(spec: OpSpec, output_names: tuple[str, ...],
                promoted: tuple[str, ...] = ()) -> CommonPlan:
    """``promoted``: tensors of their own dtype, which the result's promotes with, as torch's
    element-wise ops: the tests draw their dtypes apart, and autocast leaves them as they are."""
    return CommonPlan(
        name=spec.name, family=spec.family, doc=spec.doc, reference=spec.reference,
        spec_path=spec.source.path, spec_sha256=spec.source.sha256[:16], dtypes=spec.dtypes,
        indexing=spec.indexing, args=arg_plans(spec), arg_infos=arg_info_code(spec, promoted),
        output_names=output_names, autocast=spec.autocast,
        autocast_follows=spec.autocast_follows, uncast=promoted)


# ---- the GEMM-like families' (matmul, conv) operands, outputs and configs ----------------------

@dataclass(frozen=True)
class TensorRole:
    """A tensor argument in the role its dims give it (each family's Operand adds what its
    kernels read of it)."""

    name: str
    dims: tuple[str, ...]
    optional: bool = False

    @property
    def ptr(self) -> str:
        return f"{self.name}_ptr"

    @property
    def flag(self) -> str:
        """The kernels' constexpr saying whether an optional operand was given."""
        return f"HAS_{self.name.upper()}"


@dataclass(frozen=True)
class EpilogueOutput:
    """An output of an epilogue: its name and the code computing it from ``acc``."""

    name: str
    code: str

    @property
    def ptr(self) -> str:
        return f"{self.name}_ptr"


class EpiloguePlan:
    """What the plans of the GEMM-like families (matmul, conv) derive alike from their
    ``epilogue_inputs``, ``outputs`` and ``configs``."""

    @property
    def optional_inputs(self) -> tuple:
        return tuple(o for o in self.epilogue_inputs if o.optional)

    @property
    def block_ks(self) -> tuple[int, ...]:
        """Every BLOCK_K of the config space, ascending."""
        return tuple(sorted({c["BLOCK_K"] for c in self.configs}))


def tile_config(m: int, n: int, k: int, warps: int, stages: int, group: int = 8) -> dict:
    """A GEMM tile config: BLOCK_M x BLOCK_N outputs, BLOCK_K a step, GROUP_M rows of tiles in
    the grouped ordering, the warps and pipeline stages."""
    return {"BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": k, "GROUP_M": group, "num_warps": warps,
            "num_stages": stages}

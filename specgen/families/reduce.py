"""Reduce family: one tensor reduced over any dims with torch's ``dim``/``keepdim`` semantics.

Spec tables: ``[reduce]`` (``combine``, optional ``map`` and ``finish`` expressions, ``dim``),
``[tuning]`` (``INNER`` and ``OUTER`` tiles, ``num_warps``) and ``[schedule]``
(``launch``). The op's signature is ``name(x, dim=None, keepdim=False)`` (``dim`` required when
``dim = "required"``); the family adds ``dim`` and ``keepdim``, so the spec declares the tensor and
at most one optional ``dtype`` argument, torch's ``dtype=`` of ``sum``/``mean``/``prod``: it comes
last in the signature, ``x`` is cast to it before the reduction and the result has it.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from specgen.expr import Symbol, emit, helpers, parse_expr
from specgen.families.contract import Family
from specgen.families.common import (ArgPlan, CommonPlan, common_plan, symbols_of, tile_pairs,
                                     warps_list)
from specgen.model import OpSpec, ScalarArg, TensorArg
from specgen.reduce_lib import HELPERS
from specgen.table import Table

# combine -> (identity as Triton source, result kind): each combine's identity (an int, which
# takes any COMPUTE type, as tl.full of an integer type wants; for max and min the kernel's
# IDENTITY constexpr, the lowest or highest value of its COMPUTE type) and kind
COMBINES = {
    "sum": ("0", "value"),
    "prod": ("1", "value"),
    "max": ("IDENTITY", "value"),
    "min": ("IDENTITY", "value"),
    "argmax": ("IDENTITY", "index"),
    "argmin": ("IDENTITY", "index"),
}
# the identity constexpr of the max and min combines, in the kernel's COMPUTE type
EXTREMES = {"max": ('float("-inf")', "get_int_min_value"),
            "min": ('float("inf")', "get_int_max_value")}
DIM_MODES = ("optional", "required")
LAUNCHES = ("flat", "persistent")
# names the reference may use besides the declared arguments: the family adds them to the signature
REFERENCE_NAMES = ("dim", "keepdim")
# the scalar arguments a map and a finish may read
SCALAR_KINDS = ("float", "int", "bool")

# names the generated module binds for itself, in its kernels and host functions: a spec that
# declared one would shadow it or be shadowed (an entry ending in "_" stands for its numbered
# forms; tests/test_spec_errors.py checks the set against what the template binds)
GENERATED_NAMES = frozenset({
    "inner_kernel", "outer_kernel", "atomic_inner_kernel", "atomic_outer_kernel",  # its kernels
    "reduction",  # its imports
    "compute", "identity", "x_type", "out_type",  # the math's type and the combine's identity
    "acc", "acc_index", "count", "counter_ptr", "dim", "dims", "keepdim", "kept", "kept_mask",
    "kept_size_", "kept_tile", "kept_tiles", "n_float", "num_kept", "num_red", "num_splits", "out",
    "out_kept_stride_", "out_offsets", "out_ptr", "part", "part_index", "part_index_ptr",
    "part_mask", "part_ptr", "partials", "red", "red_block", "red_end", "red_mask", "red_size_",
    "red_start", "result", "result_index", "split", "split_block", "split_size", "splits", "ticket"
})
GENERATED_PREFIXES: tuple[str, ...] = ()


@dataclass(frozen=True)
class ReduceBody:
    combine: str
    dtype: str | None                    # the dtype argument: x is cast to it, the result has it
    map_expr: object
    finish_expr: object
    dim: str
    inner_tiles: tuple[tuple[int, int], ...]
    outer_tiles: tuple[tuple[int, int], ...]
    num_warps: tuple[int, ...]
    launch: str


def body_names(body: ReduceBody) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """A reduce spec declares no names beyond its arguments."""
    return ()


def parse_body(top: Table, spec_args: tuple, name: str) -> ReduceBody:
    args_where = top.where.child("args")
    tensors = [a for a in spec_args if isinstance(a, TensorArg)]
    dtypes = [a for a in spec_args if isinstance(a, ScalarArg) and a.type == "dtype"]
    scalars = [a for a in spec_args if isinstance(a, ScalarArg) and a.type in SCALAR_KINDS]
    if len(tensors) != 1 or len(dtypes) > 1 or len(spec_args) != len(tensors) + len(dtypes) + len(
            scalars):
        raise args_where.error("a reduce op takes exactly one tensor argument, float, int and "
                               "bool scalars, and at most one dtype argument (the family adds "
                               "'dim' and 'keepdim')")
    if name in HELPERS:
        # the generated module imports the specgen.reduce_lib helper of that name
        raise top.where.child("op").child("name").error(
            f"'{name}' is the name of a reduce_lib helper the generated module imports")
    x = tensors[0]
    if x.optional or x.dims:
        raise args_where.child(x.name).error("a reduce op's tensor takes no 'optional' or 'dims'")
    for arg in spec_args:
        if arg.name in REFERENCE_NAMES:
            raise args_where.child(arg.name).error(
                f"'{arg.name}' is the name of an argument the family adds")

    table = top.pop_table("reduce")
    combine = table.pop_choice("combine", tuple(COMBINES))
    is_index = COMBINES[combine][1] == "index"
    # the tensor and the scalars; dim, keepdim and dtype shape the launch on the host: named, so
    # that reading one says so
    symbols = symbols_of(spec_args, [a.name for a in dtypes])
    symbols.update({n: Symbol(n, "host") for n in REFERENCE_NAMES})
    map_source = table.pop("map", str, None)
    finish_source = table.pop("finish", str, None)
    if is_index and (map_source or finish_source):
        key = "map" if map_source else "finish"
        raise table.where.child(key).error(f"'{combine}' returns an index: it takes no '{key}'")
    dtype = dtypes[0].name if dtypes else None
    if is_index and dtype:
        raise args_where.child(dtype).error(
            f"'{combine}' returns an int64 index: it takes no dtype argument")
    map_expr = parse_expr(map_source, table.where.child("map"), symbols) if map_source else None
    # the finish reads the reduced value, the count and the scalars
    finish_symbols = {"acc": Symbol("acc", "value"), "N": Symbol("N", "value"),
                      **{n: s for n, s in symbols.items() if n != x.name}}
    finish_expr = (parse_expr(finish_source, table.where.child("finish"), finish_symbols, {
        x.name: "finish reads the reduced value acc and N; the tensor enters through map"})
        if finish_source else None)
    dim = table.pop_choice("dim", DIM_MODES, "optional")
    table.finish()

    tuning = top.pop_table("tuning", required=False) or Table({}, top.where.child("tuning"))
    # rows x reduced elements per tile: many short rows, or a few long ones. The first config of
    # each list is the one the interpreter runs unless a test forces another (rt.launch): keep it
    # small
    # (1, 16384): a full reduction's long splits, with 32-64 elements in flight per thread
    inner = tile_pairs(tuning, "INNER", ((4, 256), (4, 1024), (1, 4096), (8, 512), (16, 256),
                                         (1, 16384)), "kept, reduced")
    # kept x reduced elements per tile: wide along the contiguous kept dim
    outer = tile_pairs(tuning, "OUTER", ((64, 64), (64, 128), (128, 32), (128, 64), (256, 16),
                                         (512, 8)), "kept, reduced")
    # 16 warps: a full reduction's long splits reach 94% of copy bandwidth with them (H200 sweep,
    # tools/perf/sweep_reduce.py), 83% with 8
    num_warps = warps_list(tuning, (4, 8, 16))
    tuning.finish()
    schedule = top.pop_table("schedule", required=False) or Table({}, top.where.child("schedule"))
    launch = schedule.pop_choice("launch", LAUNCHES, "flat")
    schedule.finish()
    return ReduceBody(combine, dtype, map_expr, finish_expr, dim, inner, outer, num_warps, launch)


@dataclass(frozen=True)
class ReducePlan(CommonPlan):
    combine: str = "sum"
    identity: str = "0"
    index: bool = False             # argmax/argmin: the result is an int64 index
    x: str = "x"
    dtype: str | None = None        # the dtype argument: x is cast to it before the reduction
    map_code: str = ""              # "" when elements are combined as loaded
    finish_code: str = ""           # the finish expression over result and n_float, if any
    finish_reads_count: bool = False  # the finish expression reads N, the element count
    inner_configs: tuple[dict, ...] = ()
    outer_configs: tuple[dict, ...] = ()
    launch: str = "flat"

    helpers: tuple[str, ...] = ()   # specgen.kernel_lib functions the map and finish call

    @property
    def differentiable(self) -> bool:
        return not self.index

    @property
    def kernel_roles(self) -> tuple[tuple[str, str], ...]:
        """The module's kernels by the roles the runtime launches them in: a sum's atomic
        split zeroes its partials between tuning trials (a kernel of its own)."""
        roles = (("inner", "inner_kernel"), ("outer", "outer_kernel"))
        if self.combine == "sum":
            roles += (("atomic_inner", "atomic_inner_kernel"),
                      ("atomic_outer", "atomic_outer_kernel"))
        return roles

    @property
    def kernel_scalars(self) -> tuple[ArgPlan, ...]:
        """The scalars the kernel takes (after its pointers); keepdim shapes the launch only."""
        return tuple(a for a in self.scalars if a.name != "keepdim")

    @property
    def scalar_args(self) -> str:
        """The kernel scalars appended to an argument list, each after ", "."""
        return "".join(f", {self.scalar_param(a.name)}" for a in self.kernel_scalars)

    @property
    def combine_fn(self) -> str:
        """The jit helper that combines two accumulators (NaN-propagating for max and min)."""
        return f"{self.combine}_combine_f32"

    @property
    def reduce_fn(self) -> str:
        """The jit helper that reduces a tile of accumulators along one axis."""
        return f"{self.combine}_reduce_f32"

    @property
    def reduce_helpers(self) -> tuple[str, ...]:
        """The specgen.reduce_lib functions the kernel calls, imported by name."""
        return (self.combine_fn, self.reduce_fn, "strided_offsets")

    @property
    def split_block_k(self) -> dict[str, int]:
        """The narrowest output tile of each config family: splits are planned for it."""
        return {"inner": min(c["BLOCK_K"] for c in self.inner_configs),
                "outer": min(c["BLOCK_K"] for c in self.outer_configs)}

    @property
    def compute_of(self) -> str:
        """The tensor whose dtype sets the math's (COMPUTE): x's for an index (argmax), else the
        result's."""
        return "x" if self.index else "out"

    @property
    def first_lines(self) -> tuple[str, ...]:
        """The kernel's lines after the program id: float arguments in the math's type
        (float_lines), and the element count as a float where the finish expression reads it
        (the launcher passes it as an int, as every launcher passes ints alike): in float64 for
        float64 math, where float32 would round a count past 2**24 (a mean of 2**24 + 1 float64
        ones was 1 + 6e-8)."""
        if not self.finish_reads_count:
            return self.float_lines
        if not self.float64_math:
            return (*self.float_lines, "n_float = count * 1.0  # the element count as a float")
        return (*self.float_lines, "# the element count as a float, of the math's type",
                f"n_float = tl.full([], count, {self.float_type})")

    @property
    def max_tile(self) -> int:
        return max(c["BLOCK_K"] * c["BLOCK_R"] for c in self.inner_configs + self.outer_configs)

    @property
    def other(self) -> str:
        """What masked lanes of x load: the identity, as a float where it is a number (the
        interpreter converts an int ``other`` to bfloat16 by its bits)."""
        return f"{self.identity}.0" if self.identity.isdigit() else self.identity

    @property
    def extreme(self) -> tuple[str, str] | None:
        """max and min (and their index forms): the identity for a float COMPUTE type, and the
        dtype method that gives an integer one's."""
        return EXTREMES.get(self.combine.removeprefix("arg"))


def plan(spec: OpSpec) -> ReducePlan:
    body: ReduceBody = spec.body
    x = spec.tensors[0].name
    identity, kind = COMBINES[body.combine]
    index = kind == "index"
    map_code = emit(body.map_expr, {x: "x"}) if body.map_expr is not None else ""
    if map_code == "x":
        map_code = ""
    finish_code = (emit(body.finish_expr, {"acc": "result", "N": "n_float"})
                   if body.finish_expr is not None else "")
    reads_count = body.finish_expr is not None and "N" in body.finish_expr.names
    warps = body.num_warps

    def configs(tiles):
        return tuple({"BLOCK_K": k, "BLOCK_R": r, "num_warps": w}
                     for (k, r), w in itertools.product(tiles, warps))

    common = common_plan(spec, ("out",))
    dim_default = None if body.dim == "required" else "None"
    extra = (ArgPlan("dim", "dims", dim_default), ArgPlan("keepdim", "bool", "False"))
    # kind "dim": one int (argmax/argmin), "dims": an int or a tuple; optional: None is allowed
    dim_info = f'rt.ArgInfo("dim", "{"dim" if index else "dims"}"'
    dim_info += ", optional=True)" if body.dim == "optional" else ")"
    extra_infos = (dim_info, 'rt.ArgInfo("keepdim", "bool", default=False)')
    # torch's order: the tensor, dim, keepdim, then dtype (the spec declares the tensor first)
    tensor_at = next(i for i, a in enumerate(common.args) if a.kind == "tensor")
    rest = [i for i in range(len(common.args)) if i != tensor_at]
    args = (common.args[tensor_at], *extra, *(common.args[i] for i in rest))
    infos = (common.arg_infos[tensor_at], *extra_infos, *(common.arg_infos[i] for i in rest))
    fields = {**common.__dict__, "args": args, "arg_infos": infos}
    called = set()
    for expr in (body.map_expr, body.finish_expr):
        if expr is not None:
            called |= helpers(expr)
    return ReducePlan(**fields, helpers=tuple(sorted(called)), combine=body.combine,
                      identity=identity, index=index, x=x, dtype=body.dtype, map_code=map_code,
                      finish_code=finish_code, finish_reads_count=reads_count,
                      inner_configs=configs(body.inner_tiles),
                      outer_configs=configs(body.outer_tiles), launch=body.launch)


def scaffold(name: str) -> str:
    return f'''# A reduce op: see README.md, "Reduce family".
[op]
name = "{name}"
family = "reduce"
doc = "sum of squares over dim"
reference = "torch.sum(x * x, dim=dim, keepdim=keepdim)"

[args]
x = "tensor"
# torch's dtype= (x is cast to it first; the reference then passes dtype=dtype):
# dtype = {{ kind = "dtype", optional = true }}

[reduce]
combine = "sum"
map = "x * x"
'''


FAMILY = Family(
    name="reduce", parse_body=parse_body, body_names=body_names, plan=plan, scaffold=scaffold,
    generated_names=GENERATED_NAMES, generated_prefixes=GENERATED_PREFIXES,
    # torch's dtype= of a reduction
    takes=frozenset({"dtype argument"}), reference_names=REFERENCE_NAMES,
    cases="specgen.testing.reduce:reduce_cases",
    samples="specgen.testing.reduce:reduce_samples", bench="bench.reduce:cases")

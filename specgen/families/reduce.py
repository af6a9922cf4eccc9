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
import math
from dataclasses import dataclass

import torch

from specgen.expr import Symbol, emit, helpers, parse_expr
from specgen.families.contract import Family
from specgen.families.common import (ArgPlan, CommonPlan, common_plan, integer_math, scalar_args,
                                     symbols_of, tile_pairs, unread, warps_list)
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


def unread_args(body: ReduceBody, spec_args: tuple) -> tuple[tuple[str, str], ...]:
    """The scalars neither map nor finish reads (the tensor is read as it is without a map)."""
    return unread(scalar_args(spec_args), (body.map_expr, body.finish_expr),
                  "neither [reduce] map nor finish")


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

    @property
    def expression_codes(self) -> tuple[str, ...]:
        return (self.map_code, self.finish_code)

    @property
    def map_value(self) -> str:
        """The map's code, taken back to the accumulator's type where INT_MATH may widen it
        (int64 beside an int8 accumulator, which the loop must carry in its own type)."""
        return f"({self.map_code}).to(COMPUTE)" if self.uses_int_math else self.map_code


def plan(spec: OpSpec) -> ReducePlan:
    body: ReduceBody = spec.body
    x = spec.tensors[0].name
    identity, kind = COMBINES[body.combine]
    index = kind == "index"
    map_code = (emit(body.map_expr, {x: "x"}, typed_ints=integer_math(spec.dtypes))
                if body.map_expr is not None else "")
    if map_code == "x":
        map_code = ""
    finish_code = (emit(body.finish_expr, {"acc": "result", "N": "n_float"},
                        typed_ints=integer_math(spec.dtypes))
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
    return f'''# A reduce op: see docs/families.md, "Reduce family".
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


# --- Its property tests, opcheck samples and benchmark cases -------------------------------------
# The tests and the bench call these (``FAMILY``'s draw_case, samples and bench); they import
# hypothesis, specgen.testing and bench where they run: the generator needs none of them.

def _strategies(info) -> tuple[str | None, ...]:
    combine = info.launch.combine
    forced = ("inner", "outer", "split") + (("atomic",) if combine == "sum" else ())
    if combine not in ("argmax", "argmin"):
        forced += ("last",)  # the one-launch split (argmax/argmin split in two launches)
    return (None,) + forced


# a reduction of n float32 terms carries error growing with n; the output rounding dominates
# below; argmax/argmin: the very index (integer results are exact)
TOLERANCES = {torch.float32: (1e-4, 1e-4), torch.float16: (1e-3, 1e-4),
              torch.bfloat16: (8e-3, 1e-4), torch.float64: (1e-9, 1e-10), torch.int64: (0, 0)}


def draw_case(draw, info):
    """A property-test call: any layout, dims drawn as None, an int or a tuple, every strategy."""
    from hypothesis import strategies as st

    from specgen.testing.core import (Case, accepted, cast_first, dtype_arg, dtypes_of,
                                      integer_range, knobs, layouts, make_tensor, scalar_value,
                                      shapes)

    dim_info = next(a for a in info.args if a.name == "dim")
    single = dim_info.kind == "dim"
    rank = draw(st.sampled_from([0, 1, 2, 3, 4]))
    # max, min and the arg reductions of an empty range raise; those cases are tested on their own
    has_identity = info.launch.combine in ("sum", "prod")
    shape = draw(shapes(min_rank=rank, max_rank=rank, max_elements=1024,
                        allow_zero=has_identity))
    layout = draw(layouts(rank))
    dtype = draw(dtypes_of(info.dtypes))
    x_info = info.args[0]
    # integers now and then over their dtype's whole range, where sums and products wrap
    low, high = (x_info.low, x_info.high) if dtype.is_floating_point else \
        integer_range(dtype, x_info.low, x_info.high, wide=draw(st.booleans()))
    x = make_tensor(shape, dtype, layout, low=low, high=high,
                    seed=draw(st.integers(0, 2**31 - 1)))
    if single:
        choices = [st.integers(-max(rank, 1), max(rank, 1) - 1)]
    else:
        # lists: the registered op (which the suite also calls) takes `int[]?` as torch.library
        # spells it, with no int-to-list broadcasting; the public function's int and tuple forms
        # are unit-tested in tests/test_reduce.py
        dims = st.lists(st.integers(0, rank - 1), unique=True, max_size=rank).map(
            lambda ds: [d - rank if i % 2 else d for i, d in enumerate(ds)])  # some negative
        choices = [dims] if rank else [st.sampled_from([[0], [-1]])]
    if dim_info.optional or single and draw(st.integers(0, 4)) == 0:
        choices.append(st.none())
    dim = draw(st.one_of(*choices))
    keepdim = draw(st.booleans())
    if not has_identity and _empty_reduction(shape, dim):
        dim = None if rank == 0 else draw(st.sampled_from(
            [d for d in range(rank) if shape[d] > 0] or [None]))
    overrides = draw(knobs())
    strategy = draw(st.sampled_from(_strategies(info)))
    if strategy is not None:
        overrides["strategy"] = strategy
    if single and torch.is_floating_point(x) and x.numel() > 1 and draw(st.booleans()):
        # ties and NaN: argmax/argmin must return the first index, NaN counting as the extreme
        flat = x.reshape(-1) if x.is_contiguous() else None
        if flat is not None:
            flat[draw(st.integers(0, flat.numel() - 1))] = draw(st.sampled_from(
                [float("nan"), 3.0, -3.0]))
            flat[draw(st.integers(0, flat.numel() - 1))] = 3.0
    # the spec names the tensor and the dtype argument; the family adds dim and keepdim
    args = {x_info.name: x, "dim": dim, "keepdim": keepdim}
    describe = (f"{x_info.name}: {shape} {dtype} {layout} {tuple(x.stride())}; dim={dim!r} "
                f"keepdim={keepdim}")
    # the spec's own scalars (keepdim, which the family adds, is drawn above)
    for arg in info.args:
        if arg.kind in ("float", "int", "bool") and arg.name not in args:
            args[arg.name] = scalar_value(draw, arg)
            describe += f" {arg.name}={args[arg.name]!r}"
    reference_args = None
    dtype_name = next((a.name for a in info.args if a.kind == "dtype"), None)
    if dtype_name is not None:
        # torch's dtype= (sum, mean, prod), drawn after any in-place change to x
        # a sum into bool (torch's saturates) is refused: tests/test_dtypes.py; a negative
        # float cast to uint8 is undefined in C++ (CPU and GPU disagree)
        casts = tuple(d for d in info.dtypes if d != torch.bool and not (
            d == torch.uint8 and dtype.is_floating_point))
        args[dtype_name] = dtype_arg(draw, casts, dtype)
    # a call torch refuses (mean of integers without a floating dtype=) is taken as float32
    args = accepted(info, args)
    if dtype_name is not None:
        describe += f" {dtype_name}={args[dtype_name]}"
        # (an integer dtype= keeps the reference exact as it is)
        if args[dtype_name] is not None and args[dtype_name].is_floating_point:
            reference_args = cast_first(args, x_info.name, dtype_name)
    return Case(args, (), overrides, describe=describe, tolerances=TOLERANCES,
                reference_args=reference_args)


def _empty_reduction(shape: tuple[int, ...], dim) -> bool:
    if dim is None:
        return 0 in shape
    dims = (dim,) if isinstance(dim, int) else dim
    if not dims:
        return 0 in shape
    return any(shape[d] == 0 for d in dims) if shape else False


def samples(info, make) -> dict[str, list[tuple]]:
    """Opcheck calls (``make``: specgen.testing.samples.Make): a transposed and a dense input,
    over one dim and over every dim (kept), and a float16 input reduced in float32 where the op
    takes dtype=; positive values (a product, a mean)."""
    from specgen.testing.samples import default

    dim = info.args[1]
    index = dim.kind == "dim"
    every = None if dim.optional else ([0] if not index else 0)

    def call(tensor, dims, keepdim, dtype=None):
        rest = tuple(dtype if a.kind == "dtype" else default(a) for a in info.args[3:])
        return (tensor, dims, keepdim, *rest)

    calls = [call(make.t(3, 5, g=not index, lo=0.5), 1 if index else [1], False),
             call(make.r(3, 5, g=True, lo=0.5), every, True)]
    if any(a.kind == "dtype" for a in info.args):
        half = make.r(3, 5, lo=0.5).half().requires_grad_()
        calls.append(call(half, [0], False, torch.float32))
    return {info.name: calls}


def bench_cases(quick: bool) -> list:
    """The benchmark's rows (bench.harness.Case), bf16: sums over the last dim, over all and over
    the first, judged against the copy bandwidth and torch.compile. --quick divides every element
    count by 16."""

    from bench.harness import Case, ours

    dtype = torch.bfloat16

    def case(op, shape, specgen, eager):
        numel = math.prod(shape)
        out = shape[0] if op.endswith("-1)") else shape[-1] if op.endswith("0)") else 1
        return Case(family="reduce", op=op, shape="x".join(map(str, shape)) if len(shape) > 1
                    else f"2^{numel.bit_length() - 1}", dtype=dtype,
                    make_inputs=lambda: (torch.randn(shape, device="cuda", dtype=dtype),),
                    specgen=specgen, eager=eager, bytes_moved=(numel + out) * dtype.itemsize)

    wide = (2048 if quick else 32768), 1024
    full = 2**24 if quick else 2**28
    return [
        case("sum(x, -1)", wide, lambda x: ours().sum(x, -1), lambda x: torch.sum(x, -1)),
        case("sum(x)", (full,), lambda x: ours().sum(x), lambda x: torch.sum(x)),
        case("sum(x, 0)", wide, lambda x: ours().sum(x, 0), lambda x: torch.sum(x, 0)),
    ]


FAMILY = Family(
    name="reduce", parse_body=parse_body, body_names=body_names, plan=plan, scaffold=scaffold,
    generated_names=GENERATED_NAMES, generated_prefixes=GENERATED_PREFIXES,
    # torch's dtype= of a reduction
    takes=frozenset({"dtype argument"}), reference_names=REFERENCE_NAMES, unread_args=unread_args,
    draw_case=draw_case, samples=samples, bench=bench_cases)

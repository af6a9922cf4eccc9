"""Pointwise family: N-ary element-wise ops with broadcasting, any strides, fused expressions.

Spec tables: ``[compute]`` (one output per key, in order; later outputs may read earlier ones),
``[tuning]`` (``BLOCK``, ``TILE``, ``num_warps``) and ``[schedule]`` (``launch``).
"""

from __future__ import annotations

import ast
import itertools
import math
from dataclasses import dataclass

import torch

from specgen import promotion
from specgen.expr import Symbol, emit, helpers, parse_expr
from specgen.families.contract import Family
from specgen.families.common import (CommonPlan, check_name, common_plan, integer_math,
                                     power_of_two_list, symbols_of, tile_pairs, unread,
                                     warps_list)
from specgen.model import OpSpec, Output, TensorArg
from specgen.table import Table, check_type

LAUNCHES = ("flat", "persistent")
# the out= variant: specgen::<op>_out
OPERATOR_SUFFIXES = ("_out",)
# outer collapsed dims the tiled kernel walks besides its two tiled ones (rank 8 in all)
OUTER_RANK = 6

# names the generated module binds for itself, in its kernels and host functions: a spec that
# declared one would shadow it or be shadowed (an entry ending in "_" stands for its numbered
# forms; tests/test_spec_errors.py checks the set against what the template binds)
GENERATED_NAMES = frozenset({
    "pointwise",  # its imports
    "compute",    # the math's type (COMPUTE), beside the choices' constexprs
    "result", "result_type",  # the result's dtype (RESULT, by name) and its type (RESULT_TYPE)
    "convert_",   # the types torch's promotion rounds operands to (CONVERT_0, ...: by name)
})
GENERATED_PREFIXES: tuple[str, ...] = ()


@dataclass(frozen=True)
class PointwiseBody:
    outputs: tuple[Output, ...]
    blocks: tuple[int, ...]
    tiles: tuple[tuple[int, int], ...]
    num_warps: tuple[int, ...]
    launch: str
    derived_from: str | None = None     # the forward op, for a derived backward


def body_names(body: PointwiseBody) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """The names the body declares, with their keys: the outputs."""
    return tuple((o.name, ("compute", o.name)) for o in body.outputs)


def unread_args(body: PointwiseBody, spec_args: tuple) -> tuple[tuple[str, str], ...]:
    return unread(spec_args, (o.expr for o in body.outputs), "no [compute] expression")


def parse_body(top: Table, spec_args: tuple, name: str) -> PointwiseBody:
    for arg in spec_args:
        if isinstance(arg, TensorArg) and (arg.optional or arg.dims):
            raise top.where.child("args").child(arg.name).error(
                "pointwise tensors take no 'optional' or 'dims': every tensor broadcasts")
    if not any(isinstance(a, TensorArg) for a in spec_args):
        raise top.where.child("args").error("a pointwise op needs at least one tensor argument")
    outputs = parse_outputs(top.pop_table("compute"), spec_args)
    tuning = top.pop_table("tuning", required=False) or Table({}, top.where.child("tuning"))
    blocks = power_of_two_list(tuning, "BLOCK", (1024, 2048, 4096))
    # square tiles move a transposed operand through shared memory; 1-row tiles serve a
    # collapsed space whose rows are single elements
    tiles = tile_pairs(tuning, "TILE", ((32, 32), (64, 64), (64, 128), (128, 64), (1, 1024),
                                        (16, 128)), "rows, cols")
    num_warps = warps_list(tuning, (4, 8))
    tuning.finish()
    schedule = top.pop_table("schedule", required=False) or Table({}, top.where.child("schedule"))
    launch = schedule.pop_choice("launch", LAUNCHES, "flat")
    schedule.finish()
    return PointwiseBody(outputs, blocks, tiles, num_warps, launch)


def parse_outputs(compute: Table, spec_args: tuple) -> tuple[Output, ...]:
    """``[compute]``: one output per key, in file order; each may read the ones before it."""
    symbols = symbols_of(spec_args)
    outputs = []
    while compute.keys():
        name, source, where = compute.pop_item()
        check_name(name, where, "output")
        if name in symbols:
            raise where.error(f"output '{name}' has the name of an argument")
        check_type(source, str, where)
        outputs.append(Output(name, parse_expr(source, where, symbols)))
        symbols[name] = Symbol(name, "value")
    if not outputs:
        raise compute.where.error("expected at least one output, as in out = \"x + y\"")
    return tuple(outputs)


@dataclass(frozen=True)
class Tensor:
    name: str

    @property
    def ptr(self) -> str:
        return f"{self.name}_ptr"

    @property
    def var(self) -> str:
        return self.name

    @property
    def offsets(self) -> str:
        return f"{self.name}_offsets"


@dataclass(frozen=True)
class OutputTensor(Tensor):
    code: str
    source: str             # its expression, which the host walks (promotion.conversions)
    read_later: bool        # a later output reads it: rounded to the result's dtype first


@dataclass(frozen=True)
class PointwisePlan(CommonPlan):
    inputs: tuple[Tensor, ...] = ()
    outputs: tuple[OutputTensor, ...] = ()
    launch: str = "flat"
    dense_configs: tuple[dict, ...] = ()
    tiled_configs: tuple[dict, ...] = ()
    outer_rank: int = OUTER_RANK
    helpers: tuple[str, ...] = ()       # specgen.kernel_lib functions the kernels call
    conversions: int = 0                # operands torch's promotion may round: CONVERT_0, ...
    backward: str = ""                  # the op derived from this one for its eager gradients
    derived_from: str = ""              # the forward, where this op is a derived backward

    @property
    def compute_of(self) -> str:
        """The tensor whose dtype sets the math's (COMPUTE): the first output's."""
        return self.outputs[0].name

    @property
    def tensors(self) -> tuple[Tensor, ...]:
        """Outputs first, then inputs: the order strides are passed in, and memory order is set by."""
        return self.outputs + self.inputs

    @property
    def outer_dims(self) -> range:
        return range(self.outer_rank)

    @property
    def max_tile(self) -> int:
        return max([c["BLOCK"] for c in self.dense_configs] +
                   [c["TILE_M"] * c["TILE_N"] for c in self.tiled_configs])

    @property
    def expressions(self) -> tuple[tuple[str, str], ...]:
        """Each output with its expression, for the host (promotion.conversions)."""
        return tuple((o.name, o.source) for o in self.outputs)

    @property
    def tensor_names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.tensors)

    @property
    def expression_codes(self) -> tuple[str, ...]:
        return tuple(o.code for o in self.outputs)


def plan(spec: OpSpec) -> PointwisePlan:
    body: PointwiseBody = spec.body
    names = {c.name: c.constexpr for c in spec.choices}
    # the operands torch's promotion converts are wrapped in round_to_promoted, numbered across the
    # outputs in order; an earlier output is a tensor to the later ones
    # (a derived backward takes tensors of one dtype: it converts none)
    tensors = {t.name for t in spec.tensors} if body.derived_from is None else set()
    outputs, sites = [], 0
    for i, o in enumerate(body.outputs):
        tree, sites = promotion.wrap_sites(o.expr.tree, tensors, sites)
        read_later = any(o.name in later.expr.names for later in body.outputs[i + 1:])
        code = emit(tree, names, typed_ints=integer_math(spec.dtypes))
        outputs.append(OutputTensor(o.name, code, ast.unparse(o.expr.tree), read_later))
        if body.derived_from is None:
            tensors.add(o.name)
    dense = tuple({"BLOCK": b, "num_warps": w} for b, w in itertools.product(body.blocks, body.num_warps))
    tiled = tuple({"TILE_M": m, "TILE_N": n, "num_warps": w}
                  for (m, n), w in itertools.product(body.tiles, body.num_warps))
    common = common_plan(spec, tuple(o.name for o in body.outputs))
    called = set().union(*(helpers(o.expr) for o in body.outputs))
    if sites:
        called.add(promotion.CONVERTED)
    return PointwisePlan(**common.__dict__, inputs=tuple(Tensor(t.name) for t in spec.tensors),
                         outputs=tuple(outputs), launch=body.launch, dense_configs=dense,
                         tiled_configs=tiled, helpers=tuple(sorted(called)), conversions=sites,
                         backward=spec.derived[0].name if spec.derived else "",
                         derived_from=body.derived_from or "")


def scaffold(name: str) -> str:
    return f'''# A pointwise op: see README.md, "Spec format".
[op]
name = "{name}"
family = "pointwise"
doc = "x * sigmoid(alpha * x)"
reference = "x * torch.sigmoid(alpha * x)"

[args]
x = "tensor"
alpha = {{ kind = "float", default = 1.0 }}

[compute]
out = "x * sigmoid(alpha * x)"
'''


# --- Its property tests, opcheck samples and benchmark cases -------------------------------------
# The tests and the bench call these (``FAMILY``'s draw_case, samples and bench); they import
# hypothesis, specgen.testing and bench where they run: the generator needs none of them.

def draw_case(draw, info):
    """A property-test call: operands that broadcast to a drawn shape, in any layout."""
    from hypothesis import assume, strategies as st

    from specgen.runtime import interpreting
    from specgen.testing.core import (Case, accepted, broadcast_operand, dtypes_of,
                                      integer_range, knobs, layouts, make_tensor, max_numel,
                                      scalar_value, shapes)

    # a derived backward serves tensors of the output's shape and one dtype (runtime/pointwise.py);
    # its kernels are the forward's template with a longer expression, which the interpreter runs
    # tile by tile (a tall one-column shape under 1 x 1024 tiles: thousands), so its draws stay
    # at a quarter of the forward's elements
    derived = bool(info.launch.derived_from)
    budget = max_numel() // 4 if derived else None
    shape = draw(shapes(max_rank=draw(st.sampled_from([1, 2, 3, 5, 7])), max_elements=budget))
    seed = draw(st.integers(0, 2**31 - 1))
    args: dict = {}
    notes = []
    one_dtype = draw(dtypes_of(info.dtypes)) if derived else None
    for i, arg in enumerate(info.args):
        if arg.kind != "tensor":
            args[arg.name] = scalar_value(draw, arg)
            continue
        operand = draw(broadcast_operand(shape)) if not derived and draw(st.booleans()) else shape
        layout = draw(layouts(len(operand)))
        dtype = one_dtype if derived else draw(dtypes_of(info.dtypes))
        # integers now and then over their dtype's whole range, where sums and products wrap
        low, high = integer_range(dtype, arg.low, arg.high, wide=draw(st.booleans())) \
            if not dtype.is_floating_point else (arg.low, arg.high)
        args[arg.name] = make_tensor(operand, dtype, layout, low=low, high=high, seed=seed + i)
        notes.append(f"{arg.name}: {operand} {dtype} {layout}")
    args = accepted(info, args)
    tensors = [v for v in args.values() if isinstance(v, torch.Tensor)]
    shape = tuple(torch.broadcast_shapes(*(t.shape for t in tensors)))  # operands may drop dims
    # the result's dtype as torch gives it (an integer add's, a true division's float32)
    dtype = _result_dtype(info, args)
    # an input of another dtype is converted to a bfloat16 result before the math; the
    # interpreter rounds float32 to bfloat16 toward zero (torch and the GPU to nearest), which
    # that conversion and the store's make two ulps: such mixes are drawn in the GPU tier only
    assume(not (interpreting() and dtype == torch.bfloat16
                and any(t.dtype != dtype for t in tensors)))
    # an out= poisoned where it can be: NaN, else the dtype's largest value
    fill = math.nan if dtype.is_floating_point else True if dtype == torch.bool else \
        min(torch.iinfo(dtype).max, 2**53)
    outs = tuple(make_tensor(shape, dtype, draw(layouts(len(shape), allow_broadcast=False)),
                             fill=fill) for _ in info.outputs)
    return Case(args, outs, draw(knobs()), describe="; ".join(notes),
                layout_reference=_layout_reference(tensors))


def _result_dtype(info, args):
    result = info.reference(**args)
    return (result[0] if isinstance(result, tuple) else result).dtype


def _layout_reference(tensors):
    """The output of one torch element-wise op of the arity (its TensorIterator lays the result
    out as a fused element-wise op over the same operands must be laid out), or None."""
    # logical ops for bools, which torch.neg refuses
    if any(t.dtype == torch.bool for t in tensors):
        ops = {1: torch.logical_not, 2: torch.logical_or}
    else:
        ops = {1: torch.neg, 2: torch.add, 3: torch.addcmul}
    op = ops.get(len(tensors))
    # with mixed dtypes torch's CPU path copies inputs to the common dtype first, which changes
    # its layout (CUDA casts on the fly): no single answer there
    if op is None or len({t.dtype for t in tensors}) > 1:
        return None
    return op(*tensors)


def samples(info, make) -> dict[str, list[tuple]]:
    """Opcheck calls (``make``: specgen.testing.samples.Make): the first tensor dense,
    transposed and sliced; the others broadcast, full and 0-dim (away from 0: a divisor); out=
    into transposed outputs."""
    from specgen.testing.samples import default

    def call(first, others):
        tensors = iter([first, *others])
        return tuple(next(tensors) if a.kind == "tensor" else default(a) for a in info.args)

    count = sum(a.kind == "tensor" for a in info.args) - 1
    if info.launch.derived_from:   # a derived backward: tensors of one shape
        calls = [call(make.r(3, 5, g=True), [make.r(3, 5, g=True, lo=0.5)] * count),
                 call(make.t(3, 5, g=True), [make.r(3, 5, lo=0.5)] * count)]
    else:
        calls = [call(make.r(3, 5, g=True), [make.r(5, g=True, lo=0.5)] * count),
                 call(make.t(3, 5, g=True), [make.r(3, 5, lo=0.5)] * count),
                 call(make.sl(3, 5, g=True), [torch.tensor(1.5, device=make.device)] * count)]
    outs = tuple(make.out_t(3, 5) for _ in info.outputs)
    return {info.name: calls,
            f"{info.name}_out": [outs + call(make.t(3, 5), [make.r(5, lo=0.5)] * count)]}


def bench_cases(quick: bool) -> list:
    """The benchmark's rows (bench.harness.Case), bf16: memory-bound, judged against the copy
    bandwidth. --quick divides every element count by 16 (each dim of a square by 4)."""
    import torch.nn.functional as F

    from bench.harness import ours

    # Python functions rather than torch builtins, so torch.compile traces them as the others
    def add(x, y):
        return x + y

    n = 2**23 if quick else 2**27
    square, big = (1024, 2048) if quick else (4096, 8192)
    rows, cols = (1024 if quick else 16384), 4096
    return [
        _bench_case("add", [(n,), (n,)], lambda x, y: ours().add(x, y), add),
        _bench_case("add", [(square, square)] * 2, lambda x, y: ours().add(x, y), add),
        _bench_case("geglu = gelu_tanh(a)*b", [(n,), (n,)], lambda a, b: ours().geglu(a, b),
                    lambda a, b: F.gelu(a, approximate="tanh") * b),
        _bench_case('gelu(x, approximate="tanh")', [(n,)],
                    lambda x: ours().gelu(x, approximate="tanh"),
                    lambda x: F.gelu(x, approximate="tanh")),
        _bench_case("swiglu = silu(a)*b", [(n,), (n,)], lambda a, b: ours().swiglu(a, b),
                    lambda a, b: F.silu(a) * b),
        # x is contiguous, so x.t() makes the kernel read one operand column-major
        _bench_case("add(x.t(), y)", [(big, big)] * 2, lambda x, y: ours().add(x.t(), y),
                    lambda x, y: x.t() + y),
        _bench_case("add(x, bias)", [(rows, cols), (cols,)], lambda x, b: ours().add(x, b), add),
    ]


def _bench_case(op: str, input_shapes: list[tuple[int, ...]], specgen, eager):

    from bench.harness import Case

    dtype = torch.bfloat16
    numels = [math.prod(shape) for shape in input_shapes]
    return Case(family="pointwise", op=op,
                shape=", ".join(dict.fromkeys(_shape_label(shape) for shape in input_shapes)),
                dtype=dtype,
                make_inputs=lambda: tuple(torch.randn(shape, device="cuda", dtype=dtype)
                                          for shape in input_shapes),
                specgen=specgen, eager=eager,
                # the output has as many elements as the largest (broadcast) input
                bytes_moved=dtype.itemsize * (sum(numels) + max(numels)))


def _shape_label(shape: tuple[int, ...]) -> str:
    # long power-of-two vectors read better as 2^k ("2^27", not "134217728")
    if len(shape) == 1 and shape[0] >= 2**16 and shape[0].bit_count() == 1:
        return f"2^{shape[0].bit_length() - 1}"
    return "x".join(map(str, shape))


FAMILY = Family(
    name="pointwise", parse_body=parse_body, body_names=body_names, plan=plan, scaffold=scaffold,
    unread_args=unread_args,
    generated_names=GENERATED_NAMES, generated_prefixes=GENERATED_PREFIXES,
    operator_suffixes=OPERATOR_SUFFIXES,
    derive="specgen.families.pointwise_backward:derived_specs",
    draw_case=draw_case, samples=samples, bench=bench_cases)

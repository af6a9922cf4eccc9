"""Pointwise family: N-ary element-wise ops with broadcasting, any strides, fused expressions.

Spec tables: ``[compute]`` (one output per key, in order; later outputs may read earlier ones),
``[tuning]`` (``BLOCK``, ``TILE``, ``num_warps``) and ``[schedule]`` (``launch``).
"""

from __future__ import annotations

import ast
import itertools
from dataclasses import dataclass

from specgen import promotion
from specgen.expr import Symbol, emit, helpers, parse_expr
from specgen.families.contract import Family
from specgen.families.common import (CommonPlan, check_name, common_plan, power_of_two_list,
                                     symbols_of, tile_pairs, warps_list, wrap)
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
    def pointers(self) -> str:
        return ", ".join(t.ptr for t in self.inputs + self.outputs)

    @property
    def sizes(self) -> str:
        return ", ".join([f"size_{d}" for d in self.outer_dims] + ["size_m", "size_n"])

    def strides_of(self, tensor: Tensor) -> str:
        return ", ".join(f"{tensor.name}_stride_{d}" for d in [*self.outer_dims, "m", "n"])

    def base_expr(self, tensor: Tensor) -> str:
        """``x_base = i_0 * x_stride_0 + ...``, wrapped at about 100 columns."""
        terms = [f"i_{d} * {tensor.name}_stride_{d}" for d in self.outer_dims]
        return wrap(f"{tensor.name}_base = ", terms, indent=8)

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
        outputs.append(OutputTensor(o.name, emit(tree, names), ast.unparse(o.expr.tree), read_later))
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


FAMILY = Family(
    name="pointwise", parse_body=parse_body, body_names=body_names, plan=plan, scaffold=scaffold,
    generated_names=GENERATED_NAMES, generated_prefixes=GENERATED_PREFIXES,
    operator_suffixes=OPERATOR_SUFFIXES,
    derive="specgen.families.pointwise_backward:derived_specs",
    cases="specgen.testing.pointwise:pointwise_cases",
    samples="specgen.testing.pointwise:pointwise_samples", bench="bench.pointwise:cases")

"""Convolution family: a 2-D convolution as an implicit GEMM, with a fused epilogue over the
float32 accumulator ``acc``.

The GEMM's rows are the output pixels (batch x P x Q), its columns a group's output channels, its
reduction a group's input channels x R x S; the kernel computes each input tile's addresses from
the output pixels and the filter tap (implicit GEMM: the unrolled input is never built).

Operands are identified by their ``dims``: the input ``N, C, H, W`` (torch's conv2d also takes
it unbatched, ``C, H, W``), the weight ``K, C, R, S`` (K output channels, C input channels of a
group, an R x S filter), epilogue operands ``K`` (one value per output channel: a bias) or
``N, K, P, Q`` (the output's shape, broadcast as torch broadcasts: a residual).

Spec tables: ``[conv]`` (``args``: which of torch's geometry arguments, stride, padding,
dilation and groups, the op takes after the spec's own, in that order; the others are fixed at
torch's defaults), ``[epilogue]`` (as the matmul family's: one output per key over ``acc``, the
epilogue operands, scalars and earlier outputs; ``dtype``; ``promote``), ``[schedule]``
(``swizzle``) and ``[tuning]`` (the config space, as the matmul family's).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from specgen.errors import Where
from specgen.expr import emit, helpers
from specgen.families.common import (ArgPlan, CommonPlan, EpilogueOutput, EpiloguePlan,
                                     TensorRole, common_plan, tile_config)
from specgen.families.contract import Family
from specgen.families.matmul import parse_config_space, parse_epilogue, parse_promote
from specgen.model import OpSpec, TensorArg
from specgen.table import Table, parse_list

INPUT_DIMS = ("N", "C", "H", "W")
WEIGHT_DIMS = ("K", "C", "R", "S")
EPILOGUE_DIMS = (("K",), ("N", "K", "P", "Q"))
# torch's geometry arguments, in its order: (ArgInfo kind, torch's default). "pair": an int or
# two (height, width); "padding": an int, two, "same" or "valid"; the registered operator takes
# stride and dilation as two ints, padding as four (top, bottom, left, right: "same" pads an
# even filter unevenly) and groups as an int (runtime/conv.py, spell_out)
GEOMETRY = {"stride": ("pair", 1), "padding": ("padding", 0), "dilation": ("pair", 1),
            "groups": ("groups", 1)}
SWIZZLES = ("grouped", "none")



# The default config space (BLOCK_M output pixels x BLOCK_N output channels, BLOCK_K input
# channels a step); the first is what the interpreter runs unless a test forces another. Blocks
# are clamped to the problem at launch (runtime/conv.py, prune_configs): a group of 32 channels
# runs every config with 32-channel blocks.
DEFAULT_CONFIGS = (
    tile_config(128, 128, 64, warps=8, stages=3),
    tile_config(128, 64, 64, warps=4, stages=4),
    tile_config(128, 128, 32, warps=4, stages=4),
    tile_config(256, 64, 64, warps=8, stages=3),
    tile_config(256, 128, 64, warps=8, stages=3),
    tile_config(64, 128, 64, warps=4, stages=4),
    tile_config(128, 256, 64, warps=8, stages=3),
    tile_config(64, 64, 64, warps=4, stages=3),
)
# names the generated module binds for itself (tests/test_spec_errors.py checks the set against
# what the template binds)
GENERATED_NAMES = frozenset({
    "conv_rt",  # its imports
    "acc", "batch_id", "c0", "c_blocks", "channel", "first_m", "group", "group_rows", "in_bounds",
    "in_h", "in_w", "input_rows", "out_h", "out_w", "pixel", "programs_in_group", "r", "s", "step",
    "tap", "tiles", "tiles_m", "tiles_n", "conv_group", "h_start", "w_start", "taps",
    "stride_h", "stride_w", "pad_h", "pad_w", "dilation_h", "dilation_w", "batch", "height",
    "width", "channels", "out_channels", "out_row", "out_col", "out_pixels",
    "tiles_h", "tiles_w", "patch", "image", "row0", "col0", "tap_stride",  # the TMA kernel's
    # the channels-last repack kernel's
    "bid", "dst_ptr", "pixels", "src_ptr", "src_stride_b", "src_stride_c",
})
GENERATED_PREFIXES: tuple[str, ...] = ("offs_", "pid_", "mask_")
# what the template appends to a tensor's or output's name
DERIVED_SUFFIXES = ("ptr", "tile", "base", "stride", "ptrs")


@dataclass(frozen=True)
class Operand(TensorRole):
    """A tensor argument in the role its dims give it."""

    @property
    def per_channel(self) -> bool:
        return self.dims == ("K",)

    @property
    def stride_names(self) -> tuple[str, ...]:
        return tuple(f"{self.name}_stride_{d.lower()}" for d in self.dims)


@dataclass(frozen=True)
class ConvBody:
    input: Operand
    weight: Operand
    epilogue_inputs: tuple[Operand, ...]
    outputs: tuple
    out_dtype: str | None
    promoted: tuple[str, ...]
    geometry: tuple[str, ...]       # the geometry arguments the op takes, in torch's order
    swizzle: str
    configs: tuple[dict, ...]


def _classify(arg: TensorArg, where: Where) -> Operand:
    known = (INPUT_DIMS, WEIGHT_DIMS, *EPILOGUE_DIMS)
    if tuple(arg.dims) not in known:
        shown = ", ".join("[" + ", ".join(f'"{d}"' for d in k) + "]" for k in known)
        raise where.child("dims").error(
            f"expected one of {shown} (the input, the weight, a per-channel operand, an "
            f"output-shaped operand), got {list(arg.dims)}")
    if tuple(arg.dims) in (INPUT_DIMS, WEIGHT_DIMS) and arg.optional:
        raise where.child("optional").error("the input and the weight cannot be optional")
    return Operand(arg.name, tuple(arg.dims), arg.optional)


def body_names(body: ConvBody) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """The names the body declares, with their keys: the outputs and the geometry arguments."""
    return (*((o.name, ("epilogue", o.name)) for o in body.outputs),
            *((g, ("conv", "args")) for g in body.geometry))


def parse_body(top: Table, spec_args: tuple, name: str) -> ConvBody:
    args_where = top.where.child("args")
    found: dict[tuple[str, ...], Operand] = {}
    epilogue_inputs = []
    for arg in spec_args:
        if not isinstance(arg, TensorArg):
            continue
        if arg.dtypes:
            raise args_where.child(arg.name).child("dtypes").error(
                "the convolution family's tensors take the op's dtypes")
        operand = _classify(arg, args_where.child(arg.name))
        if operand.dims in (INPUT_DIMS, WEIGHT_DIMS):
            if operand.dims in found:
                role = "input" if operand.dims == INPUT_DIMS else "weight"
                raise args_where.child(arg.name).error(f"a second {role} operand; a convolution "
                                                       f"has one")
            found[operand.dims] = operand
        else:
            epilogue_inputs.append(operand)
    if INPUT_DIMS not in found or WEIGHT_DIMS not in found:
        raise args_where.error('a convolution needs an input with dims ["N", "C", "H", "W"] and '
                               'a weight with dims ["K", "C", "R", "S"]')
    conv = top.pop_table("conv", required=False) or Table({}, top.where.child("conv"))
    geometry = _parse_geometry(conv, spec_args)
    conv.finish()
    epilogue = top.pop_table("epilogue")
    x, w = found[INPUT_DIMS], found[WEIGHT_DIMS]
    promoted = parse_promote(epilogue, x, w, epilogue_inputs)
    outputs, out_dtype = parse_epilogue(epilogue, spec_args, (x.name, w.name))
    if out_dtype is not None and out_dtype not in ("float16", "bfloat16", "float32"):
        raise epilogue.where.child("dtype").error(
            f"expected float16, bfloat16 or float32, got '{out_dtype}'")
    schedule = top.pop_table("schedule", required=False) or Table({}, top.where.child("schedule"))
    swizzle = schedule.pop_choice("swizzle", SWIZZLES, SWIZZLES[0])
    schedule.finish()
    tuning = top.pop_table("tuning", required=False) or Table({}, top.where.child("tuning"))
    configs = parse_config_space(tuning, "grouped" if swizzle == "grouped" else "none",
                                 DEFAULT_CONFIGS)
    tuning.finish()
    return ConvBody(x, w, tuple(epilogue_inputs), outputs, out_dtype, promoted, geometry,
                    swizzle, configs)


def _parse_geometry(conv: Table, spec_args: tuple) -> tuple[str, ...]:
    """``[conv] args``: some of stride, padding, dilation, groups, in torch's order."""
    where = conv.where.child("args")
    names = parse_list(conv.pop_any("args", []), str, where)
    order = list(GEOMETRY)
    for name in names:
        if name not in GEOMETRY:
            raise where.error(f"'{name}' is not a geometry argument; expected some of "
                              f"{', '.join(order)}")
    if len(set(names)) != len(names):
        raise where.error("names an argument twice")
    if list(names) != sorted(names, key=order.index):
        raise where.error(f"expected torch's order ({', '.join(order)}), got {', '.join(names)}")
    declared = {a.name for a in spec_args}
    for name in names:
        if name in declared:
            raise where.error(f"'{name}' is declared in [args] too: the family adds the geometry "
                              f"arguments")
    return tuple(names)


@dataclass(frozen=True)
class OutputTensor(EpilogueOutput):
    @property
    def stride_names(self) -> tuple[str, ...]:
        return tuple(f"{self.name}_stride_{d}" for d in "nkpq")


@dataclass(frozen=True)
class ConvPlan(CommonPlan, EpiloguePlan):
    input: Operand = None
    weight: Operand = None
    epilogue_inputs: tuple[Operand, ...] = ()
    outputs: tuple[OutputTensor, ...] = ()
    out_dtype: str | None = None
    geometry: tuple[str, ...] = ()
    swizzle: str = "grouped"
    configs: tuple[dict, ...] = ()
    helpers: tuple[str, ...] = ()

    @property
    def epilogue_dims(self) -> tuple[tuple[str, tuple[str, ...]], ...]:
        return tuple((o.name, o.dims) for o in self.epilogue_inputs)

    @property
    def optional_names(self) -> tuple[str, ...]:
        return tuple(o.name for o in self.optional_inputs)



def plan(spec: OpSpec) -> ConvPlan:
    body: ConvBody = spec.body
    _check_reference_names(spec, body.geometry)
    names = {c.name: c.constexpr for c in spec.choices}
    outputs = tuple(OutputTensor(o.name, emit(o.expr, names)) for o in body.outputs)
    common = common_plan(spec, tuple(o.name for o in body.outputs), promoted=body.promoted)
    # the geometry arguments follow the spec's own, with torch's defaults
    extra = tuple(ArgPlan(g, GEOMETRY[g][0], repr(GEOMETRY[g][1])) for g in body.geometry)
    infos = tuple(f'rt.ArgInfo("{g}", "{GEOMETRY[g][0]}", default={GEOMETRY[g][1]!r})'
                  for g in body.geometry)
    fields = dict(common.__dict__, args=common.args + extra, arg_infos=common.arg_infos + infos,
                  uncast=body.promoted)
    called = set().union(*(helpers(o.expr) for o in body.outputs))
    return ConvPlan(**fields, input=body.input, weight=body.weight,
                    epilogue_inputs=body.epilogue_inputs, outputs=outputs,
                    out_dtype=body.out_dtype, geometry=body.geometry, swizzle=body.swizzle,
                    configs=body.configs, helpers=tuple(sorted(called)))


def _check_reference_names(spec: OpSpec, geometry: tuple[str, ...]) -> None:
    """The reference may name the geometry arguments the op takes, not the others (which its
    generated function would not bind)."""
    used = {n.id for n in ast.walk(ast.parse(spec.reference, mode="eval"))
            if isinstance(n, ast.Name)}
    where = Where(spec.source.path).child("op").child("reference")
    for name in GEOMETRY:
        if name in used and name not in geometry and name not in {a.name for a in spec.args}:
            raise where.error(f"'{name}' is not an argument of the op: list it in [conv] args, "
                              f"or leave it out (torch's default, {GEOMETRY[name][1]!r})")
    for name in geometry:
        if name not in used:
            raise where.error(f"argument '{name}' ([conv] args) is not used by the reference, so "
                              f"no test could check what the op does with it")


def scaffold(name: str) -> str:
    return f'''# A convolution with a fused epilogue: see docs/families.md, "Convolution family".
[op]
name = "{name}"
family = "conv"
doc = "relu(conv2d(input, weight) + bias)"
reference = "torch.relu(ref.conv2d(input, weight, bias, stride, padding))"
autocast = "lower"

[args]
input = {{ kind = "tensor", dims = ["N", "C", "H", "W"] }}
weight = {{ kind = "tensor", dims = ["K", "C", "R", "S"] }}
bias = {{ kind = "tensor", dims = ["K"], optional = true }}

[conv]
args = ["stride", "padding"]   # torch's geometry arguments the op takes (stride, padding,
                               # dilation, groups); the others are torch's defaults

[epilogue]
out = "relu(acc + bias)"
'''


FAMILY = Family(
    name="conv", parse_body=parse_body, body_names=body_names, plan=plan, scaffold=scaffold,
    generated_names=GENERATED_NAMES, generated_prefixes=GENERATED_PREFIXES,
    derived_suffixes=DERIVED_SUFFIXES, reference_names=tuple(GEOMETRY),
    cases="specgen.testing.conv:conv_cases", samples="specgen.testing.conv:conv_samples",
    bench="bench.conv:cases")

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
from typing import Any

import torch

from specgen.errors import Where
from specgen.expr import emit, helpers
from specgen.families.common import (ArgPlan, CommonPlan, EpilogueOutput, EpiloguePlan,
                                     TensorRole, common_plan, scalar_args, tile_config, unread)
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
    tile_config(128, 64, 64, warps=4, stages=3),
    tile_config(128, 128, 32, warps=4, stages=4),
    tile_config(256, 64, 64, warps=8, stages=3),
    tile_config(256, 128, 64, warps=8, stages=3),
    tile_config(64, 128, 64, warps=4, stages=4),
    tile_config(128, 256, 64, warps=8, stages=3),
    tile_config(64, 64, 64, warps=4, stages=3),
    tile_config(128, 128, 64, warps=4, stages=4),
)
# names the generated module binds for itself (tests/test_spec_errors.py checks the set against
# what the template binds)
GENERATED_NAMES = frozenset({
    "conv_rt",  # its imports
    "acc", "batch_id", "c0", "c_blocks", "channel", "first_m", "group", "group_rows", "in_bounds",
    "in_h", "in_w", "input_rows", "out_h", "out_w", "pixel", "programs_in_group", "r", "s", "step",
    "tap", "tap_r", "tap_s", "tap_offset", "tiles", "tiles_m", "tiles_n", "conv_group", "h_start",
    "w_start", "taps",
    "stride_h", "stride_w", "pad_h", "pad_w", "dilation_h", "dilation_w", "batch", "height",
    "width", "channels", "out_channels", "out_row", "out_col", "out_pixels",
    "tiles_h", "tiles_w", "patch", "image", "row0", "col0", "tap_stride",  # the TMA kernel's
    "images", "pixels_per_image",  # the flat kernel's
    # the channels-last repack kernel's
    "bid", "dst_ptr", "pixels", "src_ptr", "src_stride_b", "src_stride_c",
})
GENERATED_PREFIXES: tuple[str, ...] = ("offs_", "pid_", "mask_")
# what the template appends to a tensor's or output's name
DERIVED_SUFFIXES = ("ptr", "tile", "base", "stride", "ptrs", "window")


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


def unread_args(body: ConvBody, spec_args: tuple) -> tuple[tuple[str, str], ...]:
    """The epilogue operands and scalars no epilogue expression reads (the input and weight
    enter through acc)."""
    return unread([*body.epilogue_inputs, *scalar_args(spec_args)],
                  (o.expr for o in body.outputs), "no [epilogue] expression")


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
    """``[conv] args``: some of stride, padding, dilation, groups, in torch's order (none: the
    op convolves with torch's defaults)."""
    where = conv.where.child("args")
    raw = conv.pop_any("args", [])
    names = parse_list(raw, str, where) if raw != [] else ()
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
    generated function would not bind), and passes the padding to ref.conv2d only."""
    nodes = list(ast.walk(ast.parse(spec.reference, mode="eval")))
    used = {n.id for n in nodes if isinstance(n, ast.Name)}
    where = Where(spec.source.path).child("op").child("reference")
    for name in GEOMETRY:
        if name in used and name not in geometry and name not in {a.name for a in spec.args}:
            raise where.error(f"'{name}' is not an argument of the op: list it in [conv] args, "
                              f"or leave it out (torch's default, {GEOMETRY[name][1]!r})")
    for name in geometry:
        if name not in used:
            raise where.error(f"argument '{name}' ([conv] args) is not used by the reference, so "
                              f"no test could check what the op does with it")
    if "padding" in geometry:
        for node in nodes:
            passed = isinstance(node, ast.Call) and any(
                isinstance(n, ast.Name) and n.id == "padding"
                for n in (*node.args, *(k.value for k in node.keywords)))
            if (passed and isinstance(node.func, ast.Attribute) and node.func.attr == "conv2d"
                    and ast.unparse(node.func.value) != "ref"):
                raise where.error(
                    f"{ast.unparse(node.func)} does not take the padding the op hands its "
                    f"reference (four ints: top, bottom, left, right, as the registered operator "
                    f"spells it out); call ref.conv2d, which takes torch's forms and that one")


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
# residual = {{ kind = "tensor", dims = ["N", "K", "P", "Q"] }}  # the output's shape, broadcast
#   (above bias: an argument without a default cannot follow an optional one)
bias = {{ kind = "tensor", dims = ["K"], optional = true }}

[conv]
args = ["stride", "padding"]   # torch's geometry arguments the op takes (stride, padding,
                               # dilation, groups); the others, or all without [conv], torch's
                               # defaults; the reference takes them through ref.conv2d

[epilogue]
out = "relu(acc + bias)"
'''


# --- Its property tests, opcheck samples and benchmark cases -------------------------------------
# The tests and the bench call these (``FAMILY``'s draw_case, samples and bench); they import
# hypothesis, specgen.testing and bench where they run: the generator needs none of them.

SMALL_CONFIGS = (
    {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 1, "num_warps": 4, "num_stages": 2},
    {"BLOCK_M": 32, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 2, "num_warps": 4, "num_stages": 2},
    {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 3, "num_warps": 4, "num_stages": 3},
    {"BLOCK_M": 64, "BLOCK_N": 32, "BLOCK_K": 16, "GROUP_M": 8, "num_warps": 4, "num_stages": 3},
)


def _kinds(info) -> dict[str, str]:
    return {a.name: a.kind for a in info.args}


def _role(info, dims: tuple[str, ...]) -> str:
    return next(a.name for a in info.args if a.kind == "tensor" and tuple(a.dims) == dims)


def four_pads(padding: Any, kernel: tuple[int, int], dilation: tuple[int, int]) -> list[int]:
    """torch's padding as the registered operator takes it: (top, bottom, left, right)."""
    if padding == "valid":
        return [0, 0, 0, 0]
    if padding == "same":
        pads = []
        for size, d in zip(kernel, dilation):
            total = d * (size - 1)
            pads += [total // 2, total - total // 2]
        return pads
    h, w = (padding, padding) if isinstance(padding, int) else padding
    return [h, h, w, w]


def _pair(value: Any) -> tuple[int, int]:
    return (value, value) if isinstance(value, int) else tuple(value)


def draw_case(draw, info):
    """A property-test call: stride, padding (ints, pairs, "same", "valid"), dilation,
    groups (depthwise included), filters of 1 to 7, non-square inputs, batched and unbatched
    inputs, NCHW, channels-last and arbitrary layouts of the input and the weight, epilogue
    operands.

    Every case forces a strategy (the implicit GEMM on the tensors as they are, after a
    channels-last repack, the flat kernel where the filter is 1 x 1 at stride 1 without
    padding, or the depthwise kernel where a group has one input channel) or leaves it to the
    launcher, and forces a config: one of the spec's space by number, or a
    small tile config outside it so that small images span several tiles.
    """
    from hypothesis import strategies as st

    from specgen.runtime import interpreting
    from specgen.testing.core import (Case, broadcast_operand, knobs, layouts, make_tensor,
                                      matmul_tolerances)

    kinds = _kinds(info)
    x_name, w_name = _role(info, ("N", "C", "H", "W")), _role(info, ("K", "C", "R", "S"))
    overrides = draw(knobs())
    if draw(st.booleans()):
        overrides["config"] = draw(st.sampled_from(SMALL_CONFIGS))
    # under the interpreter every program runs in numpy: small images and channel counts
    small = interpreting()
    groups = 1
    depthwise = False
    if "groups" in kinds:
        depthwise = draw(st.integers(0, 3)) == 0
        groups = draw(st.integers(1, 4 if small else 8))
    c_group = 1 if depthwise else draw(st.integers(1, 20 if small else 70))
    k_group = draw(st.integers(1, 3)) if depthwise else draw(st.integers(1, 20 if small else 70))
    kh, kw = draw(st.integers(1, 7)), draw(st.integers(1, 7))
    stride = draw(st.sampled_from([1, 1, 2, 3, (1, 2), (2, 1)])) if "stride" in kinds else 1
    dilation = draw(st.sampled_from([1, 2, (1, 2), (2, 1)])) if "dilation" in kinds else 1
    padding: Any = 0
    if "padding" in kinds:
        forms = [0, 1, 2, (0, 1), (3, 2), "valid"] + (["same"] if stride == 1 else [])
        padding = draw(st.sampled_from(forms))
    if draw(st.integers(0, 3)) == 0:
        # a pointwise (1 x 1) convolution at stride 1 without padding, the flat kernel's, in
        # about one case of four
        kh = kw = 1
        stride, padding = 1, 0
    (sh, sw), (dh, dw) = _pair(stride), _pair(dilation)
    pads = four_pads(padding, (kh, kw), (dh, dw))
    # the input at least the dilated filter once padded; non-square
    least_h = max(1, dh * (kh - 1) + 1 - pads[0] - pads[1])
    least_w = max(1, dw * (kw - 1) + 1 - pads[2] - pads[3])
    height = least_h + draw(st.integers(0, 6 if small else 20))
    width = least_w + draw(st.integers(0, 6 if small else 20))
    unbatched = draw(st.integers(0, 5)) == 0
    batch = draw(st.integers(0 if draw(st.integers(0, 7)) == 0 else 1, 2 if small else 4))
    channels = c_group * groups
    out_channels = k_group * groups
    # "tma" where the TMA kernel can take the call (stride 1, one group, Hopper: the GPU tier),
    # else the GEMM kernel after the same copies
    strategy = draw(st.sampled_from([None, "gemm", "gemm_repack", "flat", "tma"]
                                    + (["depthwise"] if c_group == 1 else [])))
    if strategy is not None:
        overrides["strategy"] = strategy

    dtypes = [d for d in info.dtypes if d != torch.bfloat16 or not interpreting()]
    dtype = draw(st.sampled_from(dtypes))
    seed = draw(st.integers(0, 2**31 - 1))
    out_h = (height + pads[0] + pads[1] - dh * (kh - 1) - 1) // sh + 1
    out_w = (width + pads[2] + pads[3] - dw * (kw - 1) - 1) // sw + 1
    out_shape = (out_channels, out_h, out_w) if unbatched else (batch, out_channels, out_h, out_w)
    args: dict[str, Any] = {}
    notes = [f"groups={groups} C/g={c_group} K/g={k_group} filter={kh}x{kw} stride={stride} "
             f"padding={padding} dilation={dilation} input {height}x{width}"]
    for i, arg in enumerate(info.args):
        if arg.kind != "tensor":
            continue
        if arg.optional and draw(st.integers(0, 2)) == 0:
            args[arg.name] = None
            continue
        if arg.name == x_name:
            shape = (channels, height, width) if unbatched else (batch, channels, height, width)
        elif arg.name == w_name:
            shape = (out_channels, c_group, kh, kw)
        elif tuple(arg.dims) == ("K",):
            shape = (out_channels,)
        else:
            shape = draw(broadcast_operand(out_shape))
        # NCHW, channels-last (order N, H, W, C) or any drawn layout
        form = draw(st.sampled_from(["contiguous", "channels_last", "drawn"]))
        layout = draw(layouts(len(shape), allow_broadcast=False))
        own = draw(st.sampled_from(info.dtypes)) if arg.promotes else dtype
        tensor = make_tensor(shape, own, layout if form == "drawn" else type(layout).contiguous(
            len(shape)), low=arg.low, high=arg.high, seed=seed + i)
        if form == "channels_last" and tensor.dim() == 4:
            tensor = tensor.to(memory_format=torch.channels_last)
        args[arg.name] = tensor
        notes.append(f"{arg.name}: {shape} {own} {form} {layout if form == 'drawn' else ''}")
    geometry = {"stride": stride, "padding": padding, "dilation": dilation, "groups": groups}
    op_args = dict(args)
    for name, value in geometry.items():
        if name in kinds:
            args[name] = value
            op_args[name] = (pads if name == "padding" else
                             list(_pair(value)) if name in ("stride", "dilation") else value)
    tf32 = dtype == torch.float32 and not interpreting() and torch.backends.cudnn.allow_tf32
    # the gradients sum other terms: the input's over K/groups x R x S, the weight's over
    # N x P x Q (torch's convolution backward, rounded to the dtype)
    sums = max(c_group * kh * kw, k_group * kh * kw, max(batch, 1) * out_h * out_w)
    return Case(args, (), overrides, describe="; ".join(notes),
                tolerances=matmul_tolerances(c_group * kh * kw, tf32=tf32),
                grad_tolerances=matmul_tolerances(sums, tf32=tf32), op_args=op_args)


def samples(info, make) -> dict[str, list[tuple]]:
    """Opcheck calls (``make``: specgen.testing.samples.Make): an NCHW call with every argument,
    a channels-last one without the optional operands, and a grouped one where the op takes
    groups; geometry spelled out as the operator takes it."""
    kinds = _kinds(info)

    def call(channels_last: bool, full: bool, groups: int) -> tuple:
        args = []
        for a in info.args:
            if a.kind == "pair":
                args.append([2, 1] if a.name == "stride" and full else [1, 1])
            elif a.kind == "padding":
                args.append([1, 0, 1, 2] if full else [0, 0, 0, 0])
            elif a.kind == "groups":
                args.append(groups)
            elif a.kind != "tensor":
                args.append(a.default)
            elif a.optional and not full:
                args.append(None)
            else:
                dims = tuple(a.dims)
                shape = {("N", "C", "H", "W"): (2, 4, 6, 5), ("K", "C", "R", "S"): (6, 4 // groups, 3, 2),
                         ("K",): (6,)}.get(dims)
                if shape is None:
                    shape = (2, 6, 1, 1)     # an output-shaped operand, broadcast
                t = make.r(*shape)
                if channels_last and t.dim() == 4:
                    t = t.to(memory_format=torch.channels_last)
                args.append(t.requires_grad_(True))
        return tuple(args)

    calls = [call(False, True, 1), call(True, False, 1)]
    if "groups" in kinds:
        calls.append(call(False, True, 2))
    return {info.name: calls}


# the benchmark's cells: (batch, channels, height, width, out channels, filter)
BENCH_CELLS = ((32, 64, 56, 56, 64, 3), (32, 256, 14, 14, 256, 3), (8, 128, 128, 128, 128, 3),
               (32, 64, 56, 56, 256, 1))


def bench_cases(quick: bool) -> list:
    """The benchmark's rows (bench.harness.Case), bf16, in TFLOP/s (2 * N * K * P * Q * C/groups
    * R * S over the time).

    cuDNN is the peer: eager ``F.conv2d`` calls it, on NCHW tensors (which it transposes
    internally on Hopper) and on channels-last ones (input and weight, as
    ``model.to(memory_format=torch.channels_last)`` makes them). The fused op is timed against
    cuDNN's convolution followed by torch's bias add and silu. --quick quarters the batch.
    """
    import torch.nn.functional as F

    from bench.harness import ours

    # Python functions rather than torch builtins, so torch.compile traces them as eager code
    def conv(n, c, h, w, k, r, channels_last):
        return _bench_case(f"conv2d {r}x{r} (eager: cuDNN)", n, c, h, w, k, r, channels_last,
                           False, lambda x, wt: ours().conv2d(x, wt, None, 1, r // 2),
                           lambda x, wt: F.conv2d(x, wt, None, 1, wt.shape[-1] // 2))

    def conv_bias_silu(n, c, h, w, k, r, channels_last):
        return _bench_case(
            f"conv2d_bias_silu {r}x{r} (eager: cuDNN + bias + silu)", n, c, h, w, k, r,
            channels_last, True, lambda x, wt, b: ours().conv2d_bias_silu(x, wt, b, 1, r // 2),
            lambda x, wt, b: F.silu(F.conv2d(x, wt, None, 1, wt.shape[-1] // 2)
                                    + b[:, None, None]))

    # channels-last first: `specgen tune` searches a kernel at the first case that launches it at
    # its key, and an NCHW call of 3 x 3 filters launches the channels-last call's kernel at the
    # same key after copying its input, which leaves that input in L2, where the configs time
    # alike (docs/performance.md, 001o)
    channels_last_first = (True, False)
    rows = []
    for n, c, h, w, k, r in BENCH_CELLS:
        n = max(1, n // 4) if quick else n
        for channels_last in channels_last_first:
            rows.append(conv(n, c, h, w, k, r, channels_last))
    for channels_last in channels_last_first:
        n, c, h, w, k, r = BENCH_CELLS[0]
        rows.append(conv_bias_silu(max(1, n // 4) if quick else n, c, h, w, k, r, channels_last))
    return rows


def _bench_case(op: str, n: int, c: int, h: int, w: int, k: int, r: int, channels_last: bool,
                bias: bool, specgen, eager):
    from bench.harness import Case

    dtype = torch.bfloat16
    fmt = torch.channels_last if channels_last else torch.contiguous_format

    def make_inputs():
        x = torch.randn(n, c, h, w, device="cuda", dtype=dtype).to(memory_format=fmt)
        weight = (torch.randn(k, c, r, r, device="cuda", dtype=dtype) / (c * r * r) ** 0.5)
        inputs = (x, weight.to(memory_format=fmt))
        return inputs + ((torch.randn(k, device="cuda", dtype=dtype),) if bias else ())

    elements = n * c * h * w + k * c * r * r + n * k * h * w + (k if bias else 0)
    return Case(family="conv", op=op,
                shape=f"N{n} C{c} {h}x{w} K{k} {'channels-last' if channels_last else 'NCHW'}",
                dtype=dtype, make_inputs=make_inputs, specgen=specgen, eager=eager,
                bytes_moved=dtype.itemsize * elements, flops=2 * n * k * h * w * c * r * r)


FAMILY = Family(
    name="conv", parse_body=parse_body, body_names=body_names, plan=plan, scaffold=scaffold,
    generated_names=GENERATED_NAMES, generated_prefixes=GENERATED_PREFIXES,
    derived_suffixes=DERIVED_SUFFIXES, reference_names=tuple(GEOMETRY), unread_args=unread_args,
    draw_case=draw_case, samples=samples, bench=bench_cases)

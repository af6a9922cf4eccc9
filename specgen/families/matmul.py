"""Matmul family: C = A @ B with a fused epilogue over the float32 accumulator ``acc``.

Operands are identified by their ``dims``: the A operand has ``M, K``, the B operand ``K, N`` (or
``N, K``, a linear weight), epilogue operands ``N`` (a row vector such as a bias), ``M`` (a column
vector) or ``M, N`` (a residual, broadcast like torch). A leading ``"..."`` adds batch dims that
broadcast as in ``torch.matmul``; a leading ``"B"`` one batch dim that must match (``torch.bmm``).

Spec tables: ``[epilogue]`` (one output per key, over ``acc``, the epilogue operands, scalars and
earlier outputs; ``dtype`` sets the output dtype, default the inputs'; ``promote`` names the
epilogue operands that join by torch's type promotion rather than the matmul's one dtype), ``[schedule]``
(``swizzle``, ``split_k``) and ``[tuning]`` (the config space the autotuner searches: an
explicit ``configs`` list, or lists whose product is the space).

A quantized B operand declares ``[dequant]``: its integer storage (its own ``dtypes``, ``bits``
per element packed along K, low bits first), ``value``, the weight as an expression over the
unpacked integer ``q`` and scale operands with dims ``N`` (one per output channel) or ``N, G``
(one per channel and group of ``group`` K elements). The planner applies the value to each B
tile inside the K loop, scales each K block's product where the value is linear in q, or, where
it is ``q`` times per-channel factors, multiplies the accumulator by them after the loop
(DEQUANT_MODES) (docs/families.md, "Matmul family", quantized weights).
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import itertools
import math
from dataclasses import dataclass
from typing import Any

import torch

from specgen.errors import Where
from specgen.expr import Expr, Symbol, emit, helpers, parse_expr, quoted
from specgen.families.common import (MAX_TILE, MAX_WARPS, CommonPlan, EpilogueOutput,
                                     EpiloguePlan, TensorRole, check_name, common_plan, int_list,
                                     scalar_args, symbols_of, tile_config, unread)
from specgen.families.contract import Family
from specgen.model import DEFAULT_DTYPES as DTYPES, OpSpec, Output, TensorArg
from specgen.quant import GROUP_SIZES, is_group_size
from specgen.table import Table, check_type, parse_list

SWIZZLES = ("grouped", "swizzle2d", "none")
# [epilogue]'s own keys, beside its outputs
EPILOGUE_KEYS = ("dtype", "promote")
SPLIT_K_MODES = ("auto", "atomic", "off")
# batch dims after folding and collapsing that a "..." kernel walks (torch.matmul broadcasting
# leaves at most this many that cannot be merged in practice; more is a clear error at launch)
BROADCAST_BATCH_RANK = 3
# names the generated module binds for itself, in its kernels and host functions: a spec that
# declared one would shadow it or be shadowed (an entry ending in "_" stands for its numbered
# forms; tests/test_spec_errors.py checks the set against what the template binds)
GENERATED_NAMES = frozenset({
    "matmul_rt",  # its imports
    "acc", "batch", "batch_id", "bid", "col", "col0", "first_m", "group", "group_rows", "k",
    "k_start", "programs_in_group", "row", "row0", "slot", "tiles", "work", "ws_ptr",
    "m", "n", "rest", "tile",  # the kernels' names the shipped specs' modules do not show
    "counter_ptr", "slots", "ticket", "ticket_ptr",  # split-K's workspace slots and tickets
    "q", "group_id", "block",  # a quantized B's integers, their group, a K block's product
    "products", "group_products", "groups",  # the GEMV kernel's
    "one_bits",  # its word form's 1.0 bits (an argument)
})
GENERATED_PREFIXES: tuple[str, ...] = ("offs_", "pid_", "mask_", "size_b")
# what the template appends to a tensor's or output's name (x_ptr, x_stride_m, a quantized B's
# bytes and its scales loaded per group or channel, A's columns by their place in B's bytes and
# its row sums; the GEMV kernel's A row, its start, B's rows and their words, A's places):
# int8_linear's x_scale extends none of them
DERIVED_SUFFIXES = ("ptr", "tile", "base", "desc", "bytes", "group", "channel", "stride", "parts",
                    "sums", "row", "start", "rows", "words", "places",
                    *(f"p{place}" for place in range(8)))

# operand dims (without batch) by role
A_DIMS = ("M", "K")
B_DIMS = (("K", "N"), ("N", "K"))
EPILOGUE_DIMS = (("N",), ("M",), ("M", "N"))
GROUP_DIMS = ("N", "G")     # a quantized B's per-group scales or zero points
# bits per element a quantized B may pack into its 8-bit storage, along K, low bits first
DEQUANT_BITS = (1, 2, 4, 8)
# the dequant value's name for the unpacked integer
Q = "q"
CONFIG_KEYS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "num_warps", "num_stages")


# The default config space, an explicit list (a product of lists would either miss these or
# explode). The first is what the interpreter runs unless a test forces another. Blocks are
# clamped to the problem at launch (a 16-row problem runs every config with 16 rows), and configs
# under 64 rows only run on problems that small (runtime/matmul.py, prune_configs).
DEFAULT_CONFIGS = (
    # large problems, one program per SM: the Hopper bf16/fp16 tiles closest to cuBLAS; GROUP_M
    # 16 won mm and linear_gelu at 4096^3 and 8192^3 on an H200, 8 won linear at 8192^3
    tile_config(128, 256, 64, warps=8, stages=3),
    tile_config(128, 256, 64, warps=8, stages=3, group=16),
    tile_config(256, 128, 64, warps=8, stages=3),
    tile_config(128, 128, 64, warps=8, stages=4),
    # 96 KB of shared memory: two programs per SM, so one's epilogue overlaps the other's K loop
    tile_config(128, 128, 64, warps=4, stages=3),
    # too few 128 x 128 tiles to fill the GPU, or float32 inputs (twice the shared memory);
    # 128 x 64 (the slowest at large sizes) left out
    tile_config(64, 128, 64, warps=4, stages=4),
    # small M (decode): B streams through, long K blocks keep more of it in flight; 16 x 32
    # tiles give a 4096-column output 128 programs, which may stream B without split-K
    # (16 x 32 x 256 won 16 x 4096 x 4096 on an H200)
    tile_config(16, 64, 128, warps=4, stages=4),
    tile_config(16, 128, 128, warps=4, stages=4),
    tile_config(16, 32, 128, warps=4, stages=4),
    tile_config(16, 32, 256, warps=4, stages=4),
)
# the product form: what a key left out takes
PRODUCT_DEFAULTS = {"BLOCK_M": (128,), "BLOCK_N": (256, 128), "BLOCK_K": (64,), "GROUP_M": (8,),
                    "num_warps": (8,), "num_stages": (3,)}
DEFAULT_SPLIT_K = (1, 2, 4, 8, 16)
# the GEMV kernel's space (a quantized weight at M = 1); a plan leads it with the config that
# reads 8 KiB of B a program and K step in 3 stages (MatmulPlan.gemv_configs), which the
# heuristic runs untuned. Timed on an H200 (a probe of the kernel's int8 form, do_bench with its
# flush, docs/performance.md item 001m): 16 x 512 on 4 warps in 3 stages 12.0 us at 1 x 4096^2
# (in 4 stages 11.1) and 27.1 at 1 x 8192^2, against 12.2 and 31.7 for the kernel's one-stage
# form at its tuned 4 x 2048 (8 x 512 in 3 stages 11.1 and 31.8); the unpipelined long
# blocks stay in the space for the 4-bit form, whose group sums each step were not probed
# pipelined (channel mode leaves out those its accumulator would spill at)
GEMV_CONFIGS = (
    {"BLOCK_N": 16, "BLOCK_K": 512, "STAGES": 3, "num_warps": 4},
    {"BLOCK_N": 8, "BLOCK_K": 512, "STAGES": 3, "num_warps": 4},
    {"BLOCK_N": 16, "BLOCK_K": 512, "STAGES": 4, "num_warps": 4},
    {"BLOCK_N": 8, "BLOCK_K": 1024, "STAGES": 3, "num_warps": 4},
    {"BLOCK_N": 16, "BLOCK_K": 1024, "STAGES": 3, "num_warps": 4},
    {"BLOCK_N": 32, "BLOCK_K": 512, "STAGES": 3, "num_warps": 4},
    {"BLOCK_N": 8, "BLOCK_K": 2048, "STAGES": 1, "num_warps": 4},
    {"BLOCK_N": 8, "BLOCK_K": 4096, "STAGES": 1, "num_warps": 4},
    {"BLOCK_N": 4, "BLOCK_K": 2048, "STAGES": 1, "num_warps": 4},
    {"BLOCK_N": 16, "BLOCK_K": 4096, "STAGES": 1, "num_warps": 8},
)
# the most accumulator elements a thread the GEMV kernel's channel mode holds across its K loop
# (half of a thread's 255 registers)
GEMV_ACC_PER_THREAD = 128
# tl.dot needs every block dimension to be at least 16 (runtime/matmul.py's MIN_DOT_BLOCK, which
# clamps block sizes at launch; tests/test_matmul.py checks that they agree)
MIN_BLOCK = 16


@dataclass(frozen=True)
class Operand(TensorRole):
    """A tensor argument in the role its dims give it."""

    @property
    def batched(self) -> bool:
        return self.dims[0] in ("...", "B")

    @property
    def letters(self) -> str:
        """Its matrix dims as the kernel indexes them: A "mk", B "kn", epilogue "n", "m", "mn"."""
        dims = [d for d in self.dims if d not in ("...", "B")]
        if dims == ["N", "K"]:
            return "kn"   # a linear weight: the kernel reads it transposed through its strides
        return "".join(d.lower() for d in dims)


@dataclass(frozen=True)
class Dequant:
    """``[dequant]``: how the B operand's integer storage becomes the weight the K loop
    multiplies by."""

    bits: int                       # bits per element; 8 // bits elements a stored byte, along K
    group: str | None               # the int argument: K elements per column of the N, G operands
    value: Expr                     # the weight, over ``q`` and the scale operands

    @property
    def packed(self) -> int:
        """Elements a stored byte holds."""
        return 8 // self.bits


@dataclass(frozen=True)
class MatmulBody:
    a: Operand
    b: Operand
    epilogue_inputs: tuple[Operand, ...]
    outputs: tuple[Output, ...]
    out_dtype: str | None
    promoted: tuple[str, ...]       # epilogue operands of their own dtype (``[epilogue] promote``)
    swizzle: str
    split_k: str
    tuning: dict
    dequant: Dequant | None = None
    group_operands: tuple[Operand, ...] = ()    # dims N, G: read by the dequant value only


def unread_args(body: MatmulBody, spec_args: tuple) -> tuple[tuple[str, str], ...]:
    """The epilogue operands and scalars no expression reads (A and B enter through acc, the
    per-group operands through the dequant value, which checks them)."""
    args = [*body.epilogue_inputs, *scalar_args(spec_args)]
    exprs = [o.expr for o in body.outputs]
    if body.dequant is None:
        return unread(args, exprs, "no [epilogue] expression")
    return unread(args, [*exprs, body.dequant.value], "no [epilogue] or [dequant] expression",
                  also=[body.dequant.group])


def _classify(arg: TensorArg, where: Where) -> Operand:
    dims = arg.dims
    if not dims:
        raise where.error("matmul tensors need dims, as in dims = [\"M\", \"K\"] (A), "
                          "[\"K\", \"N\"] or [\"N\", \"K\"] (B), [\"N\"] (a bias)")
    rest = dims[1:] if dims[0] in ("...", "B") else dims
    known = [A_DIMS, *B_DIMS, *EPILOGUE_DIMS, GROUP_DIMS]
    if tuple(rest) not in known:
        shown = ", ".join("[" + ", ".join(f'"{d}"' for d in k) + "]" for k in known)
        raise where.child("dims").error(
            f"expected one of {shown}, optionally after a leading \"...\" (broadcast batch dims) "
            f"or \"B\" (one batch dim), got {list(dims)}")
    operand = Operand(arg.name, tuple(dims), arg.optional)
    if "K" in rest and arg.optional:
        raise where.child("optional").error("the A and B operands cannot be optional")
    if tuple(rest) == GROUP_DIMS and (arg.optional or len(rest) != len(dims)):
        raise where.error("an operand with dims [\"N\", \"G\"] (a quantized B's per-group "
                          "scales) has no batch dims and cannot be optional")
    return operand


def body_names(body: MatmulBody) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """The names the body declares, with their keys: the outputs."""
    return tuple((o.name, ("epilogue", o.name)) for o in body.outputs)


def parse_body(top: Table, spec_args: tuple, name: str) -> MatmulBody:
    args_where = top.where.child("args")
    a = b = None
    epilogue_inputs, group_operands = [], []
    for arg in spec_args:
        if not isinstance(arg, TensorArg):
            continue
        operand = _classify(arg, args_where.child(arg.name))
        if operand.letters == "ng":
            group_operands.append(operand)
        elif operand.letters in ("mk", "kn"):
            if (a if operand.letters == "mk" else b) is not None:
                role = "A (M, K)" if operand.letters == "mk" else "B (K, N or N, K)"
                raise args_where.child(arg.name).error(f"a second {role} operand; a matmul has one")
            a, b = (operand, b) if operand.letters == "mk" else (a, operand)
        else:
            epilogue_inputs.append(operand)
    if a is None or b is None:
        raise args_where.error("a matmul needs an A operand with dims [\"M\", \"K\"] and a B "
                               "operand with dims [\"K\", \"N\"] or [\"N\", \"K\"]")
    batches = {o.dims[0] for o in (a, b, *epilogue_inputs) if o.batched}
    if len(batches) > 1:
        raise args_where.error("batch dims must be all \"...\" (broadcast) or all \"B\" (exact)")
    if "B" in batches and not (a.batched and b.batched):
        raise args_where.error("with a \"B\" batch dim, both A and B must have it (as torch.bmm)")

    dequant = _parse_dequant(top, spec_args, a, b, epilogue_inputs, group_operands)
    epilogue = top.pop_table("epilogue")
    promoted = parse_promote(epilogue, a, b, epilogue_inputs)
    outputs, out_dtype = parse_epilogue(epilogue, spec_args, (a.name, b.name),
                                         tuple(o.name for o in group_operands))
    schedule = top.pop_table("schedule", required=False) or Table({}, top.where.child("schedule"))
    swizzle = schedule.pop_choice("swizzle", SWIZZLES, SWIZZLES[0])
    split_k = schedule.pop_choice("split_k", SPLIT_K_MODES, SPLIT_K_MODES[0])
    schedule.finish()
    tuning = _parse_tuning(top.pop_table("tuning", required=False)
                           or Table({}, top.where.child("tuning")), swizzle)
    return MatmulBody(a, b, tuple(epilogue_inputs), outputs, out_dtype, promoted, swizzle, split_k,
                      tuning, dequant, tuple(group_operands))


def _parse_dequant(top: Table, spec_args: tuple, a: Operand, b: Operand,
                   epilogue_inputs: list[Operand], group_operands: list[Operand]) -> Dequant | None:
    """``[dequant]``: ``bits``, ``group`` (with N, G operands), ``value`` over ``q``."""
    by_name = {arg.name: arg for arg in spec_args}
    table = top.pop_table("dequant", required=False)
    stored = by_name[b.name].dtypes
    args_where = top.where.child("args")
    if table is None:
        if group_operands:
            raise args_where.child(group_operands[0].name).error(
                "dims [\"N\", \"G\"] are a quantized B operand's per-group scales: the spec "
                f"needs a [dequant] table that reads them{top.misspelling('dequant')}")
        own = {name: by_name[name].dtypes for name in (a.name, b.name) if by_name[name].dtypes}
        if own and (len(own) != 2 or set(own.values()) != {("int8",)}):
            name = next(iter(own))
            raise args_where.child(name).child("dtypes").error(
                "the A and B operands take the op's dtypes, or both dtypes = [\"int8\"] (an "
                "exact int32 product); other integer storage is a quantized B with a [dequant] "
                "table")
        return None
    where = table.where
    if by_name[a.name].dtypes:
        raise args_where.child(a.name).child("dtypes").error(
            "with a quantized B (a [dequant] table) the A operand takes the op's float dtypes, "
            "which the dequantized B is converted to")
    if not stored or not set(stored) <= {"int8", "uint8"} or len(stored) != 1:
        raise args_where.child(b.name).error(
            f"the quantized B operand '{b.name}' must declare its storage, dtypes = [\"uint8\"] "
            f"or [\"int8\"]")
    bits = table.pop("bits", int, 8)
    if bits not in DEQUANT_BITS:
        raise where.child("bits").error(f"expected one of {', '.join(map(str, DEQUANT_BITS))} "
                                        f"(elements packed into a byte along K), got {bits}")
    if stored[0] == "int8" and bits != 8:
        raise where.child("bits").error(
            f"{bits}-bit elements are unpacked unsigned: store them as uint8 and subtract a zero "
            f"point in value")
    group = table.pop("group", str, None)
    if group is not None:
        arg = by_name.get(group)
        if arg is None or arg.kind != "int":
            found = f" (a {arg.kind} argument)" if arg is not None else ""
            raise where.child("group").error(
                f"expected the name of an int argument (K elements per group), got "
                f"'{group}'{found}")
        # the launch refuses other group sizes (a dot a place in B's bytes: MatmulPlan's
        # min_block_k), so a default among them is refused here
        least = MIN_BLOCK * (8 // bits)
        if arg.default is not None and not is_group_size(arg.default, least):
            raise args_where.child(group).child("default").error(
                f"a group size is a power of two of at least {least} for {bits}-bit elements, "
                f"got {arg.default}")
        if not group_operands:
            raise where.child("group").error("no operand has dims [\"N\", \"G\"] (per-group "
                                             "scales): leave group out")
    elif group_operands:
        raise where.error(f"operand '{group_operands[0].name}' has per-group dims [\"N\", \"G\"]: "
                          f"name the int argument that sets the group size, group = \"...\""
                          f"{table.misspelling('group')}")
    channel = [o.name for o in epilogue_inputs if o.letters == "n" and not o.optional]
    scales = {o.name for o in group_operands} | set(channel)
    # the value is a format's: the integer and its scale operands
    symbols = {n: s for n, s in symbols_of(spec_args).items() if n in scales}
    symbols[Q] = Symbol(Q, "value")
    reasons = {a.name: "the dequant value reads the unpacked integer q, not the operands",
               b.name: "the dequant value reads the unpacked integer q, not the operands"}
    for arg in spec_args:
        if arg.name not in symbols and arg.name not in reasons:
            reasons[arg.name] = ("a dequant value reads q and the scale operands, dims [\"N\"] "
                                 "or [\"N\", \"G\"] (not optional); scale the output in "
                                 "[epilogue] instead")
    value = parse_expr(table.pop("value", str), where.child("value"), symbols, reasons)
    if Q not in value.names:
        raise where.child("value").error(f"{quoted(value.source)} never reads q, the stored integer")
    unread_groups = [o.name for o in group_operands if o.name not in value.names]
    if unread_groups:
        raise args_where.child(unread_groups[0]).error(
            "a per-group operand the dequant value never reads")
    table.finish()
    return Dequant(bits, group, value)


def parse_promote(table: Table, a: Operand, b: Operand,
                   epilogue_inputs: list[Operand]) -> tuple[str, ...]:
    """``[epilogue] promote``: epilogue operands outside the matmul torch's reference calls, as
    the residual of ``F.linear(x, weight, bias) + residual``. torch's matmuls take one dtype for
    their operands (a bias included); an operand added after them by an element-wise op keeps
    its own, and the result's dtype promotes with it (torch.autocast leaves it as it is too)."""
    if "promote" not in table:
        return ()
    where = table.where.child("promote")
    names = parse_list(table.pop_any("promote"), str, where)
    epilogue_names = [o.name for o in epilogue_inputs]
    for name in names:
        if name in (a.name, b.name):
            raise where.error(f"'{name}' is an operand of the matmul, which takes one dtype for "
                              f"its operands; only epilogue operands ({', '.join(epilogue_names)}) "
                              f"may promote")
        if name not in epilogue_names:
            raise where.error(f"'{name}' is not an epilogue operand; expected some of: "
                              f"{', '.join(epilogue_names) or '(none: the op has no epilogue operands)'}")
    if len(set(names)) != len(names):
        raise where.error("names an operand twice")
    return tuple(names)


def parse_epilogue(table: Table, spec_args: tuple, matrices: tuple[str, str],
                    group_operands: tuple[str, ...] = ()):
    """``[epilogue]``: outputs in file order over ``acc``; ``dtype`` is the output dtype, or the
    name of a dtype argument that sets it (``out_dtype=torch.bfloat16``)."""
    out_dtype = table.pop("dtype", str, None)
    dtype_args = [a.name for a in spec_args if a.kind == "dtype"]
    if out_dtype is not None and out_dtype not in DTYPES + tuple(dtype_args):
        raise table.where.child("dtype").error(
            f"unknown dtype '{out_dtype}'; expected one of: {', '.join(DTYPES + tuple(dtype_args))}")
    # A and B enter only through acc: the epilogue runs once per output tile, after the K loop
    symbols = {n: s for n, s in symbols_of(spec_args, dtype_args).items()
               if n not in matrices + group_operands}
    symbols["acc"] = Symbol("acc", "value")
    outputs = []
    reasons = {m: "the operands enter the epilogue only through acc, the tile of their product"
               for m in matrices}
    reasons.update({g: "per-group scales enter through the dequantized B, not the epilogue"
                    for g in group_operands})
    while table.keys():
        name, source, where = table.pop_item()
        # `promot = "residual"` would be a second output, silently: the table's own keys and
        # the outputs share it
        close = difflib.get_close_matches(name, EPILOGUE_KEYS, n=1, cutoff=0.8)
        if close:
            raise where.error(f"'{name}' reads as a misspelling of '{close[0]}'; an output needs "
                              f"a name unlike [epilogue]'s keys ({', '.join(EPILOGUE_KEYS)})")
        check_name(name, where, "output")
        if name in symbols or name in matrices:
            raise where.error(f"output '{name}' has the name of an argument")
        check_type(source, str, where)
        outputs.append(Output(name, parse_expr(source, where, symbols, reasons)))
        symbols[name] = Symbol(name, "value")
    if not outputs:
        raise table.where.error("expected at least one output, as in out = \"acc\"")
    return tuple(outputs), out_dtype


def _parse_tuning(table: Table, swizzle: str) -> dict:
    """``[tuning]``: the config space (``parse_config_space``); ``SPLIT_K``, the factors auto
    split-K may pick."""
    configs = parse_config_space(table, swizzle, DEFAULT_CONFIGS)
    split_k = int_list(table, "SPLIT_K", DEFAULT_SPLIT_K, lambda v: v >= 1, "positive integers")
    table.finish()
    return {"configs": configs, "SPLIT_K": split_k}


def parse_config_space(table: Table, swizzle: str, default: tuple[dict, ...]) -> tuple[dict, ...]:
    """``configs = [{ BLOCK_M = 128, ... }, ...]``, an explicit list, or lists of ``BLOCK_M`` ...
    ``num_stages`` whose product is the space (neither: ``default``). The convolution family's
    tiles take the same keys."""
    _refuse_group_m(table, swizzle)
    raw = table.pop_any("configs")
    lists = [key for key in CONFIG_KEYS if key in table]
    if raw is not None and lists:
        raise table.where.child(lists[0]).error(
            "give either configs = [...] or lists of BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, "
            "num_warps, num_stages (their product), not both")
    if raw is not None:
        configs = _config_list(raw, table.where.child("configs"), swizzle)
    elif lists:
        values = {}
        for key in CONFIG_KEYS:
            values[key] = _config_values(table, key, PRODUCT_DEFAULTS[key])
        configs = tuple(dict(zip(CONFIG_KEYS, point))
                        for point in itertools.product(*(values[key] for key in CONFIG_KEYS)))
        for config in configs:
            _check_tiles(config, table.where)
    else:
        configs = default
    return configs


def _refuse_group_m(table: Table, swizzle: str) -> None:
    """GROUP_M orders the programs of the grouped and swizzle2d schedules only: under swizzle
    "none", configs that differ in it alone are one kernel, tuned once each."""
    if swizzle == "none" and "GROUP_M" in table:
        raise table.where.child("GROUP_M").error(
            'has no effect with schedule.swizzle = "none"; leave it out')


def _config_values(table: Table, key: str, default: tuple[int, ...]) -> tuple[int, ...]:
    """The product form's list of one config key (or one value)."""
    raw = table.pop_any(key)
    if raw is None:
        return default
    where = table.where.child(key)
    return tuple(_check_value(key, value, where) for value in parse_list(raw, int, where))


def _config_list(raw, where: Where, swizzle: str) -> tuple[dict, ...]:
    """``configs = [{ BLOCK_M = 128, BLOCK_N = 256, BLOCK_K = 64, num_warps = 8, num_stages = 3 },
    ...]``; GROUP_M may be left out (8)."""
    configs: list[dict] = []
    for i, item in enumerate(parse_list(raw, dict, where)):
        entry = Table(item, where.child(str(i)))
        _refuse_group_m(entry, swizzle)
        config = {}
        for key in CONFIG_KEYS:
            value = entry.pop(key, int, 8) if key == "GROUP_M" else entry.pop(key, int)
            config[key] = _check_value(key, value, entry.where.child(key))
        entry.finish()
        _check_tiles(config, entry.where)
        if config in configs:
            raise entry.where.error(f"repeats config {configs.index(config)}")
        configs.append(config)
    return tuple(configs)


def _check_tiles(config: dict, where: Where) -> None:
    """Each tile a config loads or accumulates fits one Triton block."""
    for rows, cols in (("BLOCK_M", "BLOCK_K"), ("BLOCK_K", "BLOCK_N"), ("BLOCK_M", "BLOCK_N")):
        if config[rows] * config[cols] > MAX_TILE:
            raise where.error(f"a {rows} x {cols} tile of {config[rows]} x {config[cols]} "
                              f"elements; a Triton block holds at most {MAX_TILE}")


def _check_value(key: str, value: int, where: Where) -> int:
    if key in ("GROUP_M", "num_stages"):
        if value < 1:
            raise where.error(f"expected positive integers, got {value}")
        return value
    if value <= 0 or value & (value - 1):
        raise where.error(f"expected powers of two, got {value}")
    if key.startswith("BLOCK_") and value < MIN_BLOCK:
        raise where.error(f"tl.dot needs blocks of at least {MIN_BLOCK}, got {value}")
    if key == "num_warps" and value > MAX_WARPS:
        raise where.error(f"expected at most {MAX_WARPS} warps, got {value}")
    return value


@dataclass(frozen=True)
class OutputTensor(EpilogueOutput):
    @property
    def letters(self) -> str:
        return "mn"


def _place_splits(source: str, prefix: str, levels: int) -> tuple[tuple[str, str, str], ...]:
    """``(source, first, second)`` per ``tl.split`` of ``source`` (its last ``levels`` dims of 2
    an element's place, lowest bit last), ending in ``prefix``0 ... ``prefix``{2 ** levels - 1}:
    each split parts the elements by one more bit of their place."""
    splits, sources = [], {0: source}
    for level in range(levels):
        modulus = 2 << level
        named = {}
        for residue, part in sources.items():
            for bit in (0, 1):
                place = residue + (bit << level)
                named[place] = f"{prefix}{place}" if level == levels - 1 \
                    else f"{prefix}{place}_of_{modulus}"
            splits.append((part, named[residue], named[residue + (1 << level)]))
        sources = named
    return tuple(splits)


@dataclass(frozen=True)
class MatmulPlan(CommonPlan, EpiloguePlan):
    a: Operand = None
    b: Operand = None
    epilogue_inputs: tuple[Operand, ...] = ()
    outputs: tuple[OutputTensor, ...] = ()
    out_dtype: str | None = None
    out_dtype_arg: str | None = None    # the dtype argument that sets it, where one does
    batch_rank: int = 0
    swizzle: str = "grouped"
    split_k: str = "auto"
    configs: tuple[dict, ...] = ()
    split_factors: tuple[int, ...] = ()
    # a quantized B ([dequant]): its spec, the per-group operands (dims N, G), the per-channel
    # ones the K loop reads (loaded before it), and where the value is applied (_dequant_plan)
    dequant: Dequant | None = None
    group_operands: tuple[Operand, ...] = ()
    loop_channels: tuple[Operand, ...] = ()
    dequant_mode: str = ""              # channel | block | tile
    coef_code: str = ""                 # the value as coef * q + offset (channel and block)
    offset_code: str = ""               # ("": zero)
    value_code: str = ""                # the value itself (tile; block for 64 rows or more)
    integer_product: bool = False       # int8 A and B: tl.dot accumulates exactly in int32
    own_dtypes: tuple[tuple[str, tuple[str, ...]], ...] = ()   # tensors not of the op's dtypes

    helpers: tuple[str, ...] = ()       # specgen.kernel_lib functions the epilogue calls

    @property
    def min_block_k(self) -> int:
        """The least BLOCK_K the kernels' dots take: 32 for int8 operands (NVIDIA's least K of
        an 8-bit dot), MIN_BLOCK a place in a packed B's bytes (a dot each)."""
        if self.integer_product:
            return 2 * MIN_BLOCK
        return MIN_BLOCK * (self.dequant.packed if self.dequant else 1)

    @property
    def prune_block_k(self) -> int | None:
        """The least BLOCK_K the autotuner keeps (runtime/matmul.py's prune_for), where the
        dots need more than MIN_BLOCK; None: its plain pruning."""
        return self.min_block_k if self.min_block_k > MIN_BLOCK else None

    @property
    def split_levels(self) -> int:
        """log2 of the elements a byte of B packs: how many times the GEMV splits A's row in
        two to part its elements by their place in a byte, and the levels of ``place_joins``."""
        return (self.dequant.packed if self.dequant else 1).bit_length() - 1

    @property
    def position_splits(self) -> tuple[tuple[str, str, str], ...]:
        """``(source, first, second)`` per ``tl.split`` of the GEMV's reshaped row of A
        (A_parts: its last dims the place in a byte, lowest bit last), ending in A_p0 ...
        A_p{packed - 1}: each split parts the elements by one more bit of their place."""
        return _place_splits(f"{self.a.name}_parts", f"{self.a.name}_p", self.split_levels)

    @property
    def word_elements(self) -> int:
        """Elements of K a 32-bit word of B holds: the GEMV kernel's word form (its launcher's
        WORDS, where B's rows allow it) reads B as words, whose integers become floats with no
        conversion or subtraction (``word_fields``)."""
        return 4 * self.dequant.packed

    @property
    def word_position(self) -> int:
        """The mantissa bit where the word form puts an element's integer q, so that put into
        1.0's bits it reads 1 + q / word_scale exactly: the highest multiple of the element's
        width that leaves it inside the mantissa (a place of each word then needs no shift)
        where that costs at most 3 bits of q's share, else the mantissa's top: 16 for 4 bits
        (1 + q / 128: q's share keeps 17 bits of x's float32 product), 15 for 8 bits."""
        bits = self.dequant.bits
        aligned = bits * ((23 - bits) // bits)
        return aligned if aligned >= 20 - bits else 23 - bits

    @property
    def word_sign_bits(self) -> int:
        """What the launcher XORs into 1.0's bits for signed bytes (8-bit elements only): the
        sign bit of an element's field, which makes q + 2 ** (bits - 1) of it, a nonnegative
        integer, as the byte form's SIGNED shift does."""
        if self.dequant.packed > 1:
            return 0
        return (1 << (self.dequant.bits - 1)) << self.word_position

    @property
    def word_scale(self) -> int:
        """2 ** (23 - word_position): sum x q = word_scale (sum x f - sum x), f = 1 + q / it."""
        return 2 ** (23 - self.word_position)

    @property
    def word_fields(self) -> tuple[str, ...]:
        """Per place p of a word (element word_elements * w + p, at bits p * bits), B's words
        shifted so that its bits sit at word_position (the template masks them and XORs 1.0's
        bits in, with the field's sign bit for signed bytes). A right shift of the signed words
        brings the sign's copies above the field only."""
        b, bits, position = self.b.name, self.dequant.bits, self.word_position
        fields = []
        for place in range(self.word_elements):
            shift = position - place * bits
            fields.append(f"({b}_words << {shift})" if shift > 0 else
                          f"({b}_words >> {-shift})" if shift < 0 else f"{b}_words")
        return tuple(fields)

    @property
    def word_levels(self) -> int:
        """log2 of word_elements: the dims of 2 A's row is reshaped to for the word form."""
        return self.word_elements.bit_length() - 1

    @property
    def word_splits(self) -> tuple[tuple[str, str, str], ...]:
        """``position_splits`` for the word form: A's row reshaped to (BLOCK_K // word_elements,
        2, ..., 2), ending in A_w0 ... A_w{word_elements - 1}."""
        return _place_splits(f"{self.a.name}_word_parts", f"{self.a.name}_w", self.word_levels)

    @property
    def word_mask(self) -> int:
        """An element's field at word_position, which the word form keeps of each shift."""
        return (2 ** self.dequant.bits - 1) << self.word_position

    @property
    def word_sign_bias(self) -> int:
        """What signed bytes' fields read above q in the word form (``word_sign_bits`` flipped:
        q + 128); 0 where elements are packed (their bytes are unsigned there)."""
        return 2 ** (self.dequant.bits - 1) if self.dequant.packed == 1 else 0

    def word_sum(self, xf: str, x: str) -> str:
        """The code of sum x q from the word form's sums of x f (``xf``) and of x (``x``):
        word_scale (sum x f - sum x), less WORD_BIAS sum x (the kernel's constexpr: the sign
        bias where B's bytes are signed, else 0)."""
        scale = f"{self.word_scale}.0"
        if self.word_sign_bias:
            return f"{scale} * {xf} - ({scale} + WORD_BIAS) * {x}"
        return f"{scale} * ({xf} - {x})"

    @property
    def word_sum_note(self) -> str:
        """The comment over ``word_sum``'s code."""
        note = (f"the word form's floats are f = 1 + q / {self.word_scale}: sum x q = "
                f"{self.word_scale} (sum x f - sum x)")
        if self.word_sign_bias:
            note += f", less {self.word_sign_bias} sum x for signed bytes (q + {self.word_sign_bias})"
        return note

    @property
    def place_joins(self) -> tuple[tuple[str, str, str], ...]:
        """``(first, second, joined)`` per ``tl.join`` that gathers B's places (B_p0 ...
        B_p{packed - 1}, each BLOCK_K // packed rows) into one tile: each level pairs the places
        that differ in their highest bit left, whose bit becomes the last dim, so the last
        ``joined`` is (BLOCK_K // packed, BLOCK_N, 2, ..., 2), the place's bits highest first."""
        b, joins, level = self.b.name, [], 0
        names = [f"{b}_p{p}" for p in range(self.dequant.packed if self.dequant else 1)]
        while len(names) > 1:
            half = len(names) // 2
            joined = [f"{b}_places" if half == 1 else f"{b}_j{level}_{r}" for r in range(half)]
            joins += [(names[r], names[r + half], joined[r]) for r in range(half)]
            names, level = joined, level + 1
        return tuple(joins)

    @property
    def joined_places(self) -> str:
        """The tile ``place_joins`` ends in (B's block with every place, before ``place_order``)."""
        return self.place_joins[-1][2]

    @property
    def place_order(self) -> tuple[int, ...]:
        """The permutation of the joined places (``place_joins``) to (BLOCK_K // packed, 2, ...,
        2, BLOCK_N): reshaped to (BLOCK_K, BLOCK_N), row packed * c + p is place p of byte row
        c, as K runs."""
        return (0, *range(2, 2 + self.split_levels), 1)

    @property
    def loop_inputs(self) -> tuple[Operand, ...]:
        """The operands the K loop reads besides A and B: a quantized B's scales."""
        return self.group_operands + self.loop_channels

    @property
    def gemv(self) -> bool:
        """Whether the module has the GEMV kernel (M = 1 on the CUDA cores): a float A against
        a quantized B whose value is linear in q (channel and block modes, which scale sums of
        products rather than each weight element)."""
        return (self.dequant is not None and not self.integer_product
                and self.dequant_mode in ("channel", "block"))

    @property
    def gemv_configs(self) -> tuple[dict, ...]:
        """GEMV_CONFIGS, led by the one that reads 8 KiB of B a program and step in 3 stages
        (the fastest with 8-bit weights on an H200)."""
        if not self.gemv:
            return ()
        lead = {"BLOCK_N": 16, "BLOCK_K": 512 * self.dequant.packed, "STAGES": 3, "num_warps": 4}
        space = (lead,) + tuple(c for c in GEMV_CONFIGS if c != lead)
        if not self.gemv_sums_after_loop:
            return space
        # channel mode holds a (BLOCK_N, BLOCK_K / packed) float32 accumulator through the loop:
        # past GEMV_ACC_PER_THREAD a thread it spills (the long unpipelined blocks)
        return tuple(c for c in space if c["BLOCK_N"] * c["BLOCK_K"] // self.dequant.packed
                     <= GEMV_ACC_PER_THREAD * 32 * c["num_warps"])

    @property
    def gemv_sums_after_loop(self) -> bool:
        """Whether the GEMV kernel adds each step's products into a (BLOCK_N, BLOCK_K / packed)
        accumulator and sums it once after the K loop: channel mode, whose per-channel factor
        waits for the epilogue (a sum a step would shuffle between lanes each step); per-group
        factors scale each step's group sums instead."""
        return self.dequant_mode == "channel"

    @property
    def tma(self) -> bool:
        """Whether the module has the TMA kernel: not for a quantized B, whose tiles are
        unpacked in registers after their load."""
        return self.dequant is None

    @property
    def scalars(self):
        # the group size shapes the launch (the GROUP_K constexpr), not the kernels' math
        group = self.dequant.group if self.dequant else None
        return tuple(a for a in super().scalars if a.name != group)

    @property
    def value_ints(self) -> tuple[str, ...]:
        group = self.dequant.group if self.dequant else None
        return tuple(n for n in super().value_ints if n != group)

    @property
    def promoted(self) -> tuple[str, ...]:
        """The epilogue operands that promote with the result (``[epilogue] promote``)."""
        own = {name for name, _ in self.own_dtypes}
        return tuple(name for name in self.uncast if name not in own)

    @property
    def input_dims(self) -> tuple[tuple[str, str], ...]:
        """The inputs in call order with their dims."""
        return tuple((o.name, o.dims) for o in self.inputs)

    @property
    def tensors(self) -> tuple:
        return (self.a, self.b, *self.group_operands, *self.epilogue_inputs, *self.outputs)

    def batched(self, tensor) -> bool:
        """Whether ``tensor`` has batch strides (outputs have them whenever the op is batched)."""
        return self.batch_rank > 0 and (isinstance(tensor, OutputTensor) or tensor.batched)

    @property
    def inputs(self) -> tuple[Operand, ...]:
        return (self.a, self.b, *self.group_operands, *self.epilogue_inputs)


def plan(spec: OpSpec) -> MatmulPlan:
    body: MatmulBody = spec.body
    names = {c.name: c.constexpr for c in spec.choices}
    outputs = tuple(OutputTensor(o.name, emit(o.expr, names)) for o in body.outputs)
    t = body.tuning
    operands = (body.a, body.b, *body.epilogue_inputs)
    batches = {o.dims[0] for o in operands if o.batched}
    batch_rank = 0 if not batches else (1 if "B" in batches else BROADCAST_BATCH_RANK)
    # tensors of their own dtypes (a quantized weight, float32 scales) are left out of the one
    # dtype the others share, and autocast leaves them as they are
    own = tuple((a.name, a.dtypes) for a in spec.args if isinstance(a, TensorArg) and a.dtypes)
    common = common_plan(spec, tuple(o.name for o in body.outputs), promoted=body.promoted)
    fields = dict(common.__dict__, uncast=body.promoted + tuple(name for name, _ in own))
    exprs = [o.expr for o in body.outputs]
    dequant_fields = {}
    if body.dequant is not None:
        dequant_fields = _dequant_plan(body, names)
        exprs.append(body.dequant.value)
    integer = next(a for a in spec.args if a.name == body.a.name).dtypes == ("int8",)
    # an output dtype set by a dtype argument is the call's (runtime/matmul.py reads it there)
    out_dtype_arg = body.out_dtype if body.out_dtype in names_of_kind(spec.args, "dtype") else None
    out_dtype = None if out_dtype_arg else body.out_dtype
    planned = MatmulPlan(**fields, a=body.a, b=body.b, epilogue_inputs=body.epilogue_inputs,
                         outputs=outputs, out_dtype=out_dtype, out_dtype_arg=out_dtype_arg,
                         batch_rank=batch_rank,
                         swizzle=body.swizzle, split_k=body.split_k, configs=t["configs"],
                         split_factors=tuple(sorted(set(t["SPLIT_K"]))), integer_product=integer,
                         own_dtypes=own,
                         **dequant_fields)
    used = set().union(*(helpers(e) for e in exprs))
    if planned.gemv:
        # the GEMV kernel's integers become float32 without a conversion instruction
        used.add("small_ints_to_float32")
    return dataclasses.replace(planned, helpers=tuple(sorted(used)))


def names_of_kind(args: tuple, kind: str) -> tuple[str, ...]:
    return tuple(a.name for a in args if a.kind == kind)


# where a quantized B's value is applied (docs/families.md, "Matmul family", quantized weights):
# - channel: value = coef * q with coef per output channel: the K loop multiplies A by q, and the
#   accumulator is multiplied by coef once, in the epilogue (the seed's per-channel case);
# - block: value = coef * q + offset (per-group scales and zero points): under 64 rows, each K
#   block's product with q is scaled by the block's coef and gets offset times the block's sums
#   of A's rows, a multiply per output element and block rather than per weight element; with
#   64 rows or more a block has more output elements than weight elements, and the launcher asks
#   for tile's code (the PER_TILE constexpr);
# - tile: any other value, computed for every weight element of each tile.
DEQUANT_MODES = ("channel", "block", "tile")


def _dequant_plan(body: MatmulBody, choices: dict) -> dict:
    """Where a quantized B's value is applied (DEQUANT_MODES), and its code."""
    d = body.dequant
    linear = linear_in_q(d.value.tree)
    read = {n.id for n in ast.walk(d.value.tree) if isinstance(n, ast.Name)}
    grouped = {o.name for o in body.group_operands}
    names = dict(choices)
    names.update({o.name: f"{o.name}_group" for o in body.group_operands})
    if linear is not None and linear[1] is None and not read & grouped:
        # the epilogue loads the per-channel operands under their own names
        return dict(dequant=d, group_operands=body.group_operands, dequant_mode="channel",
                    coef_code=emit(linear[0], choices))
    channels = tuple(o for o in body.epilogue_inputs if o.name in read)
    names.update({o.name: f"{o.name}_channel" for o in channels})
    fields = dict(dequant=d, group_operands=body.group_operands, loop_channels=channels)
    if linear is None:
        return dict(fields, dequant_mode="tile", value_code=emit(d.value, names))
    coef, offset = linear
    # (the launcher takes the value per weight element where 64 rows or more make the
    # block's scaling cost more than the elements: PER_TILE)
    return dict(fields, dequant_mode="block", coef_code=emit(coef, names),
                offset_code="" if offset is None else emit(offset, names),
                value_code=emit(d.value, names))


_ONE = ast.Constant(1.0)


def linear_in_q(node: ast.expr) -> tuple[ast.expr, ast.expr | None] | None:
    """(coef, offset) with ``node`` = coef * q + offset, neither reading q (offset None: zero),
    or None where ``node`` is not linear in q. Only the forms quantization formats write:
    sums, differences, negations, products and quotients with a side free of q."""
    if Q not in {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}:
        return _ZERO, node
    if isinstance(node, ast.Name):
        return _ONE, None
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        inner = linear_in_q(node.operand)
        if inner is None or isinstance(node.op, ast.UAdd):
            return inner
        return _negate(inner[0]), _negate(inner[1])
    if not isinstance(node, ast.BinOp):
        return None
    left, right = linear_in_q(node.left), linear_in_q(node.right)
    if left is None or right is None:
        return None
    if isinstance(node.op, (ast.Add, ast.Sub)):
        combine = _add if isinstance(node.op, ast.Add) else _subtract
        return combine(left[0], right[0]), combine(left[1], right[1])
    free_left, free_right = left[0] is _ZERO, right[0] is _ZERO
    if isinstance(node.op, ast.Mult) and (free_left or free_right):
        factor, (coef, offset) = (node.left, right) if free_left else (node.right, left)
        return _multiply(coef, factor), _multiply(offset, factor)
    if isinstance(node.op, ast.Div) and free_right:
        return _divide(left[0], node.right), _divide(left[1], node.right)
    return None


# a coefficient of q that is zero: the q-free parts above
_ZERO = ast.Constant(0.0)


def _negate(node):
    if node is None:
        return None
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return node.operand
    if isinstance(node, ast.Constant):
        return ast.Constant(-node.value)
    return ast.UnaryOp(ast.USub(), node)


def _add(a, b):
    return b if a is None or a is _ZERO else a if b is None or b is _ZERO else \
        ast.BinOp(a, ast.Add(), b)


def _subtract(a, b):
    if b is None or b is _ZERO:
        return a
    return _negate(b) if a is None or a is _ZERO else ast.BinOp(a, ast.Sub(), b)


def _multiply(node, factor):
    if node is None or node is _ZERO:
        return node
    if isinstance(node, ast.Constant) and node.value in (1.0, -1.0):
        return factor if node.value == 1.0 else _negate(factor)
    return ast.BinOp(node, ast.Mult(), factor)


def _divide(node, divisor):
    if node is None or node is _ZERO:
        return node
    return ast.BinOp(node, ast.Div(), divisor)


def scaffold(name: str) -> str:
    return f'''# A matmul with a fused epilogue: see docs/families.md, "Matmul family".
[op]
name = "{name}"
family = "matmul"
doc = "relu(x @ weight.T + bias)"
reference = "torch.relu(torch.nn.functional.linear(x, weight, bias))"

[args]
x = {{ kind = "tensor", dims = ["...", "M", "K"] }}
weight = {{ kind = "tensor", dims = ["N", "K"] }}
bias = {{ kind = "tensor", dims = ["N"], optional = true }}

[epilogue]
out = "relu(acc + bias)"

[schedule]
swizzle = "grouped"       # grouped | swizzle2d | none
split_k = "auto"          # auto (two-stage, deterministic) | atomic | off
'''


# --- Its property tests, opcheck samples and benchmark cases -------------------------------------
# The tests and the bench call these (``FAMILY``'s draw_case, samples and bench); they import
# hypothesis, specgen.testing and bench where they run: the generator needs none of them.

# Small tiles reach every code path on small inputs; on the GPU they also keep the number of
# distinct compilations per example low.
SMALL_CONFIGS = (
    {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 1, "num_warps": 4, "num_stages": 2},
    {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 16, "GROUP_M": 2, "num_warps": 4, "num_stages": 2},
    {"BLOCK_M": 32, "BLOCK_N": 16, "BLOCK_K": 32, "GROUP_M": 3, "num_warps": 4, "num_stages": 2},
    {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 16, "GROUP_M": 8, "num_warps": 4, "num_stages": 3},
    {"BLOCK_M": 64, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 4, "num_warps": 4, "num_stages": 3},
)


def _roles(info) -> tuple[str, str]:
    tensors = {a.name: a.dims for a in info.args if a.kind == "tensor"}
    a = next(n for n, d in tensors.items() if "M" in d and "K" in d)
    b = next(n for n, d in tensors.items() if "N" in d and "K" in d)
    return a, b


def draw_case(draw, info):
    """A property-test call: M, N, K off every block size, batch shapes, layouts, epilogues.

    The roles of an op's tensors come from their dims (A: M, K; B: K, N or N, K; the others
    feed the epilogue). Every case forces a strategy (direct, TMA, two-stage or atomic split-K
    with 1 to 4 splits, the GEMV kernel of a quantized B) or leaves it to the launcher, and
    forces a config: one of the spec's space by number (as autotuning would fit it to the sizes:
    the GPU tier checks every config without tuning each size), or a small tile config outside
    the space so that a few dozen rows already span several tiles, partial tiles and
    grouped/swizzled orderings.
    """
    from hypothesis import strategies as st

    from specgen.runtime import interpreting
    from specgen.testing.core import (Case, broadcast_operand, knobs, layouts, make_tensor,
                                      matmul_tolerances, scalar_value, sizes)

    a_name, b_name = _roles(info)
    # knobs(): a config number of the space, maybe int64 indexing; half the cases small tiles
    overrides = draw(knobs())
    small = draw(st.booleans())
    if small:
        overrides["config"] = draw(st.sampled_from(SMALL_CONFIGS))
    least = info.launch.min_block_k
    if small and least > 16:
        # int8 dots take 32 columns of K; a packed B's (one per place in a byte) BLOCK_K / packed
        overrides["config"] = dict(overrides["config"],
                                   BLOCK_K=max(overrides["config"]["BLOCK_K"], least))
    config = overrides["config"]
    # the interpreter runs every program in numpy: small tiles get small problems (the space's
    # tiles are clamped to the problem, so large sizes stay few programs)
    limit = 96 if small else 300
    # an empty M, N or K (torch allows each) in about one case of eight
    zero = draw(st.integers(0, 7)) == 0
    m, n, k = (draw(sizes(limit, allow_zero=zero)) for _ in range(3))
    quant = _quantized(info)
    group = None
    if quant.group is not None:
        # K a whole number of groups, odd counts included; under the interpreter the smaller
        # groups (each K block costs numpy calls there)
        group = draw(st.sampled_from(GROUP_SIZES[:2] if interpreting() else GROUP_SIZES))
        k = group * draw(st.integers(0 if zero else 1, 3))
    elif quant.packed > 1:
        k = -(-k // quant.packed) * quant.packed
    kinds = [None, "direct", "tma", "two_stage", "atomic"] + (["gemv"] if info.launch.gemv else [])
    strategy = draw(st.sampled_from(kinds))
    if strategy in ("two_stage", "atomic"):
        strategy = f"{strategy}:{draw(st.integers(1, 4))}"
    if strategy is not None:
        overrides["strategy"] = strategy
    if strategy == "gemv":
        # one row of A a program row, each reading all of B: M = 1 in about half the cases, as
        # the planner takes it, else at most 3 (hundreds of rows took minutes under the
        # interpreter, a program a row and column block)
        m = min(m, 1 if draw(st.booleans()) else 3)
    if strategy == "tma":
        # rows of 16-byte multiples in contiguous layouts, so the TMA kernel runs (bmm's batch
        # elements too); the layouts it cannot describe (offset, stepped, broadcast over a
        # batch) take the direct kernel
        m, n, k = (-(-size // 8) * 8 for size in (m, n, k))
    dims = {a.name: a.dims for a in info.args if a.kind == "tensor"}
    batch, batch_a, batch_b = (), (), ()
    vector_a = vector_b = False
    if dims[a_name][0] == "B":
        batch = batch_a = batch_b = (draw(st.integers(0, 3)),)
    elif "..." in dims[a_name] or "..." in dims[b_name]:
        batch = tuple(draw(st.lists(st.integers(1, 3), max_size=2)))
        if "..." in dims[a_name]:
            batch_a = draw(broadcast_operand(batch))
            vector_a = draw(st.integers(0, 7)) == 0
        if "..." in dims[b_name]:
            batch_b = draw(broadcast_operand(batch))
            vector_b = draw(st.integers(0, 7)) == 0
    # a 1-D operand has no batch dims
    batch_a, batch_b = (() if vector_a else batch_a), (() if vector_b else batch_b)
    if isinstance(config, dict) and info.launch.gemv and (
            strategy == "gemv" or (strategy is None and (vector_a or m == 1))):
        # a mapping bypasses the pruning that makes each of the GEMV kernel's K blocks whole
        # groups; the planner may take that kernel wherever A's rows are one (a 1-D A too)
        overrides["config"] = config = dict(config, BLOCK_K=max(config["BLOCK_K"], group or 0))
    batch = tuple(torch.broadcast_shapes(batch_a, batch_b))

    # bfloat16 tl.dot is wrong under TRITON_INTERPRET=1 (the interpreter multiplies the raw bit
    # patterns), so the CPU tier draws float16 and float32; the GPU tier runs bfloat16 as well
    dtypes = [d for d in info.dtypes if d != torch.bfloat16 or not interpreting()]
    dtype = draw(st.sampled_from(dtypes))
    seed = draw(st.integers(0, 2**31 - 1))
    args: dict[str, Any] = {}
    notes = [f"M={m} N={n} K={k} batch={batch} config={config}"]
    for i, arg in enumerate(info.args):
        if arg.name == quant.group:
            args[arg.name] = group
            continue
        if arg.kind == "dtype":
            args[arg.name] = draw(st.sampled_from(dtypes))
            continue
        if arg.kind != "tensor":
            args[arg.name] = scalar_value(draw, arg)
            continue
        if arg.optional and draw(st.integers(0, 2)) == 0:
            args[arg.name] = None
            continue
        if arg.name == a_name:
            shape = (k,) if vector_a else batch_a + (m, k)
        elif arg.name == b_name:
            stored = k // quant.packed
            matrix = (n, stored) if arg.dims[-2:] == ("N", "K") else (stored, n)
            shape = (stored,) if vector_b else batch_b + matrix
        elif arg.dims == ("N", "G"):
            shape = (n, k // group)
        else:
            target = _epilogue_target(arg.dims, batch, m, n, not vector_a, not vector_b)
            if arg.dims[-1] == "M" and not vector_a and draw(st.booleans()):
                # a per-row operand as torch broadcasts one against the product: (..., M, 1),
                # A's rank (runtime/matmul.py, problem)
                shape = batch_a + (m, 1)
            else:
                shape = draw(broadcast_operand(target))
        layout = draw(layouts(len(shape)))
        # a promoted epilogue operand (a residual) has a dtype of its own: it never enters tl.dot;
        # so have a quantized weight's storage and the tensors that declare their dtypes
        if arg.dtypes:
            own = draw(st.sampled_from(arg.dtypes))
        else:
            own = draw(st.sampled_from(info.dtypes)) if arg.promotes else dtype
        args[arg.name] = make_tensor(shape, own, layout, low=arg.low, high=arg.high,
                                     seed=seed + i)
        notes.append(f"{arg.name}: {shape} {own} {layout}")
    tolerances = matmul_tolerances(k)
    if dtype != torch.float64:
        # a float64 operand of the epilogue promotes the result to float64, but the product is
        # float32's sums (torch's too): the bound of the operands' dtype
        tolerances[torch.float64] = tolerances[dtype]
    if quant.rounds_weight:
        scales = [args[name] for name in quant.scales if args[name] is not None]
        tolerances = _dequant_tolerances(tolerances, k, 8 // quant.packed, args[a_name], scales)
    return Case(args, (), overrides, describe="; ".join(notes), tolerances=tolerances)


@dataclass(frozen=True)
class Quantized:
    """What the cases need of a quantized B: elements a stored byte packs, the group-size
    argument, whether the kernel rounds the dequantized weight to A's dtype (a value applied
    per tile; block mode's per-block scaling cancels offset against the product instead; a
    per-channel factor scales the float32 accumulator, and int8 is exact in every float
    dtype), and the operands the K loop reads (its scales)."""

    packed: int = 1
    group: str | None = None
    rounds_weight: bool = False
    scales: tuple[str, ...] = ()


def _quantized(info) -> Quantized:
    """Read off the op's launch layout."""
    layout = info.launch   # runtime/matmul.py's OpLayout
    if not layout.quantized:
        return Quantized()
    return Quantized(packed=layout.packed, group=layout.group,
                     rounds_weight=layout.dequant_mode != "channel", scales=layout.loop_inputs)


def _dequant_tolerances(tolerances: dict, k: int, bits: int, a: torch.Tensor,
                        scales: list[torch.Tensor]) -> dict:
    """The bounds widened for a B dequantized per tile and rounded to A's dtype (half an ulp of
    each weight, which the float64 reference multiplies exactly): K such errors, each times an
    A element, add as a random walk. A weight is at most 2**bits - 1 steps of its scale (the
    drawn zero points lie in the integers' range; the largest operand the value reads stands
    for the scale)."""
    if a.numel() == 0 or not all(s.numel() for s in scales):
        return tolerances
    largest_w = (2 ** bits - 1) * max(s.abs().max().item() for s in scales)
    spread = math.sqrt(k) * a.abs().max().item() * largest_w
    return {dtype: (rtol, atol + 4 * torch.finfo(dtype).eps * spread)
            for dtype, (rtol, atol) in tolerances.items()}


def _epilogue_target(dims: tuple[str, ...], batch: tuple[int, ...], m: int, n: int,
                     keeps_m: bool, keeps_n: bool) -> tuple[int, ...]:
    shape: list[int] = []
    for d in dims:
        if d in ("...", "B"):
            shape += batch
        elif d == "M" and keeps_m:
            shape.append(m)
        elif d == "N" and keeps_n:
            shape.append(n)
    return tuple(shape)


# the sizes of a sample's named dims: none equal, so that a dim mixed up with another fails
SAMPLE_DIMS = {"M": 3, "K": 4, "N": 5, "B": 2}


def compile_kernels(module, arch: int = 90) -> list[str]:
    """Compiles a generated matmul module's split-K kernel, in its form that sums the slices in
    its last program (FUSED), to a CUDA binary without a GPU.

    That form takes its accumulator through a runtime branch, from the K loop's type (int32 for
    int8 operands, float32) into the epilogue's (float32; float64 where an epilogue operand
    promotes the result), and the compiler refuses a value whose type an ``if`` changes where
    the interpreter does not (int8_linear and linear_residual did on an H200). The tensors are
    float32 but those of their own dtypes, the output float64 where the epilogue promotes, the
    workspace the accumulator's type. Needs Triton's NVIDIA backend (ptxas ships with it) and no
    TRITON_INTERPRET. Returns one line per kernel.
    """
    from specgen.testing.core import compile_for_nvidia

    layout = module.LAYOUT
    (name,) = [n for n in vars(module) if n.endswith("_split_kernel")]
    kernel = getattr(module, name)
    own = {tensor: dtypes[0] for tensor, dtypes in layout.own_dtypes}
    out = torch.float64 if layout.promoted else torch.float32
    pointers = {f"{tensor}_ptr": own.get(tensor, torch.float32) for tensor, _ in layout.dims}
    pointers.update({f"{tensor}_ptr": out for tensor in layout.outputs})
    pointers.update(ws_ptr=torch.int32 if layout.integer_product else torch.float32,
                    counter_ptr=torch.int32)
    types = {torch.float32: "*fp32", torch.float64: "*fp64", torch.int32: "*i32",
             torch.int8: "*i8", torch.uint8: "*u8"}
    # a float scalar as its annotation declares it (float64)
    annotations = {param.name: param.annotation for param in kernel.fn.params}
    done = []
    # two-stage in int32 offsets, atomic in int64 ones
    for atomic, index_64 in ((False, False), (True, True)):
        # small tiles compile fastest (the branch's types do not depend on them); every
        # optional operand present
        constexprs = {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": max(layout.min_block_k, 32),
                      "GROUP_M": 8, "LAYOUT": "", "EVEN_K": False, "INDEX_64": index_64,
                      "INPUT_PRECISION": "ieee", "GROUP_K": 128, "PER_TILE": False,
                      "SPLIT_K": 4, "ATOMIC": atomic, "FUSED": True}
        constexprs.update({a: True for a in kernel.arg_names if a.startswith("HAS_")})

        def arg_type(arg: str, index_64=index_64) -> str:
            if arg in pointers:
                return types[pointers[arg]]
            return annotations[arg] or ("i64" if index_64 else "i32")

        binary = compile_for_nvidia(kernel, constexprs, arg_type, arch, num_warps=4,
                                    num_stages=2)
        assert binary.asm["cubin"], name
        done.append(f"{name} fused {'atomic int64' if atomic else 'two-stage int32'}")
    return done


def samples(info, make) -> dict[str, list[tuple]]:
    """Opcheck calls (``make``: specgen.testing.samples.Make): every operand at its dims (with a
    batch of 2 where it takes one), then without the batch, the A operand transposed and the
    optional operands omitted."""
    from specgen.testing.samples import default

    quant = _quantized(info)
    b_name = _roles(info)[1]
    sizes_ = dict(SAMPLE_DIMS)
    if quant.group is not None:
        # two groups of the smallest size
        sizes_.update(K=2 * GROUP_SIZES[0], G=2)

    def call(batched: bool):
        args = []
        for a in info.args:
            if a.name == quant.group:
                args.append(GROUP_SIZES[0])
            elif a.kind != "tensor":
                args.append(default(a))
            elif not batched and a.optional:
                args.append(None)
            else:
                dims = [d for d in a.dims if d != "..." or batched]
                shape = [2 if d == "..." else sizes_[d] for d in dims]
                if a.dtypes and not a.dtypes[0].is_floating_point:
                    # integer storage (a quantized weight, K packed, or an int8 operand)
                    packed = quant.packed if a.name == b_name else 1
                    shape[dims.index("K")] //= packed
                    bounds = torch.iinfo(a.dtypes[0])
                    args.append(torch.randint(bounds.min, bounds.max + 1, shape,
                                              dtype=a.dtypes[0], device=make.device))
                elif not batched and len(shape) == 2 and a is info.args[_a_operand(info)]:
                    args.append(make.t(*shape, g=True))
                else:
                    args.append(make.r(*shape, g=True))
        return tuple(args)

    return {info.name: [call(True), call(False)]}


def _a_operand(info) -> int:
    """The A operand's position: the tensor with M and K."""
    return next(i for i, a in enumerate(info.args) if {"M", "K"} <= set(a.dims))


def bench_cases(quick: bool) -> list:
    """The benchmark's rows (bench.harness.Case), bf16, in TFLOP/s (2 * M * N * K over the time).

    cuBLAS is the ceiling: eager ``torch.mm`` and ``F.linear`` call it, and the eager linear +
    gelu pays one extra pass over the output for the activation. The decode-like row (M = 16) is
    bound by reading the weight; specgen splits its K loop over programs there. The batched row
    multiplies by a transposed operand (attention's q @ k.mT: B contiguous along K). --quick
    divides every dim by 4 (the decode row keeps M = 16).
    """
    import torch.nn.functional as F

    from bench.harness import ours

    # Python functions rather than torch builtins, so torch.compile traces them as eager code
    def linear_gelu(m, n, k):
        return _bench_case("linear_gelu = gelu_tanh(x @ w.T + b)", m, n, k,
                           [(m, k), (n, k), (n,)], lambda x, w, b: ours().linear_gelu(x, w, b),
                           lambda x, w, b: F.gelu(F.linear(x, w, b), approximate="tanh"))

    def mm(m, n, k):
        return _bench_case("mm (eager: cuBLAS)", m, n, k, [(m, k), (k, n)],
                           lambda a, b: ours().mm(a, b), lambda a, b: torch.mm(a, b))

    def bmm_nt(batch, m, n, k):
        return _bench_case("bmm(a, b.mT) (eager: cuBLAS)", m, n, k,
                           [(batch, m, k), (batch, n, k)], lambda a, b: ours().bmm(a, b.mT),
                           lambda a, b: torch.bmm(a, b.mT), batch)

    scale = 4 if quick else 1
    big, huge, d = 4096 // scale, 8192 // scale, 4096 // scale
    return [linear_gelu(big, big, big), linear_gelu(huge, huge, huge), mm(huge, huge, huge),
            mm(big, big, big), linear_gelu(16, d, d),
            bmm_nt(16, 2048 // scale, 2048 // scale, 2048 // scale)]


def _bench_case(op: str, m: int, n: int, k: int, shapes: list[tuple[int, ...]], specgen, eager,
                batch: int = 1):
    from bench.harness import Case

    dtype = torch.bfloat16
    elements = sum(math.prod(shape) for shape in shapes) + batch * m * n
    return Case(family="matmul", op=op,
                shape=f"{batch}x{m}x{n}x{k}" if batch > 1 else f"{m}x{n}x{k}", dtype=dtype,
                make_inputs=lambda: tuple(torch.randn(shape, device="cuda", dtype=dtype)
                                          for shape in shapes),
                specgen=specgen, eager=eager, bytes_moved=dtype.itemsize * elements,
                flops=2 * batch * m * n * k)


FAMILY = Family(
    name="matmul", parse_body=parse_body, body_names=body_names, plan=plan, scaffold=scaffold,
    generated_names=GENERATED_NAMES, generated_prefixes=GENERATED_PREFIXES,
    derived_suffixes=DERIVED_SUFFIXES,
    # a quantized weight's integer storage and float32 scales; an output dtype argument
    takes=frozenset({"tensor of its own dtypes", "dtype argument"}), unread_args=unread_args,
    draw_case=draw_case, samples=samples, bench=bench_cases)

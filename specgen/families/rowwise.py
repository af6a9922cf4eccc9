"""Row-wise family: ordered reductions over one axis of a tensor, then output expressions.

Spec tables: ``[rows]`` (which tensor is reduced and over which dims, tensors read along a row),
``[reduce]`` (ordered steps ``name = { op, of, scale }``; each result is a per-row symbol),
``[compute]`` (outputs, in order: element-wise when they read a tensor, else per row),
``[columns]`` (optional: outputs summed over the rows, one value per element of the reduced shape,
as the gradient of a weight),
``[tuning]`` (``CHUNK``, ``num_warps`` of the chunked kernels) and ``[schedule]`` (``strategy``).

The planner decides everything the template spells out: the passes a chunked kernel makes over a
row (steps that do not read each other share a pass), whether the max-then-sum-of-exp pattern lets
the online strategy fuse two steps into one pass, the workspace slots of the split strategy, and
which tensors each pass loads.
"""

from __future__ import annotations

import ast
import copy
import itertools
import math
from dataclasses import dataclass

import torch

from specgen.derive import grad_name
from specgen.expr import Expr, Symbol, emit, helpers, parse_expr
from specgen.families.contract import Family
from specgen.families.common import (CommonPlan, check_name, common_plan, power_of_two_list,
                                     scalar_args, symbols_of, unread, warps_list)
from specgen.model import OpSpec, Output, ScalarArg, TensorArg
from specgen.table import Table, check_type, parse_list

OPS = ("sum", "max", "min")
STRATEGIES = ("auto", "single", "looped", "online", "split")
# [rows] layout: how element outputs that read a reduction are allocated, as the torch op they
# stand for allocates its result: contiguous (softmax, log_softmax, layer_norm), in the input's
# suggested memory format (rms_norm keeps channels_last), or as an element-wise composite would
# (F.normalize: like x)
LAYOUTS = ("contiguous", "memory_format", "elementwise")
# identities the masked lanes of each reduction take, written out in the kernels: torch.compile
# re-emits a constexpr global by its repr, and tl.constexpr(-inf) would not parse back
IDENTITY = {"sum": "0.0", "max": 'float("-inf")', "min": 'float("inf")'}
N_SYMBOL = "N"
# chunked kernels: elements of a chunk each thread holds (the config space keeps the CHUNK x
# num_warps pairs in range). The wide end matters for long rows: at 1024x32768 bf16 (H200)
# rms_norm's two passes ran in 37.8 us with 16384-wide chunks on 32 warps, 42.9 us with 4096 on 16
# (docs/performance.md, "Removed probes"; torch.compile: 38.1 us)
THREAD_ELEMENTS = (2, 32)
# the widest chunk of a split program (a share of one row): wider ones leave fewer programs a row
SPLIT_CHUNK_MAX = 4096
# and its most warps: at 8x262144 bf16 (H200), chunks of 1024-4096, the split kernels of softmax,
# layer_norm and rms_norm took 10.9-13.9 us on 4 or 8 warps, 12.0-26.6 us on 16 or 32
# (tools/perf/sweep_rowwise.py --part split): a share of a row is too short to feed more warps
SPLIT_WARPS_MAX = 8

# names the generated module binds for itself, in its kernels and host functions: a spec that
# declared one would shadow it or be shadowed (an entry ending in "_" stands for its numbered
# forms; tests/test_spec_errors.py checks the set against what the template binds)
GENERATED_NAMES = frozenset({
    "rowwise",  # its imports
    "compute",  # the math's type (COMPUTE), beside the choices' constexprs
    "args", "block", "col_mask", "col_size_", "delta", "deviation", "deviation_m2", "grads",
    "greater", "hi", "item", "kernel", "lane_n", "lo", "n_float", "n_rows", "n_splits",
    "new_max", "part", "part_m2", "part_max", "part_mean", "part_n", "part_shift", "part_sum",
    "pass_m2", "pass_mean", "plan", "pointers", "reduced", "run_m2", "run_mean", "share",
    "shift", "span", "split", "split_mask", "splits", "start", "step", "term", "total",
    "tune_key", "value", "workspace", "ws_ptr"
})
# grad_: the derived backward's gradient inputs and outputs; row_ and acc_: each step's per-row
# value and running accumulator, each row output's value (row_<name>, acc_<name>)
GENERATED_PREFIXES: tuple[str, ...] = ("grad_", "row_", "acc_")


@dataclass(frozen=True)
class Step:
    name: str
    op: str
    of: Expr
    scale: Expr | None


@dataclass(frozen=True)
class RowwiseBody:
    tensor: str                          # the tensor whose rows are reduced
    dim: str | int | None                # an int (or list of ints) argument, or a fixed dim
    normalized_shape: str | None         # a shape argument: reduce over the trailing dims
    along: tuple[str, ...]               # tensors of the reduced shape, read along each row
    absent: tuple[tuple[str, float], ...]  # the value an omitted optional tensor stands for
    finfo_eps: tuple[str, ...]           # optional floats that mean finfo(float32).eps when None
    keepdim: str | None                  # a bool argument: per-row outputs keep the reduced dims
    dtype: str | None                    # a dtype argument: the row tensor is cast to it first
    steps: tuple[Step, ...]
    outputs: tuple[Output, ...]
    row_outputs: tuple[str, ...]         # outputs with one value per row (they read no tensor)
    output_layouts: tuple[tuple[str, str, tuple[str, ...]], ...]  # element outputs not laid
                                         # out contiguously: (name, layout, the tensors that
                                         # decide it)
    chunks: tuple[int, ...]
    num_warps: tuple[int, ...]
    strategy: str
    layout: str = "contiguous"           # [rows] layout
    derived_from: str | None = None      # the op whose derived backward this is (none derives
                                         # a backward op again)
    column_outputs: tuple[Output, ...] = ()  # [columns]: summed over the rows
    output_dtypes: tuple[tuple[str, str], ...] = ()  # (output, the tensor whose dtype it
                                         # takes): a derived op's gradients, each in its tensor's
                                         # dtype as torch's; the others take the op's out dtype


def _names(table: Table, key: str, allowed: dict[str, str], what: str) -> tuple[str, ...]:
    raw = table.pop_any(key)
    if raw is None:
        return ()
    where = table.where.child(key)
    names = parse_list(raw, str, where)
    for name in names:
        if name not in allowed:
            raise where.error(f"'{name}' is not {what} (expected one of: "
                              f"{', '.join(sorted(allowed)) or 'none'})")
    return names


def unread_args(body: RowwiseBody, spec_args: tuple) -> tuple[tuple[str, str], ...]:
    """The tensors and scalars no step or output reads (dim, normalized_shape, keepdim and
    dtype shape the launch on the host: not read)."""
    host = {body.dim, body.normalized_shape, body.keepdim, body.dtype}
    exprs = [e for step in body.steps for e in (step.of, step.scale)]
    exprs += [o.expr for o in (*body.outputs, *body.column_outputs)]
    args = [a for a in (*(a for a in spec_args if a.kind == "tensor"), *scalar_args(spec_args))
            if a.name not in host]
    return unread(args, exprs, "no [reduce], [compute] or [columns] expression")


def body_names(body: RowwiseBody) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """The names the body declares, with their keys: steps, outputs, column outputs."""
    return (*((s.name, ("reduce", s.name)) for s in body.steps),
            *((o.name, ("compute", o.name)) for o in body.outputs),
            *((c.name, ("columns", c.name)) for c in body.column_outputs))


def parse_body(top: Table, spec_args: tuple, name: str) -> RowwiseBody:
    args = {a.name: a for a in spec_args}
    tensors = {a.name: a for a in spec_args if isinstance(a, TensorArg)}
    rows = top.pop_table("rows")
    tensor = rows.pop("tensor", str)
    if tensor not in tensors or tensors[tensor].optional:
        raise rows.where.child("tensor").error(
            f"'{tensor}' is not a required tensor argument (tensors: {', '.join(tensors) or 'none'})")
    dim, normalized_shape = _parse_axis(rows, args)
    along = _names(rows, "along", {n: "" for n in tensors if n != tensor}, "a tensor argument")
    absent = _parse_absent(rows, tensors, along)
    optional_floats = {a.name: "" for a in spec_args
                       if isinstance(a, ScalarArg) and a.type == "float" and a.optional}
    finfo_eps = _names(rows, "finfo_eps", optional_floats, "an optional float argument")
    keepdim = _parse_keepdim(rows, args)
    dtype = _parse_dtype(rows, args, tensors, tensor)
    layout = rows.pop_choice("layout", LAYOUTS, "contiguous")
    rows.finish()
    for arg in spec_args:
        where = top.where.child("args").child(arg.name)
        if isinstance(arg, TensorArg) and arg.dims:
            raise where.error("row-wise tensors take no 'dims': [rows] sets their shapes")
        if isinstance(arg, TensorArg) and arg.optional and arg.name not in along:
            raise where.error("only tensors read along a row ([rows] along) may be optional")
        if isinstance(arg, ScalarArg) and arg.type == "dtype" and arg.name != dtype:
            raise where.error("a dtype argument is only used as [rows] dtype")
        if isinstance(arg, ScalarArg) and arg.optional and arg.name not in finfo_eps + (dtype,):
            raise where.error("an optional scalar must say what None means: list it in "
                              "[rows] finfo_eps")
        if isinstance(arg, ScalarArg) and arg.type == "shape" and arg.name not in (normalized_shape,
                                                                                  dim):
            raise where.error("a shape argument is only used as [rows] normalized_shape or dim")

    # N: the row length, which scales such as 1 / N read
    symbols = {N_SYMBOL: Symbol(N_SYMBOL, "scalar"), **symbols_of(spec_args, (dim, keepdim, dtype))}
    elementwise = set(tensors)
    steps = _parse_steps(top.pop_table("reduce"), symbols, elementwise)
    outputs, row_outputs = _parse_outputs(top.pop_table("compute"), symbols, elementwise)
    column_outputs = _parse_columns(top.pop_table("columns", required=False), symbols,
                                    elementwise)
    if keepdim and not row_outputs:
        raise rows.where.child("keepdim").error(
            "keepdim shapes the outputs with one value per row, and every output of this op is "
            "element-wise (each reads a tensor)")
    output_layouts = _output_layouts(outputs, row_outputs, steps,
                                     [n for n in tensors if n not in along], layout)

    tuning = top.pop_table("tuning", required=False) or Table({}, top.where.child("tuning"))
    chunks = power_of_two_list(tuning, "CHUNK", (1024, 2048, 4096, 8192, 16384))
    num_warps = warps_list(tuning, (4, 8, 16, 32))
    if not chunk_pairs(chunks, num_warps):
        raise tuning.where.child("CHUNK").error(
            f"no CHUNK x num_warps pair spreads {THREAD_ELEMENTS[0]} to {THREAD_ELEMENTS[1]} "
            f"elements over each thread (CHUNK {list(chunks)}, num_warps {list(num_warps)})")
    tuning.finish()
    schedule = top.pop_table("schedule", required=False) or Table({}, top.where.child("schedule"))
    strategy = schedule.pop_choice("strategy", STRATEGIES, "auto")
    if strategy == "online" and online_pair(steps) is None:
        raise schedule.where.child("strategy").error(
            "'online' needs a max step directly followed by a sum of exp(E - max), E being the "
            "expression the max reduces; this op's [reduce] has no such pair")
    schedule.finish()
    return RowwiseBody(tensor, dim, normalized_shape, along, absent, finfo_eps, keepdim, dtype,
                       steps, outputs, row_outputs, output_layouts, chunks, num_warps,
                       strategy, layout, column_outputs=column_outputs)


def chunk_pairs(chunks: tuple[int, ...], num_warps: tuple[int, ...]) -> list[tuple[int, int]]:
    """The (chunk, num_warps) pairs of the chunked kernels' config space: those that give each
    thread ``THREAD_ELEMENTS`` elements of a chunk (fewer leave threads idle, more hold too many
    registers)."""
    low, high = THREAD_ELEMENTS
    return [(c, w) for c, w in itertools.product(chunks, num_warps) if low <= c // (32 * w) <= high]


def _parse_axis(rows: Table, args: dict) -> tuple[str | int | None, str | None]:
    raw_dim = rows.pop_any("dim")
    shape = rows.pop("normalized_shape", str, None)
    if (raw_dim is None) == (shape is None):
        raise rows.where.error("give exactly one of 'dim' (an int argument or an integer) and "
                               "'normalized_shape' (a shape argument)"
                               f"{rows.misspelling('dim', 'normalized_shape')}")
    if shape is not None:
        arg = args.get(shape)
        if not (isinstance(arg, ScalarArg) and arg.type == "shape"):
            raise rows.where.child("normalized_shape").error(
                f"'{shape}' is not an argument of kind \"shape\"")
        return None, shape
    where = rows.where.child("dim")
    if isinstance(raw_dim, str):
        arg = args.get(raw_dim)
        if not (isinstance(arg, ScalarArg) and arg.type in ("int", "shape") and not arg.optional):
            raise where.error(f"'{raw_dim}' is not an argument of kind \"int\" (one dim) or "
                              f"\"shape\" (a list of dims)")
        return raw_dim, None
    return check_type(raw_dim, int, where), None


def _arg_of_kind(rows: Table, key: str, args: dict, kind: str, optional: bool,
                 example: str) -> str | None:
    """``[rows] <key>``: the name of an argument of ``kind`` (``optional`` or not), declared as
    ``example``; None when the key is absent."""
    name = rows.pop(key, str, None)
    arg = args.get(name)
    if name is not None and not (isinstance(arg, ScalarArg) and arg.type == kind
                                 and arg.optional == optional):
        raise rows.where.child(key).error(
            f"'{name}' is not an argument of kind \"{kind}\" (as {key} = {example})")
    return name


def _parse_keepdim(rows: Table, args: dict) -> str | None:
    """``[rows] keepdim``: a bool argument, as torch's keepdim=False (an op without it drops the
    reduced dims from its per-row outputs)."""
    return _arg_of_kind(rows, "keepdim", args, "bool", False,
                        '{ kind = "bool", default = false }')


def _parse_dtype(rows: Table, args: dict, tensors: dict, tensor: str) -> str | None:
    """``[rows] dtype``: a dtype argument, as torch's softmax(x, dim, dtype=None): the row tensor
    is cast to it before the op, and the outputs have it (None: the input's dtype)."""
    name = _arg_of_kind(rows, "dtype", args, "dtype", True, '{ kind = "dtype", optional = true }')
    others = [n for n in tensors if n != tensor]
    if name is not None and others:
        raise rows.where.child("dtype").error(
            f"dtype casts the row tensor '{tensor}' before the op, as torch's dtype=; this op "
            f"also reads {', '.join(others)}")
    return name


def _parse_absent(rows: Table, tensors: dict, along: tuple[str, ...]) -> tuple[tuple[str, float], ...]:
    table = rows.pop_table("absent", required=False) or Table({}, rows.where.child("absent"))
    absent = {}
    while table.keys():
        key, raw, where = table.pop_item()
        if key not in along or not tensors[key].optional:
            raise where.error(f"'{key}' is not an optional tensor listed in 'along'"
                              f"{'' if along else rows.misspelling('along')}")
        absent[key] = check_type(raw, float, where)
    missing = [n for n in along if tensors[n].optional and n not in absent]
    if missing:
        raise table.where.error(f"say what the omitted optional tensor '{missing[0]}' stands for, "
                                f"as in {missing[0]} = 1.0")
    return tuple((n, absent[n]) for n in along if n in absent)


def _new_name(name: str, where, symbols: dict, what: str) -> None:
    check_name(name, where, what)
    if name in symbols:
        raise where.error(f"{what} '{name}' has the name of an argument, N or an earlier name")


def _parse_steps(table: Table, symbols: dict, elementwise: set) -> tuple[Step, ...]:
    steps = []
    while table.keys():
        name, raw, where = table.pop_item()
        _new_name(name, where, symbols, "reduction")
        check_type(raw, dict, where)
        entry = Table(raw, where)
        op = entry.pop_choice("op", OPS)
        later = {k: "a later step; a step reads only the steps before it" for k in table.keys()}
        of = parse_expr(entry.pop("of", str), where.child("of"), symbols, later)
        if not of.names & elementwise:
            raise where.child("of").error("reduces no tensor: the expression must read a tensor "
                                          "argument")
        scale_source = entry.pop("scale", str, None)
        scale = None
        if scale_source is not None:
            per_row = {k: s for k, s in symbols.items() if k not in elementwise}
            scale = parse_expr(scale_source, where.child("scale"), per_row, {
                **later, **{t: "a scale multiplies the row's reduced value and reads no tensor"
                            for t in elementwise}})
        entry.finish()
        steps.append(Step(name, op, of, scale))
        symbols[name] = Symbol(name, "value")
    if not steps:
        raise table.where.error('expected at least one step, as in '
                                'mean = { op = "sum", of = "x", scale = "1 / N" }')
    return tuple(steps)


def _parse_outputs(table: Table, symbols: dict, elementwise: set) -> tuple[tuple[Output, ...],
                                                                         tuple[str, ...]]:
    outputs, row_outputs = [], []
    while table.keys():
        name, source, where = table.pop_item()
        _new_name(name, where, symbols, "output")
        check_type(source, str, where)
        expr = parse_expr(source, where, symbols)
        outputs.append(Output(name, expr))
        symbols[name] = Symbol(name, "value")
        if expr.names & elementwise:
            elementwise.add(name)
        else:
            row_outputs.append(name)
    if not outputs:
        raise table.where.error('expected at least one output, as in out = "x / sum"')
    return tuple(outputs), tuple(row_outputs)


def _parse_columns(table: Table | None, symbols: dict, elementwise: set) -> tuple[Output, ...]:
    """``[columns]``: outputs summed over the rows, each of the reduced shape (``grad_weight =
    "grad_out * (x - mean) * rsqrt(var + eps)"``). They may read everything [compute] may, and
    its outputs."""
    if table is None:
        return ()
    columns = []
    while table.keys():
        name, source, where = table.pop_item()
        # a column output is no value of an element: no other expression reads it
        _new_name(name, where, {**symbols, **{c.name: None for c in columns}}, "column output")
        check_type(source, str, where)
        expr = parse_expr(source, where, symbols)
        if not expr.names & elementwise:
            raise where.error("reads no tensor: a column output sums an element-wise expression "
                              "over the rows")
        columns.append(Output(name, expr))
    if not columns:
        raise table.where.error('expected at least one column output, as in '
                                'grad_bias = "grad_out"')
    return tuple(columns)


def _output_layouts(outputs: tuple[Output, ...], row_outputs: tuple[str, ...],
                    steps: tuple[Step, ...], full: list[str],
                    layout: str) -> tuple[tuple[str, str, tuple[str, ...]], ...]:
    """The element outputs not laid out contiguously, each with its layout and the full-shape
    tensors that decide it. Those that read no reduction (``h = x + residual``) are laid out as
    torch lays out an element-wise result of the tensors they read, directly or through earlier
    such outputs; the others take ``[rows] layout`` over every full-shape tensor of the op.

    The outputs follow the torch op they stand for: an element-wise op lays its result out like
    its inputs, softmax and layer_norm return contiguous results, rms_norm keeps the input's
    channels_last format, and a composite of element-wise ops (``F.normalize``: ``x / norm``)
    lays its result out like x.
    """
    reduced = {s.name for s in steps} | set(row_outputs)  # names a reduction computes
    reads: dict[str, set[str]] = {}
    layouts: dict[str, tuple[str, set[str]]] = {}
    for output in outputs:
        if output.name in row_outputs:
            continue
        names = output.expr.names
        if names & reduced:
            reduced.add(output.name)
            if layout != "contiguous":
                layouts[output.name] = (layout, set(full))
            continue
        reads[output.name] = (names & set(full)).union(*(reads.get(n, set()) for n in names))
        layouts[output.name] = ("elementwise", reads[output.name])
    # in argument order: the first operand decides torch's memory order
    return tuple((name, kind, tuple(n for n in full if n in tensors))
                 for name, (kind, tensors) in layouts.items())


def _expressions(body: RowwiseBody) -> tuple[Expr, ...]:
    """Every expression of a spec: the steps' (and their scales), the outputs', the columns'."""
    steps = tuple(e for s in body.steps for e in (s.of, s.scale) if e is not None)
    return steps + tuple(o.expr for o in (*body.outputs, *body.column_outputs))


def variance_pair(steps: tuple[Step, ...]) -> int | None:
    """Index of a mean step (a sum of E scaled by 1 / N) that the next step sums (E - mean)**2 over.

    Chunked passes compute that pair in one read: each lane of the chunk tile keeps a running
    mean and sum of squared deviations (Welford), and the lanes are merged once after the loop
    (Chan et al.), as exact as two passes and never subtracting two large sums. The loop itself
    has no block-wide reduction (a per-chunk merge would need three, each a barrier round trip).
    """
    for i, (first, second) in enumerate(zip(steps, steps[1:])):
        if first.op != "sum" or second.op != "sum" or first.scale is None:
            continue
        if ast.dump(first.scale.tree) != ast.dump(ast.parse("1 / N", mode="eval").body):
            continue
        tree = second.of.tree
        if not isinstance(tree, ast.BinOp):
            continue
        if isinstance(tree.op, ast.Mult):
            squared = ast.dump(tree.left) == ast.dump(tree.right) and tree.left
        else:
            squared = isinstance(tree.op, ast.Pow) and _int_power(tree.right) == 2 and tree.left
        if squared and _is_shifted(squared, first):
            return i
    return None


def _int_power(node: ast.expr) -> int | None:
    return node.value if isinstance(node, ast.Constant) and type(node.value) is int else None


def online_pair(steps: tuple[Step, ...]) -> int | None:
    """Index of a max step that the next step sums exp(E - max) over (E: what the max reduces).

    That pair is what online softmax fuses into one pass: a running max and a running sum
    rescaled whenever the max grows.
    """
    for i, (first, second) in enumerate(zip(steps, steps[1:])):
        if first.op != "max" or first.scale is not None or second.op != "sum":
            continue
        call = second.of.tree
        if (isinstance(call, ast.Call) and call.func.id == "exp" and len(call.args) == 1
                and _is_shifted(call.args[0], first)):
            return i
    return None


# ---- the plan -------------------------------------------------------------------------------


@dataclass(frozen=True)
class TensorPlan:
    name: str
    role: str                      # row | like | along | out | row_out | col_out
    optional: bool = False
    absent: float = 0.0
    cast: str = ""                 # a dtype the loaded values are rounded to first ([rows] dtype)

    @property
    def ptr(self) -> str:
        return f"{self.name}_ptr"

    @property
    def has(self) -> str:
        return f"HAS_{self.name.upper()}"

    @property
    def var(self) -> str:
        return f"row_{self.name}" if self.role == "row_out" else self.name


@dataclass(frozen=True)
class StepPlan:
    name: str
    op: str
    value: str                     # the element-wise value reduced, as Triton source
    scale: str | None
    slot: int                      # first workspace slot of the split strategy
    tensors: tuple[str, ...]       # tensors the value reads
    shift: bool = False            # a max whose -inf-safe copy a later sum of exp subtracts

    @property
    def var(self) -> str:
        return f"row_{self.name}"

    @property
    def acc(self) -> str:
        return f"acc_{self.name}"

    @property
    def identity(self) -> str:
        """The reduction's identity, a Triton literal (masked lanes hold it)."""
        return IDENTITY[self.op]

    @property
    def combine(self) -> str | None:
        """The kernel_lib helper that combines two max or min partials (None: a sum)."""
        return COMBINE.get(self.op)


# specgen.kernel_lib helpers that combine max and min partials (NaN propagates, as in torch)
COMBINE = {"max": "maximum_f32", "min": "minimum_f32"}


@dataclass(frozen=True)
class PassPlan:
    """One read of the row by a chunked kernel: plain steps accumulated side by side, the online
    max/sum pair, or the mean/variance pair."""

    steps: tuple[StepPlan, ...]
    kind: str                      # plain | online | variance
    tensors: tuple[str, ...]

    @property
    def online(self) -> bool:
        return self.kind == "online"

    @property
    def variance(self) -> bool:
        return self.kind == "variance"


@dataclass(frozen=True)
class OutputPlan:
    name: str
    code: str
    per_row: bool
    layout: str = "contiguous"     # or memory_format, elementwise: over the tensors in `like`
    like: tuple[str, ...] = ()
    dtype: str | None = None       # the tensor whose dtype an output takes, where not the op's


@dataclass(frozen=True)
class DerivedBackward:
    """How the forward's eager autograd calls its derived backward op (rowwise_backward.py): the
    data of the runtime's ``rowwise.Backward``."""

    op: str                        # the derived op
    call: tuple[str | int, ...]    # its arguments: forward arguments, or output gradients by index
    results: tuple[str, ...]       # its results, the gradients of these forward tensors
    grads: tuple[str | None, ...]  # the gradient of every forward argument among them, or None
    dtype: str | None              # the forward's dtype argument, which the derived op lacks:
                                   # it serves casts that leave x's values exact (exact_cast)
    # the forward's optional tensors, which the derived op needs, each with the value it stands
    # for when omitted ([rows] absent): the derived op then reads a tensor of that value
    absent: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class RowwisePlan(CommonPlan):
    row_tensor: str = ""
    dim: str | int | None = None
    normalized_shape: str | None = None
    finfo_eps: tuple[str, ...] = ()
    keepdim: str | None = None
    dtype: str | None = None
    tensors: tuple[TensorPlan, ...] = ()
    steps: tuple[StepPlan, ...] = ()
    variance: int | None = None                # index of the mean of a mean/variance pair
    reads_n: bool = False                      # an expression reads N, or a variance pair
    looped_passes: tuple[PassPlan, ...] = ()
    online_passes: tuple[PassPlan, ...] = ()
    outputs: tuple[OutputPlan, ...] = ()
    columns: tuple[OutputPlan, ...] = ()       # [columns]: outputs summed over the rows
    # calls over row values that the element and column outputs share: computed once a row
    row_terms: tuple[tuple[str, str], ...] = ()
    output_tensors: tuple[str, ...] = ()       # what element and column outputs load
    strategy: str = "auto"
    chunked_configs: tuple[dict, ...] = ()   # looped and online kernels
    split_configs: tuple[dict, ...] = ()     # split kernels: chunks up to SPLIT_CHUNK_MAX, warps
                                             # up to SPLIT_WARPS_MAX
    interpreter_config: dict | None = None
    split_interpreter_config: dict | None = None
    max_chunk: int = 0                       # the widest split chunk (sets the split count)
    widest_chunk: int = 0
    helpers: tuple[str, ...] = ()      # specgen.kernel_lib functions the kernels call
    backward: DerivedBackward | None = None
    derived_from: str | None = None

    @property
    def strategies(self) -> tuple[str, ...]:
        online = ("online",) if self.online_passes else ()
        return ("single", "looped") + online + ("split",)

    @property
    def split_passes(self) -> tuple[PassPlan, ...]:
        """The split strategy makes the fewest passes it can: online ones when the pattern is there."""
        return self.online_passes or self.looped_passes

    @property
    def slot_count(self) -> int:
        """float32 partials per row and split: one per step, and the count of a variance pair."""
        return len(self.steps) + sum(p.variance for p in self.split_passes)

    def of_role(self, *roles: str) -> tuple[TensorPlan, ...]:
        return tuple(t for t in self.tensors if t.role in roles)

    @property
    def inputs(self) -> tuple[TensorPlan, ...]:
        return self.of_role("row", "like", "along")

    @property
    def elem_tensors(self) -> tuple[TensorPlan, ...]:
        """Element-wise tensors in RowSpace order: outputs first, then the inputs."""
        return self.of_role("out") + self.of_role("row", "like")

    @property
    def optional_tensors(self) -> tuple[TensorPlan, ...]:
        return tuple(t for t in self.tensors if t.optional)

    @property
    def value_ints(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.kernel_scalars if a.kind == "int")

    @property
    def kernel_scalars(self) -> tuple:
        # the dim and keepdim shape the launch on the host; the kernels never read them
        return tuple(a for a in self.scalars if a.name not in (self.dim, self.keepdim))

    @property
    def pointer_names(self) -> tuple[str, ...]:
        """The pointer parameters every row-wise kernel starts with. Column outputs are summed
        into a float32 workspace (their strides say where a column's value goes); a later
        kernel adds its rows up into them."""
        workspace = ("cols_ws_ptr",) if self.columns else ()
        return tuple(t.ptr for t in self.inputs + self.of_role("out", "row_out")) + workspace

    @property
    def size_and_stride_groups(self) -> tuple[tuple[str, ...], ...]:
        """The size and stride parameters after them, in ``RowSpace.kernel_args`` order, a group
        a line: the sizes, then each tensor's strides."""
        rows = lambda name: tuple(f"{name}_{d}" for d in range(ROW_RANK))
        cols = lambda name: tuple(f"{name}_{d}" for d in range(COL_RANK))
        # the outermost dim's size is never read: its coordinate is what the others leave
        groups = [rows("row_size")[:-1] + cols("col_size")[:-1]]
        for t in self.elem_tensors:
            groups.append(rows(f"{t.name}_row_stride") + cols(f"{t.name}_col_stride"))
        groups += [cols(f"{t.name}_col_stride") for t in self.of_role("along", "col_out")]
        groups += [rows(f"{t.name}_row_stride") for t in self.of_role("row_out")]
        return tuple(groups)

    @property
    def flag_params(self) -> tuple[str, ...]:
        """The op's constexpr parameters, which every row-wise kernel takes after them: its
        choices and whether each optional tensor is given."""
        return (*(c.constexpr for c in self.choices), *(t.has for t in self.optional_tensors))

    def row_offsets_of(self, names: tuple[str, ...] | None = None) -> tuple[TensorPlan, ...]:
        """The tensors a kernel forms row offsets of: those of ``names`` (a split kernel's pass
        reads them and stores nothing but partials), or every one with rows."""
        return tuple(t for t in self.elem_tensors + self.of_role("row_out")
                     if names is None or t.name in names)

    def col_offsets_of(self, names: tuple[str, ...]) -> tuple[TensorPlan, ...]:
        return tuple(t for t in self.elem_tensors + self.of_role("along", "col_out")
                     if t.name in names)

    def loads(self, names: tuple[str, ...]) -> tuple[TensorPlan, ...]:
        return tuple(t for t in self.inputs if t.name in names)

    @property
    def compute_of(self) -> str:
        """The tensor whose dtype sets the math's (COMPUTE: float64 for float64, else float32):
        the first output's, or the tensor's it takes its dtype from (a gradient's, its input's)."""
        first = (self.outputs or self.columns)[0]
        return first.dtype or first.name

    @property
    def elem_outputs(self) -> tuple[OutputPlan, ...]:
        return tuple(o for o in self.outputs if not o.per_row)

    @property
    def row_outputs(self) -> tuple[OutputPlan, ...]:
        return tuple(o for o in self.outputs if o.per_row)

    @property
    def stored_elem(self) -> tuple[str, ...]:
        return tuple(o.name for o in self.elem_outputs)

    @property
    def along_names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.of_role("along"))

    @property
    def like_names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.of_role("like"))

    @property
    def dtype_key(self) -> str:
        return ", ".join(f"{t.name}.dtype" if not t.optional else
                         f"None if {t.name} is None else {t.name}.dtype" for t in self.tensors)

    @property
    def used_tensors(self) -> tuple[str, ...]:
        """Inputs any step or output reads: what the single-tile kernel loads."""
        names = {t for s in self.steps for t in s.tensors} | set(self.output_tensors)
        return tuple(t.name for t in self.inputs if t.name in names)

    @property
    def step_tensors(self) -> tuple[str, ...]:
        """Inputs the reductions read."""
        names = {t for s in self.steps for t in s.tensors}
        return tuple(t.name for t in self.inputs if t.name in names)

    @property
    def output_only_tensors(self) -> tuple[str, ...]:
        """Inputs only the outputs read: the single tile loads those after its reductions, so
        that they hold no registers across them."""
        return tuple(n for n in self.output_tensors if n not in self.step_tensors)

    @property
    def axis_doc(self) -> str:
        if self.normalized_shape:
            return f"the trailing dims `{self.normalized_shape}`"
        return f"dim `{self.dim}`" if isinstance(self.dim, str) else f"dim {self.dim}"

    @property
    def _launch_groups(self) -> tuple[tuple[TensorPlan, ...], ...]:
        """launch_plan's three tensor lists: the element-wise tensors, what the launch lays out
        along a row (the tensors read there, the column outputs), the per-row outputs."""
        return self.elem_tensors, self.of_role("along", "col_out"), self.of_role("row_out")

    @property
    def column_out_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    @property
    def chunked_part_rows(self) -> int:
        """Rows of N in a chunked program's part of the column workspace: each output's running
        sum, then each one's carry (``rowwise.LaunchPlan.column_workspace`` allocates them)."""
        return 2 * len(self.columns)

    @property
    def chunked_column_rows(self) -> tuple[tuple[str, int, int], ...]:
        """Each column output with its sum's row and its carry's row in that part."""
        count = len(self.columns)
        return tuple((c.name, i, count + i) for i, c in enumerate(self.columns))

    @property
    def promoted(self) -> tuple[str, ...]:
        """The row tensor's element-wise companions (a residual), whose dtypes promote with its
        into the outputs' as torch's ``x + residual`` does; none under ``[rows] dtype``, or in a
        derived op (its gradients take their tensors' dtypes)."""
        if self.dtype or self.derived_from:
            return ()
        return self.like_names

    @property
    def kernel_roles(self) -> tuple[tuple[str, str], ...]:
        """The module's kernels by the roles the runtime launches them in (the split passes' as
        one tuple, SPLIT_KERNELS)."""
        roles = [("single", f"{self.kernel}_single_kernel"),
                 ("looped", f"{self.kernel}_looped_kernel")]
        if self.online_passes:
            roles.append(("online", f"{self.kernel}_online_kernel"))
        roles += [("split", "SPLIT_KERNELS"), ("split_out", f"{self.kernel}_split_out_kernel")]
        if self.columns:
            roles.append(("columns", f"{self.kernel}_columns_kernel"))
        return tuple(roles)

    @property
    def launch_data(self) -> dict[str, object]:
        """The runtime's ``rowwise.Launch`` fields beside the module's constants (STRATEGY, ...):
        ``roles`` (the arguments' and tensors' parts, in field order), ``outputs`` (kind, name,
        like, the tensor whose dtype it takes), ``results``, ``fp_fusion``."""
        outputs = [("column", c.name, (), c.dtype) for c in self.columns]
        for o in self.outputs:
            kind = "per_row" if o.per_row else o.layout
            outputs.append((kind, o.name, o.like if kind in ("elementwise", "memory_format")
                            else (), o.dtype))
        roles = {
            "row_tensor": self.row_tensor, "dim": self.dim,
            "normalized_shape": self.normalized_shape, "keepdim": self.keepdim,
            "dtype": self.dtype, "finfo_eps": self.finfo_eps, "like": self.like_names,
            "along": self.along_names, "promoted": self.promoted,
            "inputs": tuple(t.name for t in self.inputs),
            "pointer_outputs": tuple(t.name for t in self.of_role("out", "row_out")),
            "launch_tensors": tuple(tuple(t.name for t in group) for group in self._launch_groups),
            "optional": tuple((t.name, t.has) for t in self.optional_tensors),
            "kernel_scalars": tuple(a.name for a in self.kernel_scalars),
            "dtype_key": tuple(t.name for t in self.tensors),
            "compute_of": self.compute_of,
        }
        return {"roles": roles, "outputs": tuple(outputs), "results": self.output_names,
                # a derived op's kernels compile without FMA contraction (launch.py): terms that
                # cancel (specgen/polynomial.py)
                "fp_fusion": not self.derived_from}


# the kernels' row and reduced dims: specgen/runtime/rowwise.py collapses layouts to the same
# two (the generator imports no runtime; tests/test_rowwise_spec.py checks that they agree)
ROW_RANK = 4
COL_RANK = 3


def eager_call(spec: OpSpec) -> DerivedBackward | None:
    """How ``spec``'s eager autograd calls the backward op derived from it at the spec stage
    (``spec.derived``: rowwise_backward.py), where it has one."""
    if not spec.derived:
        return None
    (derived,) = spec.derived
    cotangents = {grad_name(o.name): i for i, o in enumerate(spec.body.outputs)}
    results = tuple(o.name for o in derived.body.outputs + derived.body.column_outputs)
    return DerivedBackward(
        derived.name, tuple(cotangents.get(a.name, a.name) for a in derived.args), results,
        tuple(grad_name(a.name) if grad_name(a.name) in results else None for a in spec.args),
        spec.body.dtype, spec.body.absent)


def plan(spec: OpSpec) -> RowwisePlan:
    body: RowwiseBody = spec.body
    absent = dict(body.absent)
    roles = {body.tensor: "row", **{n: "along" for n in body.along}}
    # [rows] dtype: the row tensor is cast to the outputs' dtype (the dtype argument, or the
    # input's own) before the op, as torch casts it; a cast to the same or a wider dtype is exact
    cast = f"{body.outputs[0].name}_ptr.dtype.element_ty" if body.dtype else ""
    tensors = [TensorPlan(t.name, roles.get(t.name, "like"), t.optional, absent.get(t.name, 0.0),
                          cast if t.name == body.tensor else "")
               for t in spec.tensors]
    tensors += [TensorPlan(o.name, "row_out" if o.name in body.row_outputs else "out")
                for o in body.outputs]
    tensors += [TensorPlan(c.name, "col_out") for c in body.column_outputs]
    tensor_names = {t.name for t in spec.tensors}

    pair = online_pair(body.steps)
    variance = variance_pair(body.steps)
    if variance is not None and pair is not None and variance == pair + 1:
        variance = None   # the online pair's sum is not a mean to fuse again
    names = {c.name: c.constexpr for c in spec.choices}
    names[N_SYMBOL] = "n_float"
    names.update({s.name: f"row_{s.name}" for s in body.steps})
    names.update({n: f"row_{n}" for n in body.row_outputs})
    per_row = {s.name for s in body.steps} | set(body.row_outputs)
    shift = (body.steps[pair], f"row_{body.steps[pair].name}_shift") if pair is not None else None
    steps = []
    for i, step in enumerate(body.steps):
        scale = None if step.scale is None else emit(step.scale, names)
        value = emit(_rewrite(step.of, shift if i != pair else None, per_row), names)
        # a variance pair keeps a third partial, its element count, after its two
        slot = i + (variance is not None and i > variance + 1)
        steps.append(StepPlan(step.name, step.op, value, scale, slot,
                              tuple(sorted(step.of.names & tensor_names)),
                              shift=pair is not None and i == pair))
    steps = tuple(steps)

    looped = _passes(steps, body.steps, None, variance)
    online = _passes(steps, body.steps, pair, variance) if pair is not None else ()
    layouts = {name: (layout, like) for name, layout, like in body.output_layouts}
    dtypes = dict(body.output_dtypes)
    rewritten = {o.name: _rewrite(o.expr, shift, per_row)
                 for o in body.outputs + body.column_outputs}
    element = [o.name for o in body.outputs if o.name not in body.row_outputs]
    shared = _shared_row_terms(rewritten, element + [c.name for c in body.column_outputs],
                               tensor_names | set(rewritten),
                               set(names.values()) | {a.name for a in spec.args})
    codes = {name: emit(expr, names) for name, expr in rewritten.items()}
    for i, name in enumerate(element):
        # an element output equal to an earlier one (add_rms_norm's two gradients) is that one
        codes[name] = next((e for e in element[:i] if codes[e] == codes[name]), codes[name])
    outputs = tuple(OutputPlan(o.name, codes[o.name], o.name in body.row_outputs,
                               *layouts.get(o.name, ("contiguous", ())), dtype=dtypes.get(o.name))
                    for o in body.outputs)
    columns = tuple(OutputPlan(c.name, codes[c.name], False, dtype=dtypes.get(c.name))
                    for c in body.column_outputs)
    # the output pass computes every element and column output, so it loads what any reads
    output_tensors = tuple(sorted({t for o in body.outputs + body.column_outputs
                                   if o.name not in body.row_outputs
                                   for t in o.expr.names & tensor_names}))
    configs = tuple({"BLOCK_M": 1, "BLOCK_N": c, "num_warps": w}
                    for c, w in chunk_pairs(body.chunks, body.num_warps))
    # a split program reads a share of one row: narrow chunks leave more programs a row
    split_configs = tuple(c for c in configs if c["BLOCK_N"] <= SPLIT_CHUNK_MAX
                          and c["num_warps"] <= SPLIT_WARPS_MAX) or configs
    # helpers are imported by name (torch.compile re-emits them under their own names): the
    # expressions' functions, the max/min combines, and maximum_f32 of the online update
    called = set().union(*(helpers(e) for s in body.steps for e in (s.of, s.scale) if e),
                         *(helpers(o.expr) for o in body.outputs + body.column_outputs))
    called |= {COMBINE[s.op] for s in body.steps if s.op in COMBINE}
    if variance is not None:
        # the single tile's deviations and squares reduced together; the chunked passes' lanes
        called |= {"add_pairs", "welford_step", "merge_lanes", "merge_splits"}
    if columns:
        # a program's column sums over its blocks of rows
        called |= {"compensated_add", "add_to_partials"}
    # the row and column tiles and their offsets, in every row kernel
    called |= {"tile_rows", "tile_columns", "row_offset", "col_offset"}
    common = common_plan(spec, tuple(o.name for o in body.outputs + body.column_outputs))
    # a variance pair's mean is corrected by its deviations' sum over N
    reads_n = variance is not None or any(N_SYMBOL in e.names for e in _expressions(body))
    return RowwisePlan(
        **common.__dict__, row_tensor=body.tensor, dim=body.dim,
        normalized_shape=body.normalized_shape, finfo_eps=body.finfo_eps, keepdim=body.keepdim,
        dtype=body.dtype, tensors=tuple(tensors),
        steps=steps, variance=variance, reads_n=reads_n, looped_passes=looped,
        online_passes=online, outputs=outputs,
        columns=columns, row_terms=tuple((name, emit(tree, names)) for name, tree in shared),
        output_tensors=output_tensors, strategy=body.strategy, chunked_configs=configs,
        split_configs=split_configs,
        # under the interpreter: two rows a program and 16-wide chunks, so tiny rows still take
        # the row masks and several chunks
        interpreter_config={"BLOCK_M": 2, "BLOCK_N": 16, "num_warps": 4},
        split_interpreter_config={"BLOCK_M": 1, "BLOCK_N": 16, "num_warps": 4},
        max_chunk=max(c["BLOCK_N"] for c in split_configs),
        widest_chunk=max(c["BLOCK_N"] for c in configs), helpers=tuple(sorted(called)),
        backward=eager_call(spec), derived_from=body.derived_from)


def _shared_row_terms(exprs: dict[str, Expr], element: list[str], tensors: set[str],
                      taken: set[str]) -> list[tuple[str, ast.expr]]:
    """The calls that read no tensor (row values, scalars) and stand more than once in the
    element and column outputs' expressions, outermost ones: each named ``row_<function>`` and
    its places in ``exprs`` read the name (layer_norm_backward's rsqrt(var + eps), four times in
    grad_x, is computed once a row). The same operations in the same order: the same values."""
    counts: dict[str, int] = {}
    nodes: dict[str, ast.expr] = {}
    for name in element:
        for node in ast.walk(exprs[name].tree):
            if isinstance(node, ast.Call) and not any(
                    isinstance(n, ast.Name) and n.id in tensors for n in ast.walk(node)):
                key = ast.dump(node)
                counts[key] = counts.get(key, 0) + 1
                nodes.setdefault(key, node)
    repeated = {key for key, count in counts.items() if count > 1}
    # a repeated call inside another is computed with it
    inner = {ast.dump(n) for key in repeated for n in ast.walk(nodes[key]) if n is not nodes[key]}
    shared: dict[str, str] = {}
    for key in sorted(repeated - inner, key=list(counts).index):
        function = nodes[key].func.id
        label = next(f"row_{function}{suffix}" for suffix in ("", *range(1, len(repeated) + 1))
                     if f"row_{function}{suffix}" not in taken | set(shared.values()))
        shared[key] = label

    class Share(ast.NodeTransformer):
        def visit_Call(self, node: ast.Call) -> ast.expr:
            label = shared.get(ast.dump(node))
            return ast.Name(label, ast.Load()) if label else self.generic_visit(node)

    for name in element:
        # (on a copy: the spec's own tree stays as parsed)
        tree = Share().visit(copy.deepcopy(exprs[name].tree))
        exprs[name] = Expr(exprs[name].source, ast.fix_missing_locations(tree), exprs[name].names)
    return [(label, nodes[key]) for key, label in shared.items()]


def _rewrite(expr: Expr, shift: tuple[Step, str] | None, per_row: set[str]) -> Expr:
    """Two rewrites of an expression before it is emitted.

    - In the online pattern, ``exp(E - max)`` subtracts the -inf-safe max (0 when the row's max is
      -inf) wherever it appears: an all -inf row then sums to 0 in every strategy, as in the online
      update (softmax still gives NaN there, 0 / 0), and the single-tile kernel computes the exps
      of the sum and of the output once.
    - ``a / r`` with ``r`` a per-row value becomes ``a * (1.0 / r)``: one division per row rather
      than per element (one more rounding, in float32).
    """
    tree = ast.parse(ast.unparse(expr.tree), mode="eval").body

    class Rewriter(ast.NodeTransformer):
        def visit_Call(self, node: ast.Call) -> ast.expr:
            self.generic_visit(node)
            if shift is not None and node.func.id == "exp" and _is_shifted(node.args[0], shift[0]):
                node.args[0].right = ast.Name(shift[1], ast.Load())
            return node

        def visit_BinOp(self, node: ast.BinOp) -> ast.expr:
            self.generic_visit(node)
            if (isinstance(node.op, ast.Div) and isinstance(node.right, ast.Name)
                    and node.right.id in per_row):
                reciprocal = ast.BinOp(ast.Constant(1.0), ast.Div(), node.right)
                return ast.BinOp(node.left, ast.Mult(), reciprocal)
            return node

    tree = ast.fix_missing_locations(Rewriter().visit(tree))
    return Expr(expr.source, tree, expr.names)


def _is_shifted(node: ast.expr, step: Step) -> bool:
    """``E - max``, E being what the max step reduces."""
    return (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Sub)
            and isinstance(node.right, ast.Name) and node.right.id == step.name
            and ast.dump(node.left) == ast.dump(step.of.tree))


def _passes(steps: tuple[StepPlan, ...], specs: tuple[Step, ...], pair: int | None,
            variance: int | None) -> tuple[PassPlan, ...]:
    """Groups steps into reads of the row: a step joins the current pass unless its value reads a
    step of that pass (a variance needs its mean first); the online pair and the mean/variance
    pair are passes of their own."""
    passes: list[list[int]] = []
    kinds: list[str] = []
    i = 0
    while i < len(steps):
        fused = {pair: "online", variance: "variance"}.get(i)
        if fused is not None:
            passes.append([i, i + 1])
            kinds.append(fused)
            i += 2
            continue
        current = passes[-1] if passes and kinds[-1] == "plain" else None
        reads = specs[i].of.names
        if current is None or any(specs[j].name in reads for j in current):
            passes.append([i])
            kinds.append("plain")
        else:
            current.append(i)
        i += 1
    plans = []
    for members, kind in zip(passes, kinds):
        members_steps = tuple(steps[j] for j in members)
        tensors = tuple(sorted({t for s in members_steps for t in s.tensors}))
        plans.append(PassPlan(members_steps, kind, tensors))
    return tuple(plans)


def scaffold(name: str) -> str:
    return f'''# A row-wise op: see docs/families.md, "Row-wise family".
[op]
name = "{name}"
family = "rowwise"
doc = "x / sqrt(mean(x * x) + eps) over the last dim"
reference = "x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)"

[args]
x = "tensor"
eps = {{ kind = "float", default = 1e-6 }}

[rows]
tensor = "x"
dim = -1
layout = "elementwise"  # as the reference (element-wise ops) lays out its result; torch's
                        # softmax and norm kernels return contiguous ones (the default)

[reduce]
ms = {{ op = "sum", of = "x * x", scale = "1 / N" }}

[compute]
out = "x * rsqrt(ms + eps)"
'''


# --- Its property tests, opcheck samples and benchmark cases -------------------------------------
# The tests and the bench call these (``FAMILY``'s draw_case, samples and bench); they import
# hypothesis, specgen.testing and bench where they run: the generator needs none of them.
# compile_kernels compiles its kernels for sm_90 without a GPU (the CPU tier's compile test).

# where the property test draws a float argument whose spec gives no range (an eps)
EPS_RANGE = (1e-6, 0.5)

# under the interpreter, the chunked strategies are forced on at most this many rows: they run
# one or two rows a program (a split one, one row per program and kernel), some 10 ms a row each
# in numpy, while a single-tile program takes many short rows at once
CHUNKED_ROWS = 32


# float32 sums over a row round at every step; the bound grows a little with the length
TOLERANCES = {torch.float32: (5e-5, 2e-5), torch.float16: (1e-3, 1e-5),
              torch.bfloat16: (8e-3, 1e-5), torch.float64: (1e-9, 1e-10)}


def draw_case(draw, info):
    """A property-test call: a row tensor in any layout, reduced over a drawn dim or over its
    trailing dims, with companions of its shape, tensors along the row (or omitted), -inf
    entries, and every strategy forced in turn."""
    from hypothesis import strategies as st

    from specgen.runtime import interpreting
    from specgen.runtime.rowwise import compute_dtype, single_fits
    from specgen.testing.core import (Case, cast_first, dtype_arg, knobs, layouts, make_tensor,
                                      max_numel, scalar_value, shapes)

    launch = info.launch   # runtime/rowwise.py's Launch: which argument plays which part
    x_name = launch.row_tensor
    by_shape = launch.normalized_shape is not None
    dim_arg = launch.dim if isinstance(launch.dim, str) else None
    # a 0-dim tensor has one row of one element; ops with a fixed dim or a normalized_shape
    # need a dim to reduce. Under the interpreter (numpy, the looped kernels over 16-wide
    # chunks) 512 elements at most
    min_rank = 0 if dim_arg else 1
    budget = 512 if interpreting() else max_numel()
    shape = draw(shapes(min_rank=min_rank, max_rank=4, max_elements=budget))
    rank = len(shape)
    if by_shape:
        k = draw(st.integers(1, min(rank, 3)))
        reduced = tuple(range(rank - k, rank))
    elif dim_arg:
        many = next(a for a in info.args if a.name == dim_arg).kind == "shape"
        count = draw(st.integers(1, min(max(rank, 1), 3))) if many else 1
        dims = draw(st.lists(st.integers(-max(rank, 1), max(rank, 1) - 1), min_size=count,
                             max_size=count, unique_by=lambda d: d % max(rank, 1)))
        dim = dims if many else dims[0]
        reduced = () if rank == 0 else tuple(sorted(d % rank for d in dims))
    else:
        reduced = (launch.dim % rank,)
    reduced_shape = tuple(shape[d] for d in reduced)

    dtype = draw(st.sampled_from(info.dtypes))
    seed = draw(st.integers(0, 2**31 - 1))
    args: dict = {}
    notes = [f"shape {shape}, reduced dims {reduced}, {dtype}"]
    for i, arg in enumerate(info.args):
        if arg.kind == "tensor":
            if arg.optional and draw(st.booleans()):
                args[arg.name] = None
                continue
            along = arg.name in launch.along
            operand = reduced_shape if along else shape
            layout = draw(layouts(len(operand)))
            args[arg.name] = make_tensor(operand, dtype, layout, low=arg.low, high=arg.high,
                                         seed=seed + i)
            notes.append(f"{arg.name}: {operand} {layout}")
        elif arg.name == dim_arg:
            args[arg.name] = dim
        elif arg.kind == "shape":
            args[arg.name] = list(reduced_shape)
        elif arg.kind == "dtype":
            args[arg.name] = dtype_arg(draw, info.dtypes, dtype)
        elif arg.kind == "float":
            # eps-like scalars unless the spec gives a range: positive, from tiny to large
            # enough to matter
            low, high = arg.range or EPS_RANGE
            value = draw(st.floats(low, high))
            if arg.optional:
                value = draw(st.sampled_from([None, value]))
            elif arg.default is not None:
                value = draw(st.sampled_from([arg.default, value]))
            # at full precision: float64 math takes a float whole, as torch's does
            args[arg.name] = value
        else:
            args[arg.name] = scalar_value(draw, arg)

    x = args[x_name]
    # -inf entries, in the max-then-sum-of-exp ops only: torch's result for a norm of a row
    # with an infinite entry depends on its device (CUDA's fused rms_norm gives NaN for the whole
    # row, its CPU one x / inf = 0 for the finite entries, as ours does on both)
    if x.numel() and "online" in launch.strategies and draw(st.booleans()) and _writable(x):
        # one row all -inf (torch: NaN for softmax, -inf for logsumexp) and some scattered ones
        # (partial rows must match torch too)
        generator = torch.Generator(device="cpu").manual_seed(seed)
        scattered = torch.rand(x.shape, generator=generator, device="cpu") < 0.2
        x.masked_fill_(scattered.to(x.device), -math.inf)
        if reduced and len(reduced) < rank:
            rows_view = x.permute(*[d for d in range(rank) if d not in reduced], *reduced)
            rows_view[(0,) * (rank - len(reduced))].fill_(-math.inf)
        notes.append("with -inf entries")
        if draw(st.booleans()):
            # +inf too: torch gives NaN rows for softmax and log_softmax, inf for logsumexp
            # (exp(inf - inf) is NaN; the max is the answer)
            spikes = torch.rand(x.shape, generator=generator, device="cpu") < 0.05
            x.masked_fill_(spikes.to(x.device), math.inf)
            notes.append("with +inf entries")

    reference_args = None
    none_floats = [a.name for a in info.args if a.kind == "float" and a.optional
                   and args[a.name] is None]
    if none_floats:
        # torch reads None as the eps of its math type, float32 for the 16- and 32-bit dtypes
        # (the float64 reference would take float64's), float64 for float64
        eps = torch.finfo(compute_dtype(dtype)).eps
        reference_args = {**args, **{n: eps for n in none_floats}}
    cast = [a.name for a in info.args if a.kind == "dtype" and args[a.name] is not None]
    if cast:
        notes.append(f"{cast[0]}={args[cast[0]]}")
        reference_args = cast_first(reference_args or args, x_name, cast[0])

    forced = draw(knobs())
    rows = math.prod(size for d, size in enumerate(shape) if d not in reduced)
    strategies = launch.strategies
    if interpreting() and rows > CHUNKED_ROWS:
        strategies = ("single",)
    if not single_fits(math.prod(shape[d] for d in reduced)):
        # a forced single tile refuses rows this long (a clear error, tested on its own)
        strategies = tuple(s for s in strategies if s != "single")
    strategy = draw(st.sampled_from(("auto",) + strategies))
    if strategy != "auto":
        forced["strategy"] = strategy
    if strategy not in ("auto", "single") and interpreting() and draw(st.booleans()):
        # the interpreter's config (the first) and its 16-wide chunks: the other configs' chunks
        # of 1024 or more hold a CPU-tier row whole, so that the chunk loops ran once and a split
        # had one program a row; here rows take several chunks, and a split several programs
        # whose partials the second stage combines (empty ones too, past the end of short rows)
        forced["config"] = 0
        if strategy == "split":
            forced["split_chunk"] = 16
    # layout: the eager reference's result is torch's rule for each output on CPU and CUDA alike.
    # Outputs that read a reduction follow the spec's [rows] layout: contiguous for softmax,
    # log_softmax and layer_norm (their kernels make the input contiguous), the input's suggested
    # memory format for rms_norm (channels_last kept); logsumexp is a reduction. add_rms_norm's
    # reference composes an add (whose layout rule its `x + residual` output follows) and
    # F.rms_norm of that sum, one torch op per output, so "eager" checks both. A derived backward
    # op lays its gradients out as its forward lays out its results; torch's vector-Jacobian
    # product has the layout of whichever op its graph ends in (add_rms_norm's x: the sum of two
    # gradients, laid out by TensorIterator's rule), which is no contract of torch's
    derived = launch.derived_from
    # Gradients cancel by design (layer_norm's over two elements is a difference of nearly equal
    # terms), on the forward's eager path too, which runs the derived op: an element is held to
    # torch's accuracy near the drawn input (Case.nearby). At 8 nearby inputs rather than 3: where
    # one ulp of rstd moves a gradient 4x past the tolerance (rms_norm over rows of one float32
    # element, x**2 near 1600 eps), torch is accurate at a few inputs by the luck of its rounding,
    # and a GPU draw of 527744 such rows found 2 where it was at the drawn one and all 3 nearby
    backward = derived or launch.backward
    return Case(args, (), forced, describe="; ".join(notes), tolerances=TOLERANCES,
                reference_args=reference_args,
                layout_reference=None if derived else "eager", nearby=8 if backward else 0)


def _writable(tensor: torch.Tensor) -> bool:
    """In-place fills need every element at its own address (no stride-0 broadcast dims)."""
    return all(stride != 0 or size <= 1 for size, stride in zip(tensor.shape, tensor.stride()))


def compile_kernels(module, arch: int = 90) -> list[str]:
    """Compiles every kernel of a generated row-wise module to a CUDA binary, without a GPU.

    The interpreter runs kernels as plain Python, so it accepts what the compiler rejects (a
    loop-carried value whose shape changes, a non-constexpr where one is needed). Both index widths
    (with masked tiles, with and without the grid-stride loop of ROW_LOOP; int32 with the constant
    masks of aligned sizes too) and the deepest row and column splits are compiled, with bf16 tensors and float arguments as float64, as
    torch.compile passes them: a kernel must take them to float32 at once, and one
    that computes in float64 raises. Needs Triton's NVIDIA backend (ptxas ships with it) and no
    TRITON_INTERPRET. Returns one line per kernel.
    """
    from specgen.runtime.rowwise import COL_RANK, ROW_RANK
    from specgen.testing.core import compile_for_nvidia

    floats = {arg.name for arg in module.DESCRIPTION.args if arg.kind == "float"}
    done = []
    for name, kernel in sorted(vars(module).items()):
        if not name.endswith("_kernel"):
            continue
        # (index width, grid-stride loop, alignment): masked tiles with and without the loop
        # in both widths, and the constant masks of aligned sizes
        for index_64, row_loop, align in ((False, False, 1), (True, True, 1), (False, True, 256)):
            constexprs = {"ROW_DIMS": ROW_RANK, "COL_DIMS": COL_RANK, "INDEX_64": index_64,
                          "BLOCK_M": 1 if "_split" in name else 2, "BLOCK_N": 256,
                          "SPLITS_BLOCK": 16, "BLOCK_P": 16, "BLOCK_C": 64,
                          "ROW_LOOP": row_loop, "M_ALIGN": align, "N_ALIGN": align}
            constexprs.update({a: True for a in kernel.arg_names if a.startswith("HAS_")})

            def arg_type(arg: str, index_64=index_64) -> str:
                if arg.endswith("_ptr"):
                    # the workspaces (split partials, column partials) are float32
                    return "*fp32" if arg.endswith("ws_ptr") else "*bf16"
                if arg in floats:
                    return "fp64"
                return "i64" if index_64 else "i32"

            binary = compile_for_nvidia(kernel, constexprs, arg_type, arch, num_warps=4)
            # float64 may appear in the parameters and their one truncation to float32, not after
            wide = [line.strip() for line in binary.asm["ttgir"].splitlines()
                    if "f64" in line and "arith.truncf" not in line and "tt.func" not in line]
            if wide:
                raise AssertionError(f"{name}: float64 math under torch.compile: {wide[:3]}")
            done.append(f"{name} int{64 if index_64 else 32}")
    return done


def samples(info, make) -> dict[str, list[tuple]]:
    """A transposed 3 x 5 row tensor reduced over its last dim, then a 2 x 3 x 5 one over its two
    last (by normalized shape) or its last (by dim), optional tensors omitted and keepdim on;
    tensors along the rows shaped as the reduced dims, the others as the row tensor (``make``:
    specgen.testing.samples.Make)."""
    from specgen.testing.samples import default

    launch = info.launch   # runtime/rowwise.py's Launch: which argument plays which part

    def call(shape: tuple[int, ...], full: bool):
        reduced = shape[1:] if launch.normalized_shape and len(shape) == 3 else shape[-1:]
        args = []
        for a in info.args:
            if a.kind == "tensor":
                if a.optional and not full:
                    args.append(None)
                elif a.name == launch.row_tensor:
                    args.append(make.t(*shape, g=True) if len(shape) == 2
                                else make.r(*shape, g=True))
                else:
                    args.append(make.r(*(reduced if a.name in launch.along else shape), g=True))
            elif a.name == launch.normalized_shape:
                args.append(list(reduced))
            elif a.name == launch.dim:
                args.append([-1] if a.kind == "shape" else -1)
            elif a.name == launch.keepdim:
                args.append(not full)
            else:
                args.append(default(a))
        return tuple(args)

    return {info.name: [call((3, 5), True), call((2, 3, 5), False)]}


# bf16 rows of the lengths `auto` gives each strategy: many short rows (several rows a
# program), square, long rows (online or looped), and few very long rows (split over several
# programs per row)
BENCH_SHAPES = [(4096, 4096), (32768, 1024), (1024, 32768), (8, 262144)]


def bench_cases(quick: bool) -> list:
    """The benchmark's rows (bench.harness.Case): softmax, layer_norm and rms_norm at each of
    BENCH_SHAPES, their training steps, then softmax and log_softmax over dim 0 (the reduced dim
    strided, the kept one contiguous)."""
    import torch.nn.functional as F

    from bench.harness import ours

    # Python functions rather than torch builtins, so torch.compile traces them like any eager
    # code
    ops = [  # (the forward's row label, the op's name, weight vectors, specgen, eager)
        ("softmax(x, -1)", "softmax", 0, lambda x: ours().softmax(x, -1),
         lambda x: torch.softmax(x, -1)),
        ("layer_norm(x, (N,), w, b)", "layer_norm", 2,
         lambda x, w, b: ours().layer_norm(x, [x.shape[-1]], w, b),
         lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b)),
        ("rms_norm(x, (N,), w)", "rms_norm", 1, lambda x, w: ours().rms_norm(x, [x.shape[-1]], w),
         lambda x, w: F.rms_norm(x, (x.shape[-1],), w)),
    ]
    # --quick keeps each row length (it decides the strategy) and divides the row count by 16
    shapes = [(max(1, rows // 16) if quick else rows, n) for rows, n in BENCH_SHAPES]
    out = [_bench_case(op, rows, n, vectors, specgen, eager)
           for rows, n in shapes for op, _, vectors, specgen, eager in ops]
    # training at the square shape: the forward and the gradients of every input, in eager code
    # through the ops' derived backward kernels (docs/families.md, "Derived backward ops")
    rows, n = shapes[0]
    out += [_bench_case(f"{name} fwd+bwd", rows, n, vectors, specgen, eager, training=True)
            for _, name, vectors, specgen, eager in ops]
    # the rows strided, the kept dim contiguous (issue 37: tiled over the kept axis, as the
    # reduce family's outer strategy, it should reach torch.compile)
    rows, n = (1024, 2048) if quick else (4096, 8192)
    out += [_bench_case("softmax(x, 0)", rows, n, 0, lambda x: ours().softmax(x, 0),
                        lambda x: torch.softmax(x, 0)),
            _bench_case("log_softmax(x, 0)", rows, n, 0, lambda x: ours().log_softmax(x, 0),
                        lambda x: torch.log_softmax(x, 0))]
    return out


def _bench_case(op: str, rows: int, n: int, vectors: int, specgen, eager, training=False):
    """The forward alone, or (``training``) the forward and the gradients of every input, given
    a random output gradient (the first input)."""
    from bench.harness import Case, gradient_of

    dtype = torch.bfloat16

    def make_inputs():
        x = torch.randn(rows, n, device="cuda", dtype=dtype, requires_grad=training)
        weights = tuple(torch.randn(n, device="cuda", dtype=dtype, requires_grad=training)
                        for _ in range(vectors))
        grad_out = (torch.randn(rows, n, device="cuda", dtype=dtype),) if training else ()
        return (*grad_out, x, *weights)

    if training:
        specgen, eager = gradient_of(specgen), gradient_of(eager)
    # the forward reads x and each weight vector once and writes the output; a fused training
    # kernel pair also reads x and the output gradient and writes x's gradient (and the
    # weights' gradients, n each)
    return Case(family="rowwise", op=op, shape=f"{rows}x{n}", dtype=dtype,
                make_inputs=make_inputs, specgen=specgen, eager=eager,
                bytes_moved=dtype.itemsize * ((5 if training else 2) * rows * n
                                              + (2 if training else 1) * vectors * n))


FAMILY = Family(
    name="rowwise", parse_body=parse_body, body_names=body_names, plan=plan, scaffold=scaffold,
    generated_names=GENERATED_NAMES, generated_prefixes=GENERATED_PREFIXES,
    # a dtype argument (named by [rows] dtype), shape arguments (normalized_shape, dim) and
    # optional floats ([rows] finfo_eps say what None is)
    takes=frozenset({"dtype argument", "shape argument", "optional scalar"}),
    unread_args=unread_args,
    layout_hint=("the spec's [rows] layout sets it: contiguous, memory_format or elementwise, "
                 "docs/families.md"),
    derive="specgen.families.rowwise_backward:derived_specs",
    draw_case=draw_case, samples=samples, bench=bench_cases)

"""Attention family: ``softmax(score(query @ key.T * scale), masked) @ value``, FlashAttention-2
style (one program per block of query rows, an online softmax over blocks of keys).

Operands are identified by their ``dims``: the query ``["...", "H", "L", "E"]``, the key
``["...", "Hkv", "S", "E"]``, the value ``["...", "Hkv", "S", "Ev"]``, an attention mask
``["...", "L", "S"]`` (bool: True takes part; float: added to the score, as torch's
``attn_mask``), per-head tensors ``["H"]`` (ALiBi slopes), which expressions read at the
program's head, and per-batch integer tensors ``["B"]`` (a KV cache's lengths), read at its
batch element. Arguments named ``scale`` (optional float; None is ``1 / sqrt(E)``),
``dropout_p``, ``is_causal`` and ``enable_gqa`` have torch's meanings.

Spec tables: ``[attention]`` (``score``: an expression over the scaled score ``s``; ``mask``: a
condition saying which keys a query sees; both over the indices ``i`` (query row), ``j`` (key
column), ``h`` (query head), ``b`` (batch element), the lengths ``L`` and ``S`` and the
arguments), ``[schedule]`` (``split_kv``: "auto", several programs share a row's keys where
the rows alone would not fill the GPU, their partial results merged by a second kernel, as
flash decoding; or "off") and ``[tuning]``
(``BLOCK_M``, ``BLOCK_N``, ``num_warps``, ``num_stages``, whose product is the config space).

The planner reads the mask once more, at build time, for which key blocks each query block needs
(``mask_blocks``): where it can bound the visible keys (a comparison of ``j`` with an expression
linear in ``i``, as a causal or windowed mask), kernels skip the hidden blocks and leave out the
element-wise test in blocks every row sees whole; elsewhere every block is tested element by
element (correct, only slower).
"""

from __future__ import annotations

import ast
import dataclasses
import itertools
import math
from dataclasses import dataclass
from typing import Any, Mapping

import torch

from specgen import derive
from specgen.errors import Where
from specgen.expr import Expr, Symbol, emit, helpers, parse_expr, quoted
from specgen.families.common import (CommonPlan, common_plan, power_of_two_list, scalar_args,
                                     unread, warps_list)
from specgen.families.contract import Family
from specgen.model import ChoiceArg, OpSpec, ScalarArg, TensorArg
from specgen.table import Table, check_type

# operand roles by their dims
ROLES = {
    ("...", "H", "L", "E"): "query",
    ("...", "Hkv", "S", "E"): "key",
    ("...", "Hkv", "S", "Ev"): "value",
    ("...", "L", "S"): "attn_mask",
    ("H",): "per_head",
    ("B",): "per_batch",
}
# the index symbols of score and mask expressions: query row, key column, query head, batch
# element (batch dims flattened), query length, key length
INDEX_SYMBOLS = ("i", "j", "h", "b", "L", "S")
# arguments whose meaning is torch's, by name (runtime/attention.py reads them)
NAMED_ARGS = {"scale": "float", "dropout_p": "float", "enable_gqa": "bool", "is_causal": "bool"}
# those the host alone reads: no expression may, no kernel takes them
HOST_ARGS = ("dropout_p", "enable_gqa")
# those the runtime takes itself, as torch's scaled_dot_product_attention does: the host's, and
# the scale, which it resolves (None: 1 / sqrt(E)) and passes as every kernel's first float.
# is_causal is not among them: a mask reads it, as any bool argument
RUNTIME_ARGS = (*HOST_ARGS, "scale")

# names the generated module binds for itself: a spec that declared one would shadow it or be
# shadowed (tests/test_spec_errors.py checks the set against what the template binds)
GENERATED_NAMES = frozenset({
    "attention",  # its imports
    *INDEX_SYMBOLS, "s",
    "acc", "alpha", "any_hi", "any_lo", "batch", "cols", "cols_e", "cols_ev", "full_hi",
    "full_lo", "group", "key_base", "key_tile", "l_i", "m_i", "m_new", "m_safe", "num_blocks_m",
    "out_base", "p", "qk_scale", "query_tile", "row_first", "row_last", "rows", "start",
    "start_m", "value_base", "value_tile", "visible", "head_kv", "query_base", "mask_base",
    "lse", "lse_base", "out_tile", "scores", "b0", "b1", "col_j", "row_i", "lo", "hi",
    "l_safe", "no_full", "out_mask", "out_offsets", "out_ptr", "lse_ptr", "mask_ptr",
    "some_lo", "some_hi", "all_lo", "all_hi", "first_all", "has_all",
    "mask_tile", "keep", "mask_offsets", "mask_stride_b0", "mask_stride_b1", "mask_stride_h",
    "mask_stride_l", "mask_stride_s", "key_offsets", "value_offsets", "query_offsets",
    "out_stride_b0", "out_stride_b1", "out_stride_h", "out_stride_l", "out_stride_e",
    "lse_stride_b0", "lse_stride_b1", "lse_stride_h", "lse_stride_l", "split", "splits",
    "split_lo", "split_hi", "per_split", "key_blocks", "partial_ptr", "partial_lse_ptr",
    "partial_offsets", "row", "weights", "total", "parts", "lse_parts",
    "lse_max", "cols_split", "part_offsets", "NUM_SPLITS", "partial_mask", "partial_row",
    "num_rows", "heads", "head", "block_rows", "row_heads", "row_valid", "query_rows", "PACKED",
    # the backward's
    "grad_out_ptr", "grad_out_base", "grad_out_stride_b0", "grad_out_stride_b1",
    "grad_out_stride_h", "grad_out_stride_l", "grad_out_stride_e", "delta_ptr", "delta_base",
    "delta", "lse2", "grad_tile", "grad_offsets", "row_stats", "row_mask_ev",
    "grad_query", "grad_query_ptr", "grad_query_base", "grad_query_offsets",
    "grad_query_stride_b0", "grad_query_stride_b1", "grad_query_stride_h",
    "grad_query_stride_l", "grad_query_stride_e", "grad_key", "grad_key_ptr", "grad_key_base",
    "grad_key_offsets", "grad_key_stride_b0", "grad_key_stride_b1", "grad_key_stride_h",
    "grad_key_stride_s", "grad_key_stride_e", "grad_value", "grad_value_ptr",
    "grad_value_base", "grad_value_offsets", "grad_value_stride_b0", "grad_value_stride_b1",
    "grad_value_stride_h", "grad_value_stride_s", "grad_value_stride_e", "grad_mask_ptr",
    "grad_mask_base", "grad_mask_offsets", "grad_mask_stride_b0", "grad_mask_stride_b1",
    "grad_mask_stride_h", "grad_mask_stride_l", "grad_mask_stride_s", "MASK_GRAD", "grad_p",
    "grad_score", "grad_qk", "score_ds", "seen", "key_lo", "key_hi",
    "num_blocks_n", "start_n", "heads_kv", "group_head", "sees_some", "sees_all", "slots",
    "slot_base", "score_a", "score_b",
    # the math's type (float64 for float64 data)
    "COMPUTE",
})
# the backward's per-expression names: score_d<k> (the score's derivative by the k-th per-head
# tensor), head_grad_<k> and part_<k> (its sums), grad_<tensor>_ptr
GENERATED_PREFIXES: tuple[str, ...] = ("score_d", "head_grad_", "part_", "grad_")

DEFAULT_BLOCK_M = (64, 128)
DEFAULT_BLOCK_N = (64, 128)
# 3 first: an op with no frozen entry runs the space's first config. 2 fits 128 x 64 tiles at
# head dim 256 (E 256 440 -> 518 TFLOP/s on an H200), 4 won at E 128 (docs/performance.md, 001i)
DEFAULT_STAGES = (3, 2, 4)
# the backward's tiles (BLOCK_M, BLOCK_N, warps, stages). The query pass holds BLOCK_M query rows
# and walks keys BLOCK_N at a time; the key pass holds BLOCK_N keys and walks query rows BLOCK_M
# at a time. Chosen by tools/perf/sweep_attention_backward.py on an H100 (bf16, E 64 and 128):
# the query pass's first wins at both (4 stages by 8% over 3 at E 128); the key pass's first
# two at E 128 (3 stages without a causal mask, 4 with one), its third at E 64 (128 keys need
# 8 warps at E 128: with 4 its dK and dV accumulators spill, five times slower); the smaller
# tiles serve larger head dims and float32, whose pipelined tiles overflow shared memory at
# the larger ones.
QUERY_PASS_CONFIGS = ((128, 64, 8, 4), (128, 64, 8, 3), (64, 64, 4, 2), (64, 32, 4, 3))
KEY_PASS_CONFIGS = ((64, 128, 8, 3), (64, 128, 8, 4), (32, 128, 4, 3), (32, 64, 4, 4),
                    (64, 64, 4, 3))
# the first config under the interpreter: its tiny inputs need no large tiles (tl.dot needs 16)
INTERPRETER_CONFIG = {"BLOCK_M": 16, "BLOCK_N": 16, "num_warps": 4, "num_stages": 1}


@dataclass(frozen=True)
class AttentionBody:
    query: str
    key: str
    value: str
    attn_mask: str                  # "" without one
    per_head: tuple[str, ...]
    per_batch: tuple[str, ...]
    split_kv: str
    score: Expr | None
    mask: Expr | None
    # the score's derivatives, derived at build time: by s, then by each per-head tensor it
    # reads (those whose derivative is not zero), as sources over the spec's names
    score_grad: str
    head_grads: tuple[tuple[str, str], ...]
    block_m: tuple[int, ...]
    block_n: tuple[int, ...]
    num_warps: tuple[int, ...]
    num_stages: tuple[int, ...]


def body_names(body: AttentionBody) -> tuple[tuple[str, tuple[str, ...]], ...]:
    return ()


def unread_args(body: AttentionBody, spec_args: tuple) -> tuple[tuple[str, str], ...]:
    """The per-head and per-batch tensors and the scalars neither score nor mask reads."""
    scalars = [a for a in scalar_args(spec_args) if a.name not in RUNTIME_ARGS]
    tensors = [a for a in spec_args if a.name in body.per_head + body.per_batch]
    return unread([*tensors, *scalars], (body.score, body.mask),
                  "neither [attention] score nor mask")


def parse_body(top: Table, spec_args: tuple, name: str) -> AttentionBody:
    where = top.where.child("args")
    roles: dict[str, list[str]] = {role: [] for role in ROLES.values()}
    for arg in spec_args:
        _check_arg(arg, where.child(arg.name))
        if isinstance(arg, TensorArg):
            roles[ROLES[arg.dims]].append(arg.name)
    for role in ("query", "key", "value"):
        if len(roles[role]) != 1:
            dims = next(d for d, r in ROLES.items() if r == role)
            raise where.error(f"an attention op needs one {role} tensor, with dims = "
                              f"{list(dims)}; got {len(roles[role])}")
    if len(roles["attn_mask"]) > 1:
        raise where.child(roles["attn_mask"][1]).error("at most one attention mask tensor")
    for role in ("query", "key", "value", "per_head", "per_batch"):
        for tensor in roles[role]:
            if next(a for a in spec_args if a.name == tensor).optional:
                raise where.child(tensor).error(f"a {role.replace('_', '-')} tensor cannot be "
                                                f"optional (only an attention mask can)")

    table = top.pop_table("attention", required=False) or Table({}, top.where.child("attention"))
    values = {n: Symbol(n, "value") for n in (*INDEX_SYMBOLS, *roles["per_head"],
                                              *roles["per_batch"])}
    for arg in spec_args:
        if isinstance(arg, ScalarArg) and arg.name not in HOST_ARGS:
            values[arg.name] = Symbol(arg.name, "bool" if arg.type == "bool" else "scalar")
    operands = {n: "a tensor operand is no value here (per-head tensors, dims [\"H\"], are)"
                for n in (roles["query"] + roles["key"] + roles["value"] + roles["attn_mask"])}
    score = mask = None
    score_source = table.pop("score", str, None)
    if score_source is not None:
        score = parse_expr(score_source, table.where.child("score"),
                           {**values, "s": Symbol("s", "value")}, operands)
    mask_source = table.pop("mask", str, None)
    if mask_source is not None:
        mask = parse_expr(mask_source, table.where.child("mask"), values, {
            **operands, "s": "the mask says which keys a query sees, before any score"},
            condition=True)
    score_grad, head_grads = _score_grads(score, roles["per_head"], table.where.child("score"))
    table.finish()

    tuning = top.pop_table("tuning", required=False) or Table({}, top.where.child("tuning"))
    block_m = power_of_two_list(tuning, "BLOCK_M", DEFAULT_BLOCK_M, 256)
    block_n = power_of_two_list(tuning, "BLOCK_N", DEFAULT_BLOCK_N, 256)
    for key, blocks in (("BLOCK_M", block_m), ("BLOCK_N", block_n)):
        if min(blocks) < 16:
            raise tuning.where.child(key).error(f"expected blocks of at least 16 (tl.dot's "
                                                f"smallest), got {min(blocks)}")
    num_warps = warps_list(tuning, (4, 8))
    num_stages = tuple(_stages(tuning))
    tuning.finish()
    schedule = top.pop_table("schedule", required=False) or Table({}, top.where.child("schedule"))
    split_kv = schedule.pop_choice("split_kv", ("auto", "off"), "auto")
    schedule.finish()
    return AttentionBody(roles["query"][0], roles["key"][0], roles["value"][0],
                         (roles["attn_mask"] or [""])[0], tuple(roles["per_head"]),
                         tuple(roles["per_batch"]), split_kv, score, mask, score_grad, head_grads,
                         block_m, block_n, num_warps, num_stages)


def _score_grads(score: Expr | None, per_head: list[str],
                 where: Where) -> tuple[str, tuple[tuple[str, str], ...]]:
    """The backward's derivatives of the score expression: by the scaled score ``s`` (what the
    gradient of q.k goes through) and by each per-head tensor it reads (their gradients). An
    expression with no derivative rule is an error here, never a wrong gradient."""
    if score is None:
        return "1.0", ()
    grads = []
    for name in ("s", *(t for t in per_head if t in score.names)):
        try:
            tree = derive.partial(score.tree, name)
        except derive.NotDifferentiable as err:
            raise where.error(f"{quoted(score.source)}: {err}, and the backward differentiates "
                              f"the score by {name!r}: write it with functions that have one "
                              f"(docs/spec.md lists them)") from None
        grads.append((name, derive.source(tree)))
    return grads[0][1], tuple((name, grad) for name, grad in grads[1:]
                              if derive.value(derive.parse(grad)) != 0.0)


def _stages(tuning: Table) -> tuple[int, ...]:
    raw = tuning.pop_any("num_stages")
    if raw is None:
        return DEFAULT_STAGES
    where = tuning.where.child("num_stages")
    values = raw if isinstance(raw, list) else [raw]
    for value in values:
        check_type(value, int, where)
        if not 1 <= value <= 8:
            raise where.error(f"expected pipeline stages from 1 to 8, got {value}")
    return tuple(values)


def _check_arg(arg, where: Where) -> None:
    if isinstance(arg, ChoiceArg):
        raise where.error("the attention family takes no choice arguments (bool arguments "
                          "specialize its kernels)")
    if isinstance(arg, TensorArg):
        if arg.dims not in ROLES:
            shown = "; ".join(f"{list(dims)} ({role.replace('_', ' ')})"
                              for dims, role in ROLES.items())
            raise where.child("dims").error(f"expected the dims of an attention operand: {shown}; "
                                            f"got {list(arg.dims) if arg.dims else 'none'}")
        return
    wanted = NAMED_ARGS.get(arg.name)
    if wanted is not None and arg.type != wanted:
        raise where.error(f"'{arg.name}' has torch's meaning here, a {wanted} argument; "
                          f"got a {arg.type}")
    if arg.name == "scale" and not arg.optional:
        raise where.error("'scale' defaults to None (1 / sqrt(E)), as torch's: declare it "
                          "{ kind = \"float\", optional = true }")
    if arg.name == "dropout_p" and arg.default != 0.0:
        raise where.error("'dropout_p' defaults to 0.0, as torch's")


# ---- which key blocks a query block needs -------------------------------------------------------
#
# For a block of query rows [row_first, row_last], a condition's keys are bounded by two
# intervals, as Triton source: outside `any` no row sees a key (the block skips it), inside `all`
# every row sees every key (no element-wise test). Comparisons of j with an expression linear in
# i are bounded exactly (a linear function takes its extremes at the ends of the rows);
# and/or/not combine bounds; what cannot be bounded is visible anywhere and whole nowhere.

FULL = ("0", "S")
EMPTY = ("0", "0")
_FLIP = {ast.Lt: ast.GtE, ast.LtE: ast.Gt, ast.Gt: ast.LtE, ast.GtE: ast.Lt, ast.Eq: ast.NotEq,
         ast.NotEq: ast.Eq}
_MIRROR = {ast.Lt: ast.Gt, ast.LtE: ast.GtE, ast.Gt: ast.Lt, ast.GtE: ast.LtE, ast.Eq: ast.Eq,
           ast.NotEq: ast.NotEq}


@dataclass(frozen=True)
class Blocks:
    """Key bounds of a condition over a query block: ``any`` (keys outside it hidden from every
    row) and ``all`` (keys inside it visible to every row), each (lo, hi) as source."""

    any: tuple[str, str]
    all: tuple[str, str]
    exact: bool             # every comparison was bounded (else some bound is the whole range)


def mask_blocks(condition: ast.expr, names: Mapping[str, str], integers: frozenset[str]) -> Blocks:
    """The key bounds of ``condition`` (a mask with its bool arguments substituted); ``names``
    maps spec names to kernel variables, ``integers`` the names holding integers."""
    return _Bounder(names, integers).bounds(_push_not(condition, False))


def _push_not(node: ast.expr, negate: bool) -> ast.expr:
    """``node`` with every ``not`` moved onto the comparisons (De Morgan)."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        return _push_not(node.operand, not negate)
    if isinstance(node, ast.BoolOp):
        op = node.op if not negate else (ast.Or() if isinstance(node.op, ast.And) else ast.And())
        return ast.BoolOp(op, [_push_not(v, negate) for v in node.values])
    if isinstance(node, ast.Compare) and negate:
        return ast.Compare(node.left, [_FLIP[type(node.ops[0])]()], node.comparators)
    if negate:
        return ast.UnaryOp(ast.Not(), node)
    return node


def _reads(node: ast.AST, name: str) -> bool:
    return any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(node))


class _Bounder:
    def __init__(self, names: Mapping[str, str], integers: frozenset[str]):
        self.names = names
        self.integers = integers

    def bounds(self, node: ast.expr) -> Blocks:
        if isinstance(node, ast.BoolOp):
            parts = [self.bounds(v) for v in node.values]
            join = _and if isinstance(node.op, ast.And) else _or
            result = parts[0]
            for part in parts[1:]:
                result = join(result, part)
            return result
        if isinstance(node, ast.Compare):
            return self.compare(node)
        # what is left after the bool arguments were substituted and every `not` moved onto a
        # comparison cannot get here; a comparison of neither index is `uniform`
        return Blocks(FULL, EMPTY, False)

    def code(self, node: ast.expr) -> str:
        return emit(node, self.names, integers=True)

    def is_integer(self, node: ast.expr) -> bool:
        for n in ast.walk(node):
            if isinstance(n, ast.Name) and n.id not in self.integers:
                return False
            if isinstance(n, ast.Constant) and type(n.value) is not int:
                return False
            # a division, or a power (2 ** -1 is written 1.0 / 2), gives a float
            if isinstance(n, ast.BinOp) and isinstance(n.op, (ast.Div, ast.Pow)):
                return False
            if isinstance(n, ast.Call):
                return False
        return True

    def uniform(self, node: ast.expr) -> Blocks:
        test = self.code(node)
        hi = f"tl.where({test}, S, 0)"
        return Blocks(("0", hi), ("0", hi), True)

    def compare(self, node: ast.Compare) -> Blocks:
        op = type(node.ops[0])
        if not _reads(node, "j") and not _reads(node, "i"):
            return self.uniform(node)
        form = _linear(ast.BinOp(node.left, ast.Sub(), node.comparators[0]))
        if form is None:
            return Blocks(FULL, EMPTY, False)
        coef = _coefficient(form.get("j", []))
        if coef == 0:
            # j cancels out (j - j + i < 3): the comparison still names j, which a bound of the
            # rows alone would emit; it is left to the element-wise test
            if _reads(node, "j"):
                return Blocks(FULL, EMPTY, False)
            return self.rows_only(node, op, form)
        if coef is None:
            return Blocks(FULL, EMPTY, False)
        # coef * j + rest OP 0, so j OP bound with bound = -rest / coef (OP mirrored for coef < 0)
        if coef < 0:
            op = _MIRROR[op]
        bound_terms = [(-sign / coef, factor, var) for var in ("i", "") for sign, factor in
                       form.get(var, [])]
        integer = abs(coef) == 1 and all(self.is_integer(f) for _, f, _ in bound_terms)
        slope = _coefficient([(s, f) for s, f, var in bound_terms if var == "i"])
        # a fractional bound is computed in float64 from the rows on: in float32 a term past
        # 2**24 (a row of 16M keys, or a large constant) could put it keys off
        ends = [emit(_terms(bound_terms, row), self.names if integer else
                     {**self.names, row: f"tl.cast({row}, tl.float64)"}, integers=True)
                for row in ("row_first", "row_last")]
        if slope == 0:
            low = high = ends[0]
        elif slope is not None:   # a known direction: the ends are the extremes in order
            low, high = ends if slope > 0 else ends[::-1]
        else:
            low, high = f"tl.minimum({ends[0]}, {ends[1]})", f"tl.maximum({ends[0]}, {ends[1]})"

        def floor(x: str) -> str:
            return x if integer else f"tl.floor(tl.cast({x}, tl.float64)).to(tl.int32)"

        def ceil(x: str) -> str:
            return x if integer else f"tl.ceil(tl.cast({x}, tl.float64)).to(tl.int32)"

        if op is ast.LtE:     # j <= bound
            blocks = ("0", f"{floor(high)} + 1"), ("0", f"{floor(low)} + 1")
        elif op is ast.Lt:    # j < bound
            blocks = ("0", ceil(high)), ("0", ceil(low))
        elif op is ast.GtE:   # j >= bound
            blocks = (ceil(low), "S"), (ceil(high), "S")
        elif op is ast.Gt:    # j > bound
            blocks = (f"{floor(low)} + 1", "S"), (f"{floor(high)} + 1", "S")
        elif op is ast.Eq:
            blocks = (ceil(low), f"{floor(high)} + 1"), (ceil(high), f"{floor(low)} + 1")
        else:
            return Blocks(FULL, EMPTY, False)   # j != bound: no interval
        if not integer:
            # a fractional bound is rounded, which may land a whole number one off (9 * j <= i
            # - 6 at i = 150): `any` grows and `all` shrinks by a key each side, and the
            # element-wise test in the blocks at the edges decides exactly
            blocks = _widened(blocks[0], 1), _widened(blocks[1], -1)
        return Blocks(*blocks, True)

    def rows_only(self, node: ast.Compare, op: type, form: dict) -> Blocks:
        """A comparison of the rows alone: whole blocks of keys, by its truth at both ends of
        the rows (a linear comparison is monotone in i)."""
        if op in (ast.Eq, ast.NotEq):
            return Blocks(FULL, EMPTY, False)
        first, last = (self.code(_rename(node, row)) for row in ("row_first", "row_last"))
        return Blocks(("0", f"tl.where(({first}) | ({last}), S, 0)"),
                      ("0", f"tl.where(({first}) & ({last}), S, 0)"), True)


def _widened(interval: tuple[str, str], keys: int) -> tuple[str, str]:
    """``interval`` grown by ``keys`` at each end (shrunk where negative); the kernel's own
    bounds, 0 and S, stay."""
    lo, hi = interval
    return (lo if lo == "0" else f"{lo} - {keys}" if keys > 0 else f"{lo} + {-keys}",
            hi if hi == "S" else f"{hi} + {keys}" if keys > 0 else f"{hi} - {-keys}")


def _and(a: Blocks, b: Blocks) -> Blocks:
    return Blocks(_intersect(a.any, b.any), _intersect(a.all, b.all), a.exact and b.exact)


def _or(a: Blocks, b: Blocks) -> Blocks:
    # `any`: the hull of the two (an over-estimate where they leave a gap, which only tests a
    # few hidden keys element by element); `all`: the hull where the two meet, else the first
    return Blocks(_hull(a.any, b.any), _union_under(a.all, b.all), a.exact and b.exact)


def _intersect(a: tuple[str, str], b: tuple[str, str]) -> tuple[str, str]:
    # the kernel clamps lows at 0 and highs at S: those bounds add nothing
    lo = b[0] if a[0] == "0" else a[0] if b[0] == "0" else _max(a[0], b[0])
    hi = b[1] if a[1] == "S" else a[1] if b[1] == "S" else _min(a[1], b[1])
    return lo, hi


def _joined(a: tuple[str, str], b: tuple[str, str]) -> tuple[str, str] | None:
    """The join of two intervals where one settles it (the whole range, or nothing), else None."""
    if FULL in (a, b):
        return FULL
    if a == EMPTY:
        return b
    if b == EMPTY:
        return a
    return None


def _hull(a: tuple[str, str], b: tuple[str, str]) -> tuple[str, str]:
    settled = _joined(a, b)
    if settled is not None:
        return settled
    a_empty, b_empty = f"({a[1]}) <= ({a[0]})", f"({b[1]}) <= ({b[0]})"

    def pick(x: str, y: str, both: str) -> str:
        # an end the two share needs no choice
        return x if x == y else f"tl.where({a_empty}, {y}, tl.where({b_empty}, {x}, {both}))"
    return pick(a[0], b[0], _min(a[0], b[0])), pick(a[1], b[1], _max(a[1], b[1]))


def _union_under(a: tuple[str, str], b: tuple[str, str]) -> tuple[str, str]:
    """An interval inside the union of two: their hull where they meet, else the first."""
    settled = _joined(a, b)
    if settled is not None:
        return settled
    meet = f"(({a[0]}) <= ({b[1]})) & (({b[0]}) <= ({a[1]}))"
    hull = _min(a[0], b[0]), _max(a[1], b[1])
    return tuple(end if end == first else f"tl.where({meet}, {end}, {first})"
                 for end, first in zip(hull, a))


def _min(a: str, b: str) -> str:
    return a if a == b else f"tl.minimum({a}, {b})"


def _max(a: str, b: str) -> str:
    return a if a == b else f"tl.maximum({a}, {b})"


# A linear form: for "i", "j" and "" (terms free of both), a list of (sign, factor) terms, each
# factor an expression free of i and j (1 for the variable alone).
Terms = list[tuple[float, ast.expr]]
ONE = ast.Constant(1)


def _linear(node: ast.expr) -> dict[str, Terms] | None:
    """``node`` as a linear form in i and j, or None where it is not linear in them."""
    if not (_reads(node, "i") or _reads(node, "j")):
        return {"": [(1, node)]}
    if isinstance(node, ast.Name):
        return {node.id: [(1, ONE)]}
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        inner = _linear(node.operand)
        if inner is None or isinstance(node.op, ast.UAdd):
            return inner
        return {var: [(-s, f) for s, f in terms] for var, terms in inner.items()}
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)):
        left, right = _linear(node.left), _linear(node.right)
        if left is None or right is None:
            return None
        sign = -1 if isinstance(node.op, ast.Sub) else 1
        out = {var: list(terms) for var, terms in left.items()}
        for var, terms in right.items():
            out.setdefault(var, []).extend((sign * s, f) for s, f in terms)
        return out
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div) and \
            not (_reads(node.right, "i") or _reads(node.right, "j")):
        inner = _linear(node.left)
        if inner is None:
            return None
        return {var: [(s, ast.BinOp(f, ast.Div(), node.right)) for s, f in terms]
                for var, terms in inner.items()}
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
        for inner_node, factor in ((node.left, node.right), (node.right, node.left)):
            if not (_reads(factor, "i") or _reads(factor, "j")):
                inner = _linear(inner_node)
                if inner is None:
                    return None
                return {var: [(s, factor if f is ONE else ast.BinOp(f, ast.Mult(), factor))
                              for s, f in terms] for var, terms in inner.items()}
    return None


def _coefficient(terms: Terms) -> float | None:
    """The sum of ``terms`` where every factor is a number, else None."""
    total = 0
    for sign, factor in terms:
        if not all(isinstance(n, (ast.Constant, ast.BinOp, ast.UnaryOp, ast.operator,
                                  ast.unaryop)) for n in ast.walk(factor)):
            return None
        try:
            expression = ast.fix_missing_locations(ast.Expression(factor))
            value = eval(compile(expression, "<coefficient>", "eval"))
        except ArithmeticError:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return None
        total += sign * value
    return total


def _terms(terms: list[tuple[float, ast.expr, str]], row: str) -> ast.expr:
    """The sum of signed terms (``var`` "i" multiplies the factor by ``row``) as an expression
    that reads as written: ``row_first - window``, not ``-(-1 * row_first) - --window``."""
    total: ast.expr | None = None
    for sign, factor, var in terms:
        if var == "i":
            value = ast.Name(row, ast.Load()) if factor is ONE else \
                ast.BinOp(factor, ast.Mult(), ast.Name(row, ast.Load()))
        else:
            value = factor
        magnitude = abs(sign)
        if magnitude != 1:
            value = ast.BinOp(value, ast.Mult(), ast.Constant(magnitude)) if magnitude % 1 \
                else ast.BinOp(value, ast.Mult(), ast.Constant(int(magnitude)))
        if total is None:
            total = value if sign > 0 else ast.UnaryOp(ast.USub(), value)
        else:
            total = ast.BinOp(total, ast.Add() if sign > 0 else ast.Sub(), value)
    return total if total is not None else ast.Constant(0)


def _rename(node: ast.expr, row: str) -> ast.expr:
    """``node`` with i read as ``row``."""
    class Rename(ast.NodeTransformer):
        def visit_Name(self, name: ast.Name) -> ast.expr:
            return ast.Name(row, ast.Load()) if name.id == "i" else name
    return Rename().visit(ast.parse(ast.unparse(node), mode="eval").body)


# ---- the plan ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class MaskVariant:
    """The mask under one setting of the bool arguments it reads (constexprs of the kernels)."""

    test: str               # the constexpr test selecting it ("" for the only one)
    branch: str             # its line in the chain of them: "if <test>", "elif <test>", "else"
    visible: str            # the element-wise test over row_i and col_j ("" where none is needed)
    any: tuple[str, str]    # keys outside: hidden from every row of the block
    all: tuple[str, str]    # keys inside: visible to every row of the block
    note: str               # what the bounds rest on, for the kernel's comment


@dataclass(frozen=True)
class AttentionPlan(CommonPlan):
    query: str = ""
    key: str = ""
    value: str = ""
    attn_mask: str = ""
    per_head: tuple[str, ...] = ()
    per_batch: tuple[str, ...] = ()
    split_kv: bool = True
    # whether a program may take a group of query heads (neither score nor mask reads the head)
    packable: bool = False
    score: str = ""                     # the score expression's source over s, or ""
    score_grad: str = "1.0"             # its derivative by s, emitted
    # per-head tensors with a gradient, each with the score's derivative by it, emitted
    head_grads: tuple[tuple[str, str], ...] = ()
    query_pass_configs: tuple[dict, ...] = ()
    key_pass_configs: tuple[dict, ...] = ()
    flags: tuple[str, ...] = ()         # bool arguments, as constexprs
    kernel_scalars: tuple[str, ...] = ()    # float and int arguments the kernels take
    variants: tuple[MaskVariant, ...] = ()
    configs: tuple[dict, ...] = ()
    interpreter_config: dict | None = None
    helpers: tuple[str, ...] = ()

    flag_args: tuple[str, ...] = ()     # the bool arguments themselves
    kernel_floats: tuple[str, ...] = ()

    @property
    def flips_scale(self) -> bool:
        """Whether the forward flips a negative scale into the query (NEGATIVE_SCALE): without
        a score expression its whole key blocks take the row maximum of q.k before scaling,
        which needs a scale of at least 0. A score expression reads the scale as given."""
        return not self.score

    @property
    def float_args(self) -> tuple[str, ...]:
        # int arguments stay integers: masks bound keys with them
        return ("scale", *self.kernel_floats)

    @property
    def value_ints(self) -> tuple[str, ...]:
        return ()

    @property
    def compute_of(self) -> str:
        """The tensor whose element type sets the math's: the query's (float64 for float64 data,
        else float32; the key and value share its dtype)."""
        return self.query

    @property
    def tune_keys(self) -> tuple[str, ...]:
        """What autotuning keys on: the sizes, and every constexpr that makes another kernel
        (a config tuned for one variant is not the best of another), but NEGATIVE_SCALE: a
        negative scale's kernel differs by one negation of the query tile, and takes the
        positive one's config (and its frozen entry)."""
        return ("L", "S", "E", "EV", "INDEX_64", *self.flags,
                *(("MASK_KIND",) if self.attn_mask else ()), *(("SPLIT",) if self.split_kv else ()),
                *(("PACKED",) if self.packable else ()))

    @property
    def backward_tune_keys(self) -> tuple[str, ...]:
        return ("L", "S", "E", "EV", "INDEX_64", *self.flags,
                *(("MASK_KIND",) if self.attn_mask else ()))


def _flag(name: str) -> str:
    return name.upper()


def plan(spec: OpSpec) -> AttentionPlan:
    body: AttentionBody = spec.body
    flags = tuple(a.name for a in spec.args if isinstance(a, ScalarArg) and a.type == "bool"
                  and a.name not in HOST_ARGS)
    scalars = tuple(a.name for a in spec.args if isinstance(a, ScalarArg)
                    and a.type in ("float", "int") and a.name not in RUNTIME_ARGS)
    integers = frozenset({"i", "j", "h", "b", "L", "S", *body.per_batch,
                          *(a.name for a in spec.args
                            if isinstance(a, ScalarArg) and a.type == "int")})
    # the key bounds read i at the block's rows (row_first, row_last) and never j itself
    names = {f: _flag(f) for f in flags}
    score = ""
    score_names = {"i": "row_i", "j": "col_j", **{f: _flag(f) for f in flags}}
    if body.score is not None:
        score = emit(body.score, score_names)
    score_grad = emit(derive.parse(body.score_grad), score_names)
    head_grads = tuple((name, emit(derive.parse(grad), score_names))
                       for name, grad in body.head_grads)
    variants = _variants(body.mask, flags, names, integers)
    configs = tuple({"BLOCK_M": m, "BLOCK_N": n, "num_warps": w, "num_stages": s}
                    for m, n, w, s in itertools.product(body.block_m, body.block_n,
                                                        body.num_warps, body.num_stages))
    query_pass_configs, key_pass_configs = (
        tuple({"BLOCK_M": m, "BLOCK_N": n, "num_warps": w, "num_stages": st}
              for m, n, w, st in space) for space in (QUERY_PASS_CONFIGS, KEY_PASS_CONFIGS))
    used = set()
    for expr in (body.score, body.mask):
        if expr is not None:
            used |= helpers(expr)
    for grad in (body.score_grad, *(g for _, g in body.head_grads)):
        used |= helpers(Expr(grad, derive.parse(grad), frozenset()))
    # per-head tensors meet the scores after the matmul: autocast leaves them as they are
    head_reads = {"h", *body.per_head}
    packable = not any(expr is not None and expr.names & head_reads
                       for expr in (body.score, body.mask))
    common = common_plan(spec, ("out",), promoted=body.per_head)
    return AttentionPlan(**common.__dict__, query=body.query, key=body.key, value=body.value,
                         attn_mask=body.attn_mask, per_head=body.per_head,
                         per_batch=body.per_batch, split_kv=body.split_kv == "auto",
                         packable=packable, score=score, score_grad=score_grad,
                         head_grads=head_grads, query_pass_configs=query_pass_configs,
                         key_pass_configs=key_pass_configs,
                         flags=tuple(_flag(f) for f in flags), flag_args=flags,
                         kernel_scalars=scalars,
                         kernel_floats=tuple(a.name for a in spec.args if a.name in scalars
                                             and a.type == "float"),
                         variants=variants, configs=configs,
                         interpreter_config=INTERPRETER_CONFIG, helpers=tuple(sorted(used)))


def _variants(mask: Expr | None, flags: tuple[str, ...], names: Mapping[str, str],
              integers: frozenset[str]) -> tuple[MaskVariant, ...]:
    if mask is None:
        return (MaskVariant("", "", "", FULL, FULL, "no mask: every key"),)
    read = [f for f in flags if f in mask.names]
    variants = []
    for values in itertools.product((True, False), repeat=len(read)):
        setting = dict(zip(read, values))
        condition = _substitute(mask.tree, setting)
        test = " and ".join(_flag(f) if v else f"not {_flag(f)}" for f, v in setting.items())
        if condition is True:
            variants.append(MaskVariant(test, "", "", FULL, FULL, "every key visible"))
            continue
        if condition is False:
            variants.append(MaskVariant(test, "", "", EMPTY, EMPTY, "every key hidden"))
            continue
        blocks = mask_blocks(condition, names, integers)
        visible = emit(condition, {**names, "i": "row_i", "j": "col_j"}, integers=True)
        source = ast.unparse(condition)
        note = (f"keys bounded from {source!r}" if blocks.exact
                else f"{source!r} is tested element-wise in every block (its keys are not "
                     f"bounded by an expression linear in i)")
        variants.append(MaskVariant(test, "", visible, blocks.any, blocks.all, note))
    # the chain of constexpr branches that selects one, as the kernel writes it
    last = len(variants) - 1
    return tuple(dataclasses.replace(v, branch="" if not v.test else "else" if k == last and k
                                     else f"{'if' if k == 0 else 'elif'} {v.test}")
                 for k, v in enumerate(variants))


def _substitute(node: ast.expr, setting: Mapping[str, bool]) -> ast.expr | bool:
    """``node`` with bool arguments set, folded: True, False or the condition that remains."""
    if isinstance(node, ast.Name) and node.id in setting:
        return setting[node.id]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        inner = _substitute(node.operand, setting)
        return (not inner) if isinstance(inner, bool) else ast.UnaryOp(ast.Not(), inner)
    if isinstance(node, ast.BoolOp):
        is_and = isinstance(node.op, ast.And)
        kept = []
        for value in node.values:
            value = _substitute(value, setting)
            if isinstance(value, bool):
                if value != is_and:     # False in an and, True in an or: decides it
                    return value
                continue
            kept.append(value)
        if not kept:
            return is_and
        return kept[0] if len(kept) == 1 else ast.BoolOp(node.op, kept)
    return node


def scaffold(name: str) -> str:
    return f'''# An attention op: see docs/families.md, "Attention family".
[op]
name = "{name}"
family = "attention"
doc = "softmax(q.k * scale - slopes[h] * |i - j|) @ v, keys j <= i"
reference = "ref.alibi_attention(query, key, value, slopes, True, scale)"
autocast = "lower"             # torch.autocast casts the inputs as for torch's attention

[args]
query = {{ kind = "tensor", dims = ["...", "H", "L", "E"] }}
key = {{ kind = "tensor", dims = ["...", "Hkv", "S", "E"] }}
value = {{ kind = "tensor", dims = ["...", "Hkv", "S", "Ev"] }}
slopes = {{ kind = "tensor", dims = ["H"], range = [0.0, 1.0] }}
scale = {{ kind = "float", optional = true }}

[attention]
score = "s - slopes * abs(i - j)"
mask = "j <= i"
'''


# --- Its property tests, opcheck samples and benchmark cases -------------------------------------
# The tests and the bench call these (``FAMILY``'s draw_case, samples and bench); they import
# hypothesis, specgen.testing and bench where they run: the generator needs none of them.
# compile_kernels compiles its kernels for sm_90 without a GPU (the CPU tier's compile test).

# |actual - expected| <= atol + rtol * |expected|. The softmax weights are rounded to the inputs'
# dtype before they meet the values (as every flash kernel does): up to one rounding of each
# weight, times values up to 3 in magnitude, plus the output's own rounding. float64 computes in
# float64 throughout (its weights are not rounded): float32 math would be 1e-7 off
TOLERANCES = {
    torch.float32: (2e-5, 3e-5),
    torch.float16: (2e-3, 3e-3),
    torch.bfloat16: (1e-2, 2.5e-2),
    torch.float64: (1e-10, 1e-11),
}


# the gradients, atol relative to each gradient's largest element (at least 1): the backward
# rounds each probability and each score's gradient to the inputs' dtype before they meet the
# values, the keys and the queries, and takes each row's dO . O from the output as stored, not
# from the probabilities (as every flash kernel does); dQ and dK sum a row's or a key's terms,
# which may be larger than the sum. Seen: float16 at L = S = 32, 0.014 off at an element of -0.40
# (the gradient's largest 15); float16 with two equal keys (a key of stride 0), where dQ is 0,
# 0.009 (dO . O from the float16 output against the probabilities' sum); float32 with one key,
# where the gradients are 0, up to 2.2e-5. A wrong mask, scale or head sum is off by the
# gradient itself; the GPU tier's tests hold bfloat16 to twice torch's own error besides
GRAD_TOLERANCES = {
    torch.float32: (5e-5, 5e-5),
    torch.float16: (5e-3, 1.5e-2),
    torch.bfloat16: (4e-2, 1e-1),
    torch.float64: (1e-10, 1e-11),
}


# small tiles reach several query and key blocks, partial ones and the bounds of a mask on the
# interpreter's small inputs
SMALL_CONFIGS = (
    {"BLOCK_M": 16, "BLOCK_N": 16, "num_warps": 4, "num_stages": 1},
    {"BLOCK_M": 32, "BLOCK_N": 16, "num_warps": 4, "num_stages": 2},
    {"BLOCK_M": 16, "BLOCK_N": 32, "num_warps": 4, "num_stages": 2},
)


def _roles(info) -> dict[str, str]:
    """The op's tensor arguments by role (query, key, value, attn_mask; the family's ``ROLES``),
    per-head and per-batch ones apart."""
    return {ROLES[a.dims]: a.name for a in info.args
            if a.kind == "tensor" and ROLES.get(a.dims) not in (None, "per_head", "per_batch")}


def draw_case(draw, info):
    """A property-test call: batch and head counts (grouped heads where the op takes
    ``enable_gqa``), query and key lengths off every block size (1 included), head dims up to
    256 on the GPU, layouts (the ``(B, L, H, E).transpose(1, 2)`` view, permuted, sliced,
    offset), bool and float attention masks that broadcast, causal calls and the spec's own
    scalars.

    The interpreter computes a bfloat16 ``tl.dot`` wrongly, so the CPU tier draws float16,
    float32 and float64; the GPU tier draws bfloat16 too.
    """
    from hypothesis import strategies as st

    from specgen.runtime import interpreting
    from specgen.testing.core import (Case, FLOAT_RANGE, Layout, broadcast_operand, device, knobs,
                                      layouts, make_tensor, scalar_value, sizes)

    role = _roles(info)
    overrides = draw(knobs())
    # the interpreter runs every program in numpy: small tiles over small problems still span
    # several query and key blocks; the GPU tier runs the space's configs too
    # (number 0 there: the interpreter's own first config, 16 x 16)
    if interpreting():
        overrides["config"] = draw(st.sampled_from((0, *SMALL_CONFIGS)))
    elif draw(st.booleans()):
        overrides["config"] = draw(st.sampled_from(SMALL_CONFIGS))
    names = {a.name for a in info.args}
    gqa = "enable_gqa" in names and draw(st.booleans())
    small = interpreting()
    limit = 40 if small else 300
    length, keys = draw(sizes(limit, allow_zero=False)), draw(sizes(limit, allow_zero=False))
    dims = [1, 3, 8, 16, 17] if small else [1, 3, 8, 16, 17, 32, 40, 64, 80, 128, 256]
    dim, value_dim = draw(st.sampled_from(dims)), draw(st.sampled_from(dims))
    heads_kv = draw(st.integers(1, 2 if small else 3))
    group = draw(st.integers(1, 3)) if gqa else 1
    heads = heads_kv * group
    # an op with per-batch tensors (a KV cache's lengths) takes one batch dim, B
    per_batch = any(a.kind == "tensor" and a.dims == ("B",) for a in info.args)
    batch = tuple(draw(st.lists(st.integers(1, 2 if small else 3), min_size=int(per_batch),
                                max_size=1 if per_batch else 2)))
    # several programs sharing a row block's keys (flash decoding), forced now and then
    if draw(st.booleans()):
        overrides["strategy"] = f"split:{draw(st.integers(1, 4))}"
    dtypes = [d for d in info.dtypes if d != torch.bfloat16 or not interpreting()]
    dtype = draw(st.sampled_from(dtypes))
    seed = draw(st.integers(0, 2**31 - 1))

    def operand(shape: tuple[int, ...], index: int) -> torch.Tensor:
        # the (B, L, H, E) layout viewed as (B, H, L, E), or any other
        if draw(st.booleans()) and len(shape) >= 3:
            rank = len(shape)
            order = (*range(rank - 3), rank - 2, rank - 3, rank - 1)
            layout = Layout(order, (1,) * rank)
        else:
            layout = draw(layouts(len(shape)))
        return make_tensor(shape, dtype, layout, seed=seed + index)

    args: dict[str, Any] = {}
    notes = [f"batch={batch} Hq={heads} Hkv={heads_kv} L={length} S={keys} E={dim} "
             f"Ev={value_dim} {dtype} config={overrides['config']}"]
    for i, arg in enumerate(info.args):
        name = arg.name
        if name == role["query"]:
            query_batch = batch if per_batch else draw(broadcast_operand(batch))
            args[name] = operand((*query_batch, heads, length, dim), i)
        elif name == role["key"]:
            kv_batch = batch if per_batch else draw(broadcast_operand(batch))
            args[name] = operand((*kv_batch, heads_kv, keys, dim), i)
        elif name == role["value"]:
            args[name] = operand((*kv_batch, heads_kv, keys, value_dim), i)
        elif name == role.get("attn_mask"):
            # no more dims than the scores have (torch adds the mask to them in place)
            scores = torch.broadcast_shapes(query_batch, kv_batch)
            args[name] = _mask(draw, scores, heads, length, keys, dtype, seed + i)
        elif arg.kind == "tensor" and arg.dims == ("B",):   # keys in use, 0 to S
            lengths = draw(st.lists(st.integers(0, keys), min_size=batch[0], max_size=batch[0]))
            args[name] = torch.tensor(lengths, dtype=draw(st.sampled_from(
                [torch.int32, torch.int64])), device=device())
        elif arg.kind == "tensor":       # per-head values, of a dtype of their own
            own = draw(st.sampled_from(info.dtypes))
            args[name] = make_tensor((heads,), own, draw(layouts(1)), low=arg.low,
                                     high=arg.high, seed=seed + i)
        elif name == "dropout_p":
            args[name] = 0.0             # the only value taken (others raise, tested apart)
        elif name == "enable_gqa":
            args[name] = gqa
        elif name == "scale":
            # float64 math takes a scale whole (float32 math, rounded to float32); torch takes a
            # negative one too (the kernels flip it into the query)
            width = 64 if dtype == torch.float64 else 32
            args[name] = draw(st.one_of(st.none(), st.floats(0.0625, 1.0, width=width),
                                        st.floats(-1.0, -0.0625, width=width)))
        elif arg.kind == "float" and dtype == torch.float64:
            # at full precision: float64 math takes a float argument whole, as torch's does
            args[name] = draw(st.floats(*(arg.range or FLOAT_RANGE)))
        else:
            args[name] = scalar_value(draw, arg)
        if arg.kind == "tensor" and args[name] is not None:
            t = args[name]
            notes.append(f"{name}: {tuple(t.shape)} {t.dtype} strides {t.stride()}")
        elif arg.kind != "tensor":
            notes.append(f"{name}={args[name]!r}")
    if role.get("attn_mask") and args.get(role["attn_mask"]) is not None and "is_causal" in args:
        args["is_causal"] = False        # torch refuses both (tested apart)
    # a float mask's element and a per-head value sum the gradients of the scores they meet
    scores = math.prod(torch.broadcast_shapes(query_batch, kv_batch)) * heads * length * keys
    summed = [a.name for a in info.args if a.kind == "tensor" and a.dims == ("H",)]
    if role.get("attn_mask"):
        summed.append(role["attn_mask"])
    grad_sums = {name: max(1, scores // args[name].numel()) for name in summed
                 if args.get(name) is not None and args[name].is_floating_point()
                 and args[name].numel()}
    # the layout is flash's ((..., L, H, Ev) in memory), where torch's math gives another
    return Case(args, (), overrides, describe="; ".join(notes), tolerances=TOLERANCES,
                grad_tolerances=GRAD_TOLERANCES, grad_sums=grad_sums, layout_reference=None)


def _mask(draw, batch, heads, length, keys, dtype, seed) -> torch.Tensor | None:
    from hypothesis import strategies as st

    from specgen.testing.core import Layout, broadcast_operand, layouts, make_tensor

    kind = draw(st.sampled_from(["none", "bool", "float"]))
    if kind == "none":
        return None
    full = (*batch, heads, length, keys)
    # at least (L, S): torch refuses a mask of fewer dims
    last = tuple(size if draw(st.integers(0, 3)) else 1 for size in full[-2:])
    shape = (*draw(broadcast_operand(full[:-2])), *last)
    if kind == "float":
        return make_tensor(shape, dtype, draw(layouts(len(shape))), low=-4.0, high=1.0,
                           seed=seed)
    # True takes part; now and then a row sees no key (it gives zeros); bool masks are made
    # dense, and laid out transposed now and then
    transposed = draw(st.booleans())
    drawn = (*shape[:-2], shape[-1], shape[-2]) if transposed else shape
    dense = make_tensor(drawn, torch.float32, Layout.contiguous(len(drawn)), low=0.0, high=1.0,
                        seed=seed)
    mask = dense > draw(st.sampled_from([0.1, 0.5, 0.9]))
    return mask.mT if transposed else mask


def samples(info, make) -> dict[str, list[tuple]]:
    """Opcheck calls (``make``: specgen.testing.samples.Make): a batched call with every
    argument at its default (the mask given, then omitted), and a query in the (B, L, H, E)
    layout; its sizes (B 2, H 2, L 3, S 5, E 4, Ev 6) differ from each other but for B and H, so
    that most dims mixed up fail."""
    from specgen.testing.samples import default

    role = _roles(info)

    def call(masked: bool, transposed: bool) -> tuple:
        args = []
        for a in info.args:
            if a.name == role["query"]:
                q = (make.r(2, 3, 2, 4).transpose(1, 2).detach().requires_grad_(True)
                     if transposed else make.r(2, 2, 3, 4, g=True))
                args.append(q)
            elif a.name == role["key"]:
                args.append(make.r(2, 2, 5, 4, g=True))
            elif a.name == role["value"]:
                args.append(make.r(2, 2, 5, 6, g=True))
            elif a.name == role.get("attn_mask"):
                args.append(make.r(3, 5, lo=-1.0, hi=1.0) if masked else None)
            elif a.kind == "tensor" and a.dims == ("B",):
                args.append(torch.tensor([5, 2], dtype=torch.int32, device=make.device))
            elif a.kind == "tensor":
                args.append(make.r(2, g=True, lo=0.0, hi=1.0))
            elif a.kind == "float" and a.default is None and not a.optional:
                args.append(2.0 if a.range is None else (a.range[0] + a.range[1]) / 2)
            elif a.kind == "int" and a.default is None:
                args.append(2)
            else:
                args.append(default(a))
        return tuple(args)

    calls = [call(True, False), call(False, True)]
    # the backward operator: the output's gradient, the forward's output and row logsumexps,
    # the arguments (none requiring grad: the backward has no gradient of its own), and whether
    # the mask wants its gradient
    backward = []
    operator = getattr(torch.ops.specgen, info.name)
    for args in calls:
        args = tuple(a.detach() if isinstance(a, torch.Tensor) else a for a in args)
        with torch.no_grad():
            out, lse = operator(*args)
        masked = role.get("attn_mask") is not None and any(
            a.name == role["attn_mask"] and v is not None for a, v in zip(info.args, args))
        backward.append((make.r(*out.shape), out, lse, *args, masked))
    return {info.name: calls, f"{info.name}_backward": backward}


def compile_kernels(module, dim: int = 64, arch: int = 90) -> list[str]:
    """Compiles every kernel of a generated attention module for float64 inputs to a CUDA binary,
    without a GPU, on the first of ``FLOAT64_CONFIGS``' tiles for its pass at head dim ``dim``
    (a causal call with split keys, with a float mask and its gradient, then a bool mask, where
    the op takes a mask), and raises where the compiled kernel computes anything in float32.

    The interpreter runs kernels as Python: it lets a loop-carried value change type (a float32
    accumulator that a float64 dot makes float64), which the compiler refuses, and cannot show a
    float32 intermediate. Needs Triton's NVIDIA backend (ptxas ships with it) and no
    TRITON_INTERPRET. Returns one line per kernel."""
    from specgen.runtime.attention import FLOAT64_CONFIGS
    from specgen.testing.core import compile_for_nvidia

    floats = {arg.name for arg in module.DESCRIPTION.args if arg.kind == "float"}
    # each kernel's tiles: its pass's, as (held, streamed)
    roles = {"forward": ("forward", "BLOCK_M", "BLOCK_N"),
             "merge": ("forward", "BLOCK_M", "BLOCK_N"),
             "backward_query": ("query", "BLOCK_M", "BLOCK_N"),
             "backward_key": ("key", "BLOCK_N", "BLOCK_M")}
    bound = min(b for b in FLOAT64_CONFIGS["forward"] if dim <= b)
    block = max(16, 1 << (dim - 1).bit_length())
    done = []
    # the cache lengths are int32; every other tensor (the mask, statistics, workspaces and
    # gradient buffers included) float64
    per_batch = {f"{a.name}_ptr" for a in module.DESCRIPTION.args
                 if a.kind == "tensor" and a.dims == ("B",)}
    for role, kernel in module.KERNELS.items():
        space, held, streamed = roles[role]
        rows, keys, warps, stages = FLOAT64_CONFIGS[space][bound][0]
        if role == "merge":
            warps, stages = 4, 1
        # the mask kinds: float (2), with its gradient, and bool (1), a bool tensor's *i1
        for mask_kind in (2, 1) if "MASK_KIND" in kernel.arg_names else (0,):
            constexprs = {"E": dim, "EV": dim, "BLOCK_E": block, "BLOCK_EV": block, held: rows,
                          streamed: keys, "INDEX_64": False, "INPUT_PRECISION": "ieee",
                          "MASK_KIND": mask_kind, "MASK_GRAD": mask_kind == 2, "SPLIT": True,
                          "PACKED": False, "NUM_SPLITS": 4, "IS_CAUSAL": True}

            def arg_type(arg: str, mask_kind=mask_kind) -> str:
                if arg == "mask_ptr" and mask_kind == 1:
                    return "*i1"
                if arg.endswith("_ptr"):
                    return "*i32" if arg in per_batch else "*fp64"
                return "fp64" if arg in floats or arg == "scale" else "i32"

            binary = compile_for_nvidia(kernel, constexprs, arg_type, arch, num_warps=warps,
                                        num_stages=stages)
            narrow = [line.strip() for line in binary.asm["ttgir"].splitlines() if "f32" in line]
            if narrow:
                raise AssertionError(f"{module.__name__} {role} (mask kind {mask_kind}): "
                                     f"float32 in float64 math: {narrow[:3]}")
        done.append(f"{role} {rows}x{keys}")
    return done


FAMILY = Family(
    name="attention", parse_body=parse_body, body_names=body_names, plan=plan, scaffold=scaffold,
    generated_names=GENERATED_NAMES, generated_prefixes=GENERATED_PREFIXES,
    takes=frozenset({"optional scalar"}), unread_args=unread_args,
    draw_case=draw_case, samples=samples, bench_section="bench.attention:section",
    tune_cases="bench.attention:tune_cases")

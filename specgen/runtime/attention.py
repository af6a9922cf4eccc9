"""The attention family's runtime: torch's ``scaled_dot_product_attention`` rules for shapes,
heads, masks and scale, the launch of the forward kernel and of the backward's two (``RUNTIME``).

Shapes: query ``(..., Hq, L, E)``, key ``(..., Hkv, S, E)``, value ``(..., Hkv, S, Ev)``, batch
dims broadcast; heads match, or one side has one head, or (``enable_gqa=True``) the query's are a
multiple of the key's, which groups of query heads share without a copy. Any strides. The output
is laid out as torch's flash backend lays it out, ``(..., L, Hq, Ev)`` in memory viewed as
``(..., Hq, L, Ev)``, so that ``out.transpose(-3, -2).flatten(-2)`` is a view.

Autograd: the registered operator ``specgen::<op>`` returns the output and each row's
logsumexp; its backward is ``specgen::<op>_backward``, FlashAttention-2's: a pass over query
blocks (each row's dO . O, then dQ over the keys it sees) and one over key blocks (dK and dV over
the query rows that see them, the query heads of a group summed in the program). Neither holds an
L x S matrix (but a float mask's own gradient, which has that shape) and neither uses atomics:
the gradients are deterministic. Eager calls that need a gradient take the same kernels through
an ``autograd.Function`` without the dispatcher.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch
import triton

from specgen.runtime.autograd import bound_call, op_function
from specgen.runtime.checks import (DTYPE_NAMES, check_interpreted_dot, check_same_device,
                                    check_tensor_types, check_tensors)
from specgen.runtime.context import note_launch, overrides, untraced
from specgen.runtime.launch import choose_int64, launch, multiprocessors, shared_memory
from specgen.runtime.layout import (broadcast_shapes, cdiv, merge_dims, next_power_of_2, span,
                                    storage_span)
from specgen.runtime.op import FamilyRuntime, Op, typed_param
from specgen.runtime.registry import triton_op
from specgen.runtime.replay import Replays, empty, refuse, zeros

# the largest head dim a kernel tiles (E and Ev), as torch's flash backend
MAX_HEAD_DIM = 256
# batch dims a kernel walks after merging those that merge (two cover (B, H) layouts with any
# extra leading dim that broadcasts)
BATCH_RANK = 2
# the widest query and key blocks of any config: rows and keys past the end form offsets
MAX_BLOCK = 256
# tiles for head dims whose pipelined tiles no config of the space fits: (BLOCK_M, BLOCK_N,
# stages), the first that fits runs
FALLBACK_CONFIGS = ((64, 32, 2), (64, 32, 1), (32, 16, 1))
# float64 (8-byte elements, two registers each): tiles of its own, per pass and by the head dims'
# tile (the larger of BLOCK_E and BLOCK_EV, at most the key), in place of the space's, which are
# sized for 16-bit inputs and spill float64 accumulators by kilobytes (ptxas for sm_90, E 64:
# the forward's 64 x 64 on 4 warps 4896 bytes, on 8 warps 1772). Each is (held, streamed, warps,
# stages): the rows a program holds and the keys it streams (the key pass: the keys it holds,
# the rows it streams). Chosen with ptxas -v for sm_90 under Triton 3.6 (the GPU machines', whose
# float64 dots are FMA loops) and 3.8 (mma.sync m8n8k4 f64): none spills under 3.6; under 3.8
# the key pass, which holds four tiles of keys (K, V, dK, dV), spills 20 bytes at E 128 and 660
# at E 256 (16 warps spilled less there under 3.8, kilobytes under 3.6). The first that fits the
# shared memory runs untuned
FLOAT64_CONFIGS = {
    "forward": {64: ((32, 32, 4, 2), (32, 32, 8, 2)),
                128: ((32, 32, 8, 2), (16, 32, 4, 2)),
                256: ((16, 16, 8, 2),)},
    "query": {64: ((32, 32, 8, 2), (32, 32, 4, 2)),
              128: ((32, 32, 8, 2), (16, 32, 4, 2)),
              256: ((16, 16, 8, 2),)},
    "key": {64: ((32, 16, 8, 2),),
            128: ((16, 16, 8, 2),),
            256: ((16, 16, 8, 2),)},
}
# split-KV (flash decoding): the most programs per multiprocessor to plan, the fewest keys a
# split takes, and the most splits a row block may have
SPLIT_PROGRAMS_PER_SM = 2
SPLIT_MIN_KEYS = 512
MAX_SPLITS = 64
# the query block the split count assumes: the least a spec may declare (tl.dot's 16), so the
# grid stays within the cap whatever tile runs (a space of larger tiles may split less than it
# could; decoding's rows, one query or a packed GQA group, often fit one such block)
SPLIT_BLOCK_M = 16
# a group of query heads sharing a key/value head is packed into one program's rows where the
# group's rows number at most this (decoding: each head's program would read the keys again)
PACK_MAX_ROWS = 128


@dataclass(frozen=True)
class Launch:
    """An attention op's launch data: its operands by role, and the arguments its kernels take
    beyond them (bool arguments as constexprs of their upper-case names)."""

    query: str
    key: str
    value: str
    attn_mask: str                  # "" without one
    per_head: tuple[str, ...]
    per_batch: tuple[str, ...]      # integer tensors read at the batch element (cache lengths)
    scalars: tuple[str, ...]        # float and int arguments, in order
    flags: tuple[str, ...]          # bool arguments
    split_kv: bool                  # programs may share a row's keys, then a merge kernel runs
    packable: bool                  # a program may take a group of query heads (PACKED)
    flips_scale: bool               # the forward takes a negative scale's sign (NEGATIVE_SCALE)
    head_grads: tuple[str, ...]     # per-head tensors the score differentiates by


@dataclass(frozen=True)
class Problem:
    """A call's sizes after torch's broadcasting rules, and the layout of its result."""

    batch: tuple[int, ...]          # the broadcast batch dims
    heads: int                      # query heads of the result
    group: int                      # query heads per key/value head (0 where no query heads)
    heads_kv: int                   # key/value heads (the key's and value's gradients')
    length: int                     # L
    key_length: int                 # S
    dim: int                        # E
    value_dim: int                  # Ev
    rank: int                       # the result's rank


class Attention(FamilyRuntime):
    """Kernels ``forward`` (a program per (batch, head, block of query rows)), ``merge`` (split
    KV), ``backward_query`` and ``backward_key``. The registered operator returns the output and
    each row's logsumexp; the public function returns the output."""

    doc_note = ("with torch's semantics; a row whose keys are all masked gives zeros (as "
                "torch's math backend), dropout_p other than 0 raises NotImplementedError. "
                "Differentiable (FlashAttention-2's backward, deterministic); double backward "
                "is not supported.")

    public_output = 0

    def setup(self, op: Op) -> _State:
        tensors = set(op.description.tensor_positions)
        return _State(op_function(op.name, _EagerAutograd), Replays(op.name + " backward"),
                      tuple(i for i in range(len(op.description.args)) if i not in tensors))

    def register(self, op: Op) -> None:
        d = op.description
        op.register_operators(results=2, by_reference=False)
        names = ", ".join(a.name for a in d.args)
        typed = ", ".join(typed_param(a) for a in d.args)
        source = (f"def _{d.name}_backward(grad_out: torch.Tensor, out: torch.Tensor, "
                  f"lse: torch.Tensor, {typed}, mask_grad: bool = False) -> list[torch.Tensor]:\n"
                  f"    return _backward(_op, ({names},), out, lse, grad_out, mask_grad)\n")
        scope = {"torch": torch, "Optional": Optional, "_backward": backward, "_op": op}
        exec(compile(source, f"<specgen {d.name} backward operator>", "exec"), scope)
        implementation = scope[f"_{d.name}_backward"]
        implementation.__module__ = op.module
        triton_op(f"specgen::{d.name}_backward", mutates_args=())(implementation)
        backward_operator = getattr(torch.ops.specgen, f"{d.name}_backward")

        def setup_context(ctx, inputs, output):
            _, lse = output
            # the logsumexp is saved for the backward, not a differentiable output
            ctx.mark_non_differentiable(lse)
            _save(ctx, op, inputs, output)

        def autograd_backward(ctx, grad_out, grad_lse):
            def run(grad_out, out, lse, args, mask_grad):
                return backward_operator(grad_out, out, lse, *args, mask_grad=mask_grad)
            return _gradients(ctx, grad_out, run)

        torch.library.register_autograd(f"specgen::{d.name}", autograd_backward,
                                        setup_context=setup_context)

    def call(self, op: Op, key: tuple | None, args: tuple, out: object = None) -> torch.Tensor:
        d = op.description
        tensors = [args[i] for i in d.tensor_positions]
        if (torch.is_grad_enabled() and untraced(tensors)
                and any(t is not None and t.requires_grad for t in tensors)):
            # eager autograd: the kernels inside an autograd.Function, without the dispatcher
            check_tensor_types(op.name, dict(zip(d.tensor_names, tensors)),
                               optional=d.optional_tensors)
            args = op.check_scalars(args, taken=True)
            apply = op.state.function.apply
            if key is not None:
                # a later call of this signature (the same layouts, the same inputs needing a
                # gradient) skips the checks above, and both directions replay their launches
                op.replays.keep(key, bound_call(apply, (op,), args, d.tensor_positions, op.name,
                                                one_tuple=True))
            return apply(op, *args)
        return op.call(key, args)[0]

    def run(self, op: Op, args: tuple) -> tuple[torch.Tensor, torch.Tensor]:
        return forward(op, args)


RUNTIME = Attention()


@dataclass(frozen=True)
class _State:
    function: type[torch.autograd.Function]     # _EagerAutograd, named for the op
    backward_replays: Replays
    scalar_positions: tuple[int, ...]           # the arguments that are not tensors


def _eager_forward(op: Op, args: tuple) -> tuple[torch.Tensor, torch.Tensor]:
    """``forward`` for an untraced call that needs a gradient, replayed when its signature
    repeats (keyed as a plain eager call with the checked scalars: a recording of one serves
    the other where the caller's scalars were given as checked, a float scale as a float)."""
    d = op.description
    tensors = tuple(args[i] for i in d.tensor_positions)
    key, replay = op.replays.lookup(tensors, _scalars(op, args))
    if replay is not None:
        return replay(tensors)
    return op.replays.record(key, lambda: forward(op, args), tensors)


def _eager_backward(op: Op, args: tuple, out, lse, grad_out, mask_grad: bool) -> list:
    """``backward`` for an untraced call, replayed when its signature repeats."""
    replays = op.state.backward_replays
    tensors = (grad_out, out, lse, *(args[i] for i in op.description.tensor_positions))
    key, replay = replays.lookup(tensors, (mask_grad, *_scalars(op, args)))
    if replay is not None:
        return replay(tensors)
    return replays.record(key, lambda: backward(op, args, out, lse, grad_out, mask_grad),
                          tensors)


def _scalars(op: Op, args: tuple) -> tuple:
    return tuple(args[i] for i in op.state.scalar_positions)


def _save(ctx, op: Op, args: tuple, output: tuple) -> None:
    # tensors through save_for_backward (an input changed in place before the backward raises
    # torch's error), the rest as they came
    ctx.save_for_backward(*(a if isinstance(a, torch.Tensor) else None for a in args), *output)
    ctx.scalars = tuple(None if isinstance(a, torch.Tensor) else a for a in args)
    ctx.op = op


def _saved(ctx) -> tuple[list, torch.Tensor, torch.Tensor]:
    *tensors, out, lse = ctx.saved_tensors
    return [s if t is None else t for t, s in zip(tensors, ctx.scalars)], out, lse


def _gradients(ctx, grad_out: torch.Tensor, run: Callable, skip: int = 0) -> tuple:
    """Each argument's gradient (None where it needs none) for the saved call of ``ctx``, whose
    arguments' grad flags follow ``skip`` others: ``run(grad_out, out, lse, args, mask_grad)``
    gives the backward operator's list (query, key, value, mask, then per-head tensors)."""
    op = ctx.op
    # grad mode is on in a backward exactly when it builds a graph (create_graph=True)
    if torch.is_grad_enabled():
        raise RuntimeError(f"{op.name}: double backward (create_graph=True) is not supported: "
                           f"the backward's kernels are not differentiable")
    spec: Launch = op.description.launch
    args, out, lse = _saved(ctx)
    # (a registered operator's call that left trailing arguments out has no flags for them)
    needs = dict(zip((a.name for a in op.description.args), ctx.needs_input_grad[skip:]))
    grads = run(grad_out, out, lse, args, needs.get(spec.attn_mask, False))
    found = dict(zip((spec.query, spec.key, spec.value, spec.attn_mask or "", *spec.head_grads),
                     grads))
    result = []
    for (name, need), value in zip(needs.items(), args):
        grad = found.get(name) if need else None
        if need and grad is None:
            # a per-head tensor the score does not differentiate by
            grad = torch.zeros_like(value)
        result.append(grad)
    return tuple(result)


class _EagerAutograd(torch.autograd.Function):
    """Untraced calls that need a gradient: the forward and the backward kernels, without the
    dispatcher and custom-op autograd."""

    @staticmethod
    def forward(ctx, op, *args):
        out, lse = _eager_forward(op, args)
        _save(ctx, op, args, (out, lse))
        return out

    @staticmethod
    def backward(ctx, grad_out):
        def run(grad_out, out, lse, args, mask_grad):
            return _eager_backward(ctx.op, tuple(args), out, lse, grad_out, mask_grad)
        return (None, *_gradients(ctx, grad_out, run, skip=1))


@dataclass(frozen=True)
class Call:
    """A call's checked arguments: what the forward and the backward launch from."""

    named: dict                     # every argument by name
    operands: dict                  # the query, key, value and a given mask, by their names
    mask: torch.Tensor | None
    heads: dict                     # per-head tensors
    per_batch: dict                 # per-batch tensors
    problem: Problem
    device: torch.device
    scale: float


def _checked(op: Op, args: tuple) -> Call:
    d = op.description
    spec: Launch = d.launch
    named = {a.name: value for a, value in zip(d.args, args)}
    query, key, value = named[spec.query], named[spec.key], named[spec.value]
    mask = named[spec.attn_mask] if spec.attn_mask else None
    if named.get("dropout_p", 0.0) != 0.0:
        raise NotImplementedError(f"{op.name}: dropout_p={named['dropout_p']} is not supported "
                                  f"(only 0.0)")
    if mask is not None and named.get("is_causal", False):
        raise ValueError(f"{op.name}: attn_mask and is_causal=True together are refused, as "
                         f"torch refuses them; fold the causal mask into attn_mask")
    operands = {spec.query: query, spec.key: key, spec.value: value}
    if spec.per_batch:
        # a per-batch tensor is read at the batch element: one batch dim, which it indexes
        for name, tensor in operands.items():
            if tensor.dim() != 4:
                raise ValueError(
                    f"{op.name}: argument '{name}' has {tensor.dim()} dims; expected 4 (batch, "
                    f"heads, length, head dim): {', '.join(spec.per_batch)} holds a value per "
                    f"batch element, so the op takes one batch dim")
    device = check_tensors(op.name, operands, d.dtypes)
    check_interpreted_dot(op.name, query.dtype, device)
    problem = _problem(op.name, operands, mask, named.get("enable_gqa", False))
    _check_mask(op.name, spec.attn_mask, mask, query)
    heads = {name: named[name] for name in spec.per_head}
    for name, tensor in heads.items():
        _check_per_head(op.name, name, tensor, problem.heads, d.dtypes)
    per_batch = {name: named[name] for name in spec.per_batch}
    for name, tensor in per_batch.items():
        _check_per_batch(op.name, name, tensor, math.prod(problem.batch))
    check_same_device(op.name, spec.query, device, {
        **({spec.attn_mask: mask} if mask is not None else {}), **heads, **per_batch})
    if mask is not None:
        operands[spec.attn_mask] = mask
    scale = named.get("scale")
    if scale is None:
        scale = 1.0 / math.sqrt(problem.dim) if problem.dim else 1.0
    return Call(named, operands, mask, heads, per_batch, problem, device, scale)


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The kernels' math type for inputs of ``dtype``, and that of every statistic and workspace
    they write (row logsumexps, split partials, delta, gradient buffers): float64 for float64
    (torch's math backend computes float64 attention in float64), float32 otherwise."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def forward(op: Op, args: tuple) -> tuple[torch.Tensor, torch.Tensor]:
    """The output and each row's logsumexp (``(..., Hq, L)``, -inf where a row sees no key;
    float32, float64 for float64 inputs): what the backward recomputes the softmax from."""
    d = op.description
    spec: Launch = d.launch
    call = _checked(op, args)
    named, operands, mask = call.named, call.operands, call.mask
    problem, device, scale = call.problem, call.device, call.scale
    query, key, value = operands[spec.query], operands[spec.key], operands[spec.value]

    shape, strides = _out_layout(problem)
    out = empty(shape, query.dtype, device, strides)
    compute = compute_dtype(query.dtype)
    # at the output's rank, less its last dim
    lse = empty(shape[:-1], compute, device)
    if out.numel() == 0 and lse.numel() == 0:
        return out, lse

    strides = _batch_strides(op.name, problem, {**operands, "out": out, "lse": lse})
    B0, B1 = strides.pop("batch")
    lse_strides = strides.pop("lse")
    index_64 = choose_int64(op.name, d.indexing, {
        **{name: _padded_span(tensor) for name, tensor in (*operands.items(), ("out", out))},
        **_vector_spans(call)}, max_tile=0)
    meta = _constexprs(call, spec)
    mask_kind = meta.get("MASK_KIND", 0)
    # packed: a program per key/value head takes its group's query heads as rows
    packed = (spec.packable and problem.group > 1 and mask is None
              and problem.group * problem.length <= PACK_MAX_ROWS)
    blocks = B0 * B1 * (problem.heads // problem.group if packed else problem.heads)
    length = problem.length * problem.group if packed else problem.length

    vectors, vector_strides = _vectors(call)
    # a pointer stands in for an absent mask (never read)
    pointers = [query, key, value, *([mask if mask is not None else query]
                                     if spec.attn_mask else []),
                *vectors, out, lse]
    mask_strides = strides.get(spec.attn_mask, (0, 0, 0, 0, 0)) if spec.attn_mask else ()
    splits = _splits(blocks * cdiv(length, SPLIT_BLOCK_M), problem.key_length, device) \
        if spec.split_kv else 1
    split_args, constexprs = [], {}
    rows = B0 * B1 * problem.heads * problem.length
    if spec.split_kv:
        partial = partial_lse = out         # unused where one program takes a row's keys
        if splits > 1:
            partial = empty((splits, rows, problem.value_dim), compute, device)
            partial_lse = empty((splits, rows), compute, device)
        split_args = [partial, partial_lse, rows, splits]
        constexprs = {"SPLIT": splits > 1}
    if spec.packable:
        constexprs["PACKED"] = packed
    if spec.flips_scale:
        constexprs["NEGATIVE_SCALE"] = scale < 0
    note_launch(op.name, "forward", index_64, mask=mask_kind, splits=splits,
                packed=packed)

    def grid(config: dict) -> tuple[int]:
        return (blocks * cdiv(length, config["BLOCK_M"]) * splits,)

    launch(op.kernels["forward"], grid, *pointers, *split_args,
           B1, problem.heads, problem.length, problem.key_length, problem.group,
           *strides[spec.query], *strides[spec.key], *strides[spec.value], *mask_strides,
           *vector_strides, *strides["out"], *lse_strides,
           scale, *(named[name] for name in spec.scalars), **meta, **constexprs, INDEX_64=index_64,
           tune_key=(problem.length, problem.key_length, query.dtype, mask_kind, splits))
    if splits > 1:
        launch(op.kernels["merge"], (rows,), partial, partial_lse, out,
               lse, rows, splits, B1, problem.heads, problem.length,
               *strides["out"], *lse_strides, EV=int(problem.value_dim),
               BLOCK_EV=meta["BLOCK_EV"], NUM_SPLITS=next_power_of_2(splits), INDEX_64=index_64,
               num_warps=4)
    return out, lse


def backward(op: Op, args: tuple, out: torch.Tensor, lse: torch.Tensor,
             grad_out: torch.Tensor, mask_grad: bool) -> list[torch.Tensor]:
    """The gradients of the query, key and value, of a float mask (with ``mask_grad``; else an
    empty tensor stands in) and of each per-head tensor the score differentiates by, from the
    forward's output and row logsumexps and the output's gradient ``grad_out``."""
    d = op.description
    spec: Launch = d.launch
    call = _checked(op, args)
    problem, device, operands, mask = call.problem, call.device, call.operands, call.mask
    query = operands[spec.query]
    if tuple(grad_out.shape) != tuple(out.shape):
        raise ValueError(f"{op.name}: the output's gradient has shape {tuple(grad_out.shape)}, "
                         f"the output {tuple(out.shape)}")
    mask_grad = mask_grad and mask is not None and mask.dtype != torch.bool
    batch, heads, heads_kv = problem.batch, problem.heads, problem.heads_kv
    # each gradient at the problem's full shape (dense), summed to its input's where the input
    # broadcast (batch dims, one head); in the math's type until then
    compute = compute_dtype(query.dtype)
    full = {
        spec.query: (*batch, heads, problem.length, problem.dim),
        spec.key: (*batch, heads_kv, problem.key_length, problem.dim),
        spec.value: (*batch, heads_kv, problem.key_length, problem.value_dim),
    }
    grads = {}
    # no rows or no keys: no launch, every gradient 0
    launches = bool(lse.numel() and problem.key_length)
    make = empty if launches else zeros
    for name, shape in full.items():
        exact = tuple(operands[name].shape) == shape
        grads[name] = make(shape, query.dtype if exact else compute, device)
    grad_mask = (zeros((*batch, heads, problem.length, problem.key_length), compute, device)
                 if mask_grad else None)
    # a slot per 16 keys: the key pass's programs each write BLOCK_N / 16 of them
    slots = cdiv(problem.key_length, 16)
    head_grads = {name: make((math.prod(batch), heads, slots), compute, device)
                  for name in spec.head_grads}
    # addressed with the logsumexp's strides
    delta = empty(lse.shape, compute, device, lse.stride())

    if launches:
        _launch_backward(op, call, out, lse, grad_out, delta, grads, grad_mask, head_grads)

    result = [_summed(grads[name], operands[name]) for name in full]
    result.append(_summed(grad_mask, mask) if grad_mask is not None
                  else empty((0,), query.dtype, device))
    for name, buffer in head_grads.items():
        tensor = call.heads[name]
        result.append(_summed(buffer.sum((0, 2)), tensor))
    return result


def _summed(grad: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``grad`` summed over the dims ``like`` broadcast over, in ``like``'s dtype."""
    if tuple(grad.shape) != tuple(like.shape):
        grad = grad.sum_to_size(like.shape)
    return grad.to(like.dtype)


def _launch_backward(op: Op, call: Call, out, lse, grad_out, delta, grads, grad_mask,
                     head_grads) -> None:
    d = op.description
    spec: Launch = d.launch
    problem, named, operands, mask = call.problem, call.named, call.operands, call.mask
    query = operands[spec.query]
    tensors = {**operands, "out": out, "lse": lse, "grad_out": grad_out, "delta": delta,
               **{f"grad_{name}": g for name, g in zip(("query", "key", "value"), grads.values())},
               **({"grad_mask": grad_mask} if grad_mask is not None else {})}
    try:
        strides = _batch_strides(op.name, problem, tensors)
    except ValueError:
        # the output's gradient comes in a layout of the caller's making, which need not merge
        # with the others: laid out as the output (which does), it does. A copy a replay
        # would not make: this signature takes the full path
        refuse("the output's gradient is copied to the output's layout")
        grad_out = tensors["grad_out"] = empty(out.shape, grad_out.dtype, call.device,
                                               out.stride()).copy_(grad_out)
        strides = _batch_strides(op.name, problem, tensors)
    B0, B1 = strides.pop("batch")
    index_64 = choose_int64(op.name, d.indexing, {
        **{name: _padded_span(tensor) for name, tensor in tensors.items()
           if name not in ROW_STATISTICS},
        **_vector_spans(call)}, max_tile=0)
    meta = {**_constexprs(call, spec), "INDEX_64": index_64}
    mask_kind = meta.get("MASK_KIND", 0)
    vectors, vector_strides = _vectors(call)
    # a pointer stands in for an absent mask and an unwanted mask gradient (never read or written)
    mask_pointer = [mask if mask is not None else query] if spec.attn_mask else []
    mask_strides = strides.get(spec.attn_mask, (0,) * 5) if spec.attn_mask else ()
    sizes = (B1, problem.heads, problem.length, problem.key_length, problem.group)
    operand_strides = (*strides[spec.query], *strides[spec.key], *strides[spec.value],
                       *mask_strides, *vector_strides)
    scalars = (call.scale, *(named[name] for name in spec.scalars))
    tune_key = (problem.length, problem.key_length, query.dtype, mask_kind)
    batches = B0 * B1
    grad_query, grad_key, grad_value = grads.values()
    note_launch(op.name, "backward_query", index_64, mask=mask_kind)
    inputs = (query, operands[spec.key], operands[spec.value], *mask_pointer, *vectors)
    launch(op.kernels["backward_query"],
           lambda m: (batches * problem.heads * cdiv(problem.length, m["BLOCK_M"]),),
           *inputs, out, lse, grad_out, delta, grad_query,
           *([grad_mask if grad_mask is not None else query] if spec.attn_mask else []),
           *sizes, *operand_strides, *strides["out"], *strides["lse"], *strides["grad_out"],
           *strides["grad_query"],
           *((strides["grad_mask"] if grad_mask is not None else (0,) * 5)
             if spec.attn_mask else ()),
           *scalars, **meta, **({"MASK_GRAD": grad_mask is not None} if spec.attn_mask else {}),
           tune_key=(*tune_key, grad_mask is not None))
    note_launch(op.name, "backward_key", index_64, mask=mask_kind)
    launch(op.kernels["backward_key"],
           lambda m: (batches * problem.heads_kv * cdiv(problem.key_length, m["BLOCK_N"]),),
           *inputs, lse, grad_out, delta,
           grad_key, grad_value, *head_grads.values(),
           *sizes, *operand_strides, *strides["lse"], *strides["grad_out"], *strides["grad_key"],
           *strides["grad_value"], *scalars, **meta, tune_key=tune_key)


def _constexprs(call: Call, spec: Launch) -> dict:
    """What the forward's and the backward's kernels take as constexprs from a call: the bool
    arguments, the mask tensor's kind (0 none, 1 bool, 2 float), the head dims and their tiles,
    the dots' precision. Head dims are constexprs: a symbolic one (torch.compile) is specialized,
    as every flash kernel compiles per head dim."""
    problem, mask = call.problem, call.mask
    query = call.operands[spec.query]
    meta = {name.upper(): bool(call.named[name]) for name in spec.flags}
    if spec.attn_mask:
        meta["MASK_KIND"] = 0 if mask is None else 1 if mask.dtype == torch.bool else 2
    return {**meta, "E": int(problem.dim), "EV": int(problem.value_dim),
            # exact float32 and float64 dots; 16-bit inputs ignore it
            "INPUT_PRECISION": "ieee" if query.dtype in (torch.float32, torch.float64) else "tf32",
            "BLOCK_E": max(16, next_power_of_2(problem.dim)),
            "BLOCK_EV": max(16, next_power_of_2(problem.value_dim))}


def _vectors(call: Call) -> tuple[tuple[torch.Tensor, ...], list[int]]:
    """The per-head and per-batch tensors and their strides (0 where one element broadcasts)."""
    vectors = (*call.heads.values(), *call.per_batch.values())
    return vectors, [t.stride(0) if t.shape[0] > 1 else 0 for t in vectors]


def _vector_spans(call: Call) -> dict[str, int]:
    """The per-head and per-batch tensors' spans (a view may reach far into its storage)."""
    return {name: storage_span(t) for name, t in {**call.heads, **call.per_batch}.items()}


def _splits(programs: int, keys: int, device: torch.device) -> int:
    """How many programs share a row block's keys, given the row blocks' ``programs``: the most
    that keeps the grid within ``SPLIT_PROGRAMS_PER_SM`` programs a multiprocessor, each split
    at least ``SPLIT_MIN_KEYS`` keys; 1 where two splits would pass that (more than half of it
    in row blocks alone). The tests force a count (``override(strategy="split:N")``)."""
    forced = overrides().strategy
    if forced and forced.startswith("split:"):
        return int(forced.split(":")[1])
    # rounded down: a grid just past whole waves idles most multiprocessors through its last.
    # Decoding B1 H32 S131072 on an H200 (132 of them): 9 splits, 288 programs, 87% of a copy's
    # bandwidth; 8 splits, 256 programs, 102% (16 x 128 tiles, tools/perf/sweep_decode.py)
    wanted = SPLIT_PROGRAMS_PER_SM * multiprocessors(device)
    return max(1, min(wanted // programs, keys // SPLIT_MIN_KEYS, MAX_SPLITS))


def _problem(op: str, operands: dict[str, torch.Tensor], mask: torch.Tensor | None,
             gqa: bool) -> Problem:
    """``operands``: the query, key and value by their names in the op."""
    (qn, query), (kn, key), (vn, value) = operands.items()
    for name, tensor in operands.items():
        if tensor.dim() < 2:
            raise ValueError(f"{op}: argument '{name}' has {tensor.dim()} dims; expected at "
                             f"least 2 (..., length, head dim)")
    if query.dtype != key.dtype or query.dtype != value.dtype:
        raise TypeError(f"{op}: {qn}, {kn} and {vn} must have one dtype; got "
                        f"{DTYPE_NAMES[query.dtype]}, {DTYPE_NAMES[key.dtype]}, "
                        f"{DTYPE_NAMES[value.dtype]}")
    rank = max(query.dim(), key.dim(), value.dim())
    q, k, v = (_padded(t.shape, 4) for t in (query, key, value))
    if q[-1] != k[-1]:
        raise ValueError(f"{op}: {qn}'s head dim {q[-1]} differs from {kn}'s {k[-1]}")
    if k[-2] != v[-2]:
        raise ValueError(f"{op}: {kn} has {k[-2]} keys and {vn} {v[-2]}; expected one length")
    if k[-3] != v[-3]:
        raise ValueError(f"{op}: {kn} has {k[-3]} heads and {vn} {v[-3]}; expected the same")
    for name, size in ((qn, q[-1]), (vn, v[-1])):
        if size > MAX_HEAD_DIM:
            raise ValueError(f"{op}: {name}'s head dim is {size}; at most {MAX_HEAD_DIM} is "
                             f"supported")
    hq, hkv = q[-3], k[-3]
    if hq == hkv:
        heads, group = hq, 1
    elif gqa and hkv and hq % hkv == 0:
        heads, group = hq, hq // hkv
    elif hkv == 1:            # one key/value head broadcasts over the query's
        heads, group = hq, max(hq, 1)
    elif hq == 1:             # one query head broadcasts over the key's
        heads, group = hkv, 1
    elif gqa:
        raise ValueError(f"{op}: {qn} has {hq} heads and {kn} {hkv}; enable_gqa=True shares "
                         f"key/value heads among query heads, so {qn}'s head count must be a "
                         f"multiple of {kn}'s")
    else:
        hint = ("; pass enable_gqa=True to share key/value heads among query heads"
                if hkv and hq % hkv == 0 else "")
        raise ValueError(f"{op}: {qn} has {hq} heads and {kn} {hkv}; expected equal head counts "
                         f"or one head on either side{hint}")
    batch = broadcast_shapes(q[:-3], k[:-3], v[:-3])
    if batch is None:
        raise ValueError(f"{op}: batch dims do not broadcast: {qn} {tuple(query.shape)}, {kn} "
                         f"{tuple(key.shape)}, {vn} {tuple(value.shape)}")
    if mask is not None:
        # the scores' shape at the inputs' rank: the mask broadcasts to it and grows no dim (as
        # torch adds it to the scores in place)
        target = (*batch, heads, q[-2], k[-2])[-max(rank, 2):] if rank < 4 else \
            (*batch, heads, q[-2], k[-2])
        if mask.dim() > len(target) or broadcast_shapes(target, tuple(mask.shape)) != target:
            raise ValueError(f"{op}: attn_mask of shape {tuple(mask.shape)} does not broadcast "
                             f"to the scores' {target}")
    return Problem(tuple(batch), heads, group, hkv, q[-2], k[-2], q[-1], v[-1], rank)


def _padded(shape: Sequence[int], rank: int) -> tuple[int, ...]:
    return (1,) * (rank - len(shape)) + tuple(shape)


def _check_mask(op: str, name: str, mask: torch.Tensor | None, query: torch.Tensor) -> None:
    if mask is None:
        return
    if mask.dtype not in (torch.bool, query.dtype, torch.float32):
        raise TypeError(f"{op}: argument '{name}' has dtype {mask.dtype}; expected bool (True "
                        f"takes part), or the query's dtype ({query.dtype}) or float32, added "
                        f"to the scores")


def _check_per_head(op: str, name: str, tensor: torch.Tensor, heads: int,
                    dtypes: Sequence[torch.dtype]) -> None:
    if tensor.dim() != 1 or tensor.shape[0] not in (1, heads):
        raise ValueError(f"{op}: argument '{name}' has shape {tuple(tensor.shape)}; expected "
                         f"({heads},), a value per query head (or (1,), one for all)")
    check_tensors(op, {name: tensor}, dtypes)


def _check_per_batch(op: str, name: str, tensor: torch.Tensor, batch: int) -> None:
    if tensor.dim() != 1 or tensor.shape[0] not in (1, batch):
        raise ValueError(f"{op}: argument '{name}' has shape {tuple(tensor.shape)}; expected "
                         f"({batch},), a value per batch element (or (1,), one for all)")
    if tensor.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{op}: argument '{name}' has dtype {tensor.dtype}; expected int32 or "
                        f"int64 (key counts)")


# tensors of a value per row, (..., H, L): one dim fewer than the others
ROW_STATISTICS = ("lse", "delta")


def _batch_strides(op: str, problem: Problem, tensors: dict[str, torch.Tensor]) -> dict:
    """Each tensor's strides as the kernel takes them: two batch dims (merged where every tensor
    allows), then heads, rows (or keys), columns; broadcast dims have stride 0. ``"batch"``: the
    two batch sizes."""
    batch = problem.batch
    rank = len(batch)
    full = {}
    for name, tensor in tensors.items():
        shape, strides = tuple(tensor.shape), tuple(tensor.stride())
        pad = rank + (3 if name not in ROW_STATISTICS else 2) - len(shape)
        shape, strides = (1,) * pad + shape, (0,) * pad + strides
        # broadcast dims (size 1 against a larger size) step by 0
        full[name] = tuple(0 if size == 1 else stride for size, stride in zip(shape, strides))
    names = list(full)
    batch_strides = [full[n][:rank] for n in names]
    order = [d for d in reversed(range(rank)) if batch[d] != 1]
    merged = merge_dims(batch, batch_strides, order)
    if len(merged.sizes) > BATCH_RANK:
        raise ValueError(f"{op}: the batch dims {batch} of these layouts do not merge into "
                         f"{BATCH_RANK}; make the tensors contiguous over the batch dims")
    pad = BATCH_RANK - len(merged.sizes)
    result: dict = {"batch": (1,) * pad + merged.sizes}
    for name, strides in zip(names, merged.strides):
        result[name] = (0,) * pad + strides + full[name][rank:]
    return result


def _out_layout(problem: Problem) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The output's shape ``(..., Hq, L, Ev)`` and strides, dense in ``(..., L, Hq, Ev)`` order,
    at the rank torch gives it (the largest of the inputs')."""
    heads, length, dim = problem.heads, problem.length, problem.value_dim
    shape = (*problem.batch, heads, length, dim)
    strides = [dim, heads * dim, 1]
    size = length * heads * dim
    for batch in reversed(problem.batch):
        strides.insert(0, size)
        size *= batch
    drop = max(len(shape) - problem.rank, 0)     # padded leading dims of one
    return shape[drop:], tuple(strides[drop:])


def prune_configs(configs, named_args, **kwargs):
    """``early_config_prune`` of the forward kernels: configs whose pipelined key and value tiles
    (with the query tile and a tensor mask's) pass the device's shared memory are dropped, unless
    none is left (then the smallest). Autotuning skips such a config by itself; a config the
    launch starts untuned would fail where the estimate misses (the launcher then passes over
    it). float64 inputs take ``FLOAT64_CONFIGS`` instead of the space."""
    return _fitting(configs, named_args, kwargs, streamed="BLOCK_N", held="BLOCK_M",
                    held_values=False, role="forward")


def prune_query_pass_configs(configs, named_args, **kwargs):
    """``early_config_prune`` of the backward's query pass: the forward's rule, with the held
    rows' output gradients beside their queries."""
    return _fitting(configs, named_args, kwargs, streamed="BLOCK_N", held="BLOCK_M",
                    held_values=True, role="query")


def prune_key_pass_configs(configs, named_args, **kwargs):
    """``early_config_prune`` of the backward's key pass, which holds a block of keys and values
    and streams the query rows and their output gradients: the rule with the roles swapped."""
    return _fitting(configs, named_args, kwargs, streamed="BLOCK_M", held="BLOCK_N",
                    held_values=True, role="key")


def _fitting(configs, named_args, kwargs, streamed: str, held: str, held_values: bool,
             role: str):
    element = next(v for v in named_args.values() if hasattr(v, "element_size")).element_size()
    block_e, block_ev = kwargs["BLOCK_E"], kwargs["BLOCK_EV"]
    device = next(v for v in named_args.values() if hasattr(v, "device")).device
    limit = shared_memory(device)
    if element == 8:
        # float64: its own tiles (FLOAT64_CONFIGS), whatever the space
        spaces = FLOAT64_CONFIGS[role]
        bound = min(b for b in spaces if max(block_e, block_ev) <= b)
        configs = [triton.Config({held: m, streamed: n}, num_warps=w, num_stages=s)
                   for m, n, w, s in spaces[bound]]

    mask = named_args.get("mask_ptr") if kwargs.get("MASK_KIND", 0) else None
    mask_element = 0 if mask is None else mask.element_size()

    def mask_bytes(elements: int, stages: int) -> int:
        # a tensor mask's BLOCK_M x BLOCK_N tile, loaded each step. Triton pipelines a float32
        # mask's as the keys', in up to as many buffers as stages: how many, and what scratch
        # it takes beside them, depend on the mask's alignment and the head dim (the forward
        # at E 16 on a 300-wide mask, 128 x 128 blocks in 3 stages: 180736 bytes past the
        # tiles, 2.8 tiles of the mask; at E 64 one tile), so the bound is a tile a stage. A
        # narrower mask's tile Triton converts through at most one tile of scratch (bool and
        # float16 masks: 4096-8192 bytes past the tiles). Where the count still passes the
        # estimate, an unforced launch passes over the config (launch.launch)
        tile = mask_element * elements
        return tile * stages if mask_element >= 4 else tile

    def size(config) -> int:
        # Triton's own count without a mask, to the byte (ptxas for sm_90 under Triton 3.6 and
        # 3.8: the forward and the query pass at float16 E 128, float32 E 64 and E 256 with Ev
        # 64, every stage count; the key pass at float32 E 64 with its scores' tile)
        meta = config.kwargs
        tiles = config.num_stages * meta[streamed] * (block_e + block_ev)
        held_tiles = meta[held] * (block_e + (block_ev if held_values else 0))
        scores = meta["BLOCK_M"] * meta["BLOCK_N"]
        extra = 0
        if role == "key":
            # the key pass turns its scores into dV's dot operand through shared memory, and
            # streams each row's logsumexp and delta (float32 E 64, 64 x 128 blocks: Triton
            # counts 33792 bytes past the tiles)
            extra = element * scores + 16 * meta["BLOCK_M"]
        return element * (tiles + held_tiles) + extra + mask_bytes(scores, config.num_stages)

    def fits(config) -> bool:
        return size(config) <= limit

    fitting = [c for c in configs if fits(c)]
    if fitting:
        return fitting
    # none fits (float32 with head dims of 256): smaller tiles and fewer stages than the space's
    fallbacks = [triton.Config({held: m, streamed: n}, num_warps=4, num_stages=s)
                 for m, n, s in FALLBACK_CONFIGS]
    return [next((c for c in fallbacks if fits(c)), fallbacks[-1])]


def _padded_span(tensor: torch.Tensor) -> int:
    """Elements a launch may address from the tensor: its span with its last two dims (rows or
    keys, and the head dim) overrun by a block (masked lanes past the end still form offsets;
    batch and head indices never pass their sizes)."""
    rank = tensor.dim()
    shape = [size + MAX_BLOCK if d >= rank - 2 else size for d, size in enumerate(tensor.shape)]
    return span(tuple(shape), tuple(abs(s) for s in tensor.stride()))


__all__ = ["RUNTIME", "Call", "Launch", "Problem", "backward", "forward", "prune_configs",
           "prune_key_pass_configs", "prune_query_pass_configs"]

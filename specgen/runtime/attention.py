"""The attention family's runtime: torch's ``scaled_dot_product_attention`` rules for shapes,
heads, masks and scale, and the launch of the forward kernel (``RUNTIME``).

Shapes: query ``(..., Hq, L, E)``, key ``(..., Hkv, S, E)``, value ``(..., Hkv, S, Ev)``, batch
dims broadcast; heads match, or one side has one head, or (``enable_gqa=True``) the query's are a
multiple of the key's, which groups of query heads share without a copy. Any strides. The output
is laid out as torch's flash backend lays it out, ``(..., L, Hq, Ev)`` in memory viewed as
``(..., Hq, L, Ev)``, so that ``out.transpose(-3, -2).flatten(-2)`` is a view.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch
import triton

from specgen.runtime.checks import DTYPE_NAMES, check_same_device, check_tensors
from specgen.runtime.context import note_launch, overrides
from specgen.runtime.launch import choose_int64, launch, multiprocessors, shared_memory
from specgen.runtime.layout import broadcast_shapes, merge_dims, next_power_of_2, span
from specgen.runtime.op import FamilyRuntime, Op
from specgen.runtime.replay import empty

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
# split-KV (flash decoding): programs per multiprocessor to aim for, the fewest keys a split
# takes, and the most splits a row block may have
SPLIT_PROGRAMS_PER_SM = 2
SPLIT_MIN_KEYS = 512
MAX_SPLITS = 64
# the query block the split count assumes (the configs' smallest)
SPLIT_BLOCK_M = 64
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
    split_kv: bool = False          # programs may share a row's keys, then a merge kernel runs
    packable: bool = False          # a program may take a group of query heads (PACKED)


@dataclass(frozen=True)
class Problem:
    """A call's sizes after torch's broadcasting rules, and the layout of its result."""

    batch: tuple[int, ...]          # the broadcast batch dims
    heads: int                      # query heads of the result
    group: int                      # query heads per key/value head
    length: int                     # L
    keys: int                       # S
    dim: int                        # E
    value_dim: int                  # Ev
    rank: int                       # the result's rank


class Attention(FamilyRuntime):
    """Kernel ``forward``: a program per (batch, head, block of query rows)."""

    doc_note = ("with torch's semantics; a row whose keys are all masked gives zeros (as "
                "torch's math backend), dropout_p other than 0 raises NotImplementedError.")

    def run(self, op: Op, args: tuple) -> torch.Tensor:
        return forward(op, args, store_lse=False)[0]


RUNTIME = Attention()


def forward(op: Op, args: tuple, store_lse: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The output and, with ``store_lse``, each row's logsumexp (float32, ``(..., Hq, L)``):
    what the backward recomputes the softmax from."""
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
    device = check_tensors(op.name, operands, d.dtypes)
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

    batch = problem.batch
    shape, strides = _out_layout(problem)
    out = empty(shape, query.dtype, device, strides)
    lse = None
    if store_lse:   # at the output's rank, less its last dim
        lse = empty(shape[:-1], torch.float32, device)
    if out.numel() == 0 and (lse is None or lse.numel() == 0):
        return out, lse

    scale = named.get("scale")
    if scale is None:
        scale = 1.0 / math.sqrt(problem.dim) if problem.dim else 1.0
    if mask is not None:
        operands[spec.attn_mask] = mask
    strides = _batch_strides(op.name, problem, operands, out, lse)
    b0, b1 = strides.pop("batch")
    lse_strides = strides.pop("lse", (0, 0, 0, 0))
    index_64 = choose_int64(op.name, d.indexing, {
        name: _padded_span(tensor) for name, tensor in (*operands.items(), ("out", out))},
        max_tile=0)
    block_e = max(16, next_power_of_2(problem.dim))
    block_ev = max(16, next_power_of_2(problem.value_dim))
    flags = {name.upper(): bool(named[name]) for name in spec.flags}
    mask_kind = {} if not spec.attn_mask else {
        "MASK_KIND": 0 if mask is None else 1 if mask.dtype == torch.bool else 2}
    # packed: a program per key/value head takes its group's query heads as rows
    packed = (spec.packable and problem.group > 1 and mask is None
              and problem.group * problem.length <= PACK_MAX_ROWS)
    blocks = b0 * b1 * (problem.heads // problem.group if packed else problem.heads)
    length = problem.length * problem.group if packed else problem.length

    # per-head and per-batch vectors of one element broadcast (stride 0)
    vectors = (*heads.values(), *per_batch.values())
    vector_strides = [t.stride(0) if t.shape[0] > 1 else 0 for t in vectors]
    # a pointer stands in for an absent mask and an unsaved logsumexp (never read or written)
    pointers = [query, key, value, *([mask if mask is not None else query]
                                     if spec.attn_mask else []),
                *vectors, out, lse if lse is not None else out]
    mask_strides = strides.get(spec.attn_mask, (0, 0, 0, 0, 0)) if spec.attn_mask else ()
    splits = _splits(blocks * triton.cdiv(length, SPLIT_BLOCK_M), problem.keys, device) \
        if spec.split_kv else 1
    split_args, constexprs = [], {}
    rows = b0 * b1 * problem.heads * problem.length
    if spec.split_kv:
        partial = partial_lse = out         # unused where one program takes a row's keys
        if splits > 1:
            partial = empty((splits, rows, problem.value_dim), torch.float32, device)
            partial_lse = empty((splits, rows), torch.float32, device)
        split_args = [partial, partial_lse, rows, splits]
        constexprs = {"SPLIT": splits > 1}
    if spec.packable:
        constexprs["PACKED"] = packed
    note_launch(op.name, "forward", index_64, mask=mask_kind.get("MASK_KIND", 0), splits=splits,
                packed=packed)

    def grid(meta: dict) -> tuple[int]:
        return (blocks * triton.cdiv(length, meta["BLOCK_M"]) * splits,)

    launch(op.kernels["forward"], grid, *pointers, *split_args,
           b1, problem.heads, problem.length, problem.keys, problem.group,
           *strides[spec.query], *strides[spec.key], *strides[spec.value], *mask_strides,
           *vector_strides, *strides["out"], *lse_strides,
           scale, *(named[name] for name in spec.scalars),
           # head dims are constexprs: a symbolic one (torch.compile) is specialized, as every
           # flash kernel compiles per head dim
           **flags, **mask_kind, **constexprs, STORE_LSE=store_lse, E=int(problem.dim), EV=int(problem.value_dim),
           INPUT_PRECISION="ieee" if query.dtype == torch.float32 else "tf32",
           BLOCK_E=block_e, BLOCK_EV=block_ev, INDEX_64=index_64,
           tune_key=(problem.length, problem.keys, query.dtype, tuple(mask_kind.items()), splits))
    if splits > 1:
        launch(op.kernels["merge"], (rows,), partial, partial_lse, out,
               lse if lse is not None else out, rows, splits, b1, problem.heads, problem.length,
               *strides["out"], *lse_strides, STORE_LSE=store_lse, EV=int(problem.value_dim),
               BLOCK_EV=block_ev, NUM_SPLITS=next_power_of_2(splits), INDEX_64=index_64,
               num_warps=4)
    return out, lse


def _splits(programs: int, keys: int, device: torch.device) -> int:
    """How many programs share a row block's keys, given the row blocks' ``programs``: enough
    that the programs fill the GPU (``SPLIT_PROGRAMS_PER_SM`` each), each split at least
    ``SPLIT_MIN_KEYS`` keys; 1 where the row blocks alone fill it. The tests force a count
    (``override(strategy="split:N")``)."""
    forced = overrides().strategy
    if forced and forced.startswith("split:"):
        return int(forced.split(":")[1])
    wanted = SPLIT_PROGRAMS_PER_SM * multiprocessors(device)
    if programs >= wanted:
        return 1
    return max(1, min(triton.cdiv(wanted, programs), keys // SPLIT_MIN_KEYS, MAX_SPLITS))


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
    else:
        hint = ("" if gqa else "; pass enable_gqa=True to share key/value heads among query heads"
                if hkv and hq % hkv == 0 else "")
        raise ValueError(f"{op}: {qn} has {hq} heads and {kn} {hkv}, which do not "
                         f"broadcast{hint}")
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
    return Problem(tuple(batch), heads, group, q[-2], k[-2], q[-1], v[-1], rank)


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
                         f"({heads},), a value per query head")
    check_tensors(op, {name: tensor}, dtypes)


def _check_per_batch(op: str, name: str, tensor: torch.Tensor, batch: int) -> None:
    if tensor.dim() != 1 or tensor.shape[0] not in (1, batch):
        raise ValueError(f"{op}: argument '{name}' has shape {tuple(tensor.shape)}; expected "
                         f"({batch},), a value per batch element")
    if tensor.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{op}: argument '{name}' has dtype {tensor.dtype}; expected int32 or "
                        f"int64 (key counts)")


def _batch_strides(op: str, problem: Problem, operands: dict[str, torch.Tensor],
                   out: torch.Tensor, lse: torch.Tensor | None) -> dict:
    """Each tensor's strides as the kernel takes them: two batch dims (merged where every tensor
    allows), then heads, rows (or keys), columns; broadcast dims have stride 0. ``"batch"``: the
    two batch sizes."""
    batch = problem.batch
    rank = len(batch)
    full = {}
    for name, tensor in (*operands.items(), ("out", out), *((("lse", lse),) if lse is not None
                                                           else ())):
        shape, strides = tuple(tensor.shape), tuple(tensor.stride())
        pad = rank + (3 if name != "lse" else 2) - len(shape)
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
    (and the query tile) pass the device's shared memory are dropped, unless none is left (then
    the smallest). Autotuning skips such a config by itself; a config the tests force does not."""
    element = next(v for v in named_args.values() if hasattr(v, "element_size")).element_size()
    block_e, block_ev = kwargs["BLOCK_E"], kwargs["BLOCK_EV"]
    device = next(v for v in named_args.values() if hasattr(v, "device")).device
    limit = shared_memory(device)

    def size(config) -> int:
        # the estimate matches Triton's own count where it ran out (E 256, Ev 16, fp16, 64 x 128
        # blocks, 3 stages: 241664 bytes)
        meta = config.kwargs
        tiles = config.num_stages * meta["BLOCK_N"] * (block_e + block_ev)
        return element * (tiles + meta["BLOCK_M"] * block_e)

    fitting = [c for c in configs if size(c) <= limit]
    if fitting:
        return fitting
    # none fits (float32 with head dims of 256): smaller tiles and fewer stages than the space's
    fallbacks = [triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=4, num_stages=s)
                 for m, n, s in FALLBACK_CONFIGS]
    return [next((c for c in fallbacks if size(c) <= limit), fallbacks[-1])]


def _padded_span(tensor: torch.Tensor) -> int:
    """Elements a launch may address from the tensor: its span with its last two dims (rows or
    keys, and the head dim) overrun by a block (masked lanes past the end still form offsets;
    batch and head indices never pass their sizes)."""
    rank = tensor.dim()
    shape = [size + MAX_BLOCK if d >= rank - 2 else size for d, size in enumerate(tensor.shape)]
    return span(tuple(shape), tuple(abs(s) for s in tensor.stride()))


__all__ = ["RUNTIME", "Launch", "Problem", "forward", "prune_configs"]

"""Sizes, strides, memory order and dimension collapsing for launches.

Everything here reads sizes and strides only (never data), so it runs unchanged on the fake tensors
that ``torch.compile`` traces a ``triton_op`` with.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

Shape = tuple[int, ...]


def next_power_of_2(n: int) -> int:
    """The smallest power of two at least ``n`` (1 for ``n`` <= 1), always a plain int.

    A block size is a constexpr, so it cannot stay symbolic under torch.compile with dynamic shapes
    (``triton.next_power_of_2`` of a symbol is a bitwise expression Inductor cannot print). On a
    symbolic size each comparison below adds a guard: the graph is specialised on the size's
    power-of-two bucket, and recompiles only when a size leaves it.
    """
    if isinstance(n, int):
        return 1 << max(n - 1, 0).bit_length()
    power = 1
    while power < n:
        power *= 2
    return power


def cdiv(n: int, d: int) -> int:
    """``triton.cdiv`` in plain Python: Triton's is a constexpr function, whose host-side call
    costs a few microseconds (an import and a list of unwrapped arguments), and every planner
    and grid of a first call takes several. The same expression, so that symbolic sizes stay
    symbolic as they did."""
    return (n + d - 1) // d


def broadcast_shapes(*shapes: Shape) -> Shape | None:
    """torch's broadcast of ``shapes`` (None where they do not broadcast), in plain Python:
    ``torch.broadcast_shapes`` costs ~20 us a call."""
    rank = max(len(shape) for shape in shapes)
    result = [1] * rank
    for shape in shapes:
        for i, size in enumerate(shape, start=rank - len(shape)):
            if size != result[i] and size != 1:
                if result[i] != 1:
                    return None
                result[i] = size
    return tuple(result)


def strides_at(size: Shape, stride: Shape, shape: Shape) -> Shape:
    """Strides of a (size, stride) view broadcast to ``shape``."""
    lead = len(shape) - len(size)
    return (0,) * lead + tuple(st if sz == target else 0
                               for sz, st, target in zip(size, stride, shape[lead:]))


def memory_order(shape: Shape, operand_strides: Sequence[Shape]) -> list[int]:
    """Dimensions from fastest to slowest, by the rule of torch's TensorIterator.

    Operands are consulted in order; the first with a strict stride comparison decides, broadcast
    (stride 0) dimensions are skipped, and equal strides are broken by the smaller size. Using torch's
    rule makes freshly allocated outputs come out with the strides torch would give them.
    """
    ndim = len(shape)
    perm = list(range(ndim - 1, -1, -1))

    def should_swap(dim0: int, dim1: int) -> int:
        for strides in operand_strides:
            stride0, stride1 = strides[dim0], strides[dim1]
            if stride0 == 0 or stride1 == 0:
                continue
            if stride0 != stride1:
                return -1 if stride0 < stride1 else 1
            if shape[dim0] > shape[dim1]:
                return 1
        return 0

    # insertion sort that leaves ambiguous pairs where they are
    for i in range(1, ndim):
        dim1 = i
        for dim0 in range(i - 1, -1, -1):
            comparison = should_swap(perm[dim0], perm[dim1])
            if comparison > 0:
                perm[dim0], perm[dim1] = perm[dim1], perm[dim0]
                dim1 = dim0
            elif comparison < 0:
                break
    return perm


def fast_setup_strides(shape: Shape, operands: Sequence[tuple[Shape, Shape]]) -> Shape | None:
    """The strides TensorIterator's fast setup gives an element-wise result, where it applies
    (``operands``: (sizes, strides) of each input): every input of the result's shape and
    contiguous gives a contiguous result, every one channels_last (4-D) a channels_last one,
    every one non-overlapping and dense with the same strides those strides. Else None, and
    ``memory_order`` decides. The two differ on size-1 dims, whose strides the contiguity checks
    ignore: x of shape (1, 63, 5, 1) and strides (315, 1, 63, 1) is channels_last, so x + x has
    strides (315, 1, 63, 63), where ``memory_order`` keeps x's."""
    if not operands or any(tuple(size) != tuple(shape) for size, _ in operands):
        return None
    strides = [tuple(stride) for _, stride in operands]
    rank = len(shape)
    contiguous = tuple(range(rank - 1, -1, -1))
    if all(_laid_out(shape, stride, contiguous, empty_is_dense=True) for stride in strides):
        return dense_strides(shape, contiguous)
    if rank == 4 and all(_laid_out(shape, stride, (1, 3, 2, 0)) for stride in strides):
        return dense_strides(shape, (1, 3, 2, 0))
    if all(stride == strides[0] for stride in strides) and _non_overlapping_and_dense(
            shape, strides[0]):
        return strides[0]
    return None


def _laid_out(shape: Shape, stride: Shape, order: Sequence[int], empty_is_dense: bool = False) -> bool:
    """c10's contiguity check in ``order`` (fastest first): size-1 dims' strides do not count."""
    if empty_is_dense and any(size == 0 for size in shape):
        return True
    expected = 1
    for dim in order:
        if shape[dim] != 1:
            if stride[dim] != expected:
                return False
            expected *= shape[dim]
    return True


def _non_overlapping_and_dense(shape: Shape, stride: Shape) -> bool:
    """c10's check: dims of size 2 or more, by stride, are dense from 1."""
    if len(shape) == 1:
        return shape[0] < 2 or stride[0] == 1
    expected = 1
    for dim in sorted((d for d in range(len(shape)) if shape[d] >= 2), key=lambda d: stride[d]):
        if stride[dim] != expected:
            return False
        expected *= shape[dim]
    return True


def contiguous_strides(shape: Shape) -> Shape:
    """The strides ``torch.empty(shape)`` gives: row-major, a size-0 dim counted as 1."""
    return dense_strides(shape, range(len(shape) - 1, -1, -1))


def dense_strides(shape: Shape, order: Sequence[int]) -> Shape:
    """Strides of a dense tensor of ``shape`` laid out in ``order`` (fastest dimension first)."""
    strides = [0] * len(shape)
    step = 1
    for dim in order:
        strides[dim] = step
        step *= max(shape[dim], 1)
    return tuple(strides)


@dataclass(frozen=True)
class Collapsed:
    """An iteration space after collapsing: ``sizes`` slowest first, one stride tuple per operand."""

    sizes: Shape
    strides: tuple[Shape, ...]

    @property
    def numel(self) -> int:
        numel = 1
        for size in self.sizes:
            numel *= size
        return numel

    @property
    def dense(self) -> bool:
        """All operands walk memory in the same order with no gaps: one flat offset serves all."""
        return len(self.sizes) <= 1 and all(s == (1,) * len(self.sizes) for s in self.strides)

    def padded(self, rank: int, op: str) -> "Collapsed":
        """Pads with outer size-1 dimensions to exactly ``rank`` dimensions."""
        if len(self.sizes) > rank:
            raise ValueError(f"{op}: the operands have {len(self.sizes)} dimensions that cannot "
                             f"be collapsed into each other; at most {rank} are supported")
        pad = rank - len(self.sizes)
        return Collapsed((1,) * pad + self.sizes, tuple((0,) * pad + s for s in self.strides))


def collapse(shape: Shape, operand_strides: Sequence[Shape]) -> Collapsed:
    """Orders dims by memory, drops size-1 dims and merges dims that are contiguous in every operand."""
    order = [d for d in memory_order(shape, operand_strides) if shape[d] != 1]
    return merge_dims(shape, operand_strides, order)


def merge_dims(shape: Shape, operand_strides: Sequence[Shape], order: Sequence[int]) -> Collapsed:
    """The dims in ``order`` (fastest first), each merged into the previous one where every operand
    steps over it contiguously. Returns sizes and strides slowest first."""
    sizes: list[int] = []
    strides: list[list[int]] = [[] for _ in operand_strides]
    for dim in order:
        mergeable = sizes and all(s[dim] == merged[-1] * sizes[-1]
                                  for s, merged in zip(operand_strides, strides))
        if mergeable:
            sizes[-1] *= shape[dim]
            continue
        sizes.append(shape[dim])
        for s, merged in zip(operand_strides, strides):
            merged.append(s[dim])
    return Collapsed(tuple(reversed(sizes)), tuple(tuple(reversed(s)) for s in strides))


def storage_span(tensor: torch.Tensor) -> int:
    """Elements between the tensor's data pointer and its last element, plus one.

    Triton addresses ``ptr + offset`` from ``data_ptr()``, which already includes the storage
    offset, so the offset itself never enters the index arithmetic.
    """
    return span(tuple(tensor.shape), tuple(tensor.stride()))


def span(size: Shape, stride: Shape) -> int:
    """``storage_span`` from sizes and strides."""
    if 0 in size:
        return 0
    return 1 + sum((sz - 1) * abs(st) for sz, st in zip(size, stride))


def has_internal_overlap(tensor: torch.Tensor) -> bool:
    """True when two indices of ``tensor`` may address one memory location (conservative)."""
    dims = sorted((abs(st), sz) for sz, st in zip(tensor.shape, tensor.stride()) if sz > 1)
    extent = 1
    for stride, size in dims:
        if stride < extent:
            return True
        extent = stride * size
    return False

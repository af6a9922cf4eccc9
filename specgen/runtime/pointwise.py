"""Element-wise launches: torch's type promotion and output layout, and cached launch plans."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
import triton

from specgen.runtime.launch import choose_int64, grid_size, max_programs, plan_cache
from specgen.runtime.context import overrides
from specgen.runtime.layout import (Shape, collapse, dense_strides,
                                    memory_order, span, strides_at)
from specgen.runtime.replay import empty


def result_dtype(tensors: Sequence[torch.Tensor]) -> torch.dtype:
    """torch's promotion for floating tensors: 0-dim tensors only count when all are 0-dim."""
    ranked = [t for t in tensors if t.dim() > 0] or list(tensors)
    dtype = ranked[0].dtype
    for tensor in ranked[1:]:
        dtype = torch.promote_types(dtype, tensor.dtype)
    return dtype


def empty_output(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device,
                 inputs: Sequence[torch.Tensor]) -> torch.Tensor:
    """An output laid out as torch lays out the result of an element-wise op on ``inputs``."""
    return empty(shape, dtype, device, output_strides(shape, inputs))


def output_strides(shape: tuple[int, ...], inputs: Sequence[torch.Tensor]) -> Shape:
    """The strides torch gives the result of an element-wise op on ``inputs``."""
    metas = tuple((tuple(t.shape), tuple(t.stride())) for t in inputs)
    try:
        return _output_strides(shape, metas)
    except TypeError:  # symbolic sizes do not hash
        return _output_strides.__wrapped__(shape, metas)


@functools.lru_cache(maxsize=4096)
def _output_strides(shape: Shape, metas: tuple) -> Shape:
    order = memory_order(shape, [strides_at(size, stride, shape) for size, stride in metas])
    return dense_strides(shape, order)


@dataclass(frozen=True)
class LaunchPlan:
    """What one element-wise launch needs beyond the tensors themselves."""

    dense: bool                  # one flat offset serves every tensor
    index_64: bool
    args: tuple[int, ...]        # dense: (numel,); tiled: collapsed sizes, then each tensor's strides
    grid: Callable[[dict], tuple[int]]


def plan_launch(op: str, indexing: str, names: tuple[str, ...], tensors: Sequence[torch.Tensor],
                *, max_tile: int, launch: str, rank: int) -> LaunchPlan | None:
    """The launch for ``tensors`` (outputs first, then inputs), or None when there is nothing to do.

    Plans depend on sizes and strides only, so they are cached on them: repeated calls on tensors
    of one layout skip the collapsing, the span arithmetic and the grid set-up.
    """
    metas = tuple((tuple(t.shape), tuple(t.stride())) for t in tensors)
    return _plan(op, indexing, names, metas, max_tile, launch, rank, overrides(), tensors[0].device)


@plan_cache
def _plan(op, indexing, names, metas, max_tile, launch, rank, _overrides, device) -> LaunchPlan | None:
    shape = metas[0][0]
    space = collapse(shape, [strides_at(size, stride, shape) for size, stride in metas])
    if space.numel == 0:
        return None
    index_64 = choose_int64(op, indexing, {n: span(*meta) for n, meta in zip(names, metas)},
                            max_tile)
    cap = max_programs(device, launch)
    if space.dense:
        numel = space.numel
        return LaunchPlan(True, index_64, (numel,),
                          lambda meta: (grid_size(triton.cdiv(numel, meta["BLOCK"]), cap),))
    space = space.padded(rank, op)
    size_m, size_n = space.sizes[-2:]
    outer = 1
    for size in space.sizes[:-2]:
        outer *= size

    def grid(meta: dict) -> tuple[int]:
        tiles = triton.cdiv(size_m, meta["TILE_M"]) * triton.cdiv(size_n, meta["TILE_N"])
        return (grid_size(outer * tiles, cap),)

    strides = tuple(stride for operand in space.strides for stride in operand)
    return LaunchPlan(False, index_64, space.sizes + strides, grid)


__all__ = ["LaunchPlan", "Shape", "empty_output", "output_strides", "plan_launch", "result_dtype"]

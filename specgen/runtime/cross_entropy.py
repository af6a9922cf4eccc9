"""Row-wise launches of the cross_entropy family: one program per row, grid-stride over rows."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from specgen.runtime.launch import choose_int64, grid_size, max_programs, overrides
from specgen.runtime.layout import span


@dataclass(frozen=True)
class RowsLaunch:
    index_64: bool
    grid: tuple[int]


def plan_rows(op: str, indexing: str, max_tile: int, n_rows: int,
              tensors: dict[str, torch.Tensor]) -> RowsLaunch:
    """Index width and grid of a launch over ``n_rows`` rows of ``tensors`` (None entries skipped).

    Cached on sizes and strides, so repeated calls on one layout skip the span arithmetic.
    """
    metas = tuple((name, tuple(t.shape), tuple(t.stride())) for name, t in tensors.items()
                  if t is not None)
    device = next(t.device for t in tensors.values() if t is not None)
    key = (op, indexing, max_tile, n_rows, metas, overrides(), device)
    try:
        return _cached_plan(key)
    except TypeError:  # symbolic sizes (torch.compile with dynamic shapes) do not hash
        return _plan(*key)


def _plan(op, indexing, max_tile, n_rows, metas, _overrides, device) -> RowsLaunch:
    index_64 = choose_int64(op, indexing, {name: span(size, stride) for name, size, stride in metas},
                            max_tile)
    return RowsLaunch(index_64, (grid_size(n_rows, max_programs(device, "persistent")),))


_cached_plan = functools.lru_cache(maxsize=4096)(lambda key: _plan(*key))

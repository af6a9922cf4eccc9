"""Element-wise launches: torch's type promotion and output layout, and the collapsed iteration space."""

from __future__ import annotations

from typing import Sequence

import torch

from specgen.runtime.layout import Collapsed, broadcast_strides, collapse, dense_strides, memory_order


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
    order = memory_order(shape, [broadcast_strides(t, shape) for t in inputs])
    return torch.empty_strided(shape, dense_strides(shape, order), dtype=dtype, device=device)


def iteration_space(shape: tuple[int, ...], outputs: Sequence[torch.Tensor],
                    inputs: Sequence[torch.Tensor]) -> Collapsed:
    """Collapsed shape and strides, outputs first then inputs (the order that sets memory order)."""
    strides = [tuple(o.stride()) for o in outputs] + [broadcast_strides(t, shape) for t in inputs]
    return collapse(shape, strides)

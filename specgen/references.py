"""Torch computations a spec's reference may call as ``ref.<name>``, where torch's own function
takes less than the op does. Each is made of torch ops, so autograd gives torch's gradient."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def prod(x: torch.Tensor, dim: int | Sequence[int] | None = None, keepdim: bool = False,
         dtype: torch.dtype | None = None) -> torch.Tensor:
    """``torch.prod`` over an int, a sequence of ints or None (every dim; also an empty
    sequence), as ``torch.sum`` takes dims; torch.prod takes one int. One dim at a time, so its
    gradient is torch.prod's, exact at zeros and negative values (exp(sum(log x)) is NaN there)."""
    if dim is None or not isinstance(dim, int) and len(dim) == 0:
        dims = range(x.dim())
    else:
        dims = [dim] if isinstance(dim, int) else dim
    if x.dim() == 0:
        # torch.prod of the one element (its dtype= and autocast's as for any dims)
        return torch.prod(x, dtype=dtype)
    # the highest dim first: without keepdim, the lower dims keep their positions; dtype= on
    # each, as torch.prod's (under autocast an unset one is float32 in each, as in torch.prod)
    for d in sorted({d % x.dim() for d in dims}, reverse=True):
        x = torch.prod(x, d, keepdim=keepdim, dtype=dtype)
    return x


def rms_norm(x: torch.Tensor, normalized_shape: Sequence[int], weight: torch.Tensor | None = None,
             eps: float | None = None) -> torch.Tensor:
    """``F.rms_norm`` spelled out in torch ops: the same math (16-bit inputs in float32, times
    the weight, the result in x's dtype and suggested memory format), with no
    ``normalized_shape`` in any op. torch 2.11's AOTAutograd bakes a symbolic
    ``normalized_shape`` (``x.shape[-1]`` under dynamic shapes) into the CUDA backward graph of
    ``aten._fused_rms_norm`` as a garbage int, so a traced backward through the reference raised
    "Expected weight to be of same shape as normalized_shape"."""
    dims = tuple(range(-len(normalized_shape), 0))
    wide = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    if eps is None:
        eps = torch.finfo(wide.dtype).eps   # F.rms_norm's default: its math dtype's
    out = wide * torch.rsqrt(wide.pow(2).mean(dims, keepdim=True) + eps)
    if weight is not None:
        out = out * weight
    # x's dtype whatever the weight's, as F.rms_norm returns
    return out.to(x.dtype).contiguous(memory_format=torch._prims_common.suggest_memory_format(x))

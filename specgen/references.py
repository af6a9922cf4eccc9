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
    if dtype is not None:
        x = x.to(dtype)
    if dim is None or not isinstance(dim, int) and len(dim) == 0:
        dims = range(x.dim())
    else:
        dims = [dim] if isinstance(dim, int) else dim
    # the highest dim first: without keepdim, the lower dims keep their positions
    for d in sorted({d % max(x.dim(), 1) for d in dims}, reverse=True):
        x = torch.prod(x, d, keepdim=keepdim)
    return x

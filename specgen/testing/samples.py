"""Operator samples for torch.library.opcheck (tests/test_opcheck.py): a few small float32
calls of each operator a generated op registers, drawn by its family (``Family.samples``), with
inputs that require grad and laid out transposed or sliced."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Make:
    """Small tensors on one device, uniform in [lo, hi)."""

    device: str

    def r(self, *shape: int, g: bool = False, lo: float = -2.0, hi: float = 2.0) -> torch.Tensor:
        return torch.empty(*shape, device=self.device).uniform_(lo, hi).requires_grad_(g)

    def t(self, a: int, b: int, g: bool = False, **kwargs) -> torch.Tensor:
        """a x b, the transpose of a contiguous b x a."""
        return self.r(b, a, **kwargs).t().detach().requires_grad_(g)

    def sl(self, a: int, b: int, g: bool = False) -> torch.Tensor:
        """a x b, every other column from offset 1."""
        return self.r(a, 2 * b + 1)[:, 1::2].detach().requires_grad_(g)

    def out_t(self, a: int, b: int) -> torch.Tensor:
        """An a x b output laid out transposed."""
        return torch.empty(b, a, device=self.device).t()


def default(arg) -> object:
    """A non-tensor argument's value in a sample: a choice's last value (not the default, so
    that the constexpr path beside the default's is traced), else the default."""
    if arg.kind == "choice":
        return arg.choices[-1]
    return arg.default

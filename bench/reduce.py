"""Reductions and cross-entropy: memory-bound, judged against the copy bandwidth and torch.compile.

Eager cross-entropy is ``F.cross_entropy`` on float32-upcast logits (what a bf16 training loop
without a fused kernel does, and the baseline of the 3.50 ms in ../shared/DESIGN.md), cast back
to bfloat16 so the outputs compare; torch.compile compiles that same function.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from bench.harness import Case

DTYPE = torch.bfloat16


def cases(quick: bool) -> list[Case]:
    # --quick divides every element count by 16
    rows, vocab = (256 if quick else 4096), 128256
    wide = (2048 if quick else 32768), 1024
    full = 2**24 if quick else 2**28
    return [
        _ce_case("cross_entropy fwd", rows, vocab, _specgen_ce, _eager_ce, passes=1),
        _ce_case("cross_entropy fwd+bwd", rows, vocab, _specgen_ce_grad, _eager_ce_grad, passes=3),
        _sum_case("sum(x, -1)", wide, lambda x: _generated().sum(x, -1), lambda x: torch.sum(x, -1)),
        _sum_case("sum(x)", (full,), lambda x: _generated().sum(x), lambda x: torch.sum(x)),
        _sum_case("sum(x, 0)", wide, lambda x: _generated().sum(x, 0), lambda x: torch.sum(x, 0)),
    ]


def _generated():
    # imported on first use, so a missing op fails only its own column (see bench/pointwise.py)
    import generated

    return generated


def _specgen_ce(x, target):
    return _generated().cross_entropy(x, target)


def _eager_ce(x, target):
    return F.cross_entropy(x.float(), target).to(x.dtype)


def _specgen_ce_grad(x, target):
    # the gradient, so the check compares what the backward wrote; autograd.grad leaves x.grad alone
    return torch.autograd.grad(_specgen_ce(x, target), x)[0]


def _eager_ce_grad(x, target):
    return torch.autograd.grad(_eager_ce(x, target), x)[0]


def _ce_case(op, rows, vocab, specgen, eager, passes) -> Case:
    def make_inputs():
        x = torch.randn(rows, vocab, device="cuda", dtype=DTYPE, requires_grad=True)
        return x, torch.randint(0, vocab, (rows,), device="cuda")

    return Case(family="reduce", op=op, shape=f"{rows}x{vocab}", dtype=DTYPE,
                make_inputs=make_inputs, specgen=specgen, eager=eager,
                # fwd reads the logits once; fwd+bwd also reads them again and writes the gradient
                bytes_moved=passes * rows * vocab * DTYPE.itemsize)


def _sum_case(op, shape, specgen, eager) -> Case:
    numel = math.prod(shape)
    out = shape[0] if op.endswith("-1)") else shape[-1] if op.endswith("0)") else 1
    return Case(family="reduce", op=op, shape="x".join(map(str, shape)) if len(shape) > 1
                else f"2^{numel.bit_length() - 1}", dtype=DTYPE,
                make_inputs=lambda: (torch.randn(shape, device="cuda", dtype=DTYPE),),
                specgen=specgen, eager=eager, bytes_moved=(numel + out) * DTYPE.itemsize)

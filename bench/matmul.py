"""Matmul ops: compute-bound, so throughput is TFLOP/s (2 * M * N * K over the time).

cuBLAS is the ceiling: eager ``torch.mm`` and ``F.linear`` call it, and the eager linear + gelu
pays one extra pass over the output for the activation. The decode-like row (M = 16) is bound by
reading the weight; specgen splits its K loop over programs there. The batched row multiplies by
a transposed operand (attention's q @ k.mT: B contiguous along K).
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from bench.harness import Case

DTYPE = torch.bfloat16


def cases(quick: bool) -> list[Case]:
    # --quick divides every dim by 4 (the decode row keeps M = 16)
    scale = 4 if quick else 1
    big, huge, d = 4096 // scale, 8192 // scale, 4096 // scale
    return [
        _linear_gelu(big, big, big),
        _linear_gelu(huge, huge, huge),
        _mm(huge, huge, huge),
        _mm(big, big, big),
        _linear_gelu(16, d, d),
        _bmm_nt(16, 2048 // scale, 2048 // scale, 2048 // scale),
    ]


def _linear_gelu_eager(x, weight, bias):
    return F.gelu(F.linear(x, weight, bias), approximate="tanh")


def _mm_eager(a, b):
    return torch.mm(a, b)


def _bmm_nt_eager(a, b):
    return torch.bmm(a, b.mT)


def _generated():
    # Imported on first use so that this module (and --help) works before `generated` is built.
    import generated

    return generated


def _linear_gelu(m: int, n: int, k: int) -> Case:
    shapes = [(m, k), (n, k), (n,)]
    return _case("linear_gelu = gelu_tanh(x @ w.T + b)", m, n, k, shapes,
                 lambda x, w, b: _generated().linear_gelu(x, w, b), _linear_gelu_eager)


def _mm(m: int, n: int, k: int) -> Case:
    return _case("mm (eager: cuBLAS)", m, n, k, [(m, k), (k, n)],
                 lambda a, b: _generated().mm(a, b), _mm_eager)


def _bmm_nt(batch: int, m: int, n: int, k: int) -> Case:
    return _case("bmm(a, b.mT) (eager: cuBLAS)", m, n, k, [(batch, m, k), (batch, n, k)],
                 lambda a, b: _generated().bmm(a, b.mT), _bmm_nt_eager, batch)


def _case(op: str, m: int, n: int, k: int, shapes: list[tuple[int, ...]], specgen: Callable,
          eager: Callable, batch: int = 1) -> Case:
    elements = sum(torch.Size(shape).numel() for shape in shapes) + batch * m * n
    return Case(
        family="matmul",
        op=op,
        shape=f"{batch}x{m}x{n}x{k}" if batch > 1 else f"{m}x{n}x{k}",
        dtype=DTYPE,
        make_inputs=lambda: tuple(torch.randn(shape, device="cuda", dtype=DTYPE) for shape in shapes),
        specgen=specgen,
        eager=eager,
        bytes_moved=DTYPE.itemsize * elements,
        flops=2 * batch * m * n * k,
    )

"""Matmul ops: compute-bound, so throughput is TFLOP/s (2 * M * N * K over the time).

cuBLAS is the ceiling: eager ``torch.mm`` and ``F.linear`` call it, and the eager linear + gelu
pays one extra pass over the output for the activation. The decode-like row (M = 16) is bound by
reading the weight; specgen splits its K loop over programs there.
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
    ]


def _linear_gelu_eager(x, weight, bias):
    return F.gelu(F.linear(x, weight, bias), approximate="tanh")


def _mm_eager(a, b):
    return torch.mm(a, b)


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


def _case(op: str, m: int, n: int, k: int, shapes: list[tuple[int, ...]], specgen: Callable,
          eager: Callable) -> Case:
    elements = sum(torch.Size(shape).numel() for shape in shapes) + m * n
    return Case(
        family="matmul",
        op=op,
        shape=f"{m}x{n}x{k}",
        dtype=DTYPE,
        make_inputs=lambda: tuple(torch.randn(shape, device="cuda", dtype=DTYPE) for shape in shapes),
        specgen=specgen,
        eager=eager,
        bytes_moved=DTYPE.itemsize * elements,
        flops=2 * m * n * k,
    )

"""Pointwise ops: memory-bound, so the copy bandwidth is the ceiling to compare against."""

from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F

from bench.harness import Case

DTYPE = torch.bfloat16


def cases(quick: bool) -> list[Case]:
    # --quick divides every element count by 16 (each dim of a square by 4).
    n = 2**23 if quick else 2**27
    square, big = (1024, 2048) if quick else (4096, 8192)
    rows, cols = (1024 if quick else 16384), 4096
    return [
        _case("add", [(n,), (n,)], lambda x, y: _generated().add(x, y), _add),
        _case("add", [(square, square)] * 2, lambda x, y: _generated().add(x, y), _add),
        _case("geglu = gelu_tanh(a)*b", [(n,), (n,)], lambda a, b: _generated().geglu(a, b),
              lambda a, b: F.gelu(a, approximate="tanh") * b),
        _case('gelu(x, approximate="tanh")', [(n,)], lambda x: _generated().gelu(x, approximate="tanh"),
              lambda x: F.gelu(x, approximate="tanh")),
        _case("swiglu = silu(a)*b", [(n,), (n,)], lambda a, b: _generated().swiglu(a, b),
              lambda a, b: F.silu(a) * b),
        # x is contiguous, so x.t() makes the kernel read one operand column-major.
        _case("add(x.t(), y)", [(big, big)] * 2, lambda x, y: _generated().add(x.t(), y),
              lambda x, y: x.t() + y),
        _case("add(x, bias)", [(rows, cols), (cols,)], lambda x, b: _generated().add(x, b), _add),
    ]


def _add(x, y):
    # A Python function rather than the torch.add builtin, so torch.compile traces it the same
    # way as the other eager references.
    return x + y


def _generated():
    # Imported on first use so that this module (and --help) works before `generated` is built;
    # a missing package or op then fails only the specgen column of the rows that need it.
    import generated

    return generated


def _case(op: str, input_shapes: list[tuple[int, ...]], specgen: Callable, eager: Callable) -> Case:
    numels = [math.prod(shape) for shape in input_shapes]
    return Case(
        family="pointwise",
        op=op,
        shape=", ".join(dict.fromkeys(_shape_label(shape) for shape in input_shapes)),
        dtype=DTYPE,
        make_inputs=lambda: tuple(torch.randn(shape, device="cuda", dtype=DTYPE) for shape in input_shapes),
        specgen=specgen,
        eager=eager,
        # The output of a pointwise op has as many elements as its largest (broadcast) input.
        bytes_moved=DTYPE.itemsize * (sum(numels) + max(numels)),
    )


def _shape_label(shape: tuple[int, ...]) -> str:
    # Long power-of-two vectors read better as 2^k ("2^27", not "134217728").
    if len(shape) == 1 and shape[0] >= 2**16 and shape[0].bit_count() == 1:
        return f"2^{shape[0].bit_length() - 1}"
    return "x".join(map(str, shape))

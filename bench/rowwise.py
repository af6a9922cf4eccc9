"""Row-wise ops: memory-bound reductions over a dim, judged against the copy bandwidth.

The shapes span the strategies `auto` picks: many short rows (several rows a program), square,
long rows (online or looped), and few very long rows (split over several programs per row);
then softmax and log_softmax over dim 0 (the reduced dim strided, the kept one contiguous).
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from bench.harness import Case

DTYPE = torch.bfloat16
SHAPES = [(4096, 4096), (32768, 1024), (1024, 32768), (8, 262144)]


def cases(quick: bool) -> list[Case]:
    # --quick keeps each row length (it decides the strategy) and divides the row count by 16
    shapes = [(max(1, rows // 16) if quick else rows, n) for rows, n in SHAPES]
    out = [_case(op, rows, n, vectors, specgen, eager)
           for rows, n in shapes for op, _, vectors, specgen, eager in _OPS]
    # training at the square shape: the forward and the gradients of every input, in eager code
    # through the ops' derived backward kernels (docs/families.md, "Derived backward ops")
    rows, n = shapes[0]
    out += [_case(f"{name} fwd+bwd", rows, n, vectors, specgen, eager, training=True)
            for _, name, vectors, specgen, eager in _OPS]
    # the rows strided, the kept dim contiguous (issue 37: tiled over the kept axis, as the
    # reduce family's outer strategy, it should reach torch.compile)
    rows, n = (1024, 2048) if quick else (4096, 8192)
    out += [_case("softmax(x, 0)", rows, n, 0, lambda x: _generated().softmax(x, 0),
                  _softmax_0),
            _case("log_softmax(x, 0)", rows, n, 0, lambda x: _generated().log_softmax(x, 0),
                  _log_softmax_0)]
    return out


# Python functions rather than torch builtins, so torch.compile traces them like any eager code.
def _softmax(x):
    return torch.softmax(x, -1)


def _softmax_0(x):
    return torch.softmax(x, 0)


def _log_softmax_0(x):
    return torch.log_softmax(x, 0)


def _layer_norm(x, w, b):
    return F.layer_norm(x, (x.shape[-1],), w, b)


def _rms_norm(x, w):
    return F.rms_norm(x, (x.shape[-1],), w)


def _generated():
    # Imported on first use so that this module (and --help) works before `generated` is built.
    import generated

    return generated


# (the forward's row label, the op's name, weight vectors, specgen, eager)
_OPS = [
    ("softmax(x, -1)", "softmax", 0, lambda x: _generated().softmax(x, -1), _softmax),
    ("layer_norm(x, (N,), w, b)", "layer_norm", 2,
     lambda x, w, b: _generated().layer_norm(x, [x.shape[-1]], w, b), _layer_norm),
    ("rms_norm(x, (N,), w)", "rms_norm", 1,
     lambda x, w: _generated().rms_norm(x, [x.shape[-1]], w), _rms_norm),
]


def _case(op: str, rows: int, n: int, vectors: int, specgen: Callable, eager: Callable,
          training: bool = False) -> Case:
    """The forward alone, or (``training``) the forward and the gradients of every input, given
    a random output gradient (the first input)."""
    def make_inputs():
        x = torch.randn(rows, n, device="cuda", dtype=DTYPE, requires_grad=training)
        weights = tuple(torch.randn(n, device="cuda", dtype=DTYPE, requires_grad=training)
                        for _ in range(vectors))
        grad_out = (torch.randn(rows, n, device="cuda", dtype=DTYPE),) if training else ()
        return (*grad_out, x, *weights)

    if training:
        specgen, eager = _gradient_of(specgen), _gradient_of(eager)
    return Case(
        family="rowwise",
        op=op,
        shape=f"{rows}x{n}",
        dtype=DTYPE,
        make_inputs=make_inputs,
        specgen=specgen,
        eager=eager,
        # the forward reads x and each weight vector once and writes the output; a fused
        # training kernel pair also reads x and the output gradient and writes x's gradient
        # (and the weights' gradients, n each)
        bytes_moved=DTYPE.itemsize * ((5 if training else 2) * rows * n
                                      + (2 if training else 1) * vectors * n),
    )


def _gradient_of(fn: Callable) -> Callable:
    def run(grad_out, *inputs):
        # the gradient of x is what the check compares; those of the weights are computed too
        return torch.autograd.grad(fn(*inputs), inputs, grad_out)[0]
    return run

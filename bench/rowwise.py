"""Row-wise ops: memory-bound reductions over the last dim, judged against the copy bandwidth.

The shapes span the strategies `auto` picks: many short rows (several rows a program), square,
long rows (online or looped), and few very long rows (split over several programs per row).
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
    out = []
    for rows, n in shapes:
        out.append(_case("softmax(x, -1)", rows, n, 0,
                         lambda x: _generated().softmax(x, -1), _softmax))
        out.append(_case("layer_norm(x, (N,), w, b)", rows, n, 2,
                         lambda x, w, b: _generated().layer_norm(x, [x.shape[-1]], w, b),
                         _layer_norm))
        out.append(_case("rms_norm(x, (N,), w)", rows, n, 1,
                         lambda x, w: _generated().rms_norm(x, [x.shape[-1]], w), _rms_norm))
    return out


# Python functions rather than torch builtins, so torch.compile traces them like any eager code.
def _softmax(x):
    return torch.softmax(x, -1)


def _layer_norm(x, w, b):
    return F.layer_norm(x, (x.shape[-1],), w, b)


def _rms_norm(x, w):
    return F.rms_norm(x, (x.shape[-1],), w)


def _generated():
    # Imported on first use so that this module (and --help) works before `generated` is built.
    import generated

    return generated


def _case(op: str, rows: int, n: int, vectors: int, specgen: Callable, eager: Callable) -> Case:
    def make_inputs():
        x = torch.randn(rows, n, device="cuda", dtype=DTYPE)
        return (x, *(torch.randn(n, device="cuda", dtype=DTYPE) for _ in range(vectors)))

    return Case(
        family="rowwise",
        op=op,
        shape=f"{rows}x{n}",
        dtype=DTYPE,
        make_inputs=make_inputs,
        specgen=specgen,
        eager=eager,
        # x read once and the output written once, plus each weight/bias vector read once
        bytes_moved=DTYPE.itemsize * (2 * rows * n + vectors * n),
    )

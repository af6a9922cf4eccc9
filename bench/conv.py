"""Convolutions: compute-bound, so throughput is TFLOP/s (2 * N * K * P * Q * C/groups * R * S
over the time).

cuDNN is the peer: eager ``F.conv2d`` calls it, on NCHW tensors (which it transposes internally
on Hopper) and on channels-last ones (input and weight, as ``model.to(memory_format=
torch.channels_last)`` makes them). The fused op is timed against cuDNN's convolution followed by
torch's bias add and silu.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from bench.harness import Case

DTYPE = torch.bfloat16
# (batch, channels, height, width, out channels, filter): the cells
CELLS = ((32, 64, 56, 56, 64, 3), (32, 256, 14, 14, 256, 3), (8, 128, 128, 128, 128, 3),
         (32, 64, 56, 56, 256, 1))


def cases(quick: bool) -> list[Case]:
    # --quick quarters the batch
    rows = []
    for n, c, h, w, k, r in CELLS:
        n = max(1, n // 4) if quick else n
        for channels_last in (False, True):
            rows.append(_conv(n, c, h, w, k, r, channels_last))
    for channels_last in (False, True):
        n, c, h, w, k, r = CELLS[0]
        rows.append(_conv_bias_silu(max(1, n // 4) if quick else n, c, h, w, k, r, channels_last))
    return rows


def _generated():
    # Imported on first use so that this module (and --help) works before `generated` is built.
    import generated

    return generated


def _conv_eager(x, weight):
    return F.conv2d(x, weight, None, 1, weight.shape[-1] // 2)


def _conv_bias_silu_eager(x, weight, bias):
    return F.silu(F.conv2d(x, weight, None, 1, weight.shape[-1] // 2) + bias[:, None, None])


def _conv(n: int, c: int, h: int, w: int, k: int, r: int, channels_last: bool) -> Case:
    return _case(f"conv2d {r}x{r} (eager: cuDNN)", n, c, h, w, k, r, channels_last, False,
                 lambda x, wt: _generated().conv2d(x, wt, None, 1, r // 2), _conv_eager)


def _conv_bias_silu(n: int, c: int, h: int, w: int, k: int, r: int, channels_last: bool) -> Case:
    return _case(f"conv2d_bias_silu {r}x{r} (eager: cuDNN + bias + silu)", n, c, h, w, k, r,
                 channels_last, True,
                 lambda x, wt, b: _generated().conv2d_bias_silu(x, wt, b, 1, r // 2),
                 _conv_bias_silu_eager)


def _case(op: str, n: int, c: int, h: int, w: int, k: int, r: int, channels_last: bool,
          bias: bool, specgen: Callable, eager: Callable) -> Case:
    fmt = torch.channels_last if channels_last else torch.contiguous_format

    def make_inputs():
        x = torch.randn(n, c, h, w, device="cuda", dtype=DTYPE).to(memory_format=fmt)
        weight = (torch.randn(k, c, r, r, device="cuda", dtype=DTYPE) / (c * r * r) ** 0.5)
        inputs = (x, weight.to(memory_format=fmt))
        return inputs + ((torch.randn(k, device="cuda", dtype=DTYPE),) if bias else ())

    elements = n * c * h * w + k * c * r * r + n * k * h * w + (k if bias else 0)
    return Case(
        family="conv",
        op=op,
        shape=f"N{n} C{c} {h}x{w} K{k} {'channels-last' if channels_last else 'NCHW'}",
        dtype=DTYPE,
        make_inputs=make_inputs,
        specgen=specgen,
        eager=eager,
        bytes_moved=DTYPE.itemsize * elements,
        flops=2 * n * k * h * w * c * r * r,
    )

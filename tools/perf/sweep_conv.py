"""Device time of conv2d per forced strategy and config at the bench's cells, next to cuDNN's.

    PYTHONPATH=. python3 tools/perf/sweep_conv.py                  # every cell, ~6 minutes
    PYTHONPATH=. python3 tools/perf/sweep_conv.py --only 1x1       # the 1 x 1 cells only
    PYTHONPATH=. python3 tools/perf/sweep_conv.py --only 3x3 --layout channels-last --stages 1
    TRITON_INTERPRET=1 PYTHONPATH=. python3 tools/perf/sweep_conv.py --check   # small shapes

At each cell of the conv bench (specgen/families/conv.py BENCH_CELLS, bf16, NCHW and
channels-last), each strategy the planner can take there (``override(strategy=...)``: the
implicit GEMM, with the input and weight copied to channels-last first or not, the TMA kernel)
runs each config of the spec's space (``override(config=...)``, the mapping as given:
unpruned, so a config's stages are timed as written), and at 1 x 1 filters the flat kernel
each of its own (``conv_rt.FLAT_CONFIGS``: tiles and programs a multiprocessor). Every variant
is checked against cuDNN's result, then timed in CUDA graphs over inputs rotating past L2
(tools/perf/sweep_matmul.py), the copies to channels-last included; "auto" is the planner's
choice and the frozen table's config. The label names the kernel that ran (a forced strategy
the call cannot take falls back). What set the 1 x 1 rules and showed the 3 x 3 space's limits:
docs/performance.md, items 001b, 001d and 001g (001d's flat kernel was the one before 001f's).
"""

from __future__ import annotations

import argparse
import importlib
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
import sweep_matmul as sweep  # noqa: E402  (the rotation, timing and variant loop)

import generated  # noqa: E402
from specgen.families.conv import BENCH_CELLS  # noqa: E402
from specgen.runtime import conv as conv_rt  # noqa: E402
from specgen.runtime import override, record_launches  # noqa: E402

# the spec's config space (the generated module's; `generated.conv2d` is the op)
CONFIGS = importlib.import_module("generated.conv2d").CONFIGS


def inputs(n, c, h, w, k, r, channels_last, seed, device="cuda", dtype=torch.bfloat16):
    g = torch.Generator(device=device).manual_seed(seed)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    x = torch.randn(n, c, h, w, device=device, dtype=dtype, generator=g)
    weight = torch.randn(k, c, r, r, device=device, dtype=dtype, generator=g) / (c * r * r) ** 0.5
    return x.to(memory_format=fmt), weight.to(memory_format=fmt)


def variants(r: int, c: int, channels_last: bool,
             stages: int | None = None) -> list[tuple[str, dict | None]]:
    """(strategy, config) pairs to time at a cell of ``r`` x ``r`` filters and ``c`` channels:
    the copies to channels-last only where the input is NCHW, TMA where the input is
    channels-last or copied to it and with BLOCK_N at most conv_rt.TMA_MAX_BLOCK_N, as its
    prune caps it, and for 1 x 1 filters the flat kernel over its own space (FLAT_CONFIGS).
    ``stages``: the implicit GEMM's configs at that many stages too (1: no cp.async, the
    taps' loads through L1, where neighbouring taps of a tile read the same input rows)."""
    strategies = ["gemm"] + ([] if channels_last else ["gemm_repack"]) + \
        (["tma"] if channels_last or r > 1 else [])
    chosen = [("auto", None)]
    for strategy in strategies:
        for config in CONFIGS:
            if strategy == "tma" and config["BLOCK_N"] > conv_rt.TMA_MAX_BLOCK_N:
                continue
            chosen.append((strategy, dict(config)))
            if stages is not None and strategy == "gemm":
                chosen.append((strategy, {**config, "num_stages": stages}))
    if r == 1:
        chosen += [("flat", dict(config)) for config in conv_rt.FLAT_CONFIGS]
    return chosen


def conv(x, weight, strategy, config):
    """``generated.conv2d`` with ``strategy`` and ``config`` forced ("auto": the planner's)."""
    padding = weight.shape[-1] // 2
    if strategy == "auto":
        return generated.conv2d(x, weight, None, 1, padding)
    with override(strategy=strategy, config=config):
        return generated.conv2d(x, weight, None, 1, padding)


def label(variant) -> str:
    strategy, config = variant
    if config is None:
        return f"{strategy:11s} (planner, table)"
    if strategy == "flat":  # a group's channels one block; programs a multiprocessor
        return (f"{strategy:11s} {config['BLOCK_M']:3d}x{config['BLOCK_N']:3d} "
                f"x{config['PROGRAMS_PER_SM']} w{config['num_warps']} s{config['num_stages']}")
    return (f"{strategy:11s} {config['BLOCK_M']:3d}x{config['BLOCK_N']:3d}x{config['BLOCK_K']:2d}"
            f" w{config['num_warps']} s{config['num_stages']}")


def sweep_cell(cell, channels_last: bool, start: float, budget: float,
               stages: int | None = None) -> None:
    n, c, h, w, k, r = cell
    sets = [inputs(*cell, channels_last, 0)]
    size = sum(t.numel() * t.element_size() for t in sets[0]) + n * k * h * w * 2
    sets += [inputs(*cell, channels_last, seed)
             for seed in range(1, math.ceil(sweep.ROTATION_BYTES / size))]
    expected = F.conv2d(*sets[0], None, 1, r // 2).float()
    cudnn = sweep.device_us(lambda x, wt: F.conv2d(x, wt, None, 1, r // 2), sets, True)
    ours = sweep.device_us(lambda x, wt: conv(x, wt, "auto", None), sets, True)
    flops = 2 * n * k * h * w * c * r * r
    head = (f"conv2d {r}x{r} N{n} C{c} {h}x{w} K{k} "
            f"{'channels-last' if channels_last else 'NCHW'}")
    print(f"{head}: cuDNN {cudnn:.1f} us ({flops / cudnn / 1e6:.0f} TFLOP/s); generated "
          f"{ours:.1f} us ({flops / ours / 1e6:.0f} TFLOP/s)", flush=True)

    def ran(variant) -> str:
        """The label, with the kernel the call took (a failing call's fails again, reported,
        when the loop runs it)."""
        try:
            with record_launches() as log:
                conv(*sets[0], *variant)
        except Exception:  # noqa: BLE001
            return f"{label(variant)} [-]"
        return f"{label(variant)} [{log[-1].kernel if log else '?'}]"

    sweep.sweep_variants(head, variants(r, c, channels_last, stages), conv, ran, expected, sets, cudnn, ours,
                         flops / sweep.PEAK_FLOPS * 1e6, start, budget)


def check() -> None:
    """Every variant of a small 1 x 1 and 3 x 3 cell against float64 F.conv2d (float16 and the
    interpreter: its bfloat16 dot is wrong)."""
    for cell in ((2, 16, 6, 5, 32, 1), (2, 16, 6, 5, 32, 3)):
        for channels_last in (False, True):
            x, weight = inputs(*cell, channels_last, 0, "cpu", torch.float16)
            r = cell[-1]
            want = F.conv2d(x.double(), weight.double(), None, 1, r // 2)
            chosen = variants(r, cell[1], channels_last)
            for variant in chosen[:4] + chosen[-3:]:
                got = conv(x, weight, *variant)
                error = ((got.double() - want).norm() / want.norm()).item()
                print(f"{cell} {'channels-last' if channels_last else 'NCHW'} {label(variant)}: "
                      f"relative error {error:.1e}")
                assert error < 2e-3, error


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--check", action="store_true", help="correctness only (interpreter)")
    parser.add_argument("--only", choices=("1x1", "3x3"), help="the cells of one filter size")
    parser.add_argument("--budget", type=float, default=480, help="seconds for the sweep")
    parser.add_argument("--layout", choices=("nchw", "channels-last"), help="one input layout")
    parser.add_argument("--stages", type=int,
                        help="also the implicit GEMM's configs at this many stages")
    options = parser.parse_args()
    if options.check:
        check()
        return
    print(torch.cuda.get_device_name(), "torch", torch.__version__, flush=True)
    cells = [cell for cell in BENCH_CELLS
             if options.only is None or options.only == f"{cell[-1]}x{cell[-1]}"]
    # the 1 x 1 cell first: its planner rules are the open question
    cells.sort(key=lambda cell: cell[-1])
    start = time.perf_counter()
    layouts = {None: (False, True), "nchw": (False,), "channels-last": (True,)}[options.layout]
    runs = [(cell, channels_last) for cell in cells for channels_last in layouts]
    for i, (cell, channels_last) in enumerate(runs):
        sweep_cell(cell, channels_last, start, options.budget * (i + 1) / len(runs),
                   options.stages)


if __name__ == "__main__":
    main()

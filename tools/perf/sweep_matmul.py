"""Device time of the matmul kernels per forced config, next to torch's, to set the config space.

One GPU call, under 4 minutes: for mm and linear_gelu at 4096^3 and 8192^3 (bf16), the decode
shape linear_gelu 16 x 4096 x 4096 and the weight-only int4 (group 128) and int8 linears at
M = 1 and 16 by 4096 x 4096, every variant (a config forced with
``runtime.override(config=...)``, and for decode a split-K strategy) is timed with
``triton.testing.do_bench_cudagraph``: the calls are captured in a CUDA graph, so the time is
the kernels' alone (the split-K reduction and workspace allocation included), not the Python
that starts them. Inputs rotate over copies that together exceed L2, so the weights stream from
HBM as they would in a model. One line per variant: device us, TFLOP/s, the fraction of the speed
of light (max of FLOPs at peak bf16 dense and bytes at peak HBM bandwidth) and torch's time
(cuBLAS; for linear_gelu eager's linear + gelu, and the cuBLAS linear alone; for the weight-only
ops the cuBLAS linear of the dequantized bf16 weight, which reads 4 (int4) or 2 (int8) times the
weight bytes). With ``--no-graph`` next to the graph run, a weight-only case shows how much of its
time is the split-K launches' own start-up (issue 39: int4 at M = 1 took 19.6 us in the bench,
as long as the bf16 linear). The "auto" line is
what the autotuner picks from the spec's space (the config it chose is printed).
``linear`` at the large shapes, with the configs that win, separates the GELU epilogue's cost
from the layout's (it has linear_gelu's operands and batch loop, and no GELU).

Usage (GPU machine): PYTHONPATH=. python3 tools/perf/sweep_matmul.py [--only mm4096 ...] [--quick]
[--no-graph: do_bench instead of CUDA graphs, host time included where it exceeds the kernels']
"""

from __future__ import annotations

import argparse
import importlib
import itertools
import math
import time

import torch
import torch.nn.functional as F
import triton
import triton.testing

import generated
from bench.quant import GROUP_SIZE
from specgen import quant
from specgen import runtime as rt

# the module (specgen.runtime exports its launch function under the same name)
launch = importlib.import_module("specgen.runtime.launch")

# H200 SXM: dense bf16 tensor-core peak and HBM3e bandwidth (the speed of light of a case)
PEAK_FLOPS = 989e12
PEAK_BYTES_PER_S = 4.8e12
# input copies together at least this large, so repeated calls cannot hit L2 (60 MB on H200)
ROTATION_BYTES = 200 * 10**6
TIME_BUDGET_S = 200


def config(m, n, k, warps, stages, group=8):
    return {"BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": k, "GROUP_M": group, "num_warps": warps,
            "num_stages": stages}


# large problems: the default space's large configs first, then neighbours worth knowing
LARGE = [
    config(128, 256, 64, 8, 3), config(256, 128, 64, 8, 3), config(128, 128, 64, 8, 4),
    config(128, 128, 64, 4, 3), config(64, 128, 64, 4, 4), config(128, 64, 64, 4, 4),
    config(128, 256, 64, 8, 4), config(256, 128, 64, 8, 4), config(128, 256, 32, 8, 4),
    config(128, 128, 128, 8, 3), config(128, 128, 64, 4, 4), config(64, 256, 64, 4, 4),
    config(128, 256, 64, 8, 3, group=4), config(128, 256, 64, 8, 3, group=16),
    # 96 KB of shared memory and 64 accumulator registers a thread: two programs per SM
    config(128, 128, 64, 8, 3),
]
# decode (M = 16): 16-row tiles (what the large configs clamp to, and longer K blocks)
DECODE = [
    config(16, 64, 128, 4, 4), config(16, 128, 128, 4, 4), config(16, 64, 64, 4, 4),
    config(16, 128, 64, 4, 4), config(16, 256, 64, 8, 3), config(16, 64, 256, 4, 3),
    config(32, 64, 128, 4, 4), config(16, 32, 128, 4, 4), config(16, 32, 256, 4, 4),
]
DECODE_STRATEGIES = ["direct", "two_stage:2", "two_stage:4", "two_stage:8"]
# weight-only linears at decode sizes: K is split further (a program's K slice is short at M = 1)
WEIGHT_ONLY_STRATEGIES = ["direct", "two_stage:4", "two_stage:8", "two_stage:16", "atomic:8",
                          "atomic:16"]


def gelu_linear(x, w, b):
    return F.gelu(F.linear(x, w, b), approximate="tanh")


# name -> (op, M, N, K, configs, strategies), in the order they run
CASES = {
    "linear_gelu16": ("linear_gelu", 16, 4096, 4096, DECODE, DECODE_STRATEGIES),
    "int4_1": ("int4_weight_linear", 1, 4096, 4096, DECODE, WEIGHT_ONLY_STRATEGIES),
    "int4_16": ("int4_weight_linear", 16, 4096, 4096, DECODE, WEIGHT_ONLY_STRATEGIES),
    "int8_1": ("int8_weight_linear", 1, 4096, 4096, DECODE, WEIGHT_ONLY_STRATEGIES),
    "mm8192": ("mm", 8192, 8192, 8192, LARGE, ["direct"]),
    "linear_gelu8192": ("linear_gelu", 8192, 8192, 8192, LARGE, ["direct"]),
    "linear8192": ("linear", 8192, 8192, 8192, LARGE[:4], ["direct"]),
    "mm4096": ("mm", 4096, 4096, 4096, LARGE, ["direct"]),
    "linear_gelu4096": ("linear_gelu", 4096, 4096, 4096, LARGE, ["direct"]),
}
DEVICE, DTYPE = "cuda", torch.bfloat16


def inputs(op, m, n, k, seed):
    g = torch.Generator(device=DEVICE).manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, device=DEVICE, dtype=DTYPE, generator=g)
    if op == "mm":
        return randn(m, k), randn(k, n)
    if op == "int4_weight_linear":
        return (randn(m, k), *quant.quantize_int4(randn(n, k) * k ** -0.5, GROUP_SIZE))
    if op == "int8_weight_linear":
        return (randn(m, k), *quant.quantize_int8(randn(n, k) * k ** -0.5))
    return randn(m, k), randn(n, k) * k ** -0.5, randn(n)


def torch_inputs(op, args):
    """The arguments of torch's versions of ``op``: a weight-only op's weight dequantized."""
    if op == "int4_weight_linear":
        x, qweight, scales, zeros = args
        return x, quant.dequantize_int4(qweight, scales, zeros, GROUP_SIZE).to(DTYPE)
    if op == "int8_weight_linear":
        x, qweight, scales = args
        return x, quant.dequantize_int8(qweight, scales).to(DTYPE)
    return args


def torch_fns(op):
    """(label, fn) of torch's versions of ``op``."""
    if op == "mm":
        return [("cublas", torch.mm)]
    if op in ("linear", "int4_weight_linear", "int8_weight_linear"):
        return [("cublas", F.linear)]
    return [("eager", gelu_linear), ("cublas linear", F.linear)]


def device_us(fn, sets, graph: bool) -> float:
    """Median device us of ``fn`` over the rotating input sets."""
    for args in sets:
        fn(*args)
    torch.cuda.synchronize()
    cycle = itertools.cycle(sets)
    if graph:
        ms = triton.testing.do_bench_cudagraph(lambda: fn(*next(cycle)), rep=20,
                                               return_mode="median")
    else:
        ms = triton.testing.do_bench(lambda: fn(*next(cycle)), return_mode="median")
    return ms * 1e3


def speed_of_light_us(args, m, n, k) -> float:
    """FLOPs at peak, or the operands' bytes and a bf16 output's at peak bandwidth."""
    moved = sum(t.numel() * t.element_size() for t in args) + 2 * m * n
    return max(2 * m * n * k / PEAK_FLOPS, moved / PEAK_BYTES_PER_S) * 1e6


def sweep_variants(head: str, variants, run, label, expected, sets, cublas: float, ours: float,
                   sol: float, start: float, budget: float) -> None:
    """The probes' loop: each variant's result checked against ``expected`` (float32, relative
    error under 2e-2), then timed over the rotating ``sets`` in CUDA graphs, until ``budget``
    seconds past ``start``; a line a variant, then the eight fastest. ``run(*args, *variant)``
    computes, ``label(variant)`` names."""
    results = []
    for variant in variants:
        if time.perf_counter() - start > budget:
            print(f"{head}: time budget spent, the remaining variants left out", flush=True)
            break
        name = label(variant)
        try:
            out = run(*sets[0], *variant).float()
            error = ((out - expected).norm() / expected.norm()).item()
            if not error < 2e-2:
                print(f"{head} | {name} | WRONG: relative error {error:.1e}", flush=True)
                continue
            us = device_us(lambda *a: run(*a, *variant), sets, True)
        except Exception as exc:  # noqa: BLE001 - a variant that does not compile is reported
            print(f"{head} | {name} | FAILED {type(exc).__name__}: {str(exc)[:100]}", flush=True)
            continue
        results.append((us, name))
        print(f"{head} | {name} | {us:6.1f} us | {sol / us:5.1%} SOL "
              f"| {cublas / us:5.2f}x cuBLAS", flush=True)
    print(f"{head}, best first:")
    for us, name in sorted(results)[:8]:
        print(f"  {name} | {us:6.1f} us | {cublas / us:5.2f}x cuBLAS "
              f"| {ours / us:5.2f}x generated")


def shown(meta) -> str:
    return (f"{meta['BLOCK_M']}x{meta['BLOCK_N']}x{meta['BLOCK_K']} g{meta['GROUP_M']} "
            f"w{meta['num_warps']} s{meta['num_stages']}")


def tuned_configs() -> str:
    chosen = [f"{kernel.fn.__name__}: {config}" for (kernel, _, _), config in launch._tuned.items()]
    launch._tuned.clear()
    return "; ".join(chosen)


def run_case(name, graph, quick, start) -> None:
    op_name, m, n, k, configs, strategies = CASES[name]
    op = getattr(generated, op_name)
    args = inputs(op_name, m, n, k, 0)
    size = sum(t.numel() * t.element_size() for t in args)
    sets = [args] + [inputs(op_name, m, n, k, seed)
                     for seed in range(1, math.ceil(ROTATION_BYTES / size))]
    flops = 2 * m * n * k
    sol = speed_of_light_us(args, m, n, k)
    torch_sets = [torch_inputs(op_name, s) for s in sets]
    head = f"{name:16s} {op_name} M={m} N={n} K={k}"
    print(f"{head}: speed of light {sol:.1f} us ({len(sets)} input sets)", flush=True)
    reference = {}
    for label, fn in torch_fns(op_name):
        us = device_us(fn, torch_sets, graph)
        reference[label] = us
        print(f"{head} | {label:34s} | {us:9.1f} us | {flops / us / 1e6:6.1f} TFLOP/s "
              f"| {sol / us:5.1%} SOL", flush=True)
    base = next(iter(reference.values()))
    expected = torch_fns(op_name)[0][1](*torch_sets[0]).float()

    def line(label, us, extra=""):
        print(f"{head} | {label:34s} | {us:9.1f} us | {flops / us / 1e6:6.1f} TFLOP/s "
              f"| {sol / us:5.1%} SOL | {base / us:5.2f}x torch {extra}", flush=True)

    line("auto", device_us(op, sets, graph), tuned_configs())
    variants = [(s, c) for s in strategies for c in (configs[:3] if quick else configs)]
    for strategy, meta in variants:
        if time.perf_counter() - start > TIME_BUDGET_S:
            print(f"{head} | time budget spent: the remaining variants are left out", flush=True)
            return
        label = f"{shown(meta)} {strategy}"
        try:
            with rt.override(config=meta, strategy=strategy):
                out = op(*args).float()
                error = ((out - expected).norm() / expected.norm()).item()
                check = "" if error < 2e-2 else f"WRONG (relative error {error:.2e})"
                line(label, device_us(op, sets, graph), check)
        except Exception as exc:  # noqa: BLE001 - a sweep reports a failing variant and goes on
            print(f"{head} | {label:34s} | FAILED {type(exc).__name__}: {str(exc)[:120]}",
                  flush=True)
    del args, sets, torch_sets
    torch.cuda.empty_cache()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", action="append", choices=list(CASES))
    parser.add_argument("--quick", action="store_true", help="the first 3 configs of each case")
    parser.add_argument("--no-graph", action="store_true")
    options = parser.parse_args()
    print("torch", torch.__version__, "triton", triton.__version__, torch.cuda.get_device_name(),
          flush=True)
    start = time.perf_counter()
    for name in options.only or CASES:
        run_case(name, not options.no_graph, options.quick, start)
    print(f"sweep took {time.perf_counter() - start:.0f} s", flush=True)


if __name__ == "__main__":
    main()

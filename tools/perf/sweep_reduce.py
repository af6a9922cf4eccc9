"""GPU sweep of the reduce and cross_entropy kernels: device time per forced variant.

    PYTHONPATH=. python tools/perf/sweep_reduce.py            # the bench shapes, about 2-3 minutes
    PYTHONPATH=. python tools/perf/sweep_reduce.py --quick    # fewer variants
    PYTHONPATH=. python tools/perf/sweep_reduce.py --part wide   # cross_entropy, wide or full only

One line per variant: the case, the forced strategy / config / program cap, the device time in us
and its share of the speed of light (the case's bytes at the copy bandwidth measured here). Each
variant's launches are captured in a CUDA graph and timed with triton.testing.do_bench on the
replay (L2 flushed between runs), so host overhead is not in the number; "auto" is what the
planner and the autotuner pick. max_programs=N splits a reduction for N programs (the reduce
launches are flat: one program per tile). A split's second launch, an atomic's zero-fill and cross_entropy's
finish kernel are in their variants' times. The numbers set the config spaces in
specgen/families/reduce.py and specs/cross_entropy.toml and the constants of specgen/runtime/reduce.py.
"""

from __future__ import annotations

import argparse
import importlib
import itertools
import time

import torch
import triton

import generated
from specgen import runtime

DTYPE = torch.bfloat16
# the cross_entropy module (generated.cross_entropy is the op's function)
CE = importlib.import_module("generated.cross_entropy")


def device_us(fn) -> float:
    """Median device time of ``fn``'s launches: compiled and tuned first, then graph-replayed."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return triton.testing.do_bench(graph.replay, warmup=10, rep=40, return_mode="median") * 1e3


def copy_gbps() -> float:
    src = torch.empty(2**29, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src), return_mode="median")
    return 2 * src.numel() / ms / 1e6


def report(case: str, variant: str, nbytes: int, gbps: float, fn) -> None:
    sol = nbytes / gbps / 1e3
    try:
        us = device_us(fn)
    except Exception as err:  # one bad variant must not end the sweep
        print(f"{case:22s} {variant:44s} failed: {type(err).__name__}: {str(err)[:120]}", flush=True)
        return
    print(f"{case:22s} {variant:44s} {us:9.1f} us  {100 * sol / us:5.1f}% of SOL "
          f"({sol:.1f} us)", flush=True)


def forced(strategy=None, config=None, programs=None):
    """The override a variant runs under, and its label."""
    knobs = {k: v for k, v in (("strategy", strategy), ("config", config),
                               ("max_programs", programs)) if v is not None}
    label = " ".join(f"{k}={v}" for k, v in knobs.items()) or "auto"
    return knobs, label


def run_forced(knobs, fn):
    def call():
        with runtime.override(**knobs):
            fn()
    return call


def cross_entropy_cases(gbps: float, quick: bool) -> None:
    rows, vocab = 4096, 128256
    x = torch.randn(rows, vocab, device="cuda", dtype=DTYPE)
    target = torch.randint(0, vocab, (rows,), device="cuda")
    nbytes = x.numel() * x.element_size()
    # the forward without the eager target check (a wait on an event: not capturable, host work)
    forward = CE._cross_entropy_forward
    blocks = (2048, 4096) if not quick else (2048,)
    report("cross_entropy fwd", "auto (mean: forward + finish)", nbytes, gbps,
           lambda: forward(x, target, None, -100, "mean", 0.0))
    for block, warps in itertools.product(blocks, (4, 8)):
        knobs, label = forced(config={"BLOCK_V": block, "num_warps": warps})
        report("cross_entropy fwd", label + " (none)", nbytes, gbps, run_forced(
            knobs, lambda: forward(x, target, None, -100, "none", 0.0)))
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for programs in (8 * sms, 16 * sms):
        knobs, label = forced(config={"BLOCK_V": 2048, "num_warps": 4}, programs=programs)
        report("cross_entropy fwd", label + " (none)", nbytes, gbps, run_forced(
            knobs, lambda: forward(x, target, None, -100, "none", 0.0)))
    _, lse, denom = forward(x, target, None, -100, "mean", 0.0)
    grad_loss = torch.ones((), device="cuda", dtype=DTYPE)
    backward = lambda: CE._cross_entropy_backward(grad_loss, x, target, None, lse, denom, -100,  # noqa: E731
                                                  "mean", 0.0)
    report("cross_entropy bwd", "auto", 2 * nbytes, gbps, backward)
    for block, warps in itertools.product(blocks, (4, 8)):
        knobs, label = forced(config={"BLOCK_V": block, "num_warps": warps})
        report("cross_entropy bwd", label, 2 * nbytes, gbps, run_forced(knobs, backward))


def wide_sum_cases(gbps: float, quick: bool) -> None:
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    warps = (4, 8) if quick else (4, 8, 16)
    wide = torch.randn(32768, 1024, device="cuda", dtype=DTYPE)
    nbytes = wide.numel() * wide.element_size()
    report("sum(x, -1) 32768x1024", "auto", nbytes, gbps, lambda: generated.sum(wide, -1))
    for (k, r), w in itertools.product(((4, 1024), (8, 512), (16, 256), (2, 1024)), warps[:2]):
        knobs, label = forced("inner", {"BLOCK_K": k, "BLOCK_R": r, "num_warps": w})
        report("sum(x, -1) 32768x1024", label, nbytes, gbps,
               run_forced(knobs, lambda: generated.sum(wide, -1)))

    report("sum(x, 0) 32768x1024", "auto", nbytes, gbps, lambda: generated.sum(wide, 0))
    for strategy in ("split", "atomic"):
        knobs, label = forced(strategy)
        report("sum(x, 0) 32768x1024", label, nbytes, gbps,
               run_forced(knobs, lambda: generated.sum(wide, 0)))
    # programs: the split count is planned for the narrowest outer tile (64 columns), so a 64-wide
    # config runs max_programs programs, a 128-wide one half as many
    for strategy, (k, r), w, programs in itertools.product(
            ("last", "split"), ((64, 64), (64, 128), (128, 32), (128, 64)),
            warps[:2], (sms, 2 * sms, 4 * sms, 8 * sms)):
        if quick and (programs != 4 * sms or strategy == "split"):
            continue
        knobs, label = forced(strategy, {"BLOCK_K": k, "BLOCK_R": r, "num_warps": w}, programs)
        report("sum(x, 0) 32768x1024", label, nbytes, gbps,
               run_forced(knobs, lambda: generated.sum(wide, 0)))


def full_sum_cases(gbps: float, quick: bool) -> None:
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    warps = (4, 8) if quick else (4, 8, 16)
    full = torch.randn(2**28, device="cuda", dtype=DTYPE)
    nbytes = full.numel() * full.element_size()
    report("sum(x) 2^28", "auto", nbytes, gbps, lambda: generated.sum(full))
    for strategy in ("split", "atomic"):
        knobs, label = forced(strategy)
        report("sum(x) 2^28", label, nbytes, gbps, run_forced(knobs, lambda: generated.sum(full)))
    for r, w, programs in itertools.product((4096, 8192, 16384), warps, (4 * sms, 8 * sms)):
        if quick and programs != 4 * sms:
            continue
        knobs, label = forced("last", {"BLOCK_K": 1, "BLOCK_R": r, "num_warps": w}, programs)
        report("sum(x) 2^28", label, nbytes, gbps, run_forced(knobs, lambda: generated.sum(full)))


def main() -> None:
    start = time.perf_counter()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer variants")
    parser.add_argument("--part", action="append", choices=("cross_entropy", "wide", "full"),
                        help="the cases to run (default: all)")
    args = parser.parse_args()
    parts = args.part or ("cross_entropy", "wide", "full")
    gbps = copy_gbps()
    print(f"{torch.cuda.get_device_name()}: copy {gbps:.0f} GB/s (read + write); "
          f"SOL = the case's bytes at that rate", flush=True)
    for part, cases in (("cross_entropy", cross_entropy_cases), ("wide", wide_sum_cases),
                        ("full", full_sum_cases)):
        if part in parts:
            cases(gbps, args.quick)
    print(f"sweep took {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()

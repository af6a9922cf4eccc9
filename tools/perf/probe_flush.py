"""GPU probe: the row-wise 32768x1024 cells under two L2 flushes (one device call, ~2 minutes).

bench/ times as triton.testing.do_bench does: a 256 MB zero-fill before every timed call, which
leaves L2 full of dirty lines for the timed kernel to write back (docs/performance.md, "How the
flush shapes the memory-bound numbers"). This probe times the same calls under that flush and
under a read of the same 256 MB, which evicts as much but leaves every line clean, so that the
share of the 85%-of-copy gap that belongs to the flush, and the share that belongs to a kernel,
can be told apart. Each flush has its own copy bandwidth (the 1 GiB copy bench/ divides by),
timed under it. Impls: torch's copy of the same bytes, our softmax / layer_norm / rms_norm,
torch.compile of each, and a tutorial-style layer_norm kernel with the generated numerics
(``layer_norm_kernel`` below), in ROUNDS interleaved rounds; each line gives the median of the rounds' medians and their range.

Usage (GPU machine): PYTHONPATH=. python3 tools/perf/probe_flush.py [--rounds 7]
"""

from __future__ import annotations

import argparse
import itertools
import statistics

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from specgen.kernel_lib import add_pairs

ROWS, N = 32768, 1024
DTYPE = torch.bfloat16
FLUSH_BYTES = 256 * 10**6  # do_bench's buffer
REPS = 300


def bench_us(fn, sets) -> float:
    """do_bench's median (its own zero-fill flush), input sets rotated, as bench/ times."""
    for s in sets:
        fn(*s)
    torch.cuda.synchronize()
    cycle = itertools.cycle(sets)
    return triton.testing.do_bench(lambda: fn(*next(cycle)), warmup=25, rep=100,
                                   return_mode="median") * 1e3


@triton.jit
def layer_norm_kernel(x_ptr, w_ptr, b_ptr, out_ptr, stride, eps, BLOCK_M: tl.constexpr,
                      BLOCK_N: tl.constexpr, LOAD: tl.constexpr, STORE: tl.constexpr = ""):
    # the generated single tile's numerics in the tutorial's form (no row loop, N a constexpr):
    # mean, then the squared deviations with the mean correction (the sum of the deviations) in
    # one tuple reduction
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)[:, None]
    cols = tl.arange(0, BLOCK_N)[None, :]
    offs = rows * stride + cols
    x = tl.load(x_ptr + offs, eviction_policy=LOAD).to(tl.float32)
    mean = tl.sum(x, 1, keep_dims=True) / BLOCK_N
    dev = x - mean
    shift, m2 = tl.reduce((dev, dev * dev), 1, add_pairs, keep_dims=True)
    mean += shift / BLOCK_N
    rstd = tl.rsqrt(m2 / BLOCK_N + eps)
    w = tl.load(w_ptr + cols).to(tl.float32)
    b = tl.load(b_ptr + cols).to(tl.float32)
    tl.store(out_ptr + offs, ((x - mean) * rstd * w + b).to(out_ptr.dtype.element_ty),
             eviction_policy=STORE)


def timed_us(fn, sets, flush) -> float:
    """The median of REPS calls of ``fn`` (input sets rotated), each after ``flush()``: do_bench's
    loop with the flush made a parameter."""
    cycle = itertools.cycle(sets)
    for _ in range(10):
        fn(*next(cycle))
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(REPS)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(REPS)]
    for start, end in zip(starts, ends):
        args = next(cycle)
        flush()
        start.record()
        fn(*args)
        end.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends)) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=7)
    rounds = parser.parse_args().rounds
    print("device", torch.cuda.get_device_name(), "torch", torch.__version__, "triton",
          triton.__version__, flush=True)
    import generated

    cache = torch.empty(FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")
    cache.random_()
    total = torch.empty((), dtype=torch.int64, device="cuda")
    flushes = {
        "zero-fill (do_bench)": cache.zero_,
        # a read leaves the evicted lines written back before the timed call, and L2 clean
        "read": lambda: torch.sum(cache, 0, out=total),
    }
    big = torch.randn(2**30 // 4, device="cuda")
    big_out = torch.empty_like(big)
    copy_gbps = {name: 2 * 2**30 / (timed_us(lambda: big_out.copy_(big), [()], flush) * 1e3)
                 for name, flush in flushes.items()}
    big = big_out = None
    torch.cuda.empty_cache()
    for name, gbps in copy_gbps.items():
        print(f"copy 1 GiB fp32 under {name}: {gbps:.0f} GB/s", flush=True)

    sets = [(torch.randn(ROWS, N, device="cuda", dtype=DTYPE),
             torch.randn(N, device="cuda", dtype=DTYPE),
             torch.randn(N, device="cuda", dtype=DTYPE),
             torch.empty(ROWS, N, device="cuda", dtype=DTYPE)) for _ in range(2)]
    compiled = {name: torch.compile(fn, dynamic=False) for name, fn in {
        "softmax": lambda x: torch.softmax(x, -1),
        "layer_norm": lambda x, w, b: F.layer_norm(x, (N,), w, b),
        "rms_norm": lambda x, w: F.rms_norm(x, (N,), w),
    }.items()}
    impls = {
        "torch copy of x": lambda x, w, b, o: o.copy_(x),
        "softmax specgen": lambda x, w, b, o: generated.softmax(x, -1),
        "softmax compile": lambda x, w, b, o: compiled["softmax"](x),
        "layer_norm specgen": lambda x, w, b, o: generated.layer_norm(x, [N], w, b),
        "layer_norm compile": lambda x, w, b, o: compiled["layer_norm"](x, w, b),
        "layer_norm tutorial form": lambda x, w, b, o: layer_norm_kernel[(ROWS,)](
            x, w, b, o, N, 1e-5, 1, N, "", num_warps=2),
        "rms_norm specgen": lambda x, w, b, o: generated.rms_norm(x, [N], w),
        "rms_norm compile": lambda x, w, b, o: compiled["rms_norm"](x, w),
    }
    x, w, b, o = sets[0]
    ref = F.layer_norm(x.double(), (N,), w.double(), b.double())
    for name in ("layer_norm specgen", "layer_norm compile", "layer_norm tutorial form"):
        o.fill_(float("nan"))
        out = impls[name](x, w, b, o)
        out = o if "tutorial" in name else out
        print(f"check {name}: max error {(out.double() - ref).abs().max().item():.2e}", flush=True)

    nbytes = 2 * ROWS * N * DTYPE.itemsize
    times = {(flush, impl): [] for flush in flushes for impl in impls}
    for round_ in range(rounds):
        for (flush_name, flush), (impl, fn) in itertools.product(flushes.items(), impls.items()):
            times[flush_name, impl].append(timed_us(fn, sets, flush))
        print(f"round {round_} done", flush=True)
    for (flush_name, impl), us in times.items():
        median = statistics.median(us)
        share = nbytes / median / 1e3 / copy_gbps[flush_name]
        worst = nbytes / max(us) / 1e3 / copy_gbps[flush_name]
        best = nbytes / min(us) / 1e3 / copy_gbps[flush_name]
        print(f"{flush_name:22s} {impl:26s} {median:6.2f} us ({min(us):.2f}-{max(us):.2f})  "
              f"{share:6.1%} of copy ({worst:.1%}-{best:.1%})", flush=True)
    # the loop above against do_bench itself, under its own flush
    print(f"do_bench: layer_norm specgen {bench_us(impls['layer_norm specgen'], sets):.2f} us, "
          f"torch copy of x {bench_us(impls['torch copy of x'], sets):.2f} us", flush=True)


if __name__ == "__main__":
    main()

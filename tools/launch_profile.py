"""Where a generated op's time goes on a GPU: host overhead per call, and device time per kernel.

Usage (GPU machine): PYTHONPATH=. python3 tools/launch_profile.py
"""

import cProfile
import pstats
import time

import torch
from torch.profiler import ProfilerActivity, profile

import generated


def host_us(fn, calls: int = 300) -> float:
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / calls * 1e6


def device_kernels(fn, label: str) -> None:
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            fn()
        torch.cuda.synchronize()
    print(f"--- device time, {label} (10 calls)")
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=5))


def main() -> None:
    small = torch.randn(64, device="cuda", dtype=torch.bfloat16)
    t = torch.randn(8, 8, device="cuda", dtype=torch.bfloat16).t()
    print(f"host us/call  eager add {host_us(lambda: small + small):.1f}")
    print(f"host us/call  generated.add dense {host_us(lambda: generated.add(small, small)):.1f}")
    print(f"host us/call  torch.ops.specgen.add {host_us(lambda: torch.ops.specgen.add(small, small)):.1f}")
    print(f"host us/call  generated.add tiled {host_us(lambda: generated.add(t, t.t())):.1f}")
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(200):
        generated.add(t, t.t())
    profiler.disable()
    pstats.Stats(profiler).sort_stats("tottime").print_stats(25)

    big = 8192
    x = torch.randn(big, big, device="cuda", dtype=torch.bfloat16)
    y = torch.randn(big, big, device="cuda", dtype=torch.bfloat16)
    device_kernels(lambda: generated.add(x.t(), y), "add(x.t(), y) 8192^2")
    bias = torch.randn(4096, device="cuda", dtype=torch.bfloat16)
    z = torch.randn(16384, 4096, device="cuda", dtype=torch.bfloat16)
    device_kernels(lambda: generated.add(z, bias), "add(x, bias) 16384x4096")
    for kernel in (generated.add.__globals__["_add_tiled_kernel"],
                   generated.add.__globals__["_add_dense_kernel"]):
        print(kernel.fn.__name__, "best:", kernel.best_config, "cache:", kernel.cache)


if __name__ == "__main__":
    main()

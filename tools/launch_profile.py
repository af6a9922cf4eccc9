"""Where the host time of a generated op goes: cProfile of repeated calls, next to Triton's floor.

Usage (GPU machine): PYTHONPATH=. python3 tools/launch_profile.py
"""

import cProfile
import pstats
import time

import torch
import triton
import triton.language as tl

import generated


def host_us(fn, calls: int = 200) -> float:
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / calls * 1e6


@triton.jit
def _noop_kernel(x_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(x_ptr + offsets, 0.0, mask=offsets < n)


def main() -> None:
    bf16 = dict(device="cuda", dtype=torch.bfloat16)
    small = torch.randn(64, **bf16)
    wide = torch.randn(32768, 1024, **bf16)
    few = torch.randn(8, 262144, **bf16)
    vector = torch.randn(262144, **bf16)
    x16, w, b = torch.randn(16, 4096, **bf16), torch.randn(4096, 4096, **bf16), torch.randn(4096, **bf16)
    cases = {
        "eager add": lambda: small + small,
        "torch.empty": lambda: torch.empty(64, **bf16),
        "triton noop launch": lambda: _noop_kernel[(1,)](small, 64, BLOCK=64),
        "add": lambda: generated.add(small, small),
        "softmax 32768x1024": lambda: generated.softmax(wide, -1),
        "rms_norm 8x262144": lambda: generated.rms_norm(few, [262144], vector),
        "sum(x, -1) 32768x1024": lambda: generated.sum(wide, -1),
        "sum(x, 0) 32768x1024": lambda: generated.sum(wide, 0),
        "linear_gelu 16x4096x4096": lambda: generated.linear_gelu(x16, w, b),
    }
    for label, fn in cases.items():
        print(f"host us/call  {label}: {host_us(fn):.1f}", flush=True)
    for name, info in generated.REGISTRY.items():
        if info.replays.replayed or info.replays.failures:
            print(f"replays {name}: {info.replays.replayed} calls replayed, "
                  f"failed recordings: {list(info.replays.failures.values())}")
    for label in ("softmax 32768x1024", "rms_norm 8x262144", "linear_gelu 16x4096x4096"):
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(200):
            cases[label]()
        profiler.disable()
        torch.cuda.synchronize()
        print(f"--- cProfile, 200 calls of {label}")
        pstats.Stats(profiler).sort_stats("tottime").print_stats(22)


if __name__ == "__main__":
    main()

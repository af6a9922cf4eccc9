"""Our ops called eagerly next to the same calls under torch.compile (GPU machine, one call).

Users call the generated ops in eager code or inside compiled graphs, where Inductor launches
our Triton kernels itself. For each case this prints whether the compiled result equals the eager
one bit for bit (else the largest difference), both do_bench times (bench/'s timing: L2 flushed,
median), and the lines of Inductor's wrapper code that launch our kernels (grid, num_warps), so a
launch Inductor makes differently from ours shows.

Usage: PYTHONPATH=. python3 tools/compiled_ops.py
"""

from __future__ import annotations

import torch
from torch._inductor.utils import run_and_get_code

import generated
from bench.harness import bench_ms

DTYPE = torch.bfloat16


def cases():
    wide = torch.randn(32768, 1024, device="cuda", dtype=DTYPE)
    long = torch.randn(1024, 32768, device="cuda", dtype=DTYPE)
    few = torch.randn(8, 262144, device="cuda", dtype=DTYPE)
    w_short, b_short = (torch.randn(1024, device="cuda", dtype=DTYPE) for _ in range(2))
    w_long = torch.randn(32768, device="cuda", dtype=DTYPE)
    w_few = torch.randn(262144, device="cuda", dtype=DTYPE)
    a, b = (torch.randn(4096, 4096, device="cuda", dtype=DTYPE) for _ in range(2))
    return {
        "layer_norm 32768x1024": (lambda x: generated.layer_norm(x, [1024], w_short, b_short),
                                  wide),
        "softmax 32768x1024": (lambda x: generated.softmax(x, -1), wide),
        "rms_norm 1024x32768 (looped)": (lambda x: generated.rms_norm(x, [32768], w_long), long),
        "rms_norm 8x262144 (split)": (lambda x: generated.rms_norm(x, [262144], w_few), few),
        "sum(x, -1) 32768x1024": (lambda x: generated.sum(x, -1), wide),
        "sum(x, 0) 32768x1024": (lambda x: generated.sum(x, 0), wide),
        "mm 4096^3": (lambda x: generated.mm(x, b), a),
    }


def main() -> None:
    for name, (fn, x) in cases().items():
        torch._dynamo.reset()
        eager = fn(x)
        compiled_fn = torch.compile(fn, fullgraph=True, dynamic=False)
        compiled, codes = run_and_get_code(compiled_fn, x)
        if torch.equal(compiled, eager):
            parity = "bitwise equal"
        else:
            diff = (compiled.double() - eager.double()).abs()
            parity = (f"differ: {int((diff > 0).sum())} of {diff.numel()} elements, max "
                      f"{diff.max().item():.3g}")
        eager_ms, compiled_ms = bench_ms(lambda: fn(x)), bench_ms(lambda: compiled_fn(x))
        print(f"{name:32s} eager {eager_ms * 1e3:7.1f} us  compiled {compiled_ms * 1e3:7.1f} us"
              f"  {parity}", flush=True)
        for code in codes:
            for line in code.splitlines():
                if ".run(" in line or "num_warps" in line:
                    print("    " + line.strip()[:200])


if __name__ == "__main__":
    main()

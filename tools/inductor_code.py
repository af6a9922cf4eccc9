"""Prints the Triton kernels torch.compile generates for the benchmark cases that it wins, with
their autotuned configs, for side-by-side reading with ours (GPU machine, one call).

Usage: PYTHONPATH=. python3 tools/inductor_code.py [CASE ...]   (cases: sum0 rms_norm_long)
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F
from torch._inductor.utils import run_and_get_code

DTYPE = torch.bfloat16


def cases():
    wide = torch.randn(32768, 1024, device="cuda", dtype=DTYPE)
    long = torch.randn(1024, 32768, device="cuda", dtype=DTYPE)
    weight = torch.randn(32768, device="cuda", dtype=DTYPE)
    return {
        "sum0": (lambda x: torch.sum(x, 0), (wide,)),
        "rms_norm_long": (lambda x, w: F.rms_norm(x, (x.shape[-1],), w), (long, weight)),
    }


def main() -> None:
    chosen = sys.argv[1:]
    for name, (fn, args) in cases().items():
        if chosen and name not in chosen:
            continue
        _, codes = run_and_get_code(torch.compile(fn, dynamic=False), *args)
        print(f"===== {name} =====")
        for code in codes:
            print(code)
        torch._dynamo.reset()


if __name__ == "__main__":
    main()

"""Prints the Triton kernels torch.compile generates for the benchmark cases that it wins, with
their autotuned configs, for side-by-side reading with ours (GPU machine, one call).

Usage: PYTHONPATH=. python3 tools/inductor_code.py [CASE ...]
(cases: sum0, rms_norm_long, softmax_short, layer_norm_short, rms_norm_short). The configs
autotuning chose are Inductor's ``.best_config`` files, printed after the code.
"""

from __future__ import annotations

import glob
import os
import sys

import torch
import torch.nn.functional as F
from torch._inductor.utils import run_and_get_code

DTYPE = torch.bfloat16


def cases():
    wide = torch.randn(32768, 1024, device="cuda", dtype=DTYPE)
    long = torch.randn(1024, 32768, device="cuda", dtype=DTYPE)
    weight = torch.randn(32768, device="cuda", dtype=DTYPE)
    short_w, short_b = (torch.randn(1024, device="cuda", dtype=DTYPE) for _ in range(2))
    return {
        "sum0": (lambda x: torch.sum(x, 0), (wide,)),
        "rms_norm_long": (lambda x, w: F.rms_norm(x, (x.shape[-1],), w), (long, weight)),
        "softmax_short": (lambda x: torch.softmax(x, -1), (wide,)),
        "layer_norm_short": (lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b),
                             (wide, short_w, short_b)),
        "rms_norm_short": (lambda x, w: F.rms_norm(x, (x.shape[-1],), w), (wide, short_w)),
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
    # beside each kernel's file (its "kernel path" above): <hash>.best_config
    cache = os.environ.get("TORCHINDUCTOR_CACHE_DIR", "/tmp/torchinductor_*")
    for path in sorted(glob.glob(f"{cache}/**/*.best_config", recursive=True)):
        with open(path) as f:
            print(path, f.read())


if __name__ == "__main__":
    main()

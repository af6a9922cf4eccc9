"""The kernels of the missed bench cells next to their peers', one call each inside a profiler
window, for Nsight Compute (on the device machines ncu reads the hardware counters):

    ncu --clock-control none --profile-from-start off \\
        --section SpeedOfLight --section WarpStateStats --section Occupancy --section LaunchStats \\
        --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active.ratio \\
        PYTHONPATH=. python3 tools/perf/ncu_cases.py conv3 int4_16 attn64

Each case's calls run three times first (compilation, the frozen table's configs, replays), then
once between ``cudaProfilerStart`` and ``cudaProfilerStop``; the script prints ``CASE <name>``
before each window, so ncu's report reads in the same order. ncu flushes the caches before each
kernel it profiles, as do_bench does. Cases (bf16, the bench's shapes): ``conv3`` N32 C64 56x56
K64 3x3 channels-last, ``conv1`` N32 C64 56x56 K256 1x1 NCHW (ours and cuDNN); ``int4_16``
16 x 4096 x 4096 and ``int4_1`` 1 x 8192 x 8192 int4 weight-only (ours and cuBLAS's bf16
linear); ``int8_16`` 16 x 4096 x 4096 int8 weight-only; ``attn64`` B16 H16 S1024 E64 and
``attn128`` B4 H32 S4096 E128 forward (ours and SDPA's cuDNN backend). What it showed first:
docs/performance.md, item 001p.
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F

import generated
from specgen import quant

CASES = ("conv3", "conv1", "int4_16", "int4_1", "int8_16", "attn64", "attn128")


def cases(names: list[str]) -> list[tuple[str, object]]:
    """(label, call) pairs of the named cases, inputs drawn once."""
    torch.manual_seed(0)
    bf16, dev = torch.bfloat16, "cuda"
    calls = []
    if "conv3" in names:
        last = torch.channels_last
        x = torch.randn(32, 64, 56, 56, device=dev, dtype=bf16).to(memory_format=last)
        w = (torch.randn(64, 64, 3, 3, device=dev, dtype=bf16) / 24).to(memory_format=last)
        calls += [("conv3 specgen", lambda: generated.conv2d(x, w, None, 1, 1)),
                  ("conv3 cudnn", lambda: F.conv2d(x, w, None, 1, 1))]
    if "conv1" in names:
        x1 = torch.randn(32, 64, 56, 56, device=dev, dtype=bf16)
        w1 = torch.randn(256, 64, 1, 1, device=dev, dtype=bf16) / 8
        calls += [("conv1 specgen", lambda: generated.conv2d(x1, w1)),
                  ("conv1 cudnn", lambda: F.conv2d(x1, w1))]
    for m, n, k, name in ((16, 4096, 4096, "int4_16"), (1, 8192, 8192, "int4_1"),
                          (16, 4096, 4096, "int8_16")):
        if name not in names:
            continue
        weight = torch.randn(n, k, device=dev, dtype=bf16)
        a = torch.randn(m, k, device=dev, dtype=bf16)
        if name.startswith("int4"):
            q, s, z = quant.quantize_int4(weight, group_size=128)
            ours = (lambda a=a, q=q, s=s, z=z: generated.int4_weight_linear(a, q, s, z, 128))
        else:
            q, s = quant.quantize_int8(weight)
            ours = (lambda a=a, q=q, s=s: generated.int8_weight_linear(a, q, s))
        calls += [(f"{name} specgen", ours),
                  (f"{name} bf16 linear", lambda a=a, weight=weight: F.linear(a, weight))]
    for name, (b, h, s, e) in (("attn64", (16, 16, 1024, 64)), ("attn128", (4, 32, 4096, 128))):
        if name not in names:
            continue
        q, k, v = (torch.randn(b, h, s, e, device=dev, dtype=bf16) for _ in range(3))

        def cudnn(q=q, k=k, v=v):
            from torch.nn.attention import SDPBackend, sdpa_kernel
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(q, k, v)
        calls += [(f"{name} specgen",
                   lambda q=q, k=k, v=v: generated.scaled_dot_product_attention(q, k, v)),
                  (f"{name} sdpa cudnn", cudnn)]
    return calls


def main() -> None:
    names = sys.argv[1:] or list(CASES)
    unknown = sorted(set(names) - set(CASES))
    if unknown:
        raise SystemExit(f"unknown cases {unknown}; the cases: {', '.join(CASES)}")
    calls = cases(names)
    for _, call in calls:
        for _ in range(3):
            call()
    torch.cuda.synchronize()
    for label, call in calls:
        print("CASE", label, flush=True)
        torch.cuda.cudart().cudaProfilerStart()
        call()
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()


if __name__ == "__main__":
    main()

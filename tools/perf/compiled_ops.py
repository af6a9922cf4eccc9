"""Our ops called eagerly next to the same calls under torch.compile (GPU machine, one call).

Users call the generated ops in eager code or inside compiled graphs, where Inductor launches
our Triton kernels itself. For each case this prints whether the compiled result equals the eager
one bit for bit (else how many elements differ and by how much), the do_bench times (bench/'s
timing: L2 flushed, median), the kernels' device time a call (torch.profiler) and the host time
a call, then the lines of Inductor's wrapper that launch our kernels and the specialization
(`tt.divisibility`) it compiled them with, and the configs its autotuning chose for ours. With
``--code DIR`` each case's generated wrapper code is written there.

Usage: PYTHONPATH=. python3 tools/perf/compiled_ops.py [--code DIR] [--only SUBSTRING ...]
[--rounds N] [--compile-first]
"""

from __future__ import annotations

import argparse
import glob
import os
import pathlib
import re

import torch
from torch._inductor.utils import run_and_get_code

import generated
from bench.harness import bench_ms
from tools.perf.profile_cases import host_us, kernels, launch_module

DTYPE = torch.bfloat16


def cases():
    wide = torch.randn(32768, 1024, device="cuda", dtype=DTYPE)
    long = torch.randn(1024, 32768, device="cuda", dtype=DTYPE)
    few = torch.randn(8, 262144, device="cuda", dtype=DTYPE)
    w_short, b_short = (torch.randn(1024, device="cuda", dtype=DTYPE) for _ in range(2))
    w_long = torch.randn(32768, device="cuda", dtype=DTYPE)
    w_few = torch.randn(262144, device="cuda", dtype=DTYPE)
    a, b, c = (torch.randn(4096, 4096, device="cuda", dtype=DTYPE) for _ in range(3))
    logits = torch.randn(4096, 32000, device="cuda", dtype=DTYPE)
    target = torch.randint(0, 32000, (4096,), device="cuda")
    return {
        "layer_norm 32768x1024": (lambda x: generated.layer_norm(x, [1024], w_short, b_short),
                                  wide),
        "softmax 32768x1024": (lambda x: generated.softmax(x, -1), wide),
        "rms_norm 1024x32768 (looped)": (lambda x: generated.rms_norm(x, [32768], w_long), long),
        "rms_norm 8x262144 (split)": (lambda x: generated.rms_norm(x, [262144], w_few), few),
        "sum(x, -1) 32768x1024": (lambda x: generated.sum(x, -1), wide),
        "sum(x, 0) 32768x1024": (lambda x: generated.sum(x, 0), wide),
        "mean(x, -1) 32768x1024": (lambda x: generated.mean(x, -1), wide),
        "mm 4096^3": (lambda x: generated.mm(x, b), a),
        "addmm 4096^3, beta 0.5, alpha 0.3": (lambda x: generated.addmm(c, x, b, beta=0.5,
                                                                         alpha=0.3), a),
        "cross_entropy 4096x32000, smoothing 0.1": (
            lambda x: generated.cross_entropy(x, target, label_smoothing=0.1), logits),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--code", type=pathlib.Path, help="write each case's wrapper code here")
    parser.add_argument("--only", action="append", help="cases whose name contains this")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds")
    parser.add_argument("--compile-first", action="store_true",
                        help="call the compiled graph before any eager call")
    args = parser.parse_args()
    # the configs Inductor's autotuning chose for our autotuned kernels: <hash>.best_config files
    cache = os.environ.get("TORCHINDUCTOR_CACHE_DIR", "/tmp/torchinductor_*")
    seen = set(glob.glob(f"{cache}/**/*.best_config", recursive=True))
    for name, (fn, x) in cases().items():
        if args.only and not any(part in name for part in args.only):
            continue
        torch._dynamo.reset()
        tuned_before = set(launch_module._tuned)
        compiled_fn = torch.compile(fn, fullgraph=True, dynamic=False)
        if args.compile_first:
            # a program that only ever runs compiled: its launches are tuned at trace time
            compiled, codes = run_and_get_code(compiled_fn, x)
            eager = fn(x)
        else:
            eager = fn(x)
            compiled, codes = run_and_get_code(compiled_fn, x)
        if torch.equal(compiled, eager):
            parity = "bitwise equal"
        else:
            diff = (compiled.double() - eager.double()).abs()
            parity = (f"differ: {int((diff > 0).sum())} of {diff.numel()} elements, max "
                      f"{diff.max().item():.3g}")
        print(f"== {name}: {parity}", flush=True)
        # interleaved rounds: a compute-bound kernel heats the GPU and its clocks drop, so the
        # impl timed second in a single round would pay for the first one's heat
        for _ in range(args.rounds):
            for label, call in (("eager", fn), ("compiled", compiled_fn)):
                device = ", ".join(f"{kernel} {us:.1f} us x{n}"
                                   for kernel, us, n in kernels(call, (x,)))
                print(f"   {label:8s} do_bench {bench_ms(lambda: call(x)) * 1e3:6.1f} us, host "
                      f"{host_us(call, (x,)):5.1f} us a call; device: {device}", flush=True)
        for code in codes:
            for line in code.splitlines():
                if ".run(" in line:
                    print("   " + line.strip()[:160])
            # the specialization Inductor compiled our kernels with: which arguments it told
            # Triton are multiples of 16 (pointers: 16-byte aligned)
            for meta in re.findall(r"'configs': \[\{.*?\}\]", code):
                print("   " + meta[:300])
            if args.code:
                args.code.mkdir(parents=True, exist_ok=True)
                slug = re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")
                (args.code / f"{slug}.py").write_text(code)
        for key, config in launch_module._tuned.items():
            if key not in tuned_before:
                print(f"   our tuner chose for {key[0].fn.__name__}: {config}")
        for path in sorted(set(glob.glob(f"{cache}/**/*.best_config", recursive=True)) - seen):
            seen.add(path)
            print(f"   Inductor chose: {pathlib.Path(path).read_text()[:200]}")


if __name__ == "__main__":
    main()

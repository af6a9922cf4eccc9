"""GPU probe: does a row length known at compile time speed up the looped rms_norm? (one call)

At 1024x32768 bf16 our looped rms_norm ties torch.compile (0.039 ms each), whose kernel has the
same two passes but bakes the row length in. This probe times, as bench/ times (do_bench median,
L2 flushed, two input sets rotated, three interleaved rounds):
- the op, and the generated looped kernel launched directly with the config autotuning chose;
- torch.compile(dynamic=False);
- a two-pass kernel of the generated numerics (sum of squares with ``evict_last``, then the
  output pass with ``evict_first``) over the chunk widths and warps of our space, its loop
  bounds either the runtime N (as ours), the constexpr N (a loop of constant trip count, as
  Inductor's), the chunks unrolled (``tl.static_range``), or the runtime N with the loop
  unrolled twice (``tl.range(..., loop_unroll_factor=2)``: one compile serves every N).

Usage (GPU machine): PYTHONPATH=. python3 tools/probe_looped_n.py [--rows R --n N] [--check-only]
"""

from __future__ import annotations

import importlib
import itertools

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from tools.probe_memory import bench_us, probe_parser, row_sets

DTYPE = torch.bfloat16
RUNTIME, CONSTANT, UNROLLED, UNROLL2 = 0, 1, 2, 3
BOUNDS = ("runtime", "constant", "unrolled", "runtime-unroll2")


@triton.jit
def rms_two_pass_kernel(x_ptr, w_ptr, out_ptr, N, stride, eps, N_CONST: tl.constexpr,
                        BOUNDS: tl.constexpr, BLOCK_N: tl.constexpr):
    row = tl.program_id(0)
    x_row = x_ptr + row * stride
    out_row = out_ptr + row * stride
    cols = tl.arange(0, BLOCK_N)
    acc = tl.zeros([BLOCK_N], tl.float32)
    if BOUNDS == 0:
        n_float = N * 1.0
        for start in range(0, N, BLOCK_N):
            x = tl.load(x_row + start + cols, eviction_policy="evict_last").to(tl.float32)
            acc += x * x
    elif BOUNDS == 1:
        n_float = N_CONST * 1.0
        for start in range(0, N_CONST, BLOCK_N):
            x = tl.load(x_row + start + cols, eviction_policy="evict_last").to(tl.float32)
            acc += x * x
    elif BOUNDS == 3:
        n_float = N * 1.0
        for start in tl.range(0, N, BLOCK_N, loop_unroll_factor=2):
            x = tl.load(x_row + start + cols, eviction_policy="evict_last").to(tl.float32)
            acc += x * x
    else:
        n_float = N_CONST * 1.0
        for chunk in tl.static_range(N_CONST // BLOCK_N):
            x = tl.load(x_row + chunk * BLOCK_N + cols, eviction_policy="evict_last").to(tl.float32)
            acc += x * x
    rstd = tl.rsqrt(tl.sum(acc, 0) * (1 / n_float) + eps)
    if BOUNDS == 0:
        for start in range(0, N, BLOCK_N):
            x = tl.load(x_row + start + cols, eviction_policy="evict_first").to(tl.float32)
            w = tl.load(w_ptr + start + cols).to(tl.float32)
            tl.store(out_row + start + cols, (x * rstd * w).to(out_ptr.dtype.element_ty))
    elif BOUNDS == 1:
        for start in range(0, N_CONST, BLOCK_N):
            x = tl.load(x_row + start + cols, eviction_policy="evict_first").to(tl.float32)
            w = tl.load(w_ptr + start + cols).to(tl.float32)
            tl.store(out_row + start + cols, (x * rstd * w).to(out_ptr.dtype.element_ty))
    elif BOUNDS == 3:
        for start in tl.range(0, N, BLOCK_N, loop_unroll_factor=2):
            x = tl.load(x_row + start + cols, eviction_policy="evict_first").to(tl.float32)
            w = tl.load(w_ptr + start + cols).to(tl.float32)
            tl.store(out_row + start + cols, (x * rstd * w).to(out_ptr.dtype.element_ty))
    else:
        for chunk in tl.static_range(N_CONST // BLOCK_N):
            x = tl.load(x_row + chunk * BLOCK_N + cols, eviction_policy="evict_first").to(tl.float32)
            w = tl.load(w_ptr + chunk * BLOCK_N + cols).to(tl.float32)
            tl.store(out_row + chunk * BLOCK_N + cols, (x * rstd * w).to(out_ptr.dtype.element_ty))


def main() -> None:
    args = probe_parser(1024, 32768).parse_args()
    rows, n = args.rows, args.n
    device, sets = row_sets(rows, n, args.check_only)
    w = torch.randn(n, device=device, dtype=DTYPE)
    nbytes = 2 * rows * n * DTYPE.itemsize
    ref = F.rms_norm(sets[0][0].float(), (n,), w.float()).to(DTYPE)

    import generated
    variants = {"specgen op": lambda x, o: generated.rms_norm(x, [n], w)}
    if not args.check_only:
        from bench.harness import measure_copy_bandwidth
        copy_gbps = measure_copy_bandwidth()
        compiled = torch.compile(lambda x: F.rms_norm(x, (n,), w), dynamic=False)
        variants["torch.compile"] = lambda x, o: compiled(x)
        # the generated looped kernel as the op launches it, with the config the tuner chose
        module = importlib.import_module("generated.rms_norm")
        rt_launch = importlib.import_module("specgen.runtime.launch")
        generated.rms_norm(sets[0][0], [n], w)
        tuned = {k: v for k, v in rt_launch._tuned.items()
                 if k[0] is module._rms_norm_looped_kernel}
        for config in tuned.values():
            print("tuned looped config:", config, flush=True)
    chunks = [c for c in (4096, 8192, 16384) if n % c == 0]
    for block_n, warps, bounds in itertools.product(chunks, (16, 32),
                                                    (RUNTIME, CONSTANT, UNROLLED, UNROLL2)):
        def fn(x, o, block_n=block_n, warps=warps, bounds=bounds):
            rms_two_pass_kernel[(rows,)](x, w, o, n, n, 1e-6, n, bounds, block_n, num_warps=warps)
        variants[f"two-pass BLOCK_N={block_n} w={warps} "
                 f"bounds={BOUNDS[bounds]}"] = fn

    for label, fn in variants.items():
        x, o = sets[0]
        o.fill_(float("nan"))
        result = fn(x, o)
        result = result if isinstance(result, torch.Tensor) else o
        torch.testing.assert_close(result.float(), ref.float(), atol=2e-2, rtol=2e-2,
                                   msg=lambda m, label=label: f"{label}: {m}")
    if args.check_only:
        print("every variant matched torch", flush=True)
        return
    for round_ in range(3):
        for label, fn in variants.items():
            us = bench_us(fn, sets)
            print(f"round {round_} {label:52s} {us:7.1f} us  {nbytes / us / 1e3:6.0f} GB/s  "
                  f"{100 * nbytes / us / 1e3 / copy_gbps:4.0f}% copy", flush=True)


if __name__ == "__main__":
    main()

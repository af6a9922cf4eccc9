"""GPU probe: why the generated layer_norm single tile trails the tutorial kernel (one device call).

tools/probe_tma_rows.py found our layer_norm at 32768x1024 bf16 1.2-2.5 us behind the tutorial
form with the same numerics (six rounds, two runs), at 4096x4096 by about 1 us. This probe
separates the host path from the kernel (the generated kernel launched directly, as the op
launches it), then bisects the generated kernel's structure on a copy of it with switches:
- LOOP: the grid-stride loop over row blocks the generated kernel always has, or one block
  a program;
- MASKS: loads and reductions under all-true masks (tl.full), or none;
- BROADCAST: weight and bias loaded as broadcast [BLOCK_M, BLOCK_N] tiles under the mask, or
  as [1, BLOCK_N] rows;
- RUNTIME_N: 1 / N from the runtime row length, or from the constexpr tile.

Timing as bench/ times (do_bench median, L2 flushed, two input sets rotated), three
interleaved rounds. With --tiles: the generated form (no loop) at several rows a program and
with x read past L1 (cache_modifier ".cg"), so that weight and bias stay in L1.
Usage (GPU machine): PYTHONPATH=. python3 tools/probe_ln_gen.py [--rows R --n N] [--tiles]
"""

from __future__ import annotations

import importlib
import itertools

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from specgen.kernel_lib import add_pairs
from tools.probe_memory import bench_us, layer_norm_kernel, probe_parser, row_sets

DTYPE = torch.bfloat16


@triton.jit
def _ln_block(block, x_ptr, w_ptr, b_ptr, out_ptr, n_rows, n_float, x_stride, out_stride, eps,
              cols, col_mask, MASKS: tl.constexpr, BROADCAST: tl.constexpr,
              X_CACHE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = block * BLOCK_M + tl.arange(0, BLOCK_M)[:, None]
    row_mask = tl.full([BLOCK_M, 1], True, tl.int1)
    row_id = tl.where(row_mask, rows, 0)
    mask = row_mask & col_mask
    if MASKS:
        x = tl.load(x_ptr + row_id * x_stride + cols, mask=mask, other=0.0,
                    cache_modifier=X_CACHE).to(tl.float32)
        row_mean = tl.sum(tl.where(mask, x, 0.0), axis=1, keep_dims=True) * (1 / n_float)
        deviation = tl.where(mask, x - row_mean, 0.0)
    else:
        x = tl.load(x_ptr + row_id * x_stride + cols, cache_modifier=X_CACHE).to(tl.float32)
        row_mean = tl.sum(x, axis=1, keep_dims=True) * (1 / n_float)
        deviation = x - row_mean
    mean_shift, m2 = tl.reduce((deviation, deviation * deviation), 1, add_pairs, keep_dims=True)
    row_var = m2 * (1 / n_float)
    row_mean += mean_shift / n_float
    if BROADCAST:
        weight = tl.load(tl.broadcast_to(w_ptr + cols, [BLOCK_M, BLOCK_N]), mask=mask,
                         other=0.0).to(tl.float32)
        bias = tl.load(tl.broadcast_to(b_ptr + cols, [BLOCK_M, BLOCK_N]), mask=mask,
                       other=0.0).to(tl.float32)
    else:
        weight = tl.load(w_ptr + cols).to(tl.float32)
        bias = tl.load(b_ptr + cols).to(tl.float32)
    out = (x - row_mean) * tl.rsqrt(row_var + eps) * weight + bias
    if MASKS:
        tl.store(out_ptr + row_id * out_stride + cols, out.to(out_ptr.dtype.element_ty), mask=mask)
    else:
        tl.store(out_ptr + row_id * out_stride + cols, out.to(out_ptr.dtype.element_ty))


@triton.jit
def ln_bisect_kernel(x_ptr, w_ptr, b_ptr, out_ptr, n_rows, N, x_stride, out_stride, eps,
                     LOOP: tl.constexpr, MASKS: tl.constexpr, BROADCAST: tl.constexpr,
                     RUNTIME_N: tl.constexpr, X_CACHE: tl.constexpr, BLOCK_M: tl.constexpr,
                     BLOCK_N: tl.constexpr):
    pid = tl.program_id(0)
    if RUNTIME_N:
        n_float = N * 1.0
    else:
        n_float = BLOCK_N * 1.0
    cols = tl.arange(0, BLOCK_N)[None, :]
    col_mask = tl.full([1, BLOCK_N], True, tl.int1)
    if LOOP:
        for block in range(pid, tl.cdiv(n_rows, BLOCK_M), tl.num_programs(0)):
            _ln_block(block, x_ptr, w_ptr, b_ptr, out_ptr, n_rows, n_float, x_stride, out_stride,
                      eps, cols, col_mask, MASKS, BROADCAST, X_CACHE, BLOCK_M, BLOCK_N)
    else:
        _ln_block(pid, x_ptr, w_ptr, b_ptr, out_ptr, n_rows, n_float, x_stride, out_stride,
                  eps, cols, col_mask, MASKS, BROADCAST, X_CACHE, BLOCK_M, BLOCK_N)


def main() -> None:
    parser = probe_parser(32768, 1024)
    parser.add_argument("--tiles", action="store_true",
                        help="the generated form at other tiles and L1 policies, not the bisection")
    args = parser.parse_args()
    rows, n = args.rows, args.n
    device, sets = row_sets(rows, n, args.check_only)
    if not args.check_only:
        from bench.harness import measure_copy_bandwidth
        copy_gbps = measure_copy_bandwidth()
    w, b = (torch.randn(n, device=device, dtype=DTYPE) for _ in range(2))
    nbytes = 2 * rows * n * DTYPE.itemsize
    ref = F.layer_norm(sets[0][0].float(), (n,), w.float(), b.float()).to(DTYPE)

    def line(label, us):
        print(f"{label:64s} {us:7.1f} us  {nbytes / us / 1e3:6.0f} GB/s  "
              f"{100 * nbytes / us / 1e3 / copy_gbps:4.0f}% copy", flush=True)

    def checked(fn):
        x, o = sets[0]
        o.fill_(float("nan"))
        result = fn(x, o)   # the op returns its own output, the kernels write o
        result = result if isinstance(result, torch.Tensor) else o
        torch.testing.assert_close(result.float(), ref.float(), atol=2e-2, rtol=2e-2)
        return fn

    import generated
    from specgen.runtime import rowwise
    module = importlib.import_module("generated.layer_norm")
    plan = rowwise.launch_plan("layer_norm", "auto", module.STRATEGIES, "auto", module.MAX_BLOCK,
                               module.MAX_CHUNK, False, sets[0][0], (1,),
                               [sets[0][1], sets[0][0]], [w, b], [], module.LAUNCH_TENSORS)
    print("plan:", plan.strategy, plan.single, plan.masks, "grid", plan.grid(plan.single),
          flush=True)
    space = plan.space
    kernel = module._layer_norm_single_kernel
    block_m, block_n, warps = (plan.single[k] for k in ("BLOCK_M", "BLOCK_N", "num_warps"))

    variants = {
        "specgen op": lambda x, o: generated.layer_norm(x, [n], w, b),
        "generated kernel, direct": lambda x, o: kernel[plan.grid(plan.single)](
            x, w, b, o, space.rows, space.n, *space.kernel_args(), 1e-5, HAS_WEIGHT=True,
            HAS_BIAS=True, ROW_DIMS=space.row_dims, COL_DIMS=space.col_dims,
            INDEX_64=plan.index_64, ROW_LOOP=plan.row_loop, **plan.masks, **plan.single,
            num_stages=1),
        "tutorial": lambda x, o: layer_norm_kernel[(rows // block_m,)](
            x, w, b, o, n, 1e-5, block_m, block_n, "", num_warps=warps),
    }
    for loop, masks, broadcast, runtime_n in itertools.product((True, False), repeat=4):
        if args.tiles and (loop or not (masks and broadcast and runtime_n)):
            continue
        def fn(x, o, switches=(loop, masks, broadcast, runtime_n)):
            ln_bisect_kernel[(rows // block_m,)](x, w, b, o, rows, n, n, n, 1e-5, *switches, "",
                                                 block_m, block_n, num_warps=warps)
        variants[f"bisect loop={loop:d} masks={masks:d} broadcast={broadcast:d} "
                 f"runtime_n={runtime_n:d}"] = fn
    if args.tiles:
        # the generated form without the loop: x past L1 (.cg) so that weight and bias stay
        # there, and several rows a program, so that they are read once for all of them
        for x_cache, (bm, tile_warps) in itertools.product(
                ("", ".cg"), ((1, 1), (1, 2), (2, 2), (2, 4), (4, 4), (4, 8))):
            def fn(x, o, x_cache=x_cache, bm=bm, tile_warps=tile_warps):
                ln_bisect_kernel[(rows // bm,)](x, w, b, o, rows, n, n, n, 1e-5, False, True, True,
                                                True, x_cache, bm, block_n, num_warps=tile_warps)
            variants[f"tile x_cache={x_cache or '-'} BM={bm} w={tile_warps}"] = fn
    for fn in variants.values():
        checked(fn)
    if args.check_only:
        print("every variant matched torch", flush=True)
        return
    for round_ in range(3):
        for label, fn in variants.items():
            line(f"round {round_} {label}", bench_us(fn, sets))


if __name__ == "__main__":
    main()

"""GPU probe: where the memory-bound cases lose time against the copy bandwidth (one device call).

Everything is timed as bench/ times it (do_bench median, L2 flushed by a 256 MB zero-fill before
each call, two input sets rotated). The flush leaves up to an L2's worth of dirty lines, which a
kernel that streams through L2 writes back on its own clock: the probe compares load and store
eviction policies on small standalone kernels (copy, softmax, row sum) against torch's copy, our
generated ops and torch.compile at the same shapes, and two forms of cross_entropy's online
logsumexp (a chunk max per step, or a per-lane max with one exp per element).

Parts (default: all; about a minute each):
  rowwise  softmax, layer_norm, rms_norm tiles (rows a program x warps) as tutorial kernels
  ops      our softmax/layer_norm/rms_norm/sum next to torch.compile at the same shapes
  rowsum   row-sum tiles, persistent grids, and the same kernel over 1 GiB (the read ceiling)
  lse      cross_entropy's per-lane logsumexp at 4096 x 128256: chunk, warps, programs per SM
  long     rms_norm at 1024x32768: ours (tuned, and the looped kernel at fixed chunks), the
           tutorial form, and variants adding a runtime row length, the row loop and masks
  repeat   ours against the tutorial kernels three times over (the run-to-run spread)
  persist  layer_norm and rms_norm on a persistent grid that loads weight and bias once a program
           (programs per SM x warps x pipeline stages) next to the one-row-a-program tutorial form
  lnforms  layer_norm a row a program: weight and bias loaded first, one reduction instead of two,
           no weight and bias; next to softmax and rms_norm of the same form, three rounds
  stores   eviction policies of the loads and the stores together (would evict_first on both leave
           the flush's dirty lines in L2 unwritten? it does not: docs/performance.md 000f): torch's
           and Triton's copy, the three row ops a row a program at 32768x1024 and looped rms_norm
           at 1024x32768, three interleaved rounds
  copytiles Triton's copy of 32768x1024 bf16 over tile sizes and warps (elements a thread, bytes in
           flight) next to torch's copy (the driver's memcpy), three rounds
  maxnreg  the three row ops a row a program on 2 warps under register caps (more programs resident
           per SM), with each build's registers and spills, three rounds
  lnregs   layer_norm a row a program on 2 warps in forms that hold fewer registers (40 cap 25
           programs an SM, 32 would let 32 in): its registers, spills and time, three rounds
  warps    the three row ops a row a program on 1, 2 or 4 warps (one warp: no shared-memory round in
           the reductions) at 32768x1024 and 4096x4096, and the generated ops, three rounds

Usage (GPU machine): PYTHONPATH=. python3 tools/probe_memory.py [--part PART ...]
"""

from __future__ import annotations

import argparse
import importlib
import itertools

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from bench.harness import measure_copy_bandwidth
from specgen.kernel_lib import add_pairs

ROWS, N = 32768, 1024
DTYPE = torch.bfloat16
LOG2E = tl.constexpr(1.4426950408889634)
PARTS = ("ops", "rowwise", "rowsum", "lse", "long", "repeat", "persist", "lnforms",
         "stores", "warps", "copytiles", "maxnreg", "lnregs")


def probe_parser(rows: int, n: int) -> argparse.ArgumentParser:
    """The options every row probe takes: its shape, and --check-only."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=rows)
    parser.add_argument("--n", type=int, default=n)
    parser.add_argument("--check-only", action="store_true",
                        help="check every variant, time none (TRITON_INTERPRET=1 on a CPU)")
    return parser


def row_sets(rows: int, n: int, check_only: bool) -> tuple[str, list[tuple]]:
    """The device, and two (x, out) sets of rows x n for bench_us to rotate through."""
    device = "cpu" if check_only else "cuda"
    print("device", device, "torch", torch.__version__, "triton", triton.__version__, flush=True)
    return device, [(torch.randn(rows, n, device=device, dtype=DTYPE),
                     torch.empty(rows, n, device=device, dtype=DTYPE)) for _ in range(2)]


def bench_us(fn, sets) -> float:
    for s in sets:
        fn(*s)
    torch.cuda.synchronize()
    cycle = itertools.cycle(sets)
    return triton.testing.do_bench(lambda: fn(*next(cycle)), warmup=25, rep=100,
                                   return_mode="median") * 1e3


@triton.jit
def copy_kernel(x_ptr, out_ptr, BLOCK: tl.constexpr, LOAD: tl.constexpr, STORE: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, eviction_policy=LOAD), eviction_policy=STORE)


@triton.jit
def softmax_kernel(x_ptr, out_ptr, stride, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   LOAD: tl.constexpr, STORE: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)[:, None]
    offs = rows * stride + tl.arange(0, BLOCK_N)[None, :]
    x = tl.load(x_ptr + offs, eviction_policy=LOAD).to(tl.float32)
    e = tl.exp(x - tl.max(x, 1, keep_dims=True))
    out = e * (1.0 / tl.sum(e, 1, keep_dims=True))
    tl.store(out_ptr + offs, out.to(out_ptr.dtype.element_ty), eviction_policy=STORE)


@triton.jit
def layer_norm_kernel(x_ptr, w_ptr, b_ptr, out_ptr, stride, eps, BLOCK_M: tl.constexpr,
                      BLOCK_N: tl.constexpr, LOAD: tl.constexpr, STORE: tl.constexpr = ""):
    # the generated single tile's numerics: mean, then the squared deviations with the mean
    # correction (the sum of the deviations) in one tuple reduction
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


@triton.jit
def layer_norm_form_kernel(x_ptr, w_ptr, b_ptr, out_ptr, stride, eps, BLOCK_N: tl.constexpr,
                           VECTORS_FIRST: tl.constexpr, ONE_REDUCTION: tl.constexpr,
                           VECTORS: tl.constexpr):
    # forms of the one-row-a-program layer_norm: weight and bias loaded with x rather than after
    # the statistics; the sum and the sum of squares in one tuple reduction (shifted by the row's
    # first element against cancellation) rather than two in a row; no weight and bias at all
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    offs = row * stride + cols
    if VECTORS_FIRST:
        w = tl.load(w_ptr + cols).to(tl.float32)
        b = tl.load(b_ptr + cols).to(tl.float32)
    x = tl.load(x_ptr + offs).to(tl.float32)
    if ONE_REDUCTION:
        shift = tl.load(x_ptr + row * stride).to(tl.float32)
        d = x - shift
        total, squares = tl.reduce((d, d * d), 0, add_pairs)
        mean_d = total / BLOCK_N
        mean = shift + mean_d
        var = tl.maximum(squares / BLOCK_N - mean_d * mean_d, 0.0)
    else:
        mean = tl.sum(x, 0) / BLOCK_N
        dev = x - mean
        correction, m2 = tl.reduce((dev, dev * dev), 0, add_pairs)
        mean += correction / BLOCK_N
        var = m2 / BLOCK_N
    y = (x - mean) * tl.rsqrt(var + eps)
    if VECTORS:
        if not VECTORS_FIRST:
            w = tl.load(w_ptr + cols).to(tl.float32)
            b = tl.load(b_ptr + cols).to(tl.float32)
        y = y * w + b
    tl.store(out_ptr + offs, y.to(out_ptr.dtype.element_ty))


@triton.jit
def layer_norm_regs_kernel(x_ptr, w_ptr, b_ptr, out_ptr, stride, eps, BLOCK_N: tl.constexpr,
                           FORM: tl.constexpr):
    # 0: the generated numerics (x kept in float32 through the output)
    # 1: the deviations kept instead of x (x dies once they are formed)
    # 2: the row as two halves, the output written half by half (weight and bias of one half live)
    # 3: x kept as its raw 16-bit pattern, widened again for the output
    row = tl.program_id(0)
    HALF: tl.constexpr = BLOCK_N // 2
    if FORM == 2:
        lo = tl.arange(0, HALF)
        hi = HALF + tl.arange(0, HALF)
        x_lo = tl.load(x_ptr + row * stride + lo).to(tl.float32)
        x_hi = tl.load(x_ptr + row * stride + hi).to(tl.float32)
        mean = (tl.sum(x_lo, 0) + tl.sum(x_hi, 0)) / BLOCK_N
        d_lo = x_lo - mean
        d_hi = x_hi - mean
        rstd = tl.rsqrt((tl.sum(d_lo * d_lo, 0) + tl.sum(d_hi * d_hi, 0)) / BLOCK_N + eps)
        y_lo = d_lo * rstd * tl.load(w_ptr + lo).to(tl.float32) + tl.load(b_ptr + lo).to(tl.float32)
        tl.store(out_ptr + row * stride + lo, y_lo.to(out_ptr.dtype.element_ty))
        y_hi = d_hi * rstd * tl.load(w_ptr + hi).to(tl.float32) + tl.load(b_ptr + hi).to(tl.float32)
        tl.store(out_ptr + row * stride + hi, y_hi.to(out_ptr.dtype.element_ty))
    else:
        cols = tl.arange(0, BLOCK_N)
        offs = row * stride + cols
        raw = tl.load(x_ptr + offs)
        x = raw.to(tl.float32)
        mean = tl.sum(x, 0) / BLOCK_N
        dev = x - mean
        if FORM == 1:
            rstd = tl.rsqrt(tl.sum(dev * dev, 0) / BLOCK_N + eps)
            y = dev
        else:
            correction, m2 = tl.reduce((dev, dev * dev), 0, add_pairs)
            mean += correction / BLOCK_N
            rstd = tl.rsqrt(m2 / BLOCK_N + eps)
            if FORM == 3:
                bits = raw.to(tl.int16, bitcast=True)
                y = bits.to(out_ptr.dtype.element_ty, bitcast=True).to(tl.float32) - mean
            else:
                y = x - mean
        w = tl.load(w_ptr + cols).to(tl.float32)
        b = tl.load(b_ptr + cols).to(tl.float32)
        tl.store(out_ptr + offs, (y * rstd * w + b).to(out_ptr.dtype.element_ty))


@triton.jit
def rms_norm_kernel(x_ptr, w_ptr, out_ptr, stride, eps, BLOCK_M: tl.constexpr,
                    BLOCK_N: tl.constexpr, LOAD: tl.constexpr, STORE: tl.constexpr = ""):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)[:, None]
    cols = tl.arange(0, BLOCK_N)[None, :]
    offs = rows * stride + cols
    x = tl.load(x_ptr + offs, eviction_policy=LOAD).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, 1, keep_dims=True) / BLOCK_N + eps)
    w = tl.load(w_ptr + cols).to(tl.float32)
    tl.store(out_ptr + offs, (x * rstd * w).to(out_ptr.dtype.element_ty), eviction_policy=STORE)


@triton.jit
def norm_persistent_kernel(x_ptr, w_ptr, b_ptr, out_ptr, n_rows, stride, eps,
                           BLOCK_N: tl.constexpr, LAYER: tl.constexpr, STAGES: tl.constexpr):
    # weight (and bias) read once a program and kept in registers; rows in a grid-stride loop
    cols = tl.arange(0, BLOCK_N)
    w = tl.load(w_ptr + cols).to(tl.float32)
    if LAYER:
        b = tl.load(b_ptr + cols).to(tl.float32)
    for row in tl.range(tl.program_id(0), n_rows, tl.num_programs(0), num_stages=STAGES):
        offs = row * stride + cols
        x = tl.load(x_ptr + offs).to(tl.float32)
        if LAYER:
            mean = tl.sum(x, 0) / BLOCK_N
            dev = x - mean
            rstd = tl.rsqrt(tl.sum(dev * dev, 0) / BLOCK_N + eps)
            y = dev * rstd * w + b
        else:
            y = x * tl.rsqrt(tl.sum(x * x, 0) / BLOCK_N + eps) * w
        tl.store(out_ptr + offs, y.to(out_ptr.dtype.element_ty))


@triton.jit
def rms_norm_looped_kernel(x_ptr, w_ptr, out_ptr, eps, N: tl.constexpr, BLOCK_N: tl.constexpr,
                           STORE: tl.constexpr = ""):
    # Inductor's looped form for long rows (one row a program, sizes as constants, no masks):
    # squares summed per lane, then a second read of the row (from L2) for the outputs
    row = x_ptr + tl.program_id(0).to(tl.int64) * N
    out_row = out_ptr + tl.program_id(0).to(tl.int64) * N
    acc = tl.zeros([BLOCK_N], tl.float32)
    for start in range(0, N, BLOCK_N):
        x = tl.load(row + start + tl.arange(0, BLOCK_N), eviction_policy="evict_last")
        acc += x.to(tl.float32) * x.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(acc, 0) / N + eps)
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        x = tl.load(row + cols, eviction_policy="evict_first").to(tl.float32)
        w = tl.load(w_ptr + cols, eviction_policy="evict_last").to(tl.float32)
        tl.store(out_row + cols, (x * rstd * w).to(out_ptr.dtype.element_ty), eviction_policy=STORE)


@triton.jit
def _rms_norm_row(x_ptr, w_ptr, out_ptr, row, eps, n, BLOCK_N: tl.constexpr, MASKS: tl.constexpr):
    x_row = x_ptr + row * n.to(tl.int64)
    out_row = out_ptr + row * n.to(tl.int64)
    acc = tl.zeros([BLOCK_N], tl.float32)
    for start in range(0, n, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        if MASKS:
            mask = cols < n
            x = tl.load(x_row + cols, mask=mask, other=0.0, eviction_policy="evict_last")
            acc += tl.where(mask, x.to(tl.float32) * x.to(tl.float32), 0.0)
        else:
            x = tl.load(x_row + cols, eviction_policy="evict_last")
            acc += x.to(tl.float32) * x.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(acc, 0) / n + eps)
    for start in range(0, n, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        if MASKS:
            mask = cols < n
            x = tl.load(x_row + cols, mask=mask, other=0.0, eviction_policy="evict_first")
            w = tl.load(w_ptr + cols, mask=mask, other=0.0)
            tl.store(out_row + cols, (x.to(tl.float32) * rstd * w.to(tl.float32)).to(out_ptr.dtype.element_ty),
                     mask=mask)
        else:
            x = tl.load(x_row + cols, eviction_policy="evict_first")
            w = tl.load(w_ptr + cols, eviction_policy="evict_last")
            tl.store(out_row + cols, (x.to(tl.float32) * rstd * w.to(tl.float32)).to(out_ptr.dtype.element_ty))


@triton.jit
def rms_norm_variant_kernel(x_ptr, w_ptr, out_ptr, n_rows, n, eps, BLOCK_N: tl.constexpr,
                            ROW_LOOP: tl.constexpr, MASKS: tl.constexpr):
    # what separates the generated looped kernel from the probe: a runtime row length (no
    # unrolling), the grid-stride row loop, masks
    if ROW_LOOP:
        for row in range(tl.program_id(0), n_rows, tl.num_programs(0)):
            _rms_norm_row(x_ptr, w_ptr, out_ptr, row, eps, n, BLOCK_N, MASKS)
    else:
        _rms_norm_row(x_ptr, w_ptr, out_ptr, tl.program_id(0), eps, n, BLOCK_N, MASKS)


@triton.jit
def rowsum_kernel(x_ptr, out_ptr, stride, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  LOAD: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs = rows[:, None] * stride + tl.arange(0, BLOCK_N)[None, :]
    x = tl.load(x_ptr + offs, eviction_policy=LOAD).to(tl.float32)
    tl.store(out_ptr + rows, tl.sum(x, 1).to(out_ptr.dtype.element_ty))


@triton.jit
def rowsum_persistent_kernel(x_ptr, out_ptr, n_rows, stride, BLOCK_M: tl.constexpr,
                             BLOCK_N: tl.constexpr):
    # a grid of a few programs per SM, each looping over row blocks (Triton may pipeline the loads)
    for block in range(tl.program_id(0), n_rows // BLOCK_M, tl.num_programs(0)):
        rows = block * BLOCK_M + tl.arange(0, BLOCK_M)
        offs = rows[:, None] * stride + tl.arange(0, BLOCK_N)[None, :]
        x = tl.load(x_ptr + offs, eviction_policy="evict_first").to(tl.float32)
        tl.store(out_ptr + rows, tl.sum(x, 1).to(out_ptr.dtype.element_ty))


@triton.jit
def lse_chunkmax_kernel(x_ptr, lse_ptr, n_rows, n_cols, stride, BLOCK_V: tl.constexpr):
    for row in range(tl.program_id(0), n_rows, tl.num_programs(0)):
        start = x_ptr + row * stride.to(tl.int64)
        row_max = tl.full([], float("-inf"), tl.float32)
        lane_sum = tl.zeros([BLOCK_V], tl.float32)
        for col in range(0, n_cols, BLOCK_V):
            cols = col + tl.arange(0, BLOCK_V)
            x = tl.load(start + cols, mask=cols < n_cols, other=float("-inf")).to(tl.float32)
            new_max = tl.maximum(row_max, tl.max(x, 0))
            shift = tl.where(new_max == float("-inf"), 0.0, new_max) * LOG2E
            lane_sum = lane_sum * tl.exp2(row_max * LOG2E - shift) + tl.exp2(x * LOG2E - shift)
            row_max = new_max
        tl.store(lse_ptr + row, row_max + tl.log(tl.sum(lane_sum, 0)))


@triton.jit
def lse_lane_kernel(x_ptr, lse_ptr, n_rows, n_cols, stride, BLOCK_V: tl.constexpr,
                    EVEN: tl.constexpr):
    # per-lane running max and sum, one exp per element: the smaller of (max, x) minus the larger
    for row in range(tl.program_id(0), n_rows, tl.num_programs(0)):
        start = x_ptr + row * stride.to(tl.int64)
        lane_max = tl.full([BLOCK_V], -3.0e38, tl.float32)
        lane_sum = tl.zeros([BLOCK_V], tl.float32)
        for col in range(0, n_cols, BLOCK_V):
            cols = col + tl.arange(0, BLOCK_V)
            if EVEN:
                x = tl.load(start + cols).to(tl.float32)
            else:
                x = tl.load(start + cols, mask=cols < n_cols, other=float("-inf")).to(tl.float32)
            bigger = x > lane_max
            e = tl.exp2((tl.minimum(lane_max, x) - tl.maximum(lane_max, x)) * LOG2E)
            lane_sum = tl.where(bigger, lane_sum * e + 1.0, lane_sum + e)
            lane_max = tl.maximum(lane_max, x)
        row_max = tl.max(lane_max, 0)
        total = tl.sum(lane_sum * tl.exp2((lane_max - row_max) * LOG2E), 0)
        tl.store(lse_ptr + row, row_max + tl.log(total))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--part", action="append", choices=PARTS)
    parts = set(parser.parse_args().part or PARTS)
    print("device", torch.cuda.get_device_name(), "torch", torch.__version__, "triton",
          triton.__version__, flush=True)
    copy_gbps = measure_copy_bandwidth()
    print(f"copy 1 GiB: {copy_gbps:.0f} GB/s", flush=True)
    sets = [(torch.randn(ROWS, N, device="cuda", dtype=DTYPE),
             torch.empty(ROWS, N, device="cuda", dtype=DTYPE)) for _ in range(2)]
    nbytes = 2 * ROWS * N * DTYPE.itemsize

    def line(label, us, moved=nbytes):
        print(f"{label:60s} {us:7.1f} us  {moved / us / 1e3:6.0f} GB/s  "
              f"{100 * moved / us / 1e3 / copy_gbps:4.0f}% copy", flush=True)

    import generated

    vectors = [torch.randn(N, device="cuda", dtype=DTYPE) for _ in range(2)]
    if "rowwise" in parts:
        tiles = ((1, 1), (2, 1), (4, 1), (1, 2), (2, 4), (4, 8))
        for (bm, warps), load in itertools.product(tiles, ("", "evict_first")):
            grid = (ROWS // bm,)
            tag = f"BM={bm} w={warps} load={load or '-'}"
            line(f"softmax probe {tag}",
                 bench_us(lambda x, o: softmax_kernel[grid](x, o, N, bm, N, load, "",
                                                            num_warps=warps), sets))
            line(f"layer_norm probe {tag}",
                 bench_us(lambda x, o: layer_norm_kernel[grid](x, *vectors, o, N, 1e-5, bm, N, load,
                                                               num_warps=warps), sets))
            line(f"rms_norm probe {tag}",
                 bench_us(lambda x, o: rms_norm_kernel[grid](x, vectors[0], o, N, 1e-6, bm, N, load,
                                                             num_warps=warps), sets))
    if "persist" in parts:
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        for layer in (True, False):
            name = "layer_norm" if layer else "rms_norm"
            line(f"{name} probe BM=1 w=2 (one row a program)",
                 bench_us(lambda x, o: (layer_norm_kernel if layer else rms_norm_kernel)[(ROWS,)](
                     x, *(vectors if layer else vectors[:1]), o, N, 1e-5, 1, N, "", num_warps=2),
                     sets))
            for per_sm, warps, stages in itertools.product((8, 16, 32), (2, 4), (1, 2, 3)):
                if per_sm * warps > 64:
                    continue
                grid = (per_sm * sms,)
                line(f"{name} persistent {per_sm}/SM w={warps} stages={stages}",
                     bench_us(lambda x, o: norm_persistent_kernel[grid](
                         x, *vectors, o, ROWS, N, 1e-5, N, layer, stages, num_warps=warps), sets))
    if "lnforms" in parts:
        forms = {"two reductions, vectors after": (False, False, True),
                 "two reductions, vectors first": (True, False, True),
                 "one reduction, vectors after": (False, True, True),
                 "one reduction, vectors first": (True, True, True),
                 "two reductions, no vectors": (False, False, False)}
        for round_, warps in itertools.product(range(3), (2, 4)):
            for label, flags in forms.items():
                line(f"round {round_} layer_norm {label} w={warps}",
                     bench_us(lambda x, o: layer_norm_form_kernel[(ROWS,)](
                         x, *vectors, o, N, 1e-5, N, *flags, num_warps=warps), sets))
            line(f"round {round_} softmax probe w={warps}",
                 bench_us(lambda x, o: softmax_kernel[(ROWS,)](x, o, N, 1, N, "", "",
                                                               num_warps=warps), sets))
            line(f"round {round_} rms_norm probe w={warps}",
                 bench_us(lambda x, o: rms_norm_kernel[(ROWS,)](x, vectors[0], o, N, 1e-6, 1, N, "",
                                                                num_warps=warps), sets))
    if "stores" in parts:
        policies = (("", ""), ("evict_first", ""), ("", "evict_first"),
                    ("evict_first", "evict_first"), ("", "evict_last"), ("evict_last", ""),
                    ("evict_last", "evict_first"))
        long_rows, long_n = N, ROWS   # 1024 x 32768
        long_sets = [(torch.randn(long_rows, long_n, device="cuda", dtype=DTYPE),
                      torch.empty(long_rows, long_n, device="cuda", dtype=DTYPE)) for _ in range(2)]
        w_long = torch.randn(long_n, device="cuda", dtype=DTYPE)
        for round_ in range(3):
            line(f"round {round_} torch copy", bench_us(lambda x, o: o.copy_(x), sets))
            for load, store in policies:
                tag = f"load={load or '-'} store={store or '-'}"
                line(f"round {round_} copy {tag}",
                     bench_us(lambda x, o: copy_kernel[(x.numel() // 4096,)](
                         x, o, 4096, load, store, num_warps=8), sets))
                line(f"round {round_} softmax {tag}",
                     bench_us(lambda x, o: softmax_kernel[(ROWS,)](x, o, N, 1, N, load, store,
                                                                   num_warps=2), sets))
                line(f"round {round_} layer_norm {tag}",
                     bench_us(lambda x, o: layer_norm_kernel[(ROWS,)](
                         x, *vectors, o, N, 1e-5, 1, N, load, store, num_warps=2), sets))
                line(f"round {round_} rms_norm {tag}",
                     bench_us(lambda x, o: rms_norm_kernel[(ROWS,)](
                         x, vectors[0], o, N, 1e-6, 1, N, load, store, num_warps=2), sets))
            for store in ("", "evict_first"):
                line(f"round {round_} rms_norm 1024x32768 looped 8192 w=32 store={store or '-'}",
                     bench_us(lambda x, o: rms_norm_looped_kernel[(long_rows,)](
                         x, w_long, o, 1e-6, long_n, 8192, store, num_warps=32), long_sets))
        long_sets = None
    if "lnregs" in parts:
        forms = ("generated numerics", "deviations kept", "halves", "raw x kept")
        for form, label in enumerate(forms):
            built = layer_norm_regs_kernel[(ROWS,)](*sets[0][:1], *vectors, sets[0][1], N, 1e-5, N,
                                                    form, num_warps=2)
            x, out = sets[0]
            ref = F.layer_norm(x.double(), (N,), *(v.double() for v in vectors), 1e-5)
            err = ((out.double() - ref).norm() / ref.norm()).item()
            print(f"layer_norm {label}: {built.n_regs} registers, {built.n_spills} spills, "
                  f"error {err:.1e}", flush=True)
        for round_ in range(3):
            line(f"round {round_} torch copy", bench_us(lambda x, o: o.copy_(x), sets))
            for form, label in enumerate(forms):
                line(f"round {round_} layer_norm {label}",
                     bench_us(lambda x, o: layer_norm_regs_kernel[(ROWS,)](
                         x, *vectors, o, N, 1e-5, N, form, num_warps=2), sets))
    if "maxnreg" in parts:
        launchers = {
            "softmax": lambda x, o, **kw: softmax_kernel[(ROWS,)](x, o, N, 1, N, "", "", **kw),
            "layer_norm": lambda x, o, **kw: layer_norm_kernel[(ROWS,)](x, *vectors, o, N, 1e-5, 1,
                                                                        N, "", **kw),
            "rms_norm": lambda x, o, **kw: rms_norm_kernel[(ROWS,)](x, vectors[0], o, N, 1e-6, 1, N,
                                                                    "", **kw),
        }
        caps = (None, 24, 32, 40)
        for name, launch in launchers.items():
            for cap in caps:
                built = launch(*sets[0], num_warps=2, maxnreg=cap)
                print(f"{name} maxnreg={cap}: {built.n_regs} registers, {built.n_spills} spills",
                      flush=True)
        for round_ in range(3):
            line(f"round {round_} torch copy", bench_us(lambda x, o: o.copy_(x), sets))
            for (name, launch), cap in itertools.product(launchers.items(), caps):
                line(f"round {round_} {name} w=2 maxnreg={cap}",
                     bench_us(lambda x, o: launch(x, o, num_warps=2, maxnreg=cap), sets))
    if "copytiles" in parts:
        tiles = [(block, warps) for block, warps in itertools.product(
            (1024, 2048, 4096, 8192, 16384), (1, 2, 4, 8, 16)) if 8 <= block // (32 * warps) <= 64]
        for round_ in range(3):
            line(f"round {round_} torch copy", bench_us(lambda x, o: o.copy_(x), sets))
            for block, warps in tiles:
                line(f"round {round_} triton copy BLOCK={block} w={warps} "
                     f"({block // (32 * warps)} a thread)",
                     bench_us(lambda x, o: copy_kernel[(x.numel() // block,)](
                         x, o, block, "", "", num_warps=warps), sets))
    if "warps" in parts:
        square = [(torch.randn(4096, 4096, device="cuda", dtype=DTYPE),
                   torch.empty(4096, 4096, device="cuda", dtype=DTYPE)) for _ in range(2)]
        square_vectors = [torch.randn(4096, device="cuda", dtype=DTYPE) for _ in range(2)]
        shapes = (("32768x1024", sets, vectors, (1, 2, 4)),
                  ("4096x4096", square, square_vectors, (4, 8, 16)))
        for round_ in range(3):
            for label, shape_sets, vecs, warp_counts in shapes:
                rows, n = shape_sets[0][0].shape
                moved = 2 * rows * n * DTYPE.itemsize
                line(f"round {round_} {label} torch copy", bench_us(lambda x, o: o.copy_(x),
                                                                   shape_sets), moved)
                for warps in warp_counts:
                    line(f"round {round_} {label} softmax w={warps}",
                         bench_us(lambda x, o: softmax_kernel[(rows,)](
                             x, o, n, 1, n, "", "", num_warps=warps), shape_sets), moved)
                    line(f"round {round_} {label} layer_norm w={warps}",
                         bench_us(lambda x, o: layer_norm_kernel[(rows,)](
                             x, *vecs, o, n, 1e-5, 1, n, "", num_warps=warps), shape_sets), moved)
                    line(f"round {round_} {label} rms_norm w={warps}",
                         bench_us(lambda x, o: rms_norm_kernel[(rows,)](
                             x, vecs[0], o, n, 1e-6, 1, n, "", num_warps=warps), shape_sets), moved)
                line(f"round {round_} {label} generated layer_norm",
                     bench_us(lambda x, o: generated.layer_norm(x, [n], *vecs), shape_sets), moved)
        square = None
    if "ops" in parts:
        ops = {
            "softmax": (lambda x, o: generated.softmax(x, -1), lambda x, o: torch.softmax(x, -1)),
            "layer_norm": (lambda x, o: generated.layer_norm(x, [N], *vectors),
                           lambda x, o: F.layer_norm(x, (N,), *vectors)),
            "rms_norm": (lambda x, o: generated.rms_norm(x, [N], vectors[0]),
                         lambda x, o: F.rms_norm(x, (N,), vectors[0])),
        }
        for name, (ours, eager) in ops.items():
            line(f"{name} specgen", bench_us(ours, sets))
            line(f"{name} compile", bench_us(torch.compile(eager, dynamic=False), sets))
            torch._dynamo.reset()

    if "repeat" in parts:
        # the same variants three times over, interleaved: how much a number moves between runs
        wide_sums = [(x, torch.empty(N, device="cuda", dtype=DTYPE)) for x, _ in sets]
        for round_ in range(3):
            for name, ours, probe in (
                    ("softmax", lambda x, o: generated.softmax(x, -1),
                     lambda x, o: softmax_kernel[(ROWS,)](x, o, N, 1, N, "", "", num_warps=2)),
                    ("layer_norm", lambda x, o: generated.layer_norm(x, [N], *vectors),
                     lambda x, o: layer_norm_kernel[(ROWS,)](x, *vectors, o, N, 1e-5, 1, N, "",
                                                            num_warps=2)),
                    ("rms_norm", lambda x, o: generated.rms_norm(x, [N], vectors[0]),
                     lambda x, o: rms_norm_kernel[(ROWS,)](x, vectors[0], o, N, 1e-6, 1, N, "",
                                                          num_warps=2))):
                line(f"round {round_} {name} specgen", bench_us(ours, sets))
                line(f"round {round_} {name} probe BM=1 w=2", bench_us(probe, sets))
            line(f"round {round_} sum(x, 0) specgen",
                 bench_us(lambda x, o: generated.sum(x, 0), wide_sums), ROWS * N * DTYPE.itemsize)
        compiled = torch.compile(lambda x, o: torch.sum(x, 0), dynamic=False)
        line("sum(x, 0) compile", bench_us(compiled, wide_sums), ROWS * N * DTYPE.itemsize)
        torch._dynamo.reset()
    if "long" in parts:
        from specgen.runtime import rowwise
        launch_state = importlib.import_module("specgen.runtime.launch")

        rows, n = N, ROWS   # 1024 x 32768
        long_sets = [(torch.randn(rows, n, device="cuda", dtype=DTYPE),
                      torch.empty(rows, n, device="cuda", dtype=DTYPE)) for _ in range(2)]
        weight = torch.randn(n, device="cuda", dtype=DTYPE)
        ours = lambda x, o: generated.rms_norm(x, [n], weight)  # noqa: E731
        line("rms_norm 1024x32768 specgen auto", bench_us(ours, long_sets))
        # the generated looped kernel started directly at fixed configs (a forced override would
        # take the uncached host path: its time would be Python's)
        module = importlib.import_module("generated.rms_norm")
        plan = rowwise.launch_plan("rms_norm", "auto", module.STRATEGIES, "auto", module.MAX_BLOCK,
                                   module.MAX_CHUNK, False, long_sets[0][0], (1,),
                                   [long_sets[0][1], long_sets[0][0]], [weight], [],
                                   module.LAUNCH_TENSORS)
        space = plan.space
        for block, warps in ((16384, 32), (8192, 32), (4096, 16)):
            def direct(x, o, block=block, warps=warps):
                module._rms_norm_looped_kernel.fn[(rows,)](
                    x, weight, o, space.rows, space.n, *space.kernel_args(), 1e-6,
                    HAS_WEIGHT=True, ROW_DIMS=1, COL_DIMS=1, BLOCK_M=1, BLOCK_N=block,
                    ROW_LOOP=plan.row_loop, **plan.masks, INDEX_64=False, num_warps=warps,
                    num_stages=1)
            line(f"rms_norm 1024x32768 generated looped BLOCK_N={block} w={warps}",
                 bench_us(direct, long_sets))
        print("autotuned:", {k[0].fn.__name__: v for k, v in launch_state._tuned.items()}, flush=True)
        for block, warps in ((16384, 32), (8192, 32), (8192, 16), (4096, 16)):
            line(f"rms_norm 1024x32768 probe looped BLOCK_N={block} w={warps}",
                 bench_us(lambda x, o: rms_norm_looped_kernel[(rows,)](x, weight, o, 1e-6, n, block,
                                                                       num_warps=warps),
                          long_sets))
        for (block, warps), row_loop, masks, const_n in itertools.product(
                ((16384, 32), (8192, 32)), (False, True), (False, True), (False, True)):
            if const_n:
                if row_loop or masks:
                    continue
                fn = lambda x, o: rms_norm_looped_kernel[(rows,)](  # noqa: E731
                    x, weight, o, 1e-6, n, block, num_warps=warps)
            else:
                fn = lambda x, o: rms_norm_variant_kernel[(rows,)](  # noqa: E731
                    x, weight, o, rows, n, 1e-6, block, row_loop, masks, num_warps=warps)
            line(f"rms_norm variant BLOCK_N={block} w={warps} const_n={const_n} "
                 f"row_loop={row_loop} masks={masks}", bench_us(fn, long_sets))
        compiled = torch.compile(lambda x, o: F.rms_norm(x, (n,), weight), dynamic=False)
        line("rms_norm 1024x32768 compile", bench_us(compiled, long_sets))
        torch._dynamo.reset()
        long_sets = None
        # few long rows (split): three rounds, the split kernels' tuned configs
        few = [(torch.randn(8, 262144, device="cuda", dtype=DTYPE), None) for _ in range(8)]
        w_long, b_long = (torch.randn(262144, device="cuda", dtype=DTYPE) for _ in range(2))
        for round_ in range(3):
            line(f"round {round_} layer_norm 8x262144 specgen",
                 bench_us(lambda x, o: generated.layer_norm(x, [262144], w_long, b_long), few),
                 2 * 8 * 262144 * 2)
        print("autotuned:", {k[0].fn.__name__: v for k, v in launch_state._tuned.items()
                             if "layer_norm" in k[0].fn.__name__}, flush=True)

    red_bytes = ROWS * N * DTYPE.itemsize
    sums = [(x, torch.empty(ROWS, device="cuda", dtype=DTYPE)) for x, _ in sets]
    if "rowsum" in parts:
        tiles = ((1, 1), (2, 1), (4, 1), (8, 1), (4, 2), (4, 4), (8, 4), (4, 8), (16, 16))
        for (bm, warps), load in itertools.product(tiles, ("", "evict_first")):
            line(f"rowsum probe BM={bm} w={warps} load={load or '-'}",
                 bench_us(lambda x, o: rowsum_kernel[(ROWS // bm,)](x, o, N, bm, N, load,
                                                                    num_warps=warps), sums),
                 red_bytes)
    if "rowsum" in parts:
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        for (bm, warps), per_sm, stages in itertools.product(((4, 4), (8, 8), (16, 8)), (4, 8, 16),
                                                             (1, 3)):
            grid = (per_sm * sms,)
            line(f"rowsum persistent BM={bm} w={warps} {per_sm}/SM stages={stages}",
                 bench_us(lambda x, o: rowsum_persistent_kernel[grid](x, o, ROWS, N, bm, N,
                                                                      num_warps=warps,
                                                                      num_stages=stages), sums),
                 red_bytes)
        # the read ceiling: the same kernel over 1 GiB, where the flush's write-back is small
        big = [(torch.randn(ROWS * 16, N, device="cuda", dtype=DTYPE),
                torch.empty(ROWS * 16, device="cuda", dtype=DTYPE))]
        line("rowsum probe 1 GiB BM=4 w=4 load=evict_first",
             bench_us(lambda x, o: rowsum_kernel[(ROWS * 4,)](x, o, N, 4, N, "evict_first",
                                                              num_warps=4), big), red_bytes * 16)
        big = None
    if "ops" in parts:
        line("sum(x, -1) specgen", bench_us(lambda x, o: generated.sum(x, -1), sums), red_bytes)
        line("sum(x, -1) compile", bench_us(torch.compile(lambda x, o: torch.sum(x, -1)), sums),
             red_bytes)
        line("sum(x, 0) specgen", bench_us(lambda x, o: generated.sum(x, 0), sums), red_bytes)
        line("sum(x, 0) compile", bench_us(torch.compile(lambda x, o: torch.sum(x, 0)), sums),
             red_bytes)
        torch._dynamo.reset()
    sets = sums = None
    torch.cuda.empty_cache()

    if "lse" in parts:
        rows, vocab = 4096, 128256
        logits = torch.randn(rows, vocab, device="cuda", dtype=DTYPE)
        lse = torch.empty(rows, device="cuda", dtype=torch.float32)
        ref = torch.logsumexp(logits.float(), -1)
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        ce_bytes = logits.numel() * DTYPE.itemsize
        variants = [("lane", block, warps, per_sm) for block, warps, per_sm in itertools.product(
            (1024, 2048, 4096), (4, 8, 16), (8, 16, 32)) if block // (32 * warps) >= 8]
        # the chunk-max form, at its best settings of the first probe (8192 x 8 warps, 8 per SM)
        variants += [("chunkmax", block, 8, 8) for block in (4096, 8192)]
        for kernel, block, warps, per_sm in variants:
            grid = (min(rows, per_sm * sms),)
            if kernel == "lane":
                fn = lambda: lse_lane_kernel[grid](logits, lse, rows, vocab, vocab, block,  # noqa
                                                   vocab % block == 0, num_warps=warps)
            else:
                fn = lambda: lse_chunkmax_kernel[grid](logits, lse, rows, vocab, vocab,  # noqa
                                                       block, num_warps=warps)
            lse.fill_(float("nan"))
            fn()
            err = ((lse - ref).abs().max() / ref.abs().max()).item()
            us = triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e3
            line(f"lse {kernel} BLOCK_V={block} w={warps} {per_sm}/SM (err {err:.1e})", us,
                 ce_bytes)

if __name__ == "__main__":
    main()

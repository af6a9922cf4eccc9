"""Probe for issue 39 at M = 16 to 256: int4 weight-only tiles with B's nibbles interleaved.

At M = 256 N = K = 4096 the generated int4_weight_linear took 42.8 us against bf16 F.linear's
23.8 (H200, 2026-11-29 02:14), the target being parity, when its tile kernel split A's tile
into the columns that meet each nibble place (a reshape and split of A in registers, two dots
of half K) and computed each weight value in float32 (225-255 registers at its frozen configs
by ptxas, 172 bytes of spills for int8's). The generated kernel has since taken the ``join``
form below, in float32 (docs/performance.md, item 001e: 38.1 us). The forms timed here:

- ``join``: A's tile as loaded (the compiler may pipeline it into shared memory untouched), the
  two nibble tiles of B joined and interleaved back into K order, one dot of BLOCK_K;
- ``split``: A split as the generated kernel does, two dots of BLOCK_K // 2;
- ``swap`` (``--swap``): the transposed product, out.T = W @ x.T, whose first operand wgmma
  reads from registers, where the dequantization leaves the weight tile; the joined form
  stores each dequantized tile to shared memory and waits for it every step (by ptxas for
  sm_90a, triton 3.8 on a CPU machine: 20 st.shared in the joined 256 x 128 x 64 on 8 warps,
  216 registers; none in the swapped one, m64n256k16 with a register A, 230 registers; 128 x
  128 147; the 16-token 16 x 64 x 128 m64n16k16, 128; no spills);

each with the weights dequantized (``DEQUANT``) in the activations' 16-bit dtype, the nibbles
made floats by an OR into the mantissa of 128 (bf16) or 1024 (fp16) ("magic") or by a
conversion ("cvt"): q - z is an exact small integer there, so ``(q - z) * s`` rounds once, as
the float32 form rounding to bf16 does; or in float32, then rounded ("f32": the generated
kernel's way, which a spec's dequant expression needs where it is not exact in 16 bits).
``SPLIT_K`` programs a tile add their shares of K atomically into a zeroed float32 result (the
generated op splits K by 4 at M = 256: 256 x 4096 has 32 of its 256 x 128 tiles). ptxas
(sm_90a, triton 3.8, on a CPU machine) gave 128 x 128 x 64 on 8 warps 124 registers joined in
16 bits, 128 joined in float32, 181 split in float32; 256 x 128 x 64 (the generated op's
frozen tile) 237 joined in float32 against 255 and 20 bytes of spills split. Every variant is
checked against the dequantized weight's product before it is timed (CUDA graphs, inputs
rotating past L2, as sweep_matmul times), next to cuBLAS's bf16 linear of the dequantized
weight and the generated op. int8_weight_linear at
M = 256 (33.3 us, 0.71x bf16) in the generated kernel's form over a config sweep: its frozen
128 x 128 x 64 on 4 warps takes 255 registers and spills, by ptxas.

    PYTHONPATH=. python3 tools/perf/probe_int4_tile.py          # GPU: M = 256 (int4, int8), 64, 16
    PYTHONPATH=. python3 tools/perf/probe_int4_tile.py --swap   # GPU: the swapped form, int4
    TRITON_INTERPRET=1 PYTHONPATH=. python3 tools/perf/probe_int4_tile.py --check   # correctness
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import sys
import time

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(__file__))
import sweep_matmul as sweep  # noqa: E402  (the rotation, timing and inputs of the matmul sweep)
# the 16-bit dequantization, the result's store
from probe_int4_gemv import dequantized_nibbles, store_or_add  # noqa: E402

import generated  # noqa: E402
from bench.quant import GROUP_SIZE  # noqa: E402
from specgen import quant  # noqa: E402


@triton.jit
def _grouped_tile(M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """This program's (row block, column block): row blocks in groups of GROUP_M, column-major
    inside a group, so that neighbours share B's tiles."""
    pid = tl.program_id(0)
    blocks_m = tl.cdiv(M, BLOCK_M)
    in_group = GROUP_M * (N // BLOCK_N)
    first_m = pid // in_group * GROUP_M
    rows_of_group = tl.minimum(blocks_m - first_m, GROUP_M)
    return first_m + (pid % in_group) % rows_of_group, (pid % in_group) // rows_of_group


@triton.jit
def _tile_start(M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                GROUP_M: tl.constexpr, SPLIT_K: tl.constexpr):
    """This program's tile and share of K (SPLIT_K programs a tile): the share's length and
    first element, the tile's rows, their mask, its columns and the first step's K offsets."""
    pid_m, pid_n = _grouped_tile(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    share = K // SPLIT_K
    k_first = tl.program_id(1) * share
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    return share, k_first, offs_m, offs_m < M, offs_n, k_first + tl.arange(0, BLOCK_K)


@triton.jit
def _int4_start(x_ptr, M, N, K, x_stride_m, GROUP: tl.constexpr, BLOCK_M: tl.constexpr,
                BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                SPLIT_K: tl.constexpr):
    """``_tile_start`` for a packed int4 B (whole groups a K block): the share's length and
    first element, the tile's rows, their mask, its columns, the first step's bytes of B along K
    and A's tile pointers."""
    tl.static_assert(GROUP % BLOCK_K == 0)
    share, k_first, offs_m, mask_m, offs_n, offs_k = _tile_start(M, N, K, BLOCK_M, BLOCK_N,
                                                                 BLOCK_K, GROUP_M, SPLIT_K)
    offs_byte = k_first // 2 + tl.arange(0, BLOCK_K // 2)
    x_ptrs = x_ptr + offs_m[:, None] * x_stride_m + offs_k[None, :]
    return share, k_first, offs_m, mask_m, offs_n, offs_byte, x_ptrs


@triton.jit
def _int4_tile_kernel(x_ptr, q_ptr, scales_ptr, zeros_ptr, out_ptr, M, N, K,
                      x_stride_m, q_stride_n, group_stride_n, out_stride_m,
                      GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, STAGES: tl.constexpr,
                      DEQUANT: tl.constexpr, JOIN: tl.constexpr, SPLIT_K: tl.constexpr):
    DTYPE: tl.constexpr = x_ptr.dtype.element_ty
    # this program's share of K (SPLIT_K programs a tile, their sums added atomically)
    share, k_first, offs_m, mask_m, offs_n, offs_byte, x_ptrs = _int4_start(
        x_ptr, M, N, K, x_stride_m, GROUP, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, SPLIT_K)
    # B's bytes K-major in the tile, (BLOCK_K // 2, BLOCK_N), as tl.dot takes B
    q_ptrs = q_ptr + offs_n[None, :] * q_stride_n + offs_byte[:, None]
    group_ptrs = offs_n * group_stride_n
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for k in tl.range(k_first, k_first + share, BLOCK_K, num_stages=STAGES):
        x = tl.load(x_ptrs, mask=mask_m[:, None], other=0.0)
        q_bytes = tl.load(q_ptrs)
        scales = tl.load(scales_ptr + group_ptrs + k // GROUP)[None, :]
        zeros = tl.load(zeros_ptr + group_ptrs + k // GROUP)[None, :]
        if DEQUANT == "f32":
            # as the generated kernel computes a value: in float32, then rounded to DTYPE
            scales = scales.to(tl.float32)
            zeros = zeros.to(tl.float32)
            w_low = (((q_bytes & 15).to(tl.float32) - zeros) * scales).to(DTYPE)
            w_high = (((q_bytes >> 4).to(tl.float32) - zeros) * scales).to(DTYPE)
        else:
            w_low, w_high = dequantized_nibbles(q_bytes, zeros, scales, DTYPE, DEQUANT == "magic")
        if JOIN:
            # element 2c is byte c's low nibble, 2c + 1 its high one: back into K order
            w = tl.reshape(tl.permute(tl.join(w_low, w_high), (0, 2, 1)), (BLOCK_K, BLOCK_N))
            acc = tl.dot(x, w, acc)
        else:
            x_low, x_high = tl.split(tl.reshape(x, (BLOCK_M, BLOCK_K // 2, 2)))
            acc = tl.dot(x_low, w_low, acc)
            acc = tl.dot(x_high, w_high, acc)
        x_ptrs += BLOCK_K
        q_ptrs += BLOCK_K // 2
    out_ptrs = out_ptr + offs_m[:, None] * out_stride_m + offs_n[None, :]
    store_or_add(out_ptrs, acc, mask_m[:, None], SPLIT_K)


@triton.jit
def _int4_swap_kernel(x_ptr, q_ptr, scales_ptr, zeros_ptr, out_ptr, M, N, K,
                      x_stride_m, q_stride_n, group_stride_n, out_stride_m,
                      GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, STAGES: tl.constexpr,
                      DEQUANT: tl.constexpr, SPLIT_K: tl.constexpr):
    """The transposed product, out.T = W @ x.T: the dequantized weight tile (BLOCK_N rows of W)
    is the dot's first operand, which wgmma reads from registers, where the dequantization left
    it; x's tile, as loaded (pipelined into shared memory), the second. The joined form instead
    stores each dequantized B tile to shared memory for wgmma and waits for it, every step.
    BLOCK_N is wgmma's 64-row unit (a warpgroup's), BLOCK_M the tokens (16 and up)."""
    DTYPE: tl.constexpr = x_ptr.dtype.element_ty
    share, k_first, offs_m, mask_m, offs_n, offs_byte, x_ptrs = _int4_start(
        x_ptr, M, N, K, x_stride_m, GROUP, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, SPLIT_K)
    # W's bytes as stored: BLOCK_N rows, K contiguous
    q_ptrs = q_ptr + offs_n[:, None] * q_stride_n + offs_byte[None, :]
    group_ptrs = offs_n * group_stride_n
    acc = tl.zeros((BLOCK_N, BLOCK_M), tl.float32)
    for k in tl.range(k_first, k_first + share, BLOCK_K, num_stages=STAGES):
        x = tl.load(x_ptrs, mask=mask_m[:, None], other=0.0)
        q_bytes = tl.load(q_ptrs)
        scales = tl.load(scales_ptr + group_ptrs + k // GROUP)[:, None]
        zeros = tl.load(zeros_ptr + group_ptrs + k // GROUP)[:, None]
        w_low, w_high = dequantized_nibbles(q_bytes, zeros, scales, DTYPE, DEQUANT == "magic")
        # element 2c is byte c's low nibble, 2c + 1 its high one: joined along a last dim, K order
        w = tl.reshape(tl.join(w_low, w_high), (BLOCK_N, BLOCK_K))
        acc = tl.dot(w, tl.trans(x), acc)
        x_ptrs += BLOCK_K
        q_ptrs += BLOCK_K // 2
    out_ptrs = out_ptr + offs_m[None, :] * out_stride_m + offs_n[:, None]
    store_or_add(out_ptrs, acc, mask_m[None, :], SPLIT_K)


@triton.jit
def _int8_tile_kernel(x_ptr, q_ptr, scales_ptr, out_ptr, M, N, K,
                      x_stride_m, q_stride_n, out_stride_m,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                      GROUP_M: tl.constexpr, STAGES: tl.constexpr, SPLIT_K: tl.constexpr):
    """int8_weight_linear's tile as the generated kernel computes it (the integers converted to
    the activations' dtype, one dot a step, the channel scales after the loop), to tell its
    frozen config's cost from its form's."""
    DTYPE: tl.constexpr = x_ptr.dtype.element_ty
    share, k_first, offs_m, mask_m, offs_n, offs_k = _tile_start(M, N, K, BLOCK_M, BLOCK_N,
                                                                 BLOCK_K, GROUP_M, SPLIT_K)
    x_ptrs = x_ptr + offs_m[:, None] * x_stride_m + offs_k[None, :]
    q_ptrs = q_ptr + offs_n[None, :] * q_stride_n + offs_k[:, None]
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for k in tl.range(k_first, k_first + share, BLOCK_K, num_stages=STAGES):
        x = tl.load(x_ptrs, mask=mask_m[:, None], other=0.0)
        q = tl.load(q_ptrs)
        acc = tl.dot(x, q.to(DTYPE), acc)
        x_ptrs += BLOCK_K
        q_ptrs += BLOCK_K
    acc = acc * tl.load(scales_ptr + offs_n)[None, :]
    out_ptrs = out_ptr + offs_m[:, None] * out_stride_m + offs_n[None, :]
    store_or_add(out_ptrs, acc, mask_m[:, None], SPLIT_K)


def tile8(x, qweight, scales, block_m, block_n, block_k, warps, stages, split_k=1):
    """x (M, K) @ the int8 weight's transpose (qweight (N, K), scales (N,)); ``split_k`` as
    ``tile``'s."""
    m, k = x.shape
    n = qweight.shape[0]
    assert n % block_n == 0 and k % (block_k * split_k) == 0
    assert x.stride(1) == qweight.stride(1) == 1 and scales.stride(0) == 1
    out = torch.empty(m, n, device=x.device, dtype=x.dtype) if split_k == 1 else \
        torch.zeros(m, n, device=x.device, dtype=torch.float32)
    grid = (triton.cdiv(m, block_m) * (n // block_n), split_k)
    _int8_tile_kernel[grid](
        x, qweight, scales, out, m, n, k, x.stride(0), qweight.stride(0), out.stride(0),
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, GROUP_M=8, STAGES=stages,
        SPLIT_K=split_k, num_warps=warps)
    return out if split_k == 1 else out.to(x.dtype)


def tile(x, qweight, scales, zeros, block_m, block_n, block_k, warps, stages, dequant, join,
         split_k=1):
    """x (M, K) @ the int4 weight's transpose (qweight (N, K // 2), scales and zeros (N, G));
    ``split_k`` programs a tile add their shares of K into a zeroed float32 result (the zeroing
    and the cast are in the time)."""
    m, k = x.shape
    n = qweight.shape[0]
    # what the kernel takes without masks or strides of its own
    assert n % block_n == 0 and k % (block_k * split_k) == 0 and GROUP_SIZE % block_k == 0
    assert x.stride(1) == qweight.stride(1) == scales.stride(1) == 1
    assert zeros.stride() == scales.stride()
    out = torch.empty(m, n, device=x.device, dtype=x.dtype) if split_k == 1 else \
        torch.zeros(m, n, device=x.device, dtype=torch.float32)
    grid = (triton.cdiv(m, block_m) * (n // block_n), split_k)
    common = dict(GROUP=GROUP_SIZE, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, GROUP_M=8,
                  STAGES=stages, DEQUANT=dequant, SPLIT_K=split_k, num_warps=warps)
    # join: "swap" takes the transposed product (_int4_swap_kernel)
    kernel = _int4_swap_kernel if join == "swap" else _int4_tile_kernel
    if join != "swap":
        common["JOIN"] = join
    kernel[grid](x, qweight, scales, zeros, out, m, n, k, x.stride(0), qweight.stride(0),
                 scales.stride(0), out.stride(0), **common)
    return out if split_k == 1 else out.to(x.dtype)


# (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages, DEQUANT, JOIN, SPLIT_K): wgmma's 64-row tiles and
# up, 8 warps from 128 x 128; split K where 256 x 4096 has few tiles (the generated op splits by
# 4 there); the conversion, the float32 value (the generated kernel's, which a spec's dequant
# expression needs in general) and the split-A form on a few, to show what each costs
VARIANTS = [(bm, bn, bk, 8 if bm * bn >= 128 * 128 else 4, stages, "magic", True, split)
            for bm, bn, bk, stages, split in itertools.product(
                (64, 128, 256), (64, 128, 256), (64, 128), (3, 4), (1, 2, 4))
            if 64 * 64 <= bm * bn <= 128 * 256 and (split == 1 or (bk, stages) == (64, 3))]
VARIANTS += [(bm, bn, 64, 8 if bm * bn >= 128 * 128 else 4, 3, dequant, join, split)
             for (bm, bn), dequant, join, split in itertools.product(
                 ((64, 128), (128, 128), (256, 128)), ("magic", "cvt", "f32"), (True, False),
                 (1, 4))
             if (dequant, join) != ("magic", True)]
# the transposed product (JOIN "swap"): BLOCK_N weight rows a warpgroup's 64 (4 warps) or two
# warpgroups' 128 (8 warps), BLOCK_M the tokens, in the 16-bit dequantization
SWAPPED = [(bm, bn, bk, 4 if bn == 64 else 8, stages, "magic", "swap", split)
           for bm, bn, bk, stages, split in itertools.product(
               (64, 128, 256), (64, 128), (64, 128), (3, 4), (1, 2))
           if bm * bn <= 256 * 128 and (split == 1 or (bk, stages) == (64, 3))]
SMALL_SWAPPED = [(16, bn, bk, 4 if bn == 64 else 8, stages, "magic", "swap", split)
                 for bn, bk, stages, split in itertools.product((64, 128), (64, 128), (3, 4),
                                                               (1, 2, 4, 8))]
# M = 16: the small tiles (mma.sync below 64 rows), K split as the generated op splits it
SMALL = [(16, bn, bk, 4, 4, "magic", join, split)
         for bn, bk, join, split in itertools.product((64, 128), (64, 128), (True, False),
                                                      (1, 2, 4, 8))]

# int8 (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages, SPLIT_K): the generated op's frozen
# 128 x 128 x 64 on 4 warps split by 4 (255 registers and spills by ptxas) beside 8 warps and
# other tiles
INT8 = [(bm, bn, bk, warps, 3, split)
        for bm, bn, bk, warps, split in itertools.product(
            (64, 128, 256), (128, 256), (64, 128), (4, 8), (1, 4))
        if 128 * 128 <= bm * bn <= 128 * 256 and not (warps == 4 and bm * bn > 128 * 128)]


def check() -> None:
    """Every form's result at a small size against the dequantized weight's product, in float16
    (the interpreter's bfloat16 dot is wrong): the weights rounded to float16 once by their
    scale."""
    m, n, k = 70, 64, 512
    x = torch.randn(m, k).half()
    qweight, scales, zeros = quant.quantize_int4(torch.randn(n, k) * k ** -0.5, GROUP_SIZE)
    want = x.double() @ quant.dequantize_int4(qweight, scales, zeros, GROUP_SIZE).double().T
    for block_m, block_n, block_k, dequant, join, split in ((64, 64, 64, "magic", "swap", 1),
                                                            (16, 64, 128, "cvt", "swap", 2),
                                                            (64, 32, 64, "magic", True, 1),
                                                            (16, 64, 128, "magic", False, 2),
                                                            (32, 32, 64, "cvt", True, 4),
                                                            (64, 64, 128, "f32", False, 1),
                                                            (64, 32, 64, "f32", True, 2)):
        got = tile(x, qweight, scales.half(), zeros.half(), block_m, block_n, block_k, 4, 2,
                   dequant, join, split)
        error = ((got.double() - want).norm() / want.norm()).item()
        print(f"{block_m}x{block_n}x{block_k} {dequant} join {join} split-K {split}: "
              f"relative error {error:.1e}")
        assert error < 2e-3, error
    qweight8, scales8 = quant.quantize_int8(torch.randn(n, k) * k ** -0.5)
    want = x.double() @ quant.dequantize_int8(qweight8, scales8).double().T
    got = tile8(x, qweight8, scales8.half(), 64, 32, 64, 4, 2, 2)
    error = ((got.double() - want).norm() / want.norm()).item()
    print(f"int8 64x32x64: relative error {error:.1e}")
    assert error < 2e-3, error


def sweep_m(op: str, m: int, n: int, k: int, start: float, budget: float, variants) -> None:
    args = sweep.inputs(op, m, n, k, 0)
    size = sum(t.numel() * t.element_size() for t in args)
    sets = [args] + [sweep.inputs(op, m, n, k, seed)
                     for seed in range(1, math.ceil(sweep.ROTATION_BYTES / size))]
    torch_sets = [sweep.torch_inputs(op, s) for s in sets]
    expected = F.linear(*torch_sets[0]).float()
    cublas = sweep.device_us(F.linear, torch_sets, True)
    ours = sweep.device_us(getattr(generated, op), sets, True)
    sol = sweep.speed_of_light_us(args, m, n, k)
    head = f"{op} M={m} N={n} K={k}"
    print(f"{head}: speed of light {sol:.1f} us; cuBLAS bf16 (dequantized) {cublas:.1f} us; "
          f"generated {ours:.1f} us ({cublas / ours:.2f}x cuBLAS)", flush=True)
    kernel = tile if op == "int4_weight_linear" else tile8
    # (an int8 variant ends with its SPLIT_K, an int4 one too, after DEQUANT and JOIN)
    fitting = [v for v in variants if not (n % v[1] or k % (v[2] * v[-1]))]
    sweep.sweep_variants(head, fitting, kernel, _label, expected, sets, cublas, ours, sol, start,
                         budget)


def _label(variant) -> str:
    block_m, block_n, block_k, warps, stages = variant[:5]
    label = f"{block_m:3d}x{block_n:3d}x{block_k:3d} w{warps} s{stages}"
    if len(variant) == 6:
        return f"{label} split-K {variant[5]}"
    dequant, join, split = variant[5:]
    form = "swap " if join == "swap" else "join " if join else "split"
    return f"{form} {label} {dequant:5s} split-K {split}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--check", action="store_true", help="correctness only (interpreter)")
    parser.add_argument("--budget", type=float, default=480, help="seconds for the sweep")
    parser.add_argument("--swap", action="store_true",
                        help="the transposed product (the weight from registers) at M = 256, 64, 16")
    options = parser.parse_args()
    if options.check:
        check()
        return
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__,
          flush=True)
    start = time.perf_counter()
    if options.swap:
        # the transposed product alone, beside the joined form's best guesses
        joined = [v for v in VARIANTS if v[6] is True and v[5] == "magic" and v[4] == 3]
        sweep_m("int4_weight_linear", 256, 4096, 4096, start, options.budget * 0.5,
                SWAPPED + joined)
        sweep_m("int4_weight_linear", 64, 4096, 4096, start, options.budget * 0.7,
                [v for v in SWAPPED + joined if v[0] == 64])
        sweep_m("int4_weight_linear", 16, 4096, 4096, start, options.budget,
                SMALL_SWAPPED + [v for v in SMALL if v[6]])
        return
    sweep_m("int4_weight_linear", 256, 4096, 4096, start, options.budget * 0.5, VARIANTS)
    sweep_m("int8_weight_linear", 256, 4096, 4096, start, options.budget * 0.7, INT8)
    sweep_m("int4_weight_linear", 64, 4096, 4096, start, options.budget * 0.85,
            [v for v in VARIANTS if v[0] == 64 and v[5] and v[6]])
    sweep_m("int4_weight_linear", 16, 4096, 4096, start, options.budget, SMALL)


if __name__ == "__main__":
    main()

"""Probe for issue 39: an int4 weight-only GEMV without tl.dot, against the generated op and cuBLAS.

At M = 1 the generated int4_weight_linear reads its 8 MiB of weights at about 0.6 TB/s (14.4 us in
a CUDA graph on an H200 at its best forced config, 14.9 as frozen; cuBLAS's bf16 linear of the
dequantized weight 12.3 us; tools/perf/sweep_matmul.py, 2026-11-28): its tiles pad one row to 16
for tl.dot, every weight nibble goes through an int-to-float conversion (quarter rate), and a
split-K launch adds a second kernel. This kernel is the shape the decode GEMVs of the
practitioner guide take: a program holds BLOCK_N weight rows, reads BLOCK_K of K a step as
bytes (two elements each), multiplies them by x in float32 registers and sums each group's
products, then applies the group's scale and zero once:
``sum_k x[k] (q[n, k] - z[n, g]) s[n, g] = sum_g s[n, g] (sum_{k in g} x[k] q[n, k] - z[n, g]
sum_{k in g} x[k])``; the nibbles become float32 by an OR into 2**23's mantissa (MAGIC) or by
a conversion. SPLIT_K > 1 adds its partial sums into a zeroed float32 buffer (the buffer's
zeroing and the cast to the output dtype are in the time). Each variant is checked against the
dequantized weight's float32 product before it is timed (CUDA graphs, inputs rotating past L2,
as sweep_matmul times). Item 000u of docs/performance.md records an earlier plain GEMV on an
H100 (2-32 rows a program, to 512 bytes of K a step, 1-4 splits, every nibble converted) at
20.3 us, no better than the tile kernel then; this one differs in its group sums and the
conversion. M = 16 reads each program's weights once a row (through L2 after the first): a
first look at whether one kernel can serve both sizes.

    PYTHONPATH=. python3 tools/perf/probe_int4_gemv.py         # GPU: M = 1 and 16, all variants
    PYTHONPATH=. python3 tools/perf/probe_int4_gemv.py --words # GPU: M = 1, the word form
    TRITON_INTERPRET=1 PYTHONPATH=. python3 tools/perf/probe_int4_gemv.py --check   # correctness

The numbers decide whether the matmul family gets a GEMV strategy for weight-only ops at small M
(docs/performance.md, issue 39).
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

import generated  # noqa: E402
from specgen.runtime import override  # noqa: E402
from bench.quant import GROUP_SIZE  # noqa: E402
from specgen import quant  # noqa: E402


@triton.jit
def _gemv_start(q_ptr, K, q_stride_n, GROUP: tl.constexpr, BLOCK_N: tl.constexpr,
                BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr, PER_LOAD: tl.constexpr):
    """The GEMV kernels' prologue: the program's columns, K offsets and groups, its share of K
    (split pid_k of SPLIT_K), and its weight rows' pointers to the first BLOCK_K // PER_LOAD
    loaded units (bytes: 2 elements each; words: 8)."""
    # whole groups a K block: each group's scale and zero apply once to its summed products
    tl.static_assert(BLOCK_K % GROUP == 0)
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    offs_g = tl.arange(0, BLOCK_K // GROUP)
    share = K // SPLIT_K
    k_first = tl.program_id(1) * share
    q_rows = q_ptr + offs_n[:, None] * q_stride_n + tl.arange(0, BLOCK_K // PER_LOAD)[None, :]
    return offs_n, offs_k, offs_g, k_first, share, q_rows


@triton.jit
def _int4_gemv_kernel(x_ptr, q_ptr, scales_ptr, zeros_ptr, out_ptr, M, N, K,
                      x_stride_m, q_stride_n, group_stride_n, out_stride_m,
                      GROUP: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                      SPLIT_K: tl.constexpr, STAGES: tl.constexpr, MAGIC: tl.constexpr,
                      PREFETCH: tl.constexpr = False):
    GROUPS: tl.constexpr = BLOCK_K // GROUP
    offs_n, offs_k, offs_g, k_first, share, q_rows = _gemv_start(
        q_ptr, K, q_stride_n, GROUP, BLOCK_N, BLOCK_K, SPLIT_K, 2)
    for m in range(M):
        acc = tl.zeros((BLOCK_N,), tl.float32)
        if PREFETCH:
            q_next = tl.load(q_rows + k_first // 2)
        for k in tl.range(k_first, k_first + share, BLOCK_K, num_stages=STAGES):
            if PREFETCH:
                # the next block's bytes are requested before this block's math: two blocks in
                # flight a program (the last step re-reads the first block, from L2, unmasked)
                q_bytes = q_next
                k_ahead = k + BLOCK_K
                k_ahead = tl.where(k_ahead < k_first + share, k_ahead, k_first)
                q_next = tl.load(q_rows + k_ahead // 2)
            else:
                # BLOCK_N rows of BLOCK_K // 2 bytes, each row's bytes contiguous
                q_bytes = tl.load(q_rows + k // 2)
            x = tl.load(x_ptr + m * x_stride_m + k + offs_k).to(tl.float32)
            # x's elements by their place in a byte: x_low meets the low nibble
            x_low, x_high = tl.split(tl.reshape(x, (BLOCK_K // 2, 2)))
            if MAGIC:
                # a nibble in the low mantissa bits of 2**23 is 2**23 + nibble exactly: an OR and
                # a subtraction at full rate, where an int-to-float conversion runs at a quarter
                # of it (16 a clock a multiprocessor: 4.5 us for 8 MiB of nibbles on an H200)
                q_words = q_bytes.to(tl.int32)
                low = ((q_words & 15) | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0
                high = ((q_words >> 4) | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0
            else:
                low = (q_bytes & 15).to(tl.float32)
                high = (q_bytes >> 4).to(tl.float32)
            products = low * x_low[None, :] + high * x_high[None, :]
            group_products = tl.sum(tl.reshape(products, (BLOCK_N, GROUPS, GROUP // 2)), axis=2)
            group_x = tl.sum(tl.reshape(x_low + x_high, (GROUPS, GROUP // 2)), axis=1)
            groups = k // GROUP + offs_g
            group_offsets = offs_n[:, None] * group_stride_n + groups[None, :]
            scales = tl.load(scales_ptr + group_offsets).to(tl.float32)
            zeros = tl.load(zeros_ptr + group_offsets).to(tl.float32)
            acc += tl.sum(scales * (group_products - zeros * group_x[None, :]), axis=1)
        out_ptrs = out_ptr + m * out_stride_m + offs_n
        if SPLIT_K == 1:
            tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty))
        else:
            # relaxed: the sums need no ordering with other memory, only atomicity
            tl.atomic_add(out_ptrs, acc, sem="relaxed")


@triton.jit
def _int4_words_kernel(x_ptr, q_ptr, scales_ptr, zeros_ptr, out_ptr, M, N, K,
                       x_stride_m, q_stride_n, group_stride_n, out_stride_m, one_bits,
                       GROUP: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                       SPLIT_K: tl.constexpr, STAGES: tl.constexpr):
    """The GEMV on 32-bit words (8 nibbles, element 8 w + p at bits 4 p), each nibble made a
    float with no subtraction: moved to the mantissa's bits 16-19 and ORed into 1.0's bits, it
    is f = 1 + q / 128 exactly, so a group's sum of x f is sum x + sum x q / 128 and
    sum x q = 128 (sum x f - sum x). A nibble then costs a shift (none for p = 4), an AND-OR
    (one LOP3) and an FMA, where the byte form spends a byte extraction, an AND, an OR, a
    subtraction and a multiply-add on each pair's share. ``one_bits`` is 1.0's bits
    (0x3F800000) as an argument: a register, so that the AND and the OR are one LOP3 (which has
    one immediate operand; with both as constants ptxas emitted two)."""
    GROUPS: tl.constexpr = BLOCK_K // GROUP
    WORDS: tl.constexpr = BLOCK_K // 8
    # (q_stride_n in words)
    offs_n, offs_k, offs_g, k_first, share, q_rows = _gemv_start(
        q_ptr, K, q_stride_n, GROUP, BLOCK_N, BLOCK_K, SPLIT_K, 8)
    for m in range(M):
        acc = tl.zeros((BLOCK_N,), tl.float32)
        for k in tl.range(k_first, k_first + share, BLOCK_K, num_stages=STAGES):
            words = tl.load(q_rows + k // 8)
            x = tl.load(x_ptr + m * x_stride_m + k + offs_k).to(tl.float32)
            # x by place: bit 0 of p first, then bit 1, then bit 2
            x_even, x_odd = tl.split(tl.reshape(x, (WORDS, 4, 2)))
            x0, x2 = tl.split(tl.reshape(x_even, (WORDS, 2, 2)))
            x1, x3 = tl.split(tl.reshape(x_odd, (WORDS, 2, 2)))
            x0, x4 = tl.split(x0)
            x2, x6 = tl.split(x2)
            x1, x5 = tl.split(x1)
            x3, x7 = tl.split(x3)
            ONE = one_bits
            NIBBLE: tl.constexpr = 0x000F0000
            sums = ((words << 16) & NIBBLE | ONE).to(tl.float32, bitcast=True) * x0[None, :]
            sums += ((words << 12) & NIBBLE | ONE).to(tl.float32, bitcast=True) * x1[None, :]
            sums += ((words << 8) & NIBBLE | ONE).to(tl.float32, bitcast=True) * x2[None, :]
            sums += ((words << 4) & NIBBLE | ONE).to(tl.float32, bitcast=True) * x3[None, :]
            sums += (words & NIBBLE | ONE).to(tl.float32, bitcast=True) * x4[None, :]
            sums += ((words >> 4) & NIBBLE | ONE).to(tl.float32, bitcast=True) * x5[None, :]
            sums += ((words >> 8) & NIBBLE | ONE).to(tl.float32, bitcast=True) * x6[None, :]
            sums += ((words >> 12) & NIBBLE | ONE).to(tl.float32, bitcast=True) * x7[None, :]
            group_f = tl.sum(tl.reshape(sums, (BLOCK_N, GROUPS, GROUP // 8)), axis=2)
            group_x = tl.sum(tl.reshape(x, (GROUPS, GROUP)), axis=1)[None, :]
            groups = k // GROUP + offs_g
            group_offsets = offs_n[:, None] * group_stride_n + groups[None, :]
            scales = tl.load(scales_ptr + group_offsets).to(tl.float32)
            zeros = tl.load(zeros_ptr + group_offsets).to(tl.float32)
            # s (sum x q - z sum x) = s (128 sum x f - (128 + z) sum x)
            acc += tl.sum(scales * (128.0 * group_f - (128.0 + zeros) * group_x), axis=1)
        out_ptrs = out_ptr + m * out_stride_m + offs_n
        if SPLIT_K == 1:
            tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty))
        else:
            tl.atomic_add(out_ptrs, acc, sem="relaxed")


@triton.jit
def dequantized_nibbles(q_bytes, zeros, scales, DTYPE: tl.constexpr, MAGIC: tl.constexpr):
    """The weights of the low and the high nibbles of ``q_bytes`` in the activations' 16-bit
    ``DTYPE``: (q - z) * s, q - z exact there, one rounding by the scale. ``MAGIC``: a nibble
    ORed into the mantissa of BIAS is BIAS + nibble exactly (bf16 128, fp16 1024), so
    BIAS + q - (BIAS + z) = q - z with no int-to-float conversion."""
    if MAGIC:
        if DTYPE == tl.float16:
            BITS: tl.constexpr = 0x6400
            BIAS: tl.constexpr = 1024.0
        else:
            BITS: tl.constexpr = 0x4300
            BIAS: tl.constexpr = 128.0
        q_words = q_bytes.to(tl.int16)
        low = ((q_words & 15) | BITS).to(DTYPE, bitcast=True)
        high = ((q_words >> 4) | BITS).to(DTYPE, bitcast=True)
        zeros = zeros + BIAS
    else:
        low = (q_bytes & 15).to(DTYPE)
        high = (q_bytes >> 4).to(DTYPE)
    return (low - zeros) * scales, (high - zeros) * scales


@triton.jit
def group_values(ptr, offs_n, k, group_stride_n, GROUP: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_K: tl.constexpr):
    """A per-group operand (scales or zeros) of the rows ``offs_n`` over the K block at ``k``,
    as (BLOCK_N, BLOCK_K // 2): each group's value over its GROUP // 2 bytes of a row."""
    GROUPS: tl.constexpr = BLOCK_K // GROUP
    values = tl.load(ptr + offs_n[:, None] * group_stride_n
                     + (k // GROUP + tl.arange(0, GROUPS))[None, :])
    return tl.reshape(tl.broadcast_to(values[:, :, None], (BLOCK_N, GROUPS, GROUP // 2)),
                      (BLOCK_N, BLOCK_K // 2))


@triton.jit
def store_or_add(out_ptrs, acc, mask, SPLIT_K: tl.constexpr):
    """A tile's result: stored in the output's dtype, or, SPLIT_K programs a tile, added to the
    zeroed float32 result atomically (relaxed: the sums need no ordering with other memory, only
    atomicity)."""
    if SPLIT_K == 1:
        tl.store(out_ptrs, acc.to(out_ptrs.dtype.element_ty), mask=mask)
    else:
        tl.atomic_add(out_ptrs, acc, mask=mask, sem="relaxed")


@triton.jit
def _int4_dot_kernel(x_ptr, q_ptr, scales_ptr, zeros_ptr, out_ptr, M, N, K,
                     x_stride_m, q_stride_n, group_stride_n, out_stride_m,
                     GROUP: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                     SPLIT_K: tl.constexpr, STAGES: tl.constexpr, MAGIC: tl.constexpr,
                     PREFETCH: tl.constexpr = False):
    """The tile form at M <= 16: one 16-row tile, the weights dequantized in the activations'
    dtype (exact integers q - z, then one rounding by the scale) and a dot a nibble place."""
    BLOCK_M: tl.constexpr = 16
    DTYPE: tl.constexpr = x_ptr.dtype.element_ty
    tl.static_assert(BLOCK_K % GROUP == 0)
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_m = tl.arange(0, BLOCK_M)
    mask_m = offs_m < M
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_byte = tl.arange(0, BLOCK_K // 2)
    offs_k = tl.arange(0, BLOCK_K)
    share = K // SPLIT_K
    k_first = pid_k * share
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    q_rows = q_ptr + offs_n[:, None] * q_stride_n + offs_byte[None, :]
    if PREFETCH:
        q_next = tl.load(q_rows + k_first // 2)
    for k in tl.range(k_first, k_first + share, BLOCK_K, num_stages=STAGES):
        if PREFETCH:
            q_bytes = q_next
            k_ahead = k + BLOCK_K
            k_ahead = tl.where(k_ahead < k_first + share, k_ahead, k_first)
            q_next = tl.load(q_rows + k_ahead // 2)
        else:
            q_bytes = tl.load(q_rows + k // 2)
        x = tl.load(x_ptr + offs_m[:, None] * x_stride_m + (k + offs_k)[None, :],
                    mask=mask_m[:, None], other=0.0)
        x_low, x_high = tl.split(tl.reshape(x, (BLOCK_M, BLOCK_K // 2, 2)))
        scales = group_values(scales_ptr, offs_n, k, group_stride_n, GROUP, BLOCK_N, BLOCK_K)
        zeros = group_values(zeros_ptr, offs_n, k, group_stride_n, GROUP, BLOCK_N, BLOCK_K)
        w_low, w_high = dequantized_nibbles(q_bytes, zeros, scales, DTYPE, MAGIC)
        acc = tl.dot(x_low, tl.trans(w_low), acc)
        acc = tl.dot(x_high, tl.trans(w_high), acc)
    out_ptrs = out_ptr + offs_m[:, None] * out_stride_m + offs_n[None, :]
    store_or_add(out_ptrs, acc, mask_m[:, None], SPLIT_K)


@triton.jit
def _int4_swap_kernel(x_ptr, q_ptr, scales_ptr, zeros_ptr, out_ptr, M, N, K,
                      x_stride_m, q_stride_n, group_stride_n, out_stride_m,
                      GROUP: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                      SPLIT_K: tl.constexpr, STAGES: tl.constexpr):
    """The dot with its operands swapped (out^T = W x^T): BLOCK_N rows of the dequantized
    weight are the dot's first operand, which Hopper's wgmma reads from registers (so the
    dequantized tile never goes through shared memory), and x's at most 16 rows the second."""
    BLOCK_M: tl.constexpr = 16
    DTYPE: tl.constexpr = x_ptr.dtype.element_ty
    tl.static_assert(BLOCK_K % GROUP == 0)
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_m = tl.arange(0, BLOCK_M)
    mask_m = offs_m < M
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_byte = tl.arange(0, BLOCK_K // 2)
    offs_k = tl.arange(0, BLOCK_K)
    share = K // SPLIT_K
    k_first = pid_k * share
    q_rows = q_ptr + offs_n[:, None] * q_stride_n + offs_byte[None, :]
    acc = tl.zeros((BLOCK_N, BLOCK_M), tl.float32)
    for k in tl.range(k_first, k_first + share, BLOCK_K, num_stages=STAGES):
        q_bytes = tl.load(q_rows + k // 2)
        x = tl.load(x_ptr + offs_m[:, None] * x_stride_m + (k + offs_k)[None, :],
                    mask=mask_m[:, None], other=0.0)
        x_low, x_high = tl.split(tl.reshape(x, (BLOCK_M, BLOCK_K // 2, 2)))
        scales = group_values(scales_ptr, offs_n, k, group_stride_n, GROUP, BLOCK_N, BLOCK_K)
        zeros = group_values(zeros_ptr, offs_n, k, group_stride_n, GROUP, BLOCK_N, BLOCK_K)
        w_low, w_high = dequantized_nibbles(q_bytes, zeros, scales, DTYPE, True)
        acc = tl.dot(w_low, tl.trans(x_low), acc)
        acc = tl.dot(w_high, tl.trans(x_high), acc)
    out_ptrs = out_ptr + offs_m[None, :] * out_stride_m + offs_n[:, None]
    store_or_add(out_ptrs, acc, mask_m[None, :], SPLIT_K)


def gemv(x, qweight, scales, zeros, block_n, block_k, split_k, warps, stages, magic, dot=False,
         prefetch=False):
    """x (M, K) @ the int4 weight's transpose (qweight (N, K // 2), scales and zeros (N, G));
    with ``dot`` the 16-row tile kernel (M <= 16)."""
    m, k = x.shape
    n = qweight.shape[0]
    # what the kernel takes without masks or strides of its own
    assert n % block_n == 0 and k % (block_k * split_k) == 0, (n, k, block_n, block_k, split_k)
    assert block_k % GROUP_SIZE == 0 and (block_k // GROUP_SIZE) & (block_k // GROUP_SIZE - 1) == 0
    assert x.stride(1) == qweight.stride(1) == scales.stride(1) == 1
    assert zeros.stride() == scales.stride()
    out = torch.empty(m, n, device=x.device, dtype=x.dtype) if split_k == 1 else \
        torch.zeros(m, n, device=x.device, dtype=torch.float32)
    assert dot in (False, "words") or m <= 16
    if dot == "words":
        words = qweight.view(torch.int32)
        _int4_words_kernel[(n // block_n, split_k)](
            x, words, scales, zeros, out, m, n, k, x.stride(0), words.stride(0),
            scales.stride(0), out.stride(0), 0x3F800000, GROUP=GROUP_SIZE, BLOCK_N=block_n, BLOCK_K=block_k,
            SPLIT_K=split_k, STAGES=stages, num_warps=warps)
        return out if split_k == 1 else out.to(x.dtype)
    if dot == "swap":
        _int4_swap_kernel[(n // block_n, split_k)](
            x, qweight, scales, zeros, out, m, n, k, x.stride(0), qweight.stride(0),
            scales.stride(0), out.stride(0), GROUP=GROUP_SIZE, BLOCK_N=block_n, BLOCK_K=block_k,
            SPLIT_K=split_k, STAGES=stages, num_warps=warps)
        return out if split_k == 1 else out.to(x.dtype)
    kernel = _int4_dot_kernel if dot else _int4_gemv_kernel
    kernel[(n // block_n, split_k)](
        x, qweight, scales, zeros, out, m, n, k, x.stride(0), qweight.stride(0), scales.stride(0),
        out.stride(0), GROUP=GROUP_SIZE, BLOCK_N=block_n, BLOCK_K=block_k, SPLIT_K=split_k,
        STAGES=stages, MAGIC=magic, PREFETCH=prefetch, num_warps=warps)
    return out if split_k == 1 else out.to(x.dtype)


# (BLOCK_N, BLOCK_K, SPLIT_K, warps, stages, MAGIC): 4 warps, and 8 for the tiles of 16 Ki
# elements or more (32 Ki: 64 float32 products a thread at 8 warps, with the bytes and x in
# registers too); the plain conversion on a few, to show what it costs
VARIANTS = [(n, k, split, warps, stages, True)
            for n, k, split, warps, stages in itertools.product(
                (8, 16, 32, 64), (256, 512, 1024), (1, 2, 4), (4, 8), (1, 3))
            if n * k <= 32768 and (warps == 4 or n * k >= 16384)]
VARIANTS += [(n, k, split, 4, 1, False) for n, k, split in itertools.product(
    (8, 16, 32), (512, 1024), (1, 4))]
# the 16-row tile kernel: (BLOCK_N, BLOCK_K, SPLIT_K, warps, stages, MAGIC, dot)
DOT_VARIANTS = [(n, k, split, 4, stages, True, True)
                for n, k, split, stages in itertools.product(
                    (32, 64, 128), (128, 256), (1, 2, 4, 8), (3, 5))]
DOT_VARIANTS += [(n, 128, split, 4, 3, False, True) for n, split in itertools.product(
    (32, 64), (2, 8))]


# the second round (2026-11-29): more bytes in flight a program. (BLOCK_N, BLOCK_K, SPLIT_K,
# warps, stages, MAGIC, dot, PREFETCH)
GEMV_WIDE = [(n, k, split, warps, 1, True, False, prefetch)
             for n, k, split, warps, prefetch in itertools.product(
                 (4, 8, 16), (1024, 2048, 4096), (1, 2), (4, 8), (False, True))
             if n * k <= 65536 and k * split <= 4096 and not (prefetch and k * split == 4096)]
DOT_WIDE = [(n, k, split, warps, 1, True, True, True)
            for n, k, split, warps in itertools.product(
                (32, 64, 128), (128, 256, 512), (1, 2, 4), (4, 8))
            if n * k <= 32768 and (warps == 4 or n * k >= 16384)]


# the third round (2026-11-29): the swapped dot at M = 1 and 16
SWAP = [(n, k, split, warps, stages, True, "swap")
        for n, k, split, warps, stages in itertools.product(
            (64, 128), (128, 256), (1, 2, 4, 8), (4, 8), (2, 3))
        if n * k <= 32768 and not (warps == 8 and n == 64)]


# the fourth round (2026-11-29): 32-bit words, each nibble 1 + q / 128 (M = 1): (BLOCK_N,
# BLOCK_K, SPLIT_K, warps, stages, MAGIC (unused), "words")
# the byte form's best of the earlier rounds, timed beside them
GEMV_BEST = [(8, 2048, 1, 4, 1, True), (16, 512, 1, 4, 3, True), (16, 1024, 1, 4, 1, True)]
WORDS = [(n, k, split, warps, stages, True, "words")
         for n, k, split, warps, stages in itertools.product(
             (4, 8, 16, 32), (512, 1024, 2048), (1, 2), (4, 8), (1, 3))
         if 4096 <= n * k <= 32768 and (stages == 1 or k <= 1024) and (warps == 4 or n * k >= 16384)]


def check() -> None:
    """Every variant's result at a small size against the dequantized weight's product."""
    torch.manual_seed(0)
    m, n, k = 3, 128, 2048
    x = torch.randn(m, k)
    qweight, scales, zeros = quant.quantize_int4(torch.randn(n, k) * k ** -0.5, GROUP_SIZE)
    want = x.double() @ quant.dequantize_int4(qweight, scales, zeros, GROUP_SIZE).double().T
    for block_n, block_k, split_k, magic in ((16, 128, 1, True), (32, 256, 2, False),
                                             (8, 1024, 2, True), (64, 512, 4, True)):
        got = gemv(x, qweight, scales, zeros, block_n, block_k, split_k, 4, 1, magic,
                   prefetch=block_k < 1024)
        error = ((got.double() - want).norm() / want.norm()).item()
        print(f"BLOCK_N {block_n} BLOCK_K {block_k} SPLIT_K {split_k} magic {magic}: "
              f"relative error {error:.1e}")
        assert error < 1e-5, error
    # the tile kernel in float16 (the interpreter's bfloat16 dot is wrong): the weights rounded
    # to float16 once by their scale
    want32 = want
    x16 = x.half()
    want = x16.double() @ quant.dequantize_int4(qweight, scales, zeros, GROUP_SIZE).double().T
    for block_n, block_k, split_k, magic in ((32, 128, 1, True), (64, 256, 2, True),
                                             (32, 128, 4, False)):
        got = gemv(x16, qweight, scales.half(), zeros.half(), block_n, block_k, split_k, 4, 1,
                   magic, dot=True, prefetch=split_k == 1)
        error = ((got.double() - want).norm() / want.norm()).item()
        print(f"dot BLOCK_N {block_n} BLOCK_K {block_k} SPLIT_K {split_k} magic {magic}: "
              f"relative error {error:.1e}")
        assert error < 2e-3, error
    for block_n, block_k, split_k in ((16, 256, 1), (8, 512, 2)):
        got = gemv(x, qweight, scales, zeros, block_n, block_k, split_k, 4, 2, True, dot="words")
        error = ((got.double() - want32).norm() / want32.norm()).item()
        print(f"words BLOCK_N {block_n} BLOCK_K {block_k} SPLIT_K {split_k}: "
              f"relative error {error:.1e}")
        # (q's share of x f kept to about 2**-17 of x's; the byte form's error is near 2e-7)
        assert error < 1e-5, error
    for block_n, block_k, split_k in ((64, 128, 1), (64, 256, 2)):
        got = gemv(x16, qweight, scales.half(), zeros.half(), block_n, block_k, split_k, 4, 2,
                   True, dot="swap")
        error = ((got.double() - want).norm() / want.norm()).item()
        print(f"swap BLOCK_N {block_n} BLOCK_K {block_k} SPLIT_K {split_k}: "
              f"relative error {error:.1e}")
        assert error < 2e-3, error


def sweep_m(m: int, n: int, k: int, start: float, budget: float, variants) -> None:
    args = sweep.inputs("int4_weight_linear", m, n, k, 0)
    size = sum(t.numel() * t.element_size() for t in args)
    sets = [args] + [sweep.inputs("int4_weight_linear", m, n, k, seed)
                     for seed in range(1, math.ceil(sweep.ROTATION_BYTES / size))]
    torch_sets = [sweep.torch_inputs("int4_weight_linear", s) for s in sets]
    expected = F.linear(*torch_sets[0]).float()
    cublas = sweep.device_us(F.linear, torch_sets, True)
    ours = sweep.device_us(generated.int4_weight_linear, sets, True)
    sol = sweep.speed_of_light_us(args, m, n, k)
    head = f"int4 M={m} N={n} K={k}"
    print(f"{head}: speed of light {sol:.1f} us; cuBLAS bf16 (dequantized) {cublas:.1f} us; "
          f"generated int4_weight_linear {ours:.1f} us ({cublas / ours:.2f}x cuBLAS)", flush=True)
    sweep.sweep_variants(head, [v for v in variants if not (n % v[0] or k % (v[1] * v[2]))],
                         gemv, _label, expected, sets, cublas, ours, sol, start, budget)


def _label(variant) -> str:
    block_n, block_k, split_k, warps, stages, magic = variant[:6]
    dot = len(variant) > 6 and variant[6]
    prefetch = len(variant) > 7 and variant[7]
    kind = {"swap": "swap", "words": "word", True: "dot ", False: "gemv"}[dot]
    return (f"{kind} BLOCK_N {block_n:3d} BLOCK_K {block_k:5d} split {split_k} w{warps} "
            f"s{stages}{' magic' if magic else ' cvt  '}{' prefetch' if prefetch else ''}")


# the generated GEMV kernel's configs to time (--product): (BLOCK_N, BLOCK_K, num_warps, STAGES)
PRODUCT_CONFIGS = [(n, k, w, s) for n, k, w, s in itertools.product(
                       (4, 8, 16), (512, 1024, 2048, 4096), (4, 8), (1, 3))
                   if n * k <= 65536 and (s == 1 or k <= 1024)]


def sweep_product(n: int, k: int) -> None:
    """The generated weight-only ops at M = 1 with their GEMV kernel's configs forced, next to
    this probe's best form (8 x 2048, 4 warps) and cuBLAS, in one run."""
    for op in ("int4_weight_linear", "int8_weight_linear"):
        args = sweep.inputs(op, 1, n, k, 0)
        size = sum(t.numel() * t.element_size() for t in args)
        sets = [args] + [sweep.inputs(op, 1, n, k, seed)
                         for seed in range(1, math.ceil(sweep.ROTATION_BYTES / size))]
        torch_sets = [sweep.torch_inputs(op, s) for s in sets]
        expected = F.linear(*torch_sets[0]).float()
        cublas = sweep.device_us(F.linear, torch_sets, True)
        function = getattr(generated, op)
        head = f"{op} M=1 N={n} K={k}"
        line = f"{head}: cuBLAS bf16 (dequantized) {cublas:.1f} us"
        if op.startswith("int4"):
            line += f"; probe 8x2048 w4 {sweep.device_us(lambda *a: gemv(*a, 8, 2048, 1, 4, 1, True), sets, True):.1f} us"
        print(line, flush=True)
        for block_n, block_k, warps, stages in PRODUCT_CONFIGS:
            config = {"BLOCK_N": block_n, "BLOCK_K": block_k, "STAGES": stages, "num_warps": warps}
            with override(strategy="gemv", config=config):
                out = function(*args).float()
                error = ((out - expected).norm() / expected.norm()).item()
                us = sweep.device_us(function, sets, True)
            print(f"{head} | gemv {block_n:2d} x {block_k:4d} w{warps} s{stages} | {us:5.1f} us | "
                  f"{cublas / us:4.2f}x cuBLAS | error {error:.1e}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--check", action="store_true", help="correctness only (interpreter)")
    parser.add_argument("--budget", type=float, default=300, help="seconds for the sweep")
    parser.add_argument("--swap", action="store_true", help="the swapped dot at M = 1 and 16")
    parser.add_argument("--words", action="store_true",
                        help="the fourth round: 32-bit words, nibbles as 1 + q / 128 (M = 1)")
    parser.add_argument("--product", action="store_true",
                        help="the generated ops' GEMV kernel per forced config")
    parser.add_argument("--wide", action="store_true",
                        help="the second round: whole-K and prefetching variants")
    options = parser.parse_args()
    if options.check:
        check()
        return
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__,
          flush=True)
    start = time.perf_counter()
    # half the budget each: Triton specializes an integer argument equal to 1 as a constant, so
    # M = 16 compiles every variant again; there the tile kernel first (the GEMV reads each
    # program's weights once a row)
    if options.swap:
        sweep_m(16, 4096, 4096, start, options.budget * 0.6, SWAP)
        sweep_m(1, 4096, 4096, start, options.budget, SWAP)
        return
    if options.words:
        sweep_m(1, 4096, 4096, start, options.budget * 0.5, WORDS + GEMV_BEST)
        sweep_m(1, 8192, 8192, start, options.budget, WORDS + GEMV_BEST)
        return
    if options.product:
        sweep_product(4096, 4096)
        sweep_product(8192, 8192)
        return
    if options.wide:
        sweep_m(1, 4096, 4096, start, options.budget * 0.5, GEMV_WIDE)
        sweep_m(16, 4096, 4096, start, options.budget, DOT_WIDE)
        return
    sweep_m(1, 4096, 4096, start, options.budget * 0.5, VARIANTS + DOT_VARIANTS)
    sweep_m(16, 4096, 4096, start, options.budget, DOT_VARIANTS + VARIANTS)


if __name__ == "__main__":
    main()

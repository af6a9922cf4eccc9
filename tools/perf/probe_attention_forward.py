"""Probe for issue 35: a FlashAttention-2 forward written out by hand, in the variants Triton 3.6
offers on Hopper, against the generated op and torch's flash and cuDNN backends.

The generated forward (templates/attention.py.jinja) runs at 80-91% of cuDNN on an H200. This
kernel is its non-causal / causal core without masks, GQA or splits (B, H, S, E contiguous, S a
multiple of the tiles), so that each lead is timed on its own:
- ``scaled``: the tile scaled, then its row maximum subtracted (the generated kernel's masked
  blocks); ``fused``: the row maximum of q.k scaled once and one FMA a score (its whole blocks
  since 2026-11-29, the Triton tutorial's form);
- ``ptr``: K and V blocks by pointers; ``tma``: by device-side tensor descriptors;
- ``ws``: ``tl.range(..., warp_specialize=True)`` over the key blocks (TMA loads);
- ``skew``: the next key block's q.k issued before the current block's softmax, so that the
  tensor cores' work and the exponentials might overlap (fused math, pointers, non-causal).
Each variant is checked against SDPA in float32 and timed by do_bench (its L2 flush, median),
as bench/attention.py times the op; configs (BLOCK_M, BLOCK_N, warps, stages) that fail to
compile or to fit are reported and skipped. Item 001i of docs/performance.md has the H200's
numbers: the fused form +4% in this kernel, TMA, warp specialization and the skew no faster,
128 x 64 tiles on 2 stages the best at E 256.

    PYTHONPATH=. python3 tools/perf/probe_attention_forward.py            # GPU: the four cells
    PYTHONPATH=. python3 tools/perf/probe_attention_forward.py --cells 0,1 --variants ptr-fused,skew
    TRITON_INTERPRET=1 PYTHONPATH=. python3 tools/perf/probe_attention_forward.py --check
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from specgen.runtime.context import ensure_allocator

# bench/attention.py's forward cells: (batch, heads, length, head dim, causal)
CELLS = ((16, 16, 1024, 64, False), (4, 32, 4096, 128, False), (4, 32, 4096, 128, True),
         (4, 32, 4096, 256, False))
# (BLOCK_M, BLOCK_N, warps, stages)
CONFIGS = ((128, 64, 8, 3), (128, 128, 8, 3), (128, 64, 4, 3), (128, 64, 8, 4), (128, 128, 8, 2),
           (64, 64, 4, 3), (128, 32, 4, 3))
WIDE_CONFIGS = ((64, 64, 4, 2), (64, 64, 4, 3), (128, 64, 8, 2), (64, 32, 4, 3), (128, 32, 8, 2))
# name: (TMA loads, fused math, warp specialization, lazy rescaling); "skew" is a kernel of its
# own
VARIANTS = {"ptr-scaled": (False, False, False, False), "ptr-fused": (False, True, False, False),
            "tma-fused": (True, True, False, False), "tma-fused-ws": (True, True, True, False),
            "ptr-lazy": (False, True, False, True), "skew": None}


@triton.jit
def _keys(acc, m_i, l_i, q, k_ptr, v_ptr, k_desc, v_desc, stride_s, lo, hi, rows, qk_scale,
          MASK: tl.constexpr, TMA: tl.constexpr, FUSED: tl.constexpr, WS: tl.constexpr,
          LAZY: tl.constexpr, BLOCK_N: tl.constexpr, E: tl.constexpr):
    """Keys [lo, hi) into the running output; ``MASK``: the causal test (the diagonal block);
    ``LAZY``: the accumulator rescaled only in the steps where some row's maximum grew by more
    than 8 (log2 units) past the maximum the row keeps: FlashAttention-4's conditional
    rescaling, decided here for the whole program (Triton has no per-warp branch). Most steps
    then skip the accumulator's multiply; a stale maximum leaves the exponentials at most 2**8."""
    cols_e = tl.arange(0, E)
    for start in tl.range(lo, hi, BLOCK_N, warp_specialize=WS):
        start = tl.multiple_of(start, BLOCK_N)
        cols = start + tl.arange(0, BLOCK_N)
        if TMA:
            k = k_desc.load([start, 0])
        else:
            k = tl.load(k_ptr + cols[:, None] * stride_s + cols_e[None, :])
        qk = tl.dot(q, k.T)
        if LAZY:
            m_ij = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
            # (m_i + 8 is -inf while m_i is: the first block always rescales)
            grown = tl.sum((m_ij > m_i + 8.0).to(tl.int32), 0)
            if grown > 0:
                alpha = tl.exp2(m_i - m_ij)
                acc = acc * alpha[:, None]
                l_i = l_i * alpha
                m_i = m_ij
            p = tl.exp2(qk * qk_scale - m_i[:, None])
            l_i += tl.sum(p, 1)
        else:
            if FUSED:
                if MASK:
                    qk = qk * qk_scale + tl.where(rows[:, None] >= cols[None, :], 0.0, -1.0e6)
                    m_ij = tl.maximum(m_i, tl.max(qk, 1))
                    qk = qk - m_ij[:, None]
                else:
                    m_ij = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
                    qk = qk * qk_scale - m_ij[:, None]
            else:
                qk = qk * qk_scale
                if MASK:
                    qk = tl.where(rows[:, None] >= cols[None, :], qk, float("-inf"))
                m_ij = tl.maximum(m_i, tl.max(qk, 1))
                qk = qk - m_ij[:, None]
            p = tl.exp2(qk)
            alpha = tl.exp2(m_i - m_ij)
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None]
            m_i = m_ij
        if TMA:
            v = v_desc.load([start, 0])
        else:
            v = tl.load(v_ptr + cols[:, None] * stride_s + cols_e[None, :])
        acc = tl.dot(p.to(v.dtype), v, acc)
    return acc, m_i, l_i


@triton.jit
def _program(S, H, stride_b, stride_h, BLOCK_M: tl.constexpr):
    """The program's row block (heaviest first, as the generated kernel orders them) and the
    element offset of its (batch, head)."""
    num_m = tl.cdiv(S, BLOCK_M)
    pid = tl.program_id(0)
    start_m = num_m - 1 - pid % num_m
    bh = pid // num_m
    offset = (bh // H).to(tl.int64) * stride_b + (bh % H).to(tl.int64) * stride_h
    return start_m, bh, offset


@triton.jit
def attention_kernel(q_ptr, k_ptr, v_ptr, out_ptr, lse_ptr, sm_scale, H, S,
                     stride_b, stride_h, stride_s,
                     E: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     CAUSAL: tl.constexpr, TMA: tl.constexpr, FUSED: tl.constexpr,
                     WS: tl.constexpr, LAZY: tl.constexpr):
    start_m, bh, offset = _program(S, H, stride_b, stride_h, BLOCK_M)
    rows = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols_e = tl.arange(0, E)
    q = tl.load(q_ptr + offset + rows[:, None] * stride_s + cols_e[None, :])
    k_desc = None
    v_desc = None
    if TMA:
        k_desc = tl.make_tensor_descriptor(k_ptr + offset, shape=[S, E], strides=[stride_s, 1],
                                           block_shape=[BLOCK_N, E])
        v_desc = tl.make_tensor_descriptor(v_ptr + offset, shape=[S, E], strides=[stride_s, 1],
                                           block_shape=[BLOCK_N, E])
    qk_scale = sm_scale * 1.4426950408889634
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, E], tl.float32)
    # causal: the blocks left of the diagonal whole, then the diagonal block tested
    full_hi = start_m * BLOCK_M if CAUSAL else S
    acc, m_i, l_i = _keys(acc, m_i, l_i, q, k_ptr + offset, v_ptr + offset, k_desc, v_desc,
                          stride_s, 0, full_hi, rows, qk_scale, False, TMA, FUSED, WS, LAZY, BLOCK_N,
                          E)
    if CAUSAL:
        acc, m_i, l_i = _keys(acc, m_i, l_i, q, k_ptr + offset, v_ptr + offset, k_desc, v_desc,
                              stride_s, full_hi, full_hi + BLOCK_M, rows, qk_scale, True, TMA,
                              FUSED, False, False, BLOCK_N, E)
    tl.store(out_ptr + offset + rows[:, None] * stride_s + cols_e[None, :],
             (acc / l_i[:, None]).to(out_ptr.dtype.element_ty))
    tl.store(lse_ptr + bh.to(tl.int64) * S + rows, (m_i + tl.log2(l_i)) * 0.6931471805599453)


@triton.jit
def _fused_step(acc, m_i, l_i, qk, v, qk_scale):
    m_ij = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
    p = tl.exp2(qk * qk_scale - m_ij[:, None])
    alpha = tl.exp2(m_i - m_ij)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
    return acc, m_ij, l_i


@triton.jit
def skewed_kernel(q_ptr, k_ptr, v_ptr, out_ptr, lse_ptr, sm_scale, H, S,
                  stride_b, stride_h, stride_s,
                  E: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Non-causal, fused math, pointers; block j + 1's q.k is issued before block j's softmax."""
    start_m, bh, offset = _program(S, H, stride_b, stride_h, BLOCK_M)
    rows = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols_e = tl.arange(0, E)
    cols_n = tl.arange(0, BLOCK_N)
    k_base = k_ptr + offset
    v_base = v_ptr + offset
    q = tl.load(q_ptr + offset + rows[:, None] * stride_s + cols_e[None, :])
    qk_scale = sm_scale * 1.4426950408889634
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, E], tl.float32)
    qk = tl.dot(q, tl.load(k_base + cols_n[:, None] * stride_s + cols_e[None, :]).T)
    for start in range(0, S - BLOCK_N, BLOCK_N):
        start = tl.multiple_of(start, BLOCK_N)
        k_next = tl.load(k_base + (start + BLOCK_N + cols_n)[:, None] * stride_s + cols_e[None, :])
        qk_next = tl.dot(q, k_next.T)
        v = tl.load(v_base + (start + cols_n)[:, None] * stride_s + cols_e[None, :])
        acc, m_i, l_i = _fused_step(acc, m_i, l_i, qk, v, qk_scale)
        qk = qk_next
    v = tl.load(v_base + (S - BLOCK_N + cols_n)[:, None] * stride_s + cols_e[None, :])
    acc, m_i, l_i = _fused_step(acc, m_i, l_i, qk, v, qk_scale)
    tl.store(out_ptr + offset + rows[:, None] * stride_s + cols_e[None, :],
             (acc / l_i[:, None]).to(out_ptr.dtype.element_ty))
    tl.store(lse_ptr + bh.to(tl.int64) * S + rows, (m_i + tl.log2(l_i)) * 0.6931471805599453)


def runner(variant: str, q, k, v, causal: bool, config: tuple[int, int, int, int]):
    """A call of ``variant`` at ``config`` on (B, H, S, E) contiguous q, k, v, and its output."""
    block_m, block_n, warps, stages = config
    batch, heads, length, dim = q.shape
    out = torch.empty_like(q)
    lse = torch.empty(batch, heads, length, device=q.device, dtype=torch.float32)
    grid = (triton.cdiv(length, block_m) * batch * heads,)
    common = (q, k, v, out, lse, dim ** -0.5, heads, length, q.stride(0), q.stride(1),
              q.stride(2))
    if variant == "skew":
        def run():
            skewed_kernel[grid](*common, E=dim, BLOCK_M=block_m, BLOCK_N=block_n,
                                num_warps=warps, num_stages=stages)
            return out
        return run
    tma, fused, ws, lazy = VARIANTS[variant]

    def run():
        attention_kernel[grid](*common, E=dim, BLOCK_M=block_m, BLOCK_N=block_n, CAUSAL=causal,
                               TMA=tma, FUSED=fused, WS=ws, LAZY=lazy,
                               num_warps=warps, num_stages=stages)
        return out
    return run


def tflops(batch, heads, length, dim, causal, ms) -> float:
    return 4 * batch * heads * length * length * dim * (0.5 if causal else 1.0) / ms / 1e9


def check() -> None:
    """Every variant against SDPA on small float32 inputs (the interpreter: no timing)."""
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 128, 64, generator=generator) for _ in range(3))
    for causal in (False, True):
        want = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        for variant in VARIANTS:
            if variant == "skew" and causal:
                continue
            out = runner(variant, q, k, v, causal, (64, 32, 4, 1))()
            error = (out - want).abs().max().item()
            assert error < 1e-5, (variant, causal, error)
            print(f"{variant:13s} causal={causal}: max error {error:.1e}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cells", default=None, help="indices into CELLS, comma-separated")
    parser.add_argument("--variants", default=None, help="names from VARIANTS, comma-separated")
    parser.add_argument("--check", action="store_true", help="correctness only (interpreter)")
    args = parser.parse_args()
    ensure_allocator()  # device-side descriptors ask Triton for scratch
    if args.check:
        check()
        return
    import generated
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from triton.testing import do_bench

    cells = [CELLS[int(i)] for i in args.cells.split(",")] if args.cells else CELLS
    variants = args.variants.split(",") if args.variants else list(VARIANTS)
    print("torch", torch.__version__, "triton", triton.__version__, torch.cuda.get_device_name())
    for batch, heads, length, dim, causal in cells:
        q, k, v = (torch.randn(batch, heads, length, dim, device="cuda", dtype=torch.bfloat16)
                   for _ in range(3))
        want = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal)
        label = f"B{batch} H{heads} S{length} E{dim}" + (" causal" if causal else "")
        peers = {"generated": lambda: generated.scaled_dot_product_attention(q, k, v,
                                                                            is_causal=causal)}
        for name, backend in (("flash", SDPBackend.FLASH_ATTENTION),
                              ("cudnn", SDPBackend.CUDNN_ATTENTION)):
            def sdpa(backend=backend):
                with sdpa_kernel(backend):
                    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            peers[name] = sdpa
        print(label + ": " + ", ".join(
            f"{name} {tflops(batch, heads, length, dim, causal, do_bench(fn, return_mode='median')):.0f}"
            for name, fn in peers.items()) + " TFLOP/s", flush=True)
        best = {}
        for variant in variants:
            if variant == "skew" and causal:
                continue
            for config in CONFIGS if dim <= 128 else WIDE_CONFIGS:
                started = time.time()
                try:
                    run = runner(variant, q, k, v, causal, config)
                    error = (run().float() - want).abs().max().item()
                    ms = do_bench(run, return_mode="median")
                except Exception as exc:  # a config that does not compile or fit: said, skipped
                    print(f"  {variant:13s} {config}: {type(exc).__name__}: {str(exc)[:120]}")
                    continue
                rate = tflops(batch, heads, length, dim, causal, ms)
                print(f"  {variant:13s} {config}: {rate:.0f} TFLOP/s, max error {error:.1e} "
                      f"({time.time() - started:.1f} s)", flush=True)
                if error < 2e-2 and rate > best.get(variant, (0.0,))[0]:
                    best[variant] = (rate, config)
        print(f"best, {label}: " + "; ".join(f"{name} {rate:.0f} {config}"
                                             for name, (rate, config) in best.items()), flush=True)


if __name__ == "__main__":
    main()

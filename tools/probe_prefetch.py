"""Chunked row kernels with the next chunk's load issued before the current chunk is used
(register double-buffering), at 1024x32768 bf16: whether more bytes in flight per program close
the gap between softmax / layer_norm (two block-wide reductions) and rms_norm (one).

Kernels (a row a program, two reads of the row, the second from L2):
- rms: sum of squares, then x * rstd * w;
- softmax: online max and sum of exps, then exp(x - max) / sum;
each as written today (``PREFETCH=0``), with the next chunk prefetched in each loop (1), and
with the output pass's first chunk also loaded before the reductions between the passes (2).

Usage (GPU machine): PYTHONPATH=. python3 tools/probe_prefetch.py
"""

import itertools

import torch
import triton
import triton.language as tl

from tools.sweep_rowwise import graph_us


@triton.jit
def _rms(x_ptr, w_ptr, out_ptr, N, stride, BLOCK_N: tl.constexpr, PREFETCH: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * stride
    out_row = out_ptr + row * stride
    offs = tl.arange(0, BLOCK_N)
    acc = tl.zeros([BLOCK_N], tl.float32)
    if PREFETCH:
        nxt = tl.load(x_row + offs, mask=offs < N, other=0.0, eviction_policy="evict_last")
        for start in range(0, N, BLOCK_N):
            x = nxt.to(tl.float32)
            cols = start + BLOCK_N + offs
            nxt = tl.load(x_row + cols, mask=cols < N, other=0.0, eviction_policy="evict_last")
            acc += x * x
    else:
        for start in range(0, N, BLOCK_N):
            cols = start + offs
            x = tl.load(x_row + cols, mask=cols < N, other=0.0, eviction_policy="evict_last").to(tl.float32)
            acc += x * x
    if PREFETCH == 2:
        nxt = tl.load(x_row + offs, mask=offs < N, other=0.0, eviction_policy="evict_first")
    rstd = tl.rsqrt(tl.sum(acc) / N + 1e-6)
    if PREFETCH:
        if PREFETCH == 1:
            nxt = tl.load(x_row + offs, mask=offs < N, other=0.0, eviction_policy="evict_first")
        for start in range(0, N, BLOCK_N):
            x = nxt.to(tl.float32)
            cols = start + offs
            ahead = cols + BLOCK_N
            nxt = tl.load(x_row + ahead, mask=ahead < N, other=0.0, eviction_policy="evict_first")
            w = tl.load(w_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)
            tl.store(out_row + cols, (x * rstd * w).to(out_ptr.dtype.element_ty), mask=cols < N)
    else:
        for start in range(0, N, BLOCK_N):
            cols = start + offs
            x = tl.load(x_row + cols, mask=cols < N, other=0.0, eviction_policy="evict_first").to(tl.float32)
            w = tl.load(w_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)
            tl.store(out_row + cols, (x * rstd * w).to(out_ptr.dtype.element_ty), mask=cols < N)


@triton.jit
def _online(acc_max, acc_sum, x, mask):
    value = tl.where(mask, x, float("-inf"))
    new_max = tl.maximum(acc_max, value)
    shift = tl.where(new_max == float("-inf"), 0.0, new_max)
    greater = value > acc_max
    term = tl.exp(tl.where(greater, acc_max, value) - shift)
    acc_sum = tl.where(greater, acc_sum * term + 1.0, acc_sum + term)
    return new_max, acc_sum


@triton.jit
def _softmax(x_ptr, out_ptr, N, stride, BLOCK_N: tl.constexpr, PREFETCH: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * stride
    out_row = out_ptr + row * stride
    offs = tl.arange(0, BLOCK_N)
    acc_max = tl.full([BLOCK_N], float("-inf"), tl.float32)
    acc_sum = tl.zeros([BLOCK_N], tl.float32)
    if PREFETCH:
        nxt = tl.load(x_row + offs, mask=offs < N, other=0.0, eviction_policy="evict_last")
        for start in range(0, N, BLOCK_N):
            x = nxt.to(tl.float32)
            cols = start + offs
            ahead = cols + BLOCK_N
            nxt = tl.load(x_row + ahead, mask=ahead < N, other=0.0, eviction_policy="evict_last")
            acc_max, acc_sum = _online(acc_max, acc_sum, x, cols < N)
    else:
        for start in range(0, N, BLOCK_N):
            cols = start + offs
            x = tl.load(x_row + cols, mask=cols < N, other=0.0, eviction_policy="evict_last").to(tl.float32)
            acc_max, acc_sum = _online(acc_max, acc_sum, x, cols < N)
    if PREFETCH == 2:
        nxt = tl.load(x_row + offs, mask=offs < N, other=0.0, eviction_policy="evict_first")
    row_max = tl.max(acc_max)
    shift = tl.where(row_max == float("-inf"), 0.0, row_max)
    row_sum = tl.sum(acc_sum * tl.exp(acc_max - shift))
    inv = 1.0 / row_sum
    if PREFETCH:
        if PREFETCH == 1:
            nxt = tl.load(x_row + offs, mask=offs < N, other=0.0, eviction_policy="evict_first")
        for start in range(0, N, BLOCK_N):
            x = nxt.to(tl.float32)
            cols = start + offs
            ahead = cols + BLOCK_N
            nxt = tl.load(x_row + ahead, mask=ahead < N, other=0.0, eviction_policy="evict_first")
            tl.store(out_row + cols, (tl.exp(x - shift) * inv).to(out_ptr.dtype.element_ty), mask=cols < N)
    else:
        for start in range(0, N, BLOCK_N):
            cols = start + offs
            x = tl.load(x_row + cols, mask=cols < N, other=0.0, eviction_policy="evict_first").to(tl.float32)
            tl.store(out_row + cols, (tl.exp(x - shift) * inv).to(out_ptr.dtype.element_ty), mask=cols < N)


def main():
    rows, n = 1024, 32768
    x = torch.randn(rows, n, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    out = torch.empty_like(x)
    want = {"rms": torch.nn.functional.rms_norm(x.float(), [n], w.float(), 1e-6),
            "softmax": torch.softmax(x.float(), -1)}
    copy = graph_us(lambda: out.copy_(x))
    print(f"copy of x: {copy:.1f} us")
    for rnd in range(2):
        for (name, kernel), (block, warps), prefetch in itertools.product(
                (("rms", _rms), ("softmax", _softmax)),
                ((2048, 16), (4096, 8), (4096, 16), (4096, 32), (8192, 16), (8192, 32), (16384, 32)),
                (0, 1, 2)):
            args = (x, w, out) if name == "rms" else (x, out)

            def fn():
                kernel[(rows,)](*args, n, x.stride(0), BLOCK_N=block, PREFETCH=prefetch,
                                num_warps=warps)
            try:
                us = graph_us(fn)
                error = (out.float() - want[name]).abs().max().item()
                print(f"round {rnd} {name:8s} {block:6d} x {warps:2d} prefetch {prefetch}: "
                      f"{us:6.1f} us ({copy / us:4.0%} of copy), max error {error:.1e}", flush=True)
            except Exception as exc:  # noqa: BLE001 - a config that does not compile: say so
                print(f"round {rnd} {name} {block} x {warps} prefetch {prefetch}: "
                      f"{type(exc).__name__}: {str(exc)[:120]}", flush=True)


if __name__ == "__main__":
    main()

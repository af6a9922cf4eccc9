"""GPU probe: row-wise ops at 32768x1024 bf16 with rows moved by TMA (one device call).

The one-row-a-program kernels (ours and the tutorial form) read 81-85% of the copy bandwidth at
this shape, torch's copy 87% (docs/performance.md). This probe asks whether bulk copies help:
each program moves whole rows through shared memory with tensor descriptors (a row viewed as
CH chunks of W, since a TMA box is at most 256 wide), reduces there, and stores the result by
TMA. Variants: rows a program, chunk width, warps, the box used as [BM, CH, W] or reshaped to
the [BM, N] tile a template would use ("flat"), descriptors passed in or made in the kernel, and
(--persistent) a persistent grid whose loop the pipeliner prefetches (stages). Each variant is
checked against torch before it is timed.

Timing as bench/ times (do_bench median, L2 flushed, two input sets rotated): one sweep, then
three interleaved rounds of the best TMA variant of each op next to the generated op, the
pointer tutorial kernel and torch's copy.

Usage (GPU machine): PYTHONPATH=. python3 tools/probe_tma_rows.py [--rows R --n N] [--persistent]
"""

from __future__ import annotations

import argparse
import itertools

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from tools.probe_memory import (bench_us, copy_kernel, layer_norm_kernel, rms_norm_kernel,
                                softmax_kernel)

N = 1024
DTYPE = torch.bfloat16
LOG2E = tl.constexpr(1.4426950408889634)
OPS = ("copy", "softmax", "rms_norm", "layer_norm")


@triton.jit
def _row_sum(x):
    # [BM, CH, W] -> [BM, 1, 1]
    return tl.sum(tl.sum(x, 2), 1)[:, None, None]


@triton.jit
def _rows(x_desc, o_desc, row, w, b, eps, OP: tl.constexpr, N: tl.constexpr):
    x = x_desc.load([row, 0, 0])
    if OP == 0:
        y = x
    else:
        x = x.to(tl.float32)
        if OP == 1:
            m = tl.max(tl.max(x, 2), 1)[:, None, None]
            e = tl.exp2((x - m) * LOG2E)
            y = e * (1.0 / _row_sum(e))
        elif OP == 2:
            y = x * tl.rsqrt(_row_sum(x * x) / N + eps) * w
        else:
            mean = _row_sum(x) / N
            dev = x - mean
            y = dev * tl.rsqrt(_row_sum(dev * dev) / N + eps) * w + b
    o_desc.store([row, 0, 0], y.to(o_desc.dtype))


@triton.jit
def tma_flat_kernel(x_ptr, o_ptr, x_hdesc, o_hdesc, w_ptr, b_ptr, n_rows, eps, OP: tl.constexpr,
                    BM: tl.constexpr, CH: tl.constexpr, W: tl.constexpr,
                    DEVICE_DESC: tl.constexpr):
    # the form a template would take: the [BM, CH, W] box reshaped to the [BM, N] tile the
    # expressions use, and descriptors made in the kernel (as the TMA matmul does) or passed in
    N: tl.constexpr = CH * W
    if DEVICE_DESC:
        x_desc = tl.make_tensor_descriptor(x_ptr, shape=[n_rows, CH, W], strides=[N, W, 1],
                                           block_shape=[BM, CH, W])
        o_desc = tl.make_tensor_descriptor(o_ptr, shape=[n_rows, CH, W], strides=[N, W, 1],
                                           block_shape=[BM, CH, W])
    else:
        x_desc = x_hdesc
        o_desc = o_hdesc
    row = tl.program_id(0) * BM
    cols = tl.arange(0, N)[None, :]
    x = tl.reshape(x_desc.load([row, 0, 0]), [BM, N])
    if OP == 0:
        y = x
    else:
        x = x.to(tl.float32)
        w = tl.load(w_ptr + cols).to(tl.float32)
        if OP == 1:
            e = tl.exp2((x - tl.max(x, 1, keep_dims=True)) * LOG2E)
            y = e * (1.0 / tl.sum(e, 1, keep_dims=True))
        elif OP == 2:
            y = x * tl.rsqrt(tl.sum(x * x, 1, keep_dims=True) / N + eps) * w
        else:
            b = tl.load(b_ptr + cols).to(tl.float32)
            dev = x - tl.sum(x, 1, keep_dims=True) / N
            y = dev * tl.rsqrt(tl.sum(dev * dev, 1, keep_dims=True) / N + eps) * w + b
    o_desc.store([row, 0, 0], tl.reshape(y.to(o_desc.dtype), [BM, CH, W]))


@triton.jit
def tma_rows_kernel(x_desc, o_desc, w_ptr, b_ptr, n_rows, eps, OP: tl.constexpr,
                    BM: tl.constexpr, CH: tl.constexpr, W: tl.constexpr,
                    PERSISTENT: tl.constexpr, STAGES: tl.constexpr):
    cols = tl.arange(0, CH)[:, None] * W + tl.arange(0, W)[None, :]
    w = tl.load(w_ptr + cols).to(tl.float32)[None, :, :]
    b = tl.load(b_ptr + cols).to(tl.float32)[None, :, :]
    if PERSISTENT:
        for tile in tl.range(tl.program_id(0), n_rows // BM, tl.num_programs(0),
                             num_stages=STAGES):
            _rows(x_desc, o_desc, tile * BM, w, b, eps, OP, CH * W)
    else:
        _rows(x_desc, o_desc, tl.program_id(0) * BM, w, b, eps, OP, CH * W)


def reference(op, x, w, b):
    if op == "copy":
        return x.clone()
    if op == "softmax":
        return torch.softmax(x.float(), -1).to(x.dtype)
    if op == "rms_norm":
        return F.rms_norm(x.float(), (N,), w.float(), 1e-6).to(x.dtype)
    return F.layer_norm(x.float(), (N,), w.float(), b.float(), 1e-5).to(x.dtype)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=32768)
    parser.add_argument("--n", type=int, default=1024)
    parser.add_argument("--quick", action="store_true", help="a few variants (interpreter check)")
    parser.add_argument("--persistent", action="store_true",
                        help="also the persistent grids (rows per program x stages) of the 3-D form")
    args = parser.parse_args()
    global N
    rows, N = args.rows, args.n
    device = "cuda" if torch.cuda.is_available() else "cpu"
    print("device", torch.cuda.get_device_name() if device == "cuda" else "cpu",
          "torch", torch.__version__, "triton", triton.__version__, flush=True)
    # device-side descriptors take their 128 bytes from Triton's launch-time allocator
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8,
                                                                 device=device))
    if device == "cuda":
        from bench.harness import measure_copy_bandwidth
        copy_gbps = measure_copy_bandwidth()
    else:
        copy_gbps = float("nan")
    print(f"copy 1 GiB: {copy_gbps:.0f} GB/s", flush=True)
    sets = [(torch.randn(rows, N, device=device, dtype=DTYPE),
             torch.empty(rows, N, device=device, dtype=DTYPE)) for _ in range(2)]
    w, b = (torch.randn(N, device=device, dtype=DTYPE) for _ in range(2))
    nbytes = 2 * rows * N * DTYPE.itemsize
    sms = torch.cuda.get_device_properties(0).multi_processor_count if device == "cuda" else 2

    def line(label, us):
        print(f"{label:64s} {us:7.1f} us  {nbytes / us / 1e3:6.0f} GB/s  "
              f"{100 * nbytes / us / 1e3 / copy_gbps:4.0f}% copy", flush=True)

    def tma(op, bm, width, warps, per_sm, stages):
        ch = N // width
        descs = {id(x): (TensorDescriptor.from_tensor(x.view(rows, ch, width), [bm, ch, width]),
                         TensorDescriptor.from_tensor(o.view(rows, ch, width), [bm, ch, width]))
                 for x, o in sets}
        grid = (min(per_sm * sms, rows // bm) if per_sm else rows // bm,)
        eps = 1e-5 if op == "layer_norm" else 1e-6

        def fn(x, o):
            tma_rows_kernel[grid](*descs[id(x)], w, b, rows, eps, OPS.index(op), bm, ch, width,
                                  bool(per_sm), stages, num_warps=warps)
        return fn

    def flat(op, bm, width, warps, device_desc):
        ch = N // width
        descs = {id(x): (TensorDescriptor.from_tensor(x.view(rows, ch, width), [bm, ch, width]),
                         TensorDescriptor.from_tensor(o.view(rows, ch, width), [bm, ch, width]))
                 for x, o in sets}
        eps = 1e-5 if op == "layer_norm" else 1e-6

        def fn(x, o):
            tma_flat_kernel[(rows // bm,)](x, o, *descs[id(x)], w, b, rows, eps, OPS.index(op),
                                           bm, ch, width, device_desc, num_warps=warps)
        return fn

    def checked(op, fn):
        x, o = sets[0]
        o.fill_(float("nan"))
        fn(x, o)
        torch.testing.assert_close(o.float(), reference(op, x, w, b).float(), atol=2e-2, rtol=2e-2)
        return fn

    def timed(fn):
        return bench_us(fn, sets) if device == "cuda" else float("nan")

    # the first run (docs/performance.md): persistent grids and 4 rows a program lose; one or two
    # rows a program on 1-2 warps win at 1024 wide
    warps_range = (1, 2) if N <= 1024 else (4, 8)
    variants = list(itertools.product((1, 2), (64, 256), warps_range))
    # (rows a program, warps, programs per SM, pipeline stages)
    persistent = [v for v in itertools.product((1, 2), (2, 4), (4, 8, 16), (2, 3))
                  if v[1] * v[2] <= 32] if args.persistent else []
    if args.quick:
        variants = [(1, 256, 2), (2, 64, 1)]
        persistent = [(2, 2, 2, 2)] if args.persistent else []
    best = {}
    for op in OPS:
        for bm, warps, per_sm, stages in persistent:
            line(f"{op} TMA 3-D persistent BM={bm} w={warps} per_sm={per_sm} stages={stages}",
                 timed(checked(op, tma(op, bm, 256, warps, per_sm, stages))))
        for v in variants:
            us = timed(checked(op, tma(op, *v, 0, 1)))
            line(f"{op} TMA 3-D BM={v[0]} W={v[1]} w={v[2]}", us)
            for device_desc in (False, True):
                us = timed(checked(op, flat(op, *v, device_desc)))
                line(f"{op} TMA flat BM={v[0]} W={v[1]} w={v[2]} device_desc={device_desc}", us)
                if op not in best or us < best[op][0]:
                    best[op] = (us, (*v, device_desc))
    if device != "cuda":
        print("interpreter: every variant matched torch", flush=True)
        return

    pointer = {
        "copy": lambda x, o: copy_kernel[(x.numel() // 4096,)](x, o, 4096, "", "", num_warps=8),
        "softmax": lambda x, o: softmax_kernel[(rows,)](x, o, N, 1, N, "", "",
                                                        num_warps=warps_range[-1]),
        "rms_norm": lambda x, o: rms_norm_kernel[(rows,)](x, w, o, N, 1e-6, 1, N, "",
                                                           num_warps=warps_range[-1]),
        "layer_norm": lambda x, o: layer_norm_kernel[(rows,)](x, w, b, o, N, 1e-5, 1, N, "",
                                                               num_warps=warps_range[-1]),
    }
    import generated
    ours = {
        "copy": lambda x, o: o.copy_(x),
        "softmax": lambda x, o: generated.softmax(x, -1),
        "rms_norm": lambda x, o: generated.rms_norm(x, [N], w, eps=1e-6),
        "layer_norm": lambda x, o: generated.layer_norm(x, [N], w, b),
    }
    for round_ in range(3):
        for op in OPS:
            line(f"round {round_} {op} {'torch' if op == 'copy' else 'specgen'}",
                 timed(ours[op]))
            line(f"round {round_} {op} pointer tutorial", timed(checked(op, pointer[op])))
            v = best[op][1]
            line(f"round {round_} {op} TMA flat best {v}", timed(flat(op, *v)))


if __name__ == "__main__":
    main()

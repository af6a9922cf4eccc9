"""TMA matmul variants of linear_gelu next to ours, cuBLAS and torch.compile (one GPU call).

The lead for linear_gelu's gap to compile (docs/performance.md): load both operands through TMA
descriptors (the weight as [BLOCK_N, BLOCK_K] tiles, transposed for the dot) on a one-tile-a-
program grid or on a persistent grid whose flattened loop overlaps a tile's epilogue with the next
tile's loads, as in Triton's persistent-matmul tutorial. Each variant is timed per config with
``do_bench_cudagraph`` (device time, inputs rotated past L2), checked against torch first.

Usage (GPU machine): PYTHONPATH=. python3 tools/probe_matmul.py [--shape 4096] [--shape 8192] [--ws]
"""

from __future__ import annotations

import argparse
import itertools
import math

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
import triton.testing
from triton.tools.tensor_descriptor import TensorDescriptor

import generated
from specgen.kernel_lib import gelu_tanh_f32

ROTATION_BYTES = 200 * 10**6
NUM_SMS = torch.cuda.get_device_properties(0).multi_processor_count if torch.cuda.is_available() else 132


@triton.jit
def _tile_ids(tile, tiles_m, tiles_n, GROUP_M: tl.constexpr):
    programs_in_group = GROUP_M * tiles_n
    first_m = (tile // programs_in_group) * GROUP_M
    group_rows = min(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (tile % programs_in_group) % group_rows
    pid_n = (tile % programs_in_group) // group_rows
    return pid_m, pid_n


@triton.jit
def _output_tile(x_desc, w_desc, out_desc, bias_ptr, N, K, pid_m, pid_n, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, WS: tl.constexpr):
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    # WS: Triton's automatic warp specialization (a producer warp issues the TMA copies)
    for k in tl.range(tl.cdiv(K, BLOCK_K), warp_specialize=WS):
        x = x_desc.load([pid_m * BLOCK_M, k * BLOCK_K])
        w = w_desc.load([pid_n * BLOCK_N, k * BLOCK_K])
        acc = tl.dot(x, w.T, acc)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    bias = tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)
    out = gelu_tanh_f32(acc + bias[None, :])
    out_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], out.to(out_desc.dtype))


@triton.jit
def tma_tile_kernel(x_desc, w_desc, out_desc, bias_ptr, M, N, K,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                    GROUP_M: tl.constexpr):
    pid_m, pid_n = _tile_ids(tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)
    _output_tile(x_desc, w_desc, out_desc, bias_ptr, N, K, pid_m, pid_n, BLOCK_M, BLOCK_N, BLOCK_K,
                 False)


@triton.jit
def tma_persistent_kernel(x_desc, w_desc, out_desc, bias_ptr, M, N, K,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                          GROUP_M: tl.constexpr, PROGRAMS: tl.constexpr, FLATTEN: tl.constexpr,
                          WS: tl.constexpr = False):
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    for tile in tl.range(tl.program_id(0), tiles_m * tiles_n, PROGRAMS, flatten=FLATTEN):
        pid_m, pid_n = _tile_ids(tile, tiles_m, tiles_n, GROUP_M)
        _output_tile(x_desc, w_desc, out_desc, bias_ptr, N, K, pid_m, pid_n, BLOCK_M, BLOCK_N,
                     BLOCK_K, WS)


def tma_linear_gelu(x, w, b, meta, persistent, flatten=True, ws=False):
    m, k = x.shape
    n = w.shape[0]
    bm, bn, bk = meta["BLOCK_M"], meta["BLOCK_N"], meta["BLOCK_K"]
    out = torch.empty((m, n), device=x.device, dtype=x.dtype)
    x_desc = TensorDescriptor.from_tensor(x, [bm, bk])
    w_desc = TensorDescriptor.from_tensor(w, [bn, bk])
    out_desc = TensorDescriptor.from_tensor(out, [bm, bn])
    tiles = triton.cdiv(m, bm) * triton.cdiv(n, bn)
    common = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=meta["GROUP_M"],
                  num_warps=meta["num_warps"], num_stages=meta["num_stages"])
    if persistent:
        programs = min(tiles, NUM_SMS * meta.get("per_sm", 1))
        tma_persistent_kernel[(programs,)](x_desc, w_desc, out_desc, b, m, n, k,
                                           PROGRAMS=programs, FLATTEN=flatten, WS=ws, **common)
    else:
        tma_tile_kernel[(tiles,)](x_desc, w_desc, out_desc, b, m, n, k, **common)
    return out


def config(m, n, k, warps, stages, group=8, per_sm=1):
    return {"BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": k, "GROUP_M": group, "num_warps": warps,
            "num_stages": stages, "per_sm": per_sm}


CONFIGS = [
    config(128, 256, 64, 8, 3), config(128, 256, 64, 8, 4), config(256, 128, 64, 8, 3),
    config(128, 128, 64, 8, 4), config(128, 128, 64, 4, 4), config(128, 128, 64, 8, 3, per_sm=2),
    config(128, 256, 64, 8, 3, group=16), config(128, 128, 128, 8, 3),
]


WS_CONFIGS = [
    config(128, 256, 64, 8, 3, group=16), config(128, 256, 64, 8, 3), config(128, 128, 64, 8, 4),
    config(128, 128, 64, 4, 4), config(128, 256, 64, 8, 2, group=16),
]


def reference(x, w, b):
    return F.gelu(F.linear(x, w, b), approximate="tanh")


def device_us(fn, sets) -> float:
    for args in sets:
        fn(*args)
    torch.cuda.synchronize()
    cycle = itertools.cycle(sets)
    return triton.testing.do_bench_cudagraph(lambda: fn(*next(cycle)), rep=20,
                                             return_mode="median") * 1e3


def host_us(fn, sets) -> float:
    """bench/'s timing: do_bench with its L2 flush, host time included."""
    cycle = itertools.cycle(sets)
    return triton.testing.do_bench(lambda: fn(*next(cycle)), warmup=25, rep=100,
                                   return_mode="median") * 1e3


def run_shape(size: int, ws: bool) -> None:
    m = n = k = size

    def make(seed):
        g = torch.Generator(device="cuda").manual_seed(seed)
        return (torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=g),
                torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=g) * k ** -0.5,
                torch.randn(n, device="cuda", dtype=torch.bfloat16, generator=g))
    first = make(0)
    per_set = sum(t.numel() * t.element_size() for t in first)
    sets = [first] + [make(s) for s in range(1, math.ceil(ROTATION_BYTES / per_set))]
    expected = reference(*first).double()
    flops = 2 * m * n * k
    compiled = torch.compile(reference)
    cublas_gelu = lambda x, w, b: torch._addmm_activation(b, x, w.t(), use_gelu=True)  # noqa: E731

    def line(label, fn):
        try:
            out = fn(*first).double()
            error = ((out - expected).norm() / expected.norm()).item()
            check = "" if error < 2e-2 else f" WRONG {error:.2e}"
            us = device_us(fn, sets)
            bench = host_us(fn, sets)
            print(f"{size} | {label:44s} | graph {us:8.1f} us {flops / us / 1e6:6.1f} TFLOP/s "
                  f"| do_bench {bench:8.1f} us{check}", flush=True)
        except Exception as exc:  # noqa: BLE001 - a probe reports a failing variant and goes on
            print(f"{size} | {label:44s} | FAILED {type(exc).__name__}: {str(exc)[:200]}",
                  flush=True)

    line("eager", reference)
    line("compile", compiled)
    line("cublasLt addmm+gelu", cublas_gelu)
    line("specgen linear_gelu", generated.linear_gelu)
    for meta in WS_CONFIGS if ws else CONFIGS:
        shown = (f"{meta['BLOCK_M']}x{meta['BLOCK_N']}x{meta['BLOCK_K']} g{meta['GROUP_M']} "
                 f"w{meta['num_warps']} s{meta['num_stages']}")
        if ws:
            for flatten in (False, True):
                line(f"tma persistent ws flat={flatten} {shown}",
                     lambda x, w, b, meta=meta, flatten=flatten: tma_linear_gelu(
                         x, w, b, meta, True, flatten=flatten, ws=True))
            continue
        line(f"tma tile {shown}", lambda x, w, b, meta=meta: tma_linear_gelu(x, w, b, meta, False))
        line(f"tma persistent x{meta['per_sm']} {shown}",
             lambda x, w, b, meta=meta: tma_linear_gelu(x, w, b, meta, True))
        line(f"tma persistent noflat x{meta['per_sm']} {shown}",
             lambda x, w, b, meta=meta: tma_linear_gelu(x, w, b, meta, True, flatten=False))
    del sets, first
    torch.cuda.empty_cache()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", type=int, action="append")
    parser.add_argument("--ws", action="store_true", help="the warp-specialized variants only")
    options = parser.parse_args()
    print("torch", torch.__version__, "triton", triton.__version__, torch.cuda.get_device_name(),
          flush=True)
    for size in options.shape or [4096, 8192]:
        run_shape(size, options.ws)


if __name__ == "__main__":
    main()

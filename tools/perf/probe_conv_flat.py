"""Probe for issue 40's NCHW 1 x 1 cell: the flat kernel's orientation and stores.

At N32 C64 56x56 K256 (bf16, NCHW) the generated flat kernel takes 0.024 ms against cuDNN's
0.021 (0.88x, H200, docs/performance.md 001f): the cell moves 64 MB (the output is four times
the input), cuDNN at about 3.0 TB/s, ours at 2.7. The generated kernel computes a tile of
pixels x output channels (``acc = x_tile @ w_tile``), whose NCHW store runs along the tile's
first dim: across threads of the accumulator's layout, which Triton converts through shared
memory first. The forms timed here, each a persistent weight-stationary walk as the
generated kernel's (a program loads its weight block once and walks pixel blocks in a pipelined
``tl.range``):

- ``ORIENT`` "pk": the generated kernel's tile (pixels x channels), or "kp": the transposed
  product (``acc = w_tile.T @ x_tile``: channels x pixels), whose rows are the output's
  contiguous pixel runs as the accumulator holds them;
- ``STORE`` "ptr": ``tl.store`` of the tile, or "tma": a TMA store (a 3-D descriptor over the
  output as (N, K, H * W)), asynchronous, clipped at each image's last partial block;
- ``LOAD`` "ptr" or "tma" (the input as (N, C, H * W), channels x pixels blocks).

By ptxas for sm_90a (triton 3.8 on a CPU machine, 128 x 128 on 8 warps, 3 stages): "pk" with
pointer stores 126 registers and 4 st.shared (the conversion), "kp" 136 and 12, either with a
TMA store 90-92 registers (and no st.global). Each is checked against ``F.conv2d`` first, then timed as the bench times (do_bench with its
L2 flush, the median of 3 interleaved rounds), next to cuDNN and the generated op.

    PYTHONPATH=. python3 tools/perf/probe_conv_flat.py            # GPU
    TRITON_INTERPRET=1 PYTHONPATH=. python3 tools/perf/probe_conv_flat.py --check
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

import generated

DEVICE = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"


@triton.jit
def _flat_kernel(x_ptr, w_ptr, out_ptr, images, C, K, pixels,
                 x_stride_n, x_stride_c, w_stride_k, out_stride_n, out_stride_k,
                 C_BLOCK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 STAGES: tl.constexpr, ORIENT: tl.constexpr, LOAD: tl.constexpr,
                 STORE: tl.constexpr):
    """NCHW input (pixels contiguous), weight (K, C), NCHW output; C <= C_BLOCK."""
    pid_n = tl.program_id(0)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_c = tl.arange(0, C_BLOCK)
    mask_c = offs_c < C
    # the weight block, loaded once: (C_BLOCK, BLOCK_N) for "pk", (BLOCK_N, C_BLOCK) for "kp"
    if ORIENT == "pk":
        w = tl.load(w_ptr + offs_n[None, :] * w_stride_k + offs_c[:, None],
                    mask=mask_c[:, None], other=0.0)
    else:
        w = tl.load(w_ptr + offs_n[:, None] * w_stride_k + offs_c[None, :],
                    mask=mask_c[None, :], other=0.0)
    if LOAD == "tma":
        x_desc = tl.make_tensor_descriptor(x_ptr, shape=[images, C, pixels],
                                           strides=[x_stride_n, x_stride_c, 1],
                                           block_shape=[1, C_BLOCK, BLOCK_M])
    if STORE == "tma":
        out_desc = tl.make_tensor_descriptor(out_ptr, shape=[images, K, pixels],
                                             strides=[out_stride_n, out_stride_k, 1],
                                             block_shape=[1, BLOCK_N, BLOCK_M])
    tiles_m = tl.cdiv(pixels, BLOCK_M)
    for tile in tl.range(tl.program_id(1), images * tiles_m, tl.num_programs(1),
                         num_stages=STAGES):
        image = tile // tiles_m
        first = (tile % tiles_m) * BLOCK_M
        pixel = first + tl.arange(0, BLOCK_M)
        mask_m = pixel < pixels
        # (channels, pixels): the input's contiguous runs along the last dim
        if LOAD == "tma":
            x = x_desc.load([image, 0, first]).reshape(C_BLOCK, BLOCK_M)
        else:
            x = tl.load(x_ptr + image * x_stride_n + offs_c[:, None] * x_stride_c
                        + pixel[None, :], mask=mask_c[:, None] & mask_m[None, :], other=0.0)
        if ORIENT == "pk":
            # the generated kernel's tile: pixels x channels
            acc = tl.dot(tl.trans(x), w)
            tile_kp = tl.trans(acc)
        else:
            tile_kp = tl.dot(w, x)
        values = tile_kp.to(out_ptr.dtype.element_ty)
        if STORE == "tma":
            out_desc.store([image, pid_n * BLOCK_N, first], values.reshape(1, BLOCK_N, BLOCK_M))
        else:
            tl.store(out_ptr + image * out_stride_n + offs_n[:, None] * out_stride_k
                     + pixel[None, :], values, mask=mask_m[None, :])


def flat(x, w, block_m, block_n, warps, stages, per_sm, orient, load, store):
    images, c, h, wd = x.shape
    k = w.shape[0]
    assert x.is_contiguous() and k % block_n == 0
    out = torch.empty(images, k, h, wd, device=x.device, dtype=x.dtype)
    w2 = w.reshape(k, c)
    c_block = max(16, triton.next_power_of_2(c))
    sms = torch.cuda.get_device_properties(0).multi_processor_count if DEVICE == "cuda" else 4
    programs = max(1, sms * per_sm // (k // block_n))
    _flat_kernel[(k // block_n, programs)](
        x, w2, out, images, c, k, h * wd, x.stride(0), x.stride(1), w2.stride(0),
        out.stride(0), out.stride(1), C_BLOCK=c_block, BLOCK_M=block_m, BLOCK_N=block_n,
        STAGES=stages, ORIENT=orient, LOAD=load, STORE=store, num_warps=warps)
    return out


# (BLOCK_M pixels, BLOCK_N channels, warps, stages, programs a multiprocessor, ORIENT, LOAD,
# STORE): the generated kernel's frozen 128 x 128 on 8 warps, 2 a multiprocessor, and its
# neighbours
VARIANTS = [(bm, bn, warps, stages, per_sm, orient, load, store)
            for (bm, bn, warps), stages, per_sm, orient, load, store in itertools.product(
                ((128, 128, 8), (64, 256, 8), (128, 64, 4)),
                (2, 3), (2,), ("pk", "kp"), ("ptr", "tma"), ("ptr", "tma"))]


def check() -> None:
    torch.manual_seed(0)
    # 80 pixels an image: rows of 160 bytes (TMA's strides are multiples of 16), and a partial
    # last block of pixels; 20 channels of a 32-channel block (the rest loads zeros)
    x = torch.randn(3, 20, 8, 10, device=DEVICE, dtype=torch.float16)
    w = torch.randn(64, 20, 1, 1, device=DEVICE, dtype=torch.float16) / 5
    want = F.conv2d(x.double(), w.double())
    for variant in ((32, 32, 4, 2, 1, "pk", "ptr", "ptr"), (32, 64, 4, 2, 1, "kp", "tma", "tma"),
                    (64, 32, 4, 3, 2, "pk", "tma", "ptr"), (16, 32, 4, 2, 1, "kp", "ptr", "tma")):
        got = flat(x, w, *variant)
        error = ((got.double() - want).norm() / want.norm()).item()
        print(variant, f"relative error {error:.1e}")
        assert error < 2e-3, error


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--check", action="store_true", help="correctness only (interpreter)")
    if parser.parse_args().check:
        check()
        return
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8,
                                                                 device="cuda"))
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__,
          flush=True)
    x = torch.randn(32, 64, 56, 56, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(256, 64, 1, 1, device="cuda", dtype=torch.bfloat16) / 8
    want = F.conv2d(x.float(), w.float())
    fns = {"cuDNN": lambda: F.conv2d(x, w), "generated": lambda: generated.conv2d(x, w)}
    for variant in VARIANTS:
        fns["{}x{} w{} s{} {}/SM {} load {} store {}".format(*variant)] = \
            (lambda v=variant: flat(x, w, *v))
    ok = {}
    for name, fn in fns.items():
        try:
            error = ((fn().float() - want).norm() / want.norm()).item()
        except Exception as exc:  # noqa: BLE001 - a variant that does not compile is reported
            print(f"{name}: FAILED {type(exc).__name__}: {str(exc)[:150]}", flush=True)
            continue
        if not error < 2e-2:
            print(f"{name}: WRONG, relative error {error:.1e}", flush=True)
            continue
        ok[name] = fn
    rounds = {name: [] for name in ok}
    for _ in range(3):
        for name, fn in ok.items():
            rounds[name].append(triton.testing.do_bench(fn, warmup=25, rep=100,
                                                        return_mode="median") * 1000)
    times = {name: statistics.median(t) for name, t in rounds.items()}
    cudnn = times["cuDNN"]
    for name in sorted(times, key=times.get):
        print(f"{name:42s} {times[name]:6.1f} us  {cudnn / times[name]:.2f}x cuDNN", flush=True)


if __name__ == "__main__":
    main()

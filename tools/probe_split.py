"""GPU probe: few long rows (8x262144 bf16), where a row-wise op is launch-bound (one device call).

The split strategy runs two kernels: partial statistics of each share of a row, then the outputs
(the second kernel re-reads its share, from L2). This probe asks what one kernel would gain: each
program keeps its share in registers, publishes its partial, waits at a per-row barrier (an
atomic ticket, spun on) for the other programs of its row, combines the row's partials and
writes its share. A spin barrier needs every program of a row resident at once, which
``launch_cooperative_grid`` guarantees (the launch fails otherwise).

Lines, each timed two ways: ``bench`` = do_bench median as bench/ times it (L2 flushed, inputs
rotated, host path included where it outlasts the flush); ``graph`` = the same call captured in
a CUDA graph and replayed after the flush (device time only). For rms_norm and layer_norm:
ours (two kernels), torch.compile, and the one-kernel form at several shares and warp counts.

Usage (GPU machine): PYTHONPATH=. python3 tools/probe_split.py
"""

from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

ROWS, N = 8, 262144
DTYPE = torch.bfloat16
SETS = 8  # rotated input sets (4 MB each), as bench/ rotates small cases


@triton.jit
def one_kernel_norm(x_ptr, w_ptr, b_ptr, out_ptr, part_ptr, ticket_ptr, N, eps,
                    SPLITS: tl.constexpr, SHARE: tl.constexpr, LAYER: tl.constexpr):
    pid = tl.program_id(0)
    row = pid // SPLITS
    cols = (pid % SPLITS) * SHARE + tl.arange(0, SHARE)
    offs = row.to(tl.int64) * N + cols
    x = tl.load(x_ptr + offs).to(tl.float32)
    if LAYER:
        # the share's sum and its centred sum of squares (merged below as in Chan et al.)
        share_sum = tl.sum(x, 0)
        dev = x - share_sum / SHARE
        tl.store(part_ptr + 2 * pid, share_sum)
        tl.store(part_ptr + 2 * pid + 1, tl.sum(dev * dev, 0))
    else:
        tl.store(part_ptr + pid, tl.sum(x * x, 0))
    # barrier of the row's programs: release the partial, then wait for every ticket
    tl.atomic_add(ticket_ptr + row, 1, sem="release")
    arrived = tl.atomic_add(ticket_ptr + row, 0, sem="acquire")
    while arrived < SPLITS:
        arrived = tl.atomic_add(ticket_ptr + row, 0, sem="acquire")
    splits = tl.arange(0, SPLITS)
    if LAYER:
        sums = tl.load(part_ptr + 2 * (row * SPLITS + splits), cache_modifier=".cg")
        m2s = tl.load(part_ptr + 2 * (row * SPLITS + splits) + 1, cache_modifier=".cg")
        mean = tl.sum(sums, 0) / N
        share_means = sums / SHARE
        var = (tl.sum(m2s, 0) + tl.sum(SHARE * (share_means - mean) * (share_means - mean), 0)) / N
        y = (x - mean) * tl.rsqrt(var + eps) * tl.load(w_ptr + cols).to(tl.float32) \
            + tl.load(b_ptr + cols).to(tl.float32)
    else:
        total = tl.sum(tl.load(part_ptr + row * SPLITS + splits, cache_modifier=".cg"), 0)
        y = x * tl.rsqrt(total / N + eps) * tl.load(w_ptr + cols).to(tl.float32)
    tl.store(out_ptr + offs, y.to(out_ptr.dtype.element_ty))
    # the row's last program out resets the tickets for the next launch
    if tl.atomic_add(ticket_ptr + ROWS_MAX + row, 1) == SPLITS - 1:
        tl.atomic_xchg(ticket_ptr + row, 0)
        tl.atomic_xchg(ticket_ptr + ROWS_MAX + row, 0)


ROWS_MAX = tl.constexpr(1024)


def timed(fn, sets) -> tuple[float, float]:
    for s in sets:
        fn(*s)
    torch.cuda.synchronize()
    cycle = itertools.cycle(sets)
    bench = triton.testing.do_bench(lambda: fn(*next(cycle)), warmup=25, rep=100,
                                    return_mode="median") * 1e3
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn(*sets[0])
    dev = triton.testing.do_bench(graph.replay, warmup=10, rep=50, return_mode="median") * 1e3
    return bench, dev


def main() -> None:
    import generated

    print("device", torch.cuda.get_device_name(), "torch", torch.__version__, "triton",
          triton.__version__, flush=True)
    w = torch.randn(N, device="cuda", dtype=DTYPE)
    b = torch.randn(N, device="cuda", dtype=DTYPE)
    sets = [(torch.randn(ROWS, N, device="cuda", dtype=DTYPE),) for _ in range(SETS)]
    tickets = torch.zeros(2 * ROWS_MAX.value, device="cuda", dtype=torch.int32)
    parts = torch.empty(2 * ROWS * 1024, device="cuda", dtype=torch.float32)

    def line(label, times):
        print(f"{label:56s} bench {times[0]:6.1f} us   graph {times[1]:6.1f} us", flush=True)

    for layer in (False, True):
        name = "layer_norm" if layer else "rms_norm"
        vec = (w, b) if layer else (w,)
        ref = (lambda x: F.layer_norm(x, (N,), w, b)) if layer else (lambda x: F.rms_norm(x, (N,), w))
        ours = getattr(generated, name)
        compiled = torch.compile(ref, dynamic=False)
        line(f"{name} ours (split, two kernels)", timed(lambda x: ours(x, [N], *vec), sets))
        line(f"{name} torch.compile", timed(compiled, sets))
        for share, warps in itertools.product((1024, 2048, 4096, 8192), (2, 4, 8)):
            if not 4 <= share // (32 * warps) <= 64:
                continue
            splits = N // share

            def one(x, share=share, warps=warps, splits=splits):
                out = torch.empty_like(x)
                one_kernel_norm[(ROWS * splits,)](x, w, b, out, parts, tickets, N, 1e-5, splits,
                                                  share, layer, num_warps=warps,
                                                  launch_cooperative_grid=True)
                return out

            try:
                out = one(sets[0][0])
                err = ((out.double() - ref(sets[0][0]).double()).norm()
                       / ref(sets[0][0]).double().norm()).item()
                line(f"{name} one kernel share={share} w={warps} (err {err:.1e})", timed(one, sets))
            except Exception as exc:  # a grid too large for one wave says so here
                print(f"{name} one kernel share={share} w={warps}: {type(exc).__name__}: {exc}",
                      flush=True)


if __name__ == "__main__":
    main()

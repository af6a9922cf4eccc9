"""Attention forward, and forward+backward, bf16: TFLOP/s of specgen against torch's scaled_dot_product_attention with
its own choice, forced to the flash backend and forced to cuDNN, and for the variants written as
specs against torch.compile'd FlexAttention with the same score_mod / mask_mod.

FLOPs count the two matmuls, 4 * B * H * L * S * E, halved under a causal mask (the keys a row
sees), as FlashAttention's benchmarks count them; forward+backward counts 3.5 times that (the
backward's five matmuls, as FlashAttention's benchmarks). Each timing is do_bench's median (L2 flushed
before each call); the check column is specgen's largest error against SDPA (its default
backend) on the inputs in float32.

    python3 -m bench --only attention
"""

from __future__ import annotations

import traceback
from typing import Callable

import torch
import torch.nn.functional as F

from bench import harness

DTYPE = torch.bfloat16
# (batch, heads, length, head dim, causal): the cells
SHAPES = ((4, 32, 4096, 128, False), (4, 32, 4096, 128, True), (16, 16, 1024, 64, False),
          (4, 32, 4096, 256, False))
PEERS = ("specgen", "sdpa", "sdpa flash", "sdpa cudnn")
# forward+backward: the cells
TRAINING_SHAPES = SHAPES[:3]


def _generated():
    import generated

    return generated


def _sdpa(backend):
    from torch.nn.attention import sdpa_kernel

    def run(q, k, v, causal):
        if backend is None:
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return run


def _flex(score_mod, mask_mod, length):
    """torch.compile'd flex_attention with its block mask made once, outside the timing (as a
    model makes it once per shape)."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    compiled = torch.compile(flex_attention)
    block = create_block_mask(mask_mod, None, None, length, length, device="cuda")

    def run(q, k, v):
        return compiled(q, k, v, score_mod=score_mod, block_mask=block)
    return run


def _time(fn: Callable) -> float | str:
    try:
        return harness.bench_ms(fn)
    except Exception as exc:   # a backend the build lacks: the cell says why
        traceback.print_exc()
        return harness.describe(exc)


def _cell(value, flops) -> str:
    if isinstance(value, str):
        return f"failed: {value}"
    return f"{flops / value / 1e9:.0f}"


def section(run: harness.Run) -> str:
    g = _generated()
    rows = []
    for batch, heads, length, dim, causal in SHAPES:
        q, k, v = (torch.randn(batch, heads, length, dim, device="cuda", dtype=DTYPE)
                   for _ in range(3))
        flops = 4 * batch * heads * length * length * dim * (0.5 if causal else 1.0)
        from torch.nn.attention import SDPBackend
        impls = {
            "specgen": lambda: g.scaled_dot_product_attention(q, k, v, is_causal=causal),
            "sdpa": lambda: _sdpa(None)(q, k, v, causal),
            "sdpa flash": lambda: _sdpa(SDPBackend.FLASH_ATTENTION)(q, k, v, causal),
            "sdpa cudnn": lambda: _sdpa(SDPBackend.CUDNN_ATTENTION)(q, k, v, causal),
        }
        ours = impls["specgen"]()
        want = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal)
        error = (ours.float() - want).abs().max().item()
        times = {name: _time(fn) for name, fn in impls.items()}
        cells = [f"B{batch} H{heads} S{length} E{dim}" + (" causal" if causal else "")]
        cells += [_cell(times[name], flops) for name in PEERS]
        cells += ["", f"{error:.1e}"]
        print(" | ".join(cells), flush=True)
        rows.append(cells)
        del q, k, v
    rows += _variants(g)
    header = ("case", *(f"{p} TFLOP/s" for p in PEERS), "FlexAttention TFLOP/s",
              "max error vs float32")
    decode_header = ("decode case", "specgen GB/s", "sdpa GB/s", "copy GB/s", "specgen % copy",
                     "sdpa % copy", "max error vs float32")
    return (f"## attention\n\nForward, {harness.dtype_name(DTYPE)}; {_versions()}. Measured "
            f"{run.date} by `{run.command}`. Each cell is one do_bench median (L2 flushed before "
            "each call). TFLOP/s: 4 * B * H * L * S * E, halved where causal, times the window's "
            "share of keys for the sliding window. The variants' FlexAttention column is "
            "torch.compile(flex_attention) with the same score_mod / mask_mod.\n\n"
            + harness.markdown_table(header, rows) + "\n\n"
            "Decoding: one query row against full caches (SDPA computes the same with "
            "enable_gqa=True); GB/s counts the caches, the query and the output once; copy is a "
            "device copy of the same bytes timed the same way.\n\n"
            + harness.markdown_table(decode_header, _decode(g)) + "\n\n"
            "Forward+backward: the forward and torch.autograd.grad of the query, key and value, "
            "TFLOP/s counting 3.5 times the forward's FLOPs (as FlashAttention's benchmarks); peak MiB is the most memory allocated during one such step beyond the inputs; the "
            "error is the largest over the three gradients, against float32 SDPA, relative to "
            "each gradient's largest element.\n\n"
            + harness.markdown_table(TRAINING_HEADER, _training(g)) + "\n")


TRAINING_HEADER = ("fwd+bwd case", *(f"{p} TFLOP/s" for p in PEERS), "specgen peak MiB",
                   "sdpa flash peak MiB", "max error vs float32")


def _training(g) -> list[list[str]]:
    from torch.nn.attention import SDPBackend

    rows = []
    for batch, heads, length, dim, causal in TRAINING_SHAPES:
        q, k, v = (torch.randn(batch, heads, length, dim, device="cuda", dtype=DTYPE,
                               requires_grad=True) for _ in range(3))
        grad = torch.randn(batch, heads, length, dim, device="cuda", dtype=DTYPE)
        flops = 3.5 * 4 * batch * heads * length * length * dim * (0.5 if causal else 1.0)
        forwards = {
            "specgen": lambda q, k, v: g.scaled_dot_product_attention(q, k, v, is_causal=causal),
            "sdpa": lambda q, k, v: _sdpa(None)(q, k, v, causal),
            "sdpa flash": lambda q, k, v: _sdpa(SDPBackend.FLASH_ATTENTION)(q, k, v, causal),
            "sdpa cudnn": lambda q, k, v: _sdpa(SDPBackend.CUDNN_ATTENTION)(q, k, v, causal),
        }

        def step(forward):
            return lambda: torch.autograd.grad(forward(q, k, v), (q, k, v), grad)

        times = {name: _time(step(fn)) for name, fn in forwards.items()}
        peaks = {name: _peak_mib(step(forwards[name])) for name in ("specgen", "sdpa flash")}
        ours = step(forwards["specgen"])()
        wide = [t.detach().float().requires_grad_() for t in (q, k, v)]
        want = torch.autograd.grad(F.scaled_dot_product_attention(*wide, is_causal=causal),
                                   wide, grad.float())
        error = max(((o.float() - w).abs().max() / w.abs().max()).item()
                    for o, w in zip(ours, want))
        cells = [f"B{batch} H{heads} S{length} E{dim}" + (" causal" if causal else "")]
        cells += [_cell(times[name], flops) for name in PEERS]
        cells += [peaks["specgen"], peaks["sdpa flash"], f"{error:.1e}"]
        print(" | ".join(cells), flush=True)
        rows.append(cells)
        del q, k, v, grad, wide, want, ours
    return rows


def _peak_mib(fn: Callable) -> str:
    try:
        fn()
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        fn()
        torch.cuda.synchronize()
        return f"{(torch.cuda.max_memory_allocated() - before) / 2**20:.0f}"
    except Exception as exc:
        return f"failed: {harness.describe(exc)}"


# (batch, query heads, key/value heads, cached keys, head dim): the decoding cells
DECODE_SHAPES = ((8, 32, 8, 32768, 128), (1, 32, 32, 131072, 128))


def decode_inputs(batch: int, heads: int, heads_kv: int, keys: int, dim: int):
    """A decoding cell's query, full caches and lengths, and the bytes a call moves (the caches,
    the query and the output once)."""
    q = torch.randn(batch, heads, 1, dim, device="cuda", dtype=DTYPE)
    k, v = (torch.randn(batch, heads_kv, keys, dim, device="cuda", dtype=DTYPE) for _ in range(2))
    lengths = torch.full((batch,), keys, device="cuda", dtype=torch.int32)
    moved = (2 * k.numel() + 2 * q.numel()) * k.element_size()
    return q, k, v, lengths, moved


def same_bytes_copy(moved: int) -> Callable[[], object]:
    """A device copy that reads and writes ``moved`` bytes in all: a decoding cell's bar."""
    source = torch.empty(moved // 2, device="cuda", dtype=torch.uint8)
    target = torch.empty_like(source)
    return lambda: target.copy_(source)


def _decode(g) -> list[list[str]]:
    rows = []
    for batch, heads, heads_kv, keys, dim in DECODE_SHAPES:
        q, k, v, lengths, moved = decode_inputs(batch, heads, heads_kv, keys, dim)
        copy = same_bytes_copy(moved)
        times = {
            "specgen": _time(lambda: g.decode_attention(q, k, v, lengths, enable_gqa=True)),
            "sdpa": _time(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)),
            "copy": _time(copy),
        }
        ours = g.decode_attention(q, k, v, lengths, enable_gqa=True)
        want = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), enable_gqa=True)
        error = (ours.float() - want).abs().max().item()
        rate = {name: (moved / ms / 1e6 if not isinstance(ms, str) else ms)
                for name, ms in times.items()}

        def cell(value):
            return f"failed: {value}" if isinstance(value, str) else f"{value:.0f}"

        def share(value):
            if isinstance(value, str) or isinstance(rate["copy"], str):
                return ""
            return f"{100 * value / rate['copy']:.0f}%"
        cells = [f"B{batch} Hq{heads} Hkv{heads_kv} S{keys} E{dim}", cell(rate["specgen"]),
                 cell(rate["sdpa"]), cell(rate["copy"]), share(rate["specgen"]),
                 share(rate["sdpa"]), f"{error:.1e}"]
        print(" | ".join(cells), flush=True)
        rows.append(cells)
        del q, k, v, copy
    return rows


# the authored variants' cell: (batch, heads, length, head dim), the sliding window's width
VARIANT_SHAPE = (4, 32, 4096, 128)
WINDOW = 1024
SOFTCAP = 30.0


# each variant's call as the section times it, by its row's name, on a module of the ops (the
# generated ones, or specgen.references), q, k, v and ALiBi's per-head slopes: softcap and ALiBi
# causal, the sliding window of WINDOW keys
VARIANT_CALLS: dict[str, Callable] = {
    "softcap_attention causal":
        lambda g, q, k, v, slopes: g.softcap_attention(q, k, v, SOFTCAP, True),
    "alibi_attention causal": lambda g, q, k, v, slopes: g.alibi_attention(q, k, v, slopes, True),
    f"sliding_window_attention {WINDOW}":
        lambda g, q, k, v, slopes: g.sliding_window_attention(q, k, v, WINDOW),
}


def _visible_share(name: str, length: int) -> float:
    """The share of a variant's score matrix its queries see: causal half, or the window's."""
    return min(WINDOW / length, 1.0) if name.startswith("sliding") else 0.5


def _variants(g) -> list[list[str]]:
    batch, heads, length, dim = VARIANT_SHAPE
    q, k, v = (torch.randn(batch, heads, length, dim, device="cuda", dtype=DTYPE)
               for _ in range(3))
    slopes = torch.rand(heads, device="cuda")
    rows = []

    def softcap_mod(score, b, h, i, j):
        return SOFTCAP * torch.tanh(score / SOFTCAP)

    def alibi_mod(score, b, h, i, j):
        return score - slopes[h] * (i - j).abs()

    def causal_mask(b, h, i, j):
        return j <= i

    def window_mask(b, h, i, j):
        return (j <= i) & (j > i - WINDOW)

    flexes = {"softcap_attention causal": _flex(softcap_mod, causal_mask, length),
              "alibi_attention causal": _flex(alibi_mod, causal_mask, length),
              f"sliding_window_attention {WINDOW}": _flex(None, window_mask, length)}
    for name, flex in flexes.items():
        flops = 4 * batch * heads * length * length * dim * _visible_share(name, length)
        times = {"specgen": _time(lambda: VARIANT_CALLS[name](g, q, k, v, slopes)),
                 "flex": _time(lambda: flex(q, k, v))}
        cells = [f"{name} B{batch} H{heads} S{length} E{dim}", _cell(times["specgen"], flops),
                 "", "", "", _cell(times["flex"], flops), ""]
        print(" | ".join(cells), flush=True)
        rows.append(cells)
    return rows


def _versions() -> str:
    import triton

    return (f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton "
            f"{triton.__version__}")


def tune_cases(quick: bool) -> list[harness.Case]:
    """What `specgen tune` searches for the attention family (its benchmark is a section): the
    forward at the section's cells, and forward+backward at its training cells (the backward's
    two passes), each against SDPA in the same dtype; the gradients compared as one vector;
    decoding at its cells (full caches: SDPA computes the same); and the authored variants at
    their cell against their references. ``quick``: sequences 16 times shorter."""
    cases = []
    for batch, heads, length, dim, causal in SHAPES:
        length = length // 16 if quick else length
        shape = f"B{batch} H{heads} S{length} E{dim}" + (" causal" if causal else "")
        flops = 4 * batch * heads * length * length * dim * (0.5 if causal else 1.0)
        sizes = (batch, heads, length, dim)
        cases.append(harness.Case(
            family="attention", op="scaled_dot_product_attention", shape=shape, dtype=DTYPE,
            make_inputs=lambda sizes=sizes: tuple(
                torch.randn(sizes, device="cuda", dtype=DTYPE) for _ in range(3)),
            specgen=lambda q, k, v, causal=causal: _generated().scaled_dot_product_attention(
                q, k, v, is_causal=causal),
            eager=lambda q, k, v, causal=causal: F.scaled_dot_product_attention(
                q, k, v, is_causal=causal),
            bytes_moved=4 * DTYPE.itemsize * batch * heads * length * dim, flops=int(flops)))
        if (batch, heads, length * (16 if quick else 1), dim, causal) not in TRAINING_SHAPES:
            continue

        def step(attention, causal=causal):
            def run(q, k, v, grad):
                out = attention(q, k, v, is_causal=causal)
                return torch.cat([g.flatten() for g in torch.autograd.grad(out, (q, k, v), grad)])
            return run

        cases.append(harness.Case(
            family="attention", op="scaled_dot_product_attention fwd+bwd", shape=shape,
            dtype=DTYPE,
            make_inputs=lambda sizes=sizes: (
                *(torch.randn(sizes, device="cuda", dtype=DTYPE, requires_grad=True)
                  for _ in range(3)), torch.randn(sizes, device="cuda", dtype=DTYPE)),
            specgen=step(lambda *a, **k: _generated().scaled_dot_product_attention(*a, **k)),
            eager=step(F.scaled_dot_product_attention),
            bytes_moved=8 * DTYPE.itemsize * batch * heads * length * dim,
            flops=int(3.5 * flops)))
    for batch, heads, heads_kv, keys, dim in DECODE_SHAPES:
        keys = keys // 16 if quick else keys

        def caches(batch=batch, heads=heads, heads_kv=heads_kv, keys=keys, dim=dim):
            return (torch.randn(batch, heads, 1, dim, device="cuda", dtype=DTYPE),
                    *(torch.randn(batch, heads_kv, keys, dim, device="cuda", dtype=DTYPE)
                      for _ in range(2)),
                    torch.full((batch,), keys, device="cuda", dtype=torch.int32))

        cases.append(harness.Case(
            family="attention", op="decode_attention",
            shape=f"B{batch} Hq{heads} Hkv{heads_kv} S{keys} E{dim}", dtype=DTYPE,
            make_inputs=caches,
            specgen=lambda q, k, v, lengths: _generated().decode_attention(
                q, k, v, lengths, enable_gqa=True),
            eager=lambda q, k, v, lengths: F.scaled_dot_product_attention(
                q, k, v, enable_gqa=True),
            bytes_moved=2 * DTYPE.itemsize * batch * heads_kv * keys * dim))
    # the authored variants at their cell, against their references (specgen/references.py)
    from specgen import references

    batch, heads, length, dim = VARIANT_SHAPE
    length = length // 16 if quick else length
    sizes = (batch, heads, length, dim)

    def variant_inputs():
        return (*(torch.randn(sizes, device="cuda", dtype=DTYPE) for _ in range(3)),
                torch.rand(heads, device="cuda"))

    def variant(module, name):
        return lambda q, k, v, slopes: VARIANT_CALLS[name](module(), q, k, v, slopes)

    for name in VARIANT_CALLS:
        share = _visible_share(name, length)
        cases.append(harness.Case(
            family="attention", op=name, shape=f"B{batch} H{heads} S{length} E{dim}",
            dtype=DTYPE, make_inputs=variant_inputs,
            specgen=variant(_generated, name), eager=variant(lambda: references, name),
            bytes_moved=4 * DTYPE.itemsize * batch * heads * length * dim,
            flops=int(4 * batch * heads * length * length * dim * share)))
    return cases

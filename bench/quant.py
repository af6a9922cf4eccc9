"""Quantized linear layers, bf16 activations: microseconds per call of specgen's weight-only
``int4_weight_linear`` (group 128) and ``int8_weight_linear`` against ``F.linear`` with the bf16
weight, torch's int4 kernel (``torch.ops.aten._weight_int4pack_mm``, its own packing) and
torch.compile of each op's reference (dequantize, then ``F.linear``); then W8A8 ``int8_linear``
against cuBLAS int8 (``torch._int_mm``) alone and with the scales applied in eager torch.

Weight-only layers are bound by reading the weight where inference runs (M = 1 to 64): int4
moves a quarter of bf16's bytes, int8 half. Each timing is the median of interleaved rounds of
do_bench medians (L2 flushed before each call, so every call reads its weight from memory).

    python3 -m bench --only quantized
"""

from __future__ import annotations

import statistics
import traceback
from typing import Callable

import torch
import torch.nn.functional as F

from bench import harness

DTYPE = torch.bfloat16
GROUP_SIZE = 128
# (M, N, K): the cells, decode to a prefill chunk
WEIGHT_ONLY_SHAPES = ((1, 4096, 4096), (1, 8192, 8192), (16, 4096, 4096), (16, 14336, 4096),
                      (256, 4096, 4096))
W8A8_SHAPES = ((256, 4096, 4096), (1024, 4096, 4096), (4096, 4096, 4096))
ROUNDS = 3


def _generated():
    import generated

    return generated


def _quant():
    from specgen import quant

    return quant


def _int4_eager(x, qweight, scales, zeros):
    return F.linear(x, _quant().dequantize_int4(qweight, scales, zeros, GROUP_SIZE))


def _int8_eager(x, qweight, scales):
    return F.linear(x, _quant().dequantize_int8(qweight, scales))


def _w8a8_eager(x, x_scale, qweight, w_scale):
    return (torch._int_mm(x, qweight.T) * x_scale * w_scale).to(DTYPE)


def _torch_int4(n: int, k: int) -> tuple[Callable, tuple] | None:
    """torch's tinygemm int4 kernel on random packed weights of the same size (its own layout:
    ``_convert_weight_to_int4pack``), or None where this torch has none."""
    try:
        packed = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device="cuda")
        weight = torch.ops.aten._convert_weight_to_int4pack(packed, 8)
        scales_and_zeros = torch.rand(k // GROUP_SIZE, n, 2, dtype=DTYPE, device="cuda")

        def run(x):
            return torch.ops.aten._weight_int4pack_mm(x, weight, GROUP_SIZE, scales_and_zeros)
        run(torch.randn(1, k, dtype=DTYPE, device="cuda"))
        return run, (weight, scales_and_zeros)
    except Exception:  # not built for this GPU or torch
        traceback.print_exc()
        return None


def _time(fns: dict[str, Callable[[], object]]) -> dict[str, float]:
    """Median ms of each, in interleaved rounds (a failing one is left out)."""
    rounds: dict[str, list[float]] = {}
    for _ in range(ROUNDS):
        for name, fn in fns.items():
            try:
                rounds.setdefault(name, []).append(harness.bench_ms(fn))
            except Exception:
                traceback.print_exc()
    return {name: statistics.median(times) for name, times in rounds.items() if times}


def _check(out: torch.Tensor, ref: torch.Tensor) -> str:
    error = harness.relative_error(out, ref)
    return f"{'PASS' if error < harness.TOLERANCE[DTYPE] else 'FAIL'} ({error:.1e})"


def _compiled(fn: Callable) -> Callable:
    return torch.compile(fn, dynamic=False)


def weight_only_row(m: int, n: int, k: int) -> list[str]:
    quant = _quant()
    g = _generated()
    w = torch.randn(n, k, dtype=DTYPE, device="cuda") / k ** 0.5
    x = torch.randn(m, k, dtype=DTYPE, device="cuda")
    q4, s4, z4 = quant.quantize_int4(w, GROUP_SIZE)
    q8, s8 = quant.quantize_int8(w)
    fns = {
        "bf16": lambda: F.linear(x, w),
        "int4 ours": lambda: g.int4_weight_linear(x, q4, s4, z4, GROUP_SIZE),
        "int8 ours": lambda: g.int8_weight_linear(x, q8, s8),
    }
    torch_int4 = _torch_int4(n, k)
    if torch_int4 is not None:
        fns["int4 torch"] = lambda: torch_int4[0](x)
    int4_compiled, int8_compiled = _compiled(_int4_eager), _compiled(_int8_eager)
    fns["int4 compile"] = lambda: int4_compiled(x, q4, s4, z4)
    fns["int8 compile"] = lambda: int8_compiled(x, q8, s8)
    checks = [_check(g.int4_weight_linear(x, q4, s4, z4, GROUP_SIZE), _int4_eager(x, q4, s4, z4)),
              _check(g.int8_weight_linear(x, q8, s8), _int8_eager(x, q8, s8))]
    ms = _time(fns)
    torch._dynamo.reset()

    def us(name: str) -> str:
        return f"{ms[name] * 1e3:.1f}" if name in ms else "-"

    def speedup(name: str) -> str:
        return f"{ms['bf16'] / ms[name]:.2f}" if {name, "bf16"} <= ms.keys() else "-"
    return [f"{m}x{n}x{k}", us("bf16"), us("int4 torch"), us("int4 compile"), us("int4 ours"),
            speedup("int4 ours"), us("int8 compile"), us("int8 ours"), speedup("int8 ours"),
            "; ".join(checks)]


def w8a8_row(m: int, n: int, k: int) -> list[str]:
    g = _generated()
    x = torch.randint(-127, 128, (m, k), dtype=torch.int8, device="cuda")
    qweight = torch.randint(-127, 128, (n, k), dtype=torch.int8, device="cuda")
    x_scale = torch.rand(m, 1, device="cuda") / 100
    w_scale = torch.rand(n, device="cuda") / 100
    compiled = _compiled(_w8a8_eager)
    fns = {
        "int_mm": lambda: torch._int_mm(x, qweight.T),
        "eager": lambda: _w8a8_eager(x, x_scale, qweight, w_scale),
        "compile": lambda: compiled(x, x_scale, qweight, w_scale),
        "ours": lambda: g.int8_linear(x, x_scale, qweight, w_scale),
    }
    check = _check(g.int8_linear(x, x_scale, qweight, w_scale),
                   _w8a8_eager(x, x_scale, qweight, w_scale))
    ms = _time(fns)
    torch._dynamo.reset()
    tops = {name: 2 * m * n * k / (t * 1e9) for name, t in ms.items()}

    def cell(name: str) -> str:
        return f"{ms[name] * 1e3:.1f} ({tops[name]:.0f})" if name in ms else "-"
    versus = f"{ms['int_mm'] / ms['ours']:.3f}" if {"int_mm", "ours"} <= ms.keys() else "-"
    return [f"{m}x{n}x{k}", cell("int_mm"), cell("eager"), cell("compile"), cell("ours"), versus,
            check]


def section(run: harness.Run) -> str:
    weight_only = []
    for shape in WEIGHT_ONLY_SHAPES:
        weight_only.append(weight_only_row(*shape))
        print("[quantized]", " | ".join(weight_only[-1]), flush=True)
    w8a8 = []
    for shape in W8A8_SHAPES:
        w8a8.append(w8a8_row(*shape))
        print("[quantized]", " | ".join(w8a8[-1]), flush=True)
    provenance = (f"Measured {run.date} on {run.device} by `{run.command}`. Weight-only: bf16 "
                  f"activations, group {GROUP_SIZE} for int4; microseconds per call; `x bf16` is "
                  f"F.linear's time over ours. W8A8: microseconds (TOP/s); `vs _int_mm` is "
                  f"cuBLAS int8's time over ours (it leaves out the scales).")
    return "\n".join([
        "## quantized", "", provenance, "",
        harness.markdown_table(
            ("M x N x K", "bf16 F.linear us", "torch int4 us", "compile int4 us", "int4 us",
             "int4 x bf16", "compile int8 us", "int8 us", "int8 x bf16", "check (int4; int8)"),
            weight_only), "",
        harness.markdown_table(
            ("M x N x K", "torch._int_mm", "_int_mm + scales eager", "compile", "int8_linear",
             "vs _int_mm", "check"), w8a8), ""])


def tune_cases(quick: bool) -> list[harness.Case]:
    """The weight-only and W8A8 cells as cases `specgen tune` searches (their checks against
    the eager references)."""
    scale = 4 if quick else 1
    cases = []
    for m, n, k in WEIGHT_ONLY_SHAPES:
        n, k = n // scale, k // scale
        cases.append(_weight_only_case("int4_weight_linear", m, n, k))
        cases.append(_weight_only_case("int8_weight_linear", m, n, k))
    for m, n, k in W8A8_SHAPES:
        cases.append(_w8a8_case(m // scale, n // scale, k // scale))
    return cases


def _weight_only_case(op: str, m: int, n: int, k: int) -> harness.Case:
    def make_inputs():
        quant = _quant()
        w = torch.randn(n, k, dtype=DTYPE, device="cuda") / k ** 0.5
        x = torch.randn(m, k, dtype=DTYPE, device="cuda")
        if op == "int4_weight_linear":
            return (x, *quant.quantize_int4(w, GROUP_SIZE))
        return (x, *quant.quantize_int8(w))
    if op == "int4_weight_linear":
        specgen = lambda x, q, s, z: _generated().int4_weight_linear(x, q, s, z, GROUP_SIZE)  # noqa: E731
        eager = _int4_eager
    else:
        specgen = lambda x, q, s: _generated().int8_weight_linear(x, q, s)  # noqa: E731
        eager = _int8_eager
    bytes_moved = (k // 2 if op == "int4_weight_linear" else k) * n + 2 * (m * k + m * n)
    return harness.Case(family="quantized", op=op, shape=f"{m}x{n}x{k}", dtype=DTYPE,
                        make_inputs=make_inputs, specgen=specgen, eager=eager,
                        bytes_moved=bytes_moved, flops=2 * m * n * k)


def _w8a8_case(m: int, n: int, k: int) -> harness.Case:
    def make_inputs():
        return (torch.randint(-127, 128, (m, k), dtype=torch.int8, device="cuda"),
                torch.rand(m, 1, device="cuda") / 100,
                torch.randint(-127, 128, (n, k), dtype=torch.int8, device="cuda"),
                torch.rand(n, device="cuda") / 100)
    return harness.Case(family="quantized", op="int8_linear", shape=f"{m}x{n}x{k}", dtype=DTYPE,
                        make_inputs=make_inputs,
                        specgen=lambda *args: _generated().int8_linear(*args),
                        eager=_w8a8_eager, bytes_moved=m * k + n * k + 2 * m * n,
                        flops=2 * m * n * k)

"""Cases for the matmul family: M, N, K off every block size, batch shapes, layouts, epilogues.

The roles of an op's tensors come from their dims (A: M, K; B: K, N or N, K; the others feed the
epilogue). Every case forces a strategy (direct, TMA, two-stage or atomic split-K with 1 to 4
splits) or leaves it to the launcher, and forces a config: one of the spec's space by number (as
autotuning would fit it to the sizes: the GPU tier checks every config without tuning each size),
or a small tile config outside the space so that a few dozen rows already span several tiles,
partial tiles and grouped/swizzled orderings.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from typing import Any

import torch
from hypothesis import strategies as st

from specgen.quant import GROUP_SIZES
from specgen.runtime import OpInfo, interpreting
from specgen.testing.core import (
    Case,
    broadcast_operand,
    knobs,
    layouts,
    make_tensor,
    scalar_value,
    sizes,
)
from specgen.testing.samples import Make, default

# Small tiles reach every code path on small inputs; on the GPU they also keep the number of
# distinct compilations per example low.
SMALL_CONFIGS = (
    {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 1, "num_warps": 4, "num_stages": 2},
    {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 16, "GROUP_M": 2, "num_warps": 4, "num_stages": 2},
    {"BLOCK_M": 32, "BLOCK_N": 16, "BLOCK_K": 32, "GROUP_M": 3, "num_warps": 4, "num_stages": 2},
    {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 16, "GROUP_M": 8, "num_warps": 4, "num_stages": 3},
    {"BLOCK_M": 64, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 4, "num_warps": 4, "num_stages": 3},
)


def matmul_tolerances(k: int, tf32: bool = False) -> dict[torch.dtype, tuple[float, float]]:
    """(rtol, atol) per output dtype for a K-term float32 (float64) accumulation of products up
    to 9.

    The reference sees the same rounded inputs in float64, so the error is the float32 sums
    (worst case growing with K) plus one rounding to the output dtype. TF32 rounds each input to
    10 mantissa bits first: about 1e-3 of every product.
    """
    k = max(k, 1)
    accumulate = 2e-6 * k + (5e-3 * k ** 0.5 if tf32 else 0.0)
    return {
        torch.float32: (1e-5 if not tf32 else 2e-3, accumulate + 1e-5),
        torch.float16: (1e-3, accumulate + 1e-4),
        torch.bfloat16: (8e-3, accumulate + 1e-3),
        # float64 operands accumulate in float64 (no TF32)
        torch.float64: (1e-12, 4e-15 * k + 1e-13),
    }


def _roles(info: OpInfo) -> tuple[str, str]:
    tensors = {a.name: a.dims for a in info.args if a.kind == "tensor"}
    a = next(n for n, d in tensors.items() if "M" in d and "K" in d)
    b = next(n for n, d in tensors.items() if "N" in d and "K" in d)
    return a, b


@st.composite
def matmul_cases(draw, info: OpInfo) -> Case:
    a_name, b_name = _roles(info)
    # knobs(): a config number of the space, maybe int64 indexing; half the cases small tiles
    overrides = draw(knobs())
    small = draw(st.booleans())
    if small:
        overrides["config"] = draw(st.sampled_from(SMALL_CONFIGS))
    least = _layout(info).min_block_k
    if small and least > 16:
        # int8 dots take 32 columns of K; a packed B's (one per place in a byte) BLOCK_K / packed
        overrides["config"] = dict(overrides["config"],
                                   BLOCK_K=max(overrides["config"]["BLOCK_K"], least))
    config = overrides["config"]
    # the interpreter runs every program in numpy: small tiles get small problems (the space's
    # tiles are clamped to the problem, so large sizes stay few programs)
    limit = 96 if small else 300
    # an empty M, N or K (torch allows each) in about one case of eight
    zero = draw(st.integers(0, 7)) == 0
    m, n, k = (draw(sizes(limit, allow_zero=zero)) for _ in range(3))
    tensors = {a.name: a for a in info.args if a.kind == "tensor"}
    quant = _quantized(info)
    group = None
    if quant.group is not None:
        # K a whole number of groups, odd counts included; under the interpreter the smaller
        # groups (each K block costs numpy calls there)
        group = draw(st.sampled_from(GROUP_SIZES[:2] if interpreting() else GROUP_SIZES))
        k = group * draw(st.integers(0 if zero else 1, 3))
    elif quant.packed > 1:
        k = -(-k // quant.packed) * quant.packed
    strategy = draw(st.sampled_from([None, "direct", "tma", "two_stage", "atomic"]))
    if strategy in ("two_stage", "atomic"):
        strategy = f"{strategy}:{draw(st.integers(1, 4))}"
    if strategy is not None:
        overrides["strategy"] = strategy
    if strategy == "tma":
        # rows of 16-byte multiples in contiguous layouts, so the TMA kernel runs (bmm's batch
        # elements too); the layouts it cannot describe (offset, stepped, broadcast over a
        # batch) take the direct kernel
        m, n, k = (-(-size // 8) * 8 for size in (m, n, k))
    dims = {a.name: a.dims for a in info.args if a.kind == "tensor"}
    batch, batch_a, batch_b = (), (), ()
    vector_a = vector_b = False
    if dims[a_name][0] == "B":
        batch = batch_a = batch_b = (draw(st.integers(0, 3)),)
    elif "..." in dims[a_name] or "..." in dims[b_name]:
        batch = tuple(draw(st.lists(st.integers(1, 3), max_size=2)))
        if "..." in dims[a_name]:
            batch_a = draw(broadcast_operand(batch))
            vector_a = draw(st.integers(0, 7)) == 0
        if "..." in dims[b_name]:
            batch_b = draw(broadcast_operand(batch))
            vector_b = draw(st.integers(0, 7)) == 0
    # a 1-D operand has no batch dims
    batch_a, batch_b = (() if vector_a else batch_a), (() if vector_b else batch_b)
    batch = tuple(torch.broadcast_shapes(batch_a, batch_b))

    # bfloat16 tl.dot is wrong under TRITON_INTERPRET=1 (the interpreter multiplies the raw bit
    # patterns), so the CPU tier draws float16 and float32; the GPU tier runs bfloat16 as well
    dtypes = [d for d in info.dtypes if d != torch.bfloat16 or not interpreting()]
    dtype = draw(st.sampled_from(dtypes))
    seed = draw(st.integers(0, 2**31 - 1))
    args: dict[str, Any] = {}
    notes = [f"M={m} N={n} K={k} batch={batch} config={config}"]
    for i, arg in enumerate(info.args):
        if arg.name == quant.group:
            args[arg.name] = group
            continue
        if arg.kind == "dtype":
            args[arg.name] = draw(st.sampled_from(dtypes))
            continue
        if arg.kind != "tensor":
            args[arg.name] = scalar_value(draw, arg)
            continue
        if arg.optional and draw(st.integers(0, 2)) == 0:
            args[arg.name] = None
            continue
        if arg.name == a_name:
            shape = (k,) if vector_a else batch_a + (m, k)
        elif arg.name == b_name:
            stored = k // quant.packed
            matrix = (n, stored) if arg.dims[-2:] == ("N", "K") else (stored, n)
            shape = (stored,) if vector_b else batch_b + matrix
        elif arg.dims == ("N", "G"):
            shape = (n, k // group)
        else:
            target = _epilogue_target(arg.dims, batch, m, n, not vector_a, not vector_b)
            if arg.dims[-1] == "M" and not vector_a and draw(st.booleans()):
                # a per-row operand as torch broadcasts one against the product: (..., M, 1),
                # A's rank (runtime/matmul.py, problem)
                shape = batch_a + (m, 1)
            else:
                shape = draw(broadcast_operand(target))
        layout = draw(layouts(len(shape)))
        # a promoted epilogue operand (a residual) has a dtype of its own: it never enters tl.dot;
        # so have a quantized weight's storage and the tensors that declare their dtypes
        if arg.dtypes:
            own = draw(st.sampled_from(arg.dtypes))
        else:
            own = draw(st.sampled_from(info.dtypes)) if arg.promotes else dtype
        args[arg.name] = make_tensor(shape, own, layout, low=arg.low, high=arg.high,
                                     seed=seed + i)
        notes.append(f"{arg.name}: {shape} {own} {layout}")
    tolerances = matmul_tolerances(k)
    if dtype != torch.float64:
        # a float64 operand of the epilogue promotes the result to float64, but the product is
        # float32's sums (torch's too): the bound of the operands' dtype
        tolerances[torch.float64] = tolerances[dtype]
    if quant.rounds_weight:
        scales = [args[name] for name in quant.scales if args[name] is not None]
        tolerances = _dequant_tolerances(tolerances, k, 8 // quant.packed, args[a_name], scales)
    return Case(args, (), overrides, describe="; ".join(notes), tolerances=tolerances)


@dataclass(frozen=True)
class Quantized:
    """What the cases need of a quantized B: elements a stored byte packs, the group-size
    argument, whether the kernel rounds the dequantized weight to A's dtype (a value applied
    per tile; block mode's per-block scaling cancels offset against the product instead; a
    per-channel factor scales the float32 accumulator, and int8 is exact in every float
    dtype), and the operands the K loop reads (its scales)."""

    packed: int = 1
    group: str | None = None
    rounds_weight: bool = False
    scales: tuple[str, ...] = ()


def _layout(info: OpInfo):
    """The op's launch layout (runtime/matmul.py's OpLayout)."""
    return sys.modules[info.function.__module__].OP.description.launch


def _quantized(info: OpInfo) -> Quantized:
    """Read off the op's launch layout."""
    layout = _layout(info)
    if not layout.quantized:
        return Quantized()
    return Quantized(packed=layout.packed, group=layout.group,
                     rounds_weight=layout.dequant_mode != "channel", scales=layout.loop_inputs)


def _dequant_tolerances(tolerances: dict, k: int, bits: int, a: torch.Tensor,
                        scales: list[torch.Tensor]) -> dict:
    """The bounds widened for a B dequantized per tile and rounded to A's dtype (half an ulp of
    each weight, which the float64 reference multiplies exactly): K such errors, each times an
    A element, add as a random walk. A weight is at most 2**bits - 1 steps of its scale (the
    drawn zero points lie in the integers' range; the largest operand the value reads stands
    for the scale)."""
    if a.numel() == 0 or not all(s.numel() for s in scales):
        return tolerances
    largest_w = (2 ** bits - 1) * max(s.abs().max().item() for s in scales)
    spread = math.sqrt(k) * a.abs().max().item() * largest_w
    return {dtype: (rtol, atol + 4 * torch.finfo(dtype).eps * spread)
            for dtype, (rtol, atol) in tolerances.items()}


def _epilogue_target(dims: tuple[str, ...], batch: tuple[int, ...], m: int, n: int,
                     keeps_m: bool, keeps_n: bool) -> tuple[int, ...]:
    shape: list[int] = []
    for d in dims:
        if d in ("...", "B"):
            shape += batch
        elif d == "M" and keeps_m:
            shape.append(m)
        elif d == "N" and keeps_n:
            shape.append(n)
    return tuple(shape)


# the sizes of a sample's named dims: none equal, so that a dim mixed up with another fails
SAMPLE_DIMS = {"M": 3, "K": 4, "N": 5, "B": 2}


def matmul_samples(info: OpInfo, make: Make) -> dict[str, list[tuple]]:
    """Every operand at its dims (with a batch of 2 where it takes one), then without the batch,
    the A operand transposed and the optional operands omitted."""
    quant = _quantized(info)
    b_name = _roles(info)[1]
    sizes_ = dict(SAMPLE_DIMS)
    if quant.group is not None:
        # two groups of the smallest size
        sizes_.update(K=2 * GROUP_SIZES[0], G=2)

    def call(batched: bool):
        args = []
        for a in info.args:
            if a.name == quant.group:
                args.append(GROUP_SIZES[0])
            elif a.kind != "tensor":
                args.append(default(a))
            elif not batched and a.optional:
                args.append(None)
            else:
                dims = [d for d in a.dims if d != "..." or batched]
                shape = [2 if d == "..." else sizes_[d] for d in dims]
                if a.dtypes and not a.dtypes[0].is_floating_point:
                    # integer storage (a quantized weight, K packed, or an int8 operand)
                    packed = quant.packed if a.name == b_name else 1
                    shape[dims.index("K")] //= packed
                    bounds = torch.iinfo(a.dtypes[0])
                    args.append(torch.randint(bounds.min, bounds.max + 1, shape,
                                              dtype=a.dtypes[0], device=make.device))
                elif not batched and len(shape) == 2 and a is info.args[_a_operand(info)]:
                    args.append(make.t(*shape, g=True))
                else:
                    args.append(make.r(*shape, g=True))
        return tuple(args)

    return {info.name: [call(True), call(False)]}


def _a_operand(info: OpInfo) -> int:
    """The A operand's position: the tensor with M and K."""
    return next(i for i, a in enumerate(info.args) if {"M", "K"} <= set(a.dims))

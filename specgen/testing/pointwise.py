"""Cases for the pointwise family: operands that broadcast to a drawn shape, in any layout."""

from __future__ import annotations

import math
import sys
from typing import Any

import torch
from hypothesis import assume, strategies as st

from specgen.runtime import OpInfo, interpreting
from specgen.testing.core import (Case, accepted, broadcast_operand, dtypes_of, integer_range,
                                  knobs, layouts, make_tensor, max_numel, scalar_value, shapes)
from specgen.testing.samples import Make, default


@st.composite
def pointwise_cases(draw, info: OpInfo) -> Case:
    # a derived backward serves tensors of the output's shape and one dtype (runtime/pointwise.py);
    # its kernels are the forward's template with a longer expression, which the interpreter runs
    # tile by tile (a tall one-column shape under 1 x 1024 tiles: thousands), so its draws stay
    # at a quarter of the forward's elements
    derived = bool(_launch(info).derived_from)
    budget = max_numel() // 4 if derived else None
    shape = draw(shapes(max_rank=draw(st.sampled_from([1, 2, 3, 5, 7])), max_elements=budget))
    seed = draw(st.integers(0, 2**31 - 1))
    args: dict[str, Any] = {}
    notes = []
    one_dtype = draw(dtypes_of(info.dtypes)) if derived else None
    for i, arg in enumerate(info.args):
        if arg.kind != "tensor":
            args[arg.name] = scalar_value(draw, arg)
            continue
        operand = draw(broadcast_operand(shape)) if not derived and draw(st.booleans()) else shape
        layout = draw(layouts(len(operand)))
        dtype = one_dtype if derived else draw(dtypes_of(info.dtypes))
        # integers now and then over their dtype's whole range, where sums and products wrap
        low, high = integer_range(dtype, arg.low, arg.high, wide=draw(st.booleans())) \
            if not dtype.is_floating_point else (arg.low, arg.high)
        args[arg.name] = make_tensor(operand, dtype, layout, low=low, high=high, seed=seed + i)
        notes.append(f"{arg.name}: {operand} {dtype} {layout}")
    args = accepted(info, args)
    tensors = [v for v in args.values() if isinstance(v, torch.Tensor)]
    shape = tuple(torch.broadcast_shapes(*(t.shape for t in tensors)))  # operands may drop dims
    # the result's dtype as torch gives it (an integer add's, a true division's float32)
    dtype = _result_dtype(info, args)
    # an input of another dtype is converted to a bfloat16 result before the math; the
    # interpreter rounds float32 to bfloat16 toward zero (torch and the GPU to nearest), which
    # that conversion and the store's make two ulps: such mixes are drawn in the GPU tier only
    assume(not (interpreting() and dtype == torch.bfloat16
                and any(t.dtype != dtype for t in tensors)))
    # an out= poisoned where it can be: NaN, else the dtype's largest value
    fill = math.nan if dtype.is_floating_point else True if dtype == torch.bool else \
        min(torch.iinfo(dtype).max, 2**53)
    outs = tuple(make_tensor(shape, dtype, draw(layouts(len(shape), allow_broadcast=False)),
                             fill=fill) for _ in info.outputs)
    return Case(args, outs, draw(knobs()), describe="; ".join(notes),
                layout_reference=_layout_reference(tensors))


def _launch(info: OpInfo):
    return sys.modules[info.function.__module__].OP.description.launch


def _result_dtype(info: OpInfo, args: dict[str, Any]) -> torch.dtype:
    result = info.reference(**args)
    return (result[0] if isinstance(result, tuple) else result).dtype


# one torch element-wise op per arity: its TensorIterator lays the result out as a fused
# element-wise op over the same operands must be laid out
_ELEMENTWISE = {1: torch.neg, 2: torch.add, 3: torch.addcmul}
_LOGICAL = {1: torch.logical_not, 2: torch.logical_or}   # for bools, which torch.neg refuses


def _layout_reference(tensors: list[torch.Tensor]) -> torch.Tensor | None:
    ops = _LOGICAL if any(t.dtype == torch.bool for t in tensors) else _ELEMENTWISE
    op = ops.get(len(tensors))
    # with mixed dtypes torch's CPU path copies inputs to the common dtype first, which changes
    # its layout (CUDA casts on the fly): no single answer there
    if op is None or len({t.dtype for t in tensors}) > 1:
        return None
    return op(*tensors)


def pointwise_samples(info: OpInfo, make: Make) -> dict[str, list[tuple]]:
    """The first tensor dense, transposed and sliced; the others broadcast, full and 0-dim (away
    from 0: a divisor); out= into transposed outputs."""
    def call(first, others):
        tensors = iter([first, *others])
        return tuple(next(tensors) if a.kind == "tensor" else default(a) for a in info.args)

    count = sum(a.kind == "tensor" for a in info.args) - 1
    if _launch(info).derived_from:   # a derived backward: tensors of one shape
        samples = [call(make.r(3, 5, g=True), [make.r(3, 5, g=True, lo=0.5)] * count),
                   call(make.t(3, 5, g=True), [make.r(3, 5, lo=0.5)] * count)]
    else:
        samples = [call(make.r(3, 5, g=True), [make.r(5, g=True, lo=0.5)] * count),
                   call(make.t(3, 5, g=True), [make.r(3, 5, lo=0.5)] * count),
                   call(make.sl(3, 5, g=True), [torch.tensor(1.5, device=make.device)] * count)]
    outs = tuple(make.out_t(3, 5) for _ in info.outputs)
    return {info.name: samples,
            f"{info.name}_out": [outs + call(make.t(3, 5), [make.r(5, lo=0.5)] * count)]}

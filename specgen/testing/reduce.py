"""Cases for the reduce family: any layout, dims drawn as None, an int or a tuple, every strategy."""

from __future__ import annotations

import sys

import torch
from hypothesis import strategies as st

from specgen.runtime import OpInfo
from specgen.testing.core import (Case, accepted, cast_first, dtype_arg, dtypes_of,
                                  integer_range, knobs, layouts, make_tensor, scalar_value, shapes)
from specgen.testing.samples import Make, default

# a reduction of n float32 terms carries error growing with n; the output rounding dominates below
_REDUCE_TOLERANCES = {
    torch.float32: (1e-4, 1e-4),
    torch.float16: (1e-3, 1e-4),
    torch.bfloat16: (8e-3, 1e-4),
    torch.float64: (1e-9, 1e-10),
    torch.int64: (0, 0),      # argmax/argmin: the very index (integer results are exact)
}


def _strategies(info: OpInfo) -> tuple[str | None, ...]:
    module = sys.modules[info.function.__module__]
    forced = ("inner", "outer", "split") + (("atomic",) if module.COMBINE == "sum" else ())
    if module.COMBINE not in ("argmax", "argmin"):
        forced += ("last",)  # the one-launch split (argmax/argmin split in two launches)
    return (None,) + forced


@st.composite
def reduce_cases(draw, info: OpInfo) -> Case:
    dim_info = next(a for a in info.args if a.name == "dim")
    single = dim_info.kind == "dim"
    rank = draw(st.sampled_from([0, 1, 2, 3, 4]))
    # max, min and the arg reductions of an empty range raise; those cases are tested on their own
    has_identity = sys.modules[info.function.__module__].COMBINE in ("sum", "prod")
    shape = draw(shapes(min_rank=rank, max_rank=rank, max_elements=1024,
                        allow_zero=has_identity))
    layout = draw(layouts(rank))
    dtype = draw(dtypes_of(info.dtypes))
    x_info = info.args[0]
    # integers now and then over their dtype's whole range, where sums and products wrap
    low, high = (x_info.low, x_info.high) if dtype.is_floating_point else \
        integer_range(dtype, x_info.low, x_info.high, wide=draw(st.booleans()))
    x = make_tensor(shape, dtype, layout, low=low, high=high,
                    seed=draw(st.integers(0, 2**31 - 1)))
    if single:
        choices = [st.integers(-max(rank, 1), max(rank, 1) - 1)]
    else:
        # lists: the registered op (which the suite also calls) takes `int[]?` as torch.library
        # spells it, with no int-to-list broadcasting; the public function's int and tuple forms
        # are unit-tested in tests/test_reduce.py
        dims = st.lists(st.integers(0, rank - 1), unique=True, max_size=rank).map(
            lambda ds: [d - rank if i % 2 else d for i, d in enumerate(ds)])  # some negative
        choices = [dims] if rank else [st.sampled_from([[0], [-1]])]
    if dim_info.optional or single and draw(st.integers(0, 4)) == 0:
        choices.append(st.none())
    dim = draw(st.one_of(*choices))
    keepdim = draw(st.booleans())
    if not has_identity and _empty_reduction(shape, dim):
        dim = None if rank == 0 else draw(st.sampled_from(
            [d for d in range(rank) if shape[d] > 0] or [None]))
    overrides = draw(knobs())
    strategy = draw(st.sampled_from(_strategies(info)))
    if strategy is not None:
        overrides["strategy"] = strategy
    if single and torch.is_floating_point(x) and x.numel() > 1 and draw(st.booleans()):
        # ties and NaN: argmax/argmin must return the first index, NaN counting as the extreme
        flat = x.reshape(-1) if x.is_contiguous() else None
        if flat is not None:
            flat[draw(st.integers(0, flat.numel() - 1))] = draw(st.sampled_from(
                [float("nan"), 3.0, -3.0]))
            flat[draw(st.integers(0, flat.numel() - 1))] = 3.0
    # the spec names the tensor and the dtype argument; the family adds dim and keepdim
    args = {x_info.name: x, "dim": dim, "keepdim": keepdim}
    describe = (f"{x_info.name}: {shape} {dtype} {layout} {tuple(x.stride())}; dim={dim!r} "
                f"keepdim={keepdim}")
    # the spec's own scalars (keepdim, which the family adds, is drawn above)
    for arg in info.args:
        if arg.kind in ("float", "int", "bool") and arg.name not in args:
            args[arg.name] = scalar_value(draw, arg)
            describe += f" {arg.name}={args[arg.name]!r}"
    reference_args = None
    dtype_name = next((a.name for a in info.args if a.kind == "dtype"), None)
    if dtype_name is not None:
        # torch's dtype= (sum, mean, prod), drawn after any in-place change to x
        # a sum into bool (torch's saturates) is refused: tests/test_dtypes.py; a negative
        # float cast to uint8 is undefined in C++ (CPU and GPU disagree)
        casts = tuple(d for d in info.dtypes if d != torch.bool and not (
            d == torch.uint8 and dtype.is_floating_point))
        args[dtype_name] = dtype_arg(draw, casts, dtype)
    # a call torch refuses (mean of integers without a floating dtype=) is taken as float32
    args = accepted(info, args)
    x = args[x_info.name]
    if dtype_name is not None:
        describe += f" {dtype_name}={args[dtype_name]}"
        # (an integer dtype= keeps the reference exact as it is)
        if args[dtype_name] is not None and args[dtype_name].is_floating_point:
            reference_args = cast_first(args, x_info.name, dtype_name)
    return Case(args, (), overrides, describe=describe, tolerances=_REDUCE_TOLERANCES,
                reference_args=reference_args)


def _empty_reduction(shape: tuple[int, ...], dim) -> bool:
    if dim is None:
        return 0 in shape
    dims = (dim,) if isinstance(dim, int) else dim
    if not dims:
        return 0 in shape
    return any(shape[d] == 0 for d in dims) if shape else False


def reduce_samples(info: OpInfo, make: Make) -> dict[str, list[tuple]]:
    """A transposed and a dense input, over one dim and over every dim (kept), and a float16
    input reduced in float32 where the op takes dtype=; positive values (a product, a mean)."""
    x, dim = info.args[0], info.args[1]
    index = dim.kind == "dim"
    every = None if dim.optional else ([0] if not index else 0)

    def call(tensor, dims, keepdim, dtype=None):
        rest = tuple(dtype if a.kind == "dtype" else default(a) for a in info.args[3:])
        return (tensor, dims, keepdim, *rest)

    samples = [call(make.t(3, 5, g=not index, lo=0.5), 1 if index else [1], False),
               call(make.r(3, 5, g=True, lo=0.5), every, True)]
    if any(a.kind == "dtype" for a in info.args):
        half = make.r(3, 5, lo=0.5).half().requires_grad_()
        samples.append(call(half, [0], False, torch.float32))
    return {info.name: samples}

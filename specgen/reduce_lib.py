"""Triton helpers of the reduce family.

Combine functions serve both the element-wise accumulation inside a tile loop and the final
``tl.reduce`` across a tile. Core ``tl`` operations only, so the interpreter runs them. Values are
float32 or float64, or integers (a kernel's COMPUTE type: an integer result's own, int64 for a
sum), whose comparisons hold no NaN.

Generated modules import these by name, unaliased (``from specgen.reduce_lib import
sum_combine_f32``): torch.compile re-emits a user kernel together with the jit functions it calls
under their own ``__name__`` and does not resolve module attributes. The names are unique (the
``_f32`` suffix, ``strided_offsets``), and the reduce planner rejects an op named like one of them.
"""

import triton.language as tl

from specgen.kernel_lib import device_function, row_offset


@device_function
def sum_combine_f32(a, b):
    return a + b


@device_function
def prod_combine_f32(a, b):
    return a * b


@device_function
def max_combine_f32(a, b):
    # torch.amax propagates NaN; tl.max and a plain a > b would drop it
    return tl.where((a != a) | (a > b), a, b)


@device_function
def min_combine_f32(a, b):
    return tl.where((a != a) | (a < b), a, b)


@device_function
def argmax_combine_f32(a, a_index, b, b_index):
    # torch.argmax: NaN counts as the largest value, and ties go to the first index
    a_nan = a != a
    b_nan = b != b
    a_first = a_index < b_index
    pick_a = (a > b) | ((a == b) & a_first) | (a_nan & ~b_nan) | (a_nan & b_nan & a_first)
    return tl.where(pick_a, a, b), tl.where(pick_a, a_index, b_index)


@device_function
def argmin_combine_f32(a, a_index, b, b_index):
    a_nan = a != a
    b_nan = b != b
    a_first = a_index < b_index
    pick_a = (a < b) | ((a == b) & a_first) | (a_nan & ~b_nan) | (a_nan & b_nan & a_first)
    return tl.where(pick_a, a, b), tl.where(pick_a, a_index, b_index)


@device_function
def strided_offsets(index, size_1, size_2, size_3, stride_0, stride_1, stride_2, stride_3,
            DIMS: tl.constexpr):
    """Offsets of a flat ``index`` over up to 4 dims (slowest 0 to fastest 3; the DIMS fastest used):
    kernel_lib's row_offset, whose dims run fastest first.

    DIMS is a constexpr so that the common one-dim case is a plain multiply: no division, and the
    compiler sees the contiguity it needs to vectorize loads.
    """
    return row_offset(index, DIMS, size_3, size_2, size_1, stride_3, stride_2, stride_1, stride_0)


# Reductions of a tile along one axis. Built-in reductions where possible (the interpreter runs
# tl.reduce with a custom combine one element at a time); prod needs the custom combine.
@device_function
def sum_reduce_f32(acc, AXIS: tl.constexpr):
    return tl.sum(acc, AXIS)


@device_function
def prod_reduce_f32(acc, AXIS: tl.constexpr):
    return tl.reduce(acc, AXIS, prod_combine_f32)


@device_function
def max_reduce_f32(acc, AXIS: tl.constexpr):
    if acc.dtype.is_floating():
        # tl.max need not propagate NaN: count NaNs on the side so that one does, as in torch.amax
        nans = tl.sum((acc != acc).to(tl.int32), AXIS)
        return tl.where(nans > 0, float("nan"), tl.max(acc, AXIS))
    else:
        return tl.max(acc, AXIS)


@device_function
def min_reduce_f32(acc, AXIS: tl.constexpr):
    if acc.dtype.is_floating():
        nans = tl.sum((acc != acc).to(tl.int32), AXIS)
        return tl.where(nans > 0, float("nan"), tl.min(acc, AXIS))
    else:
        return tl.min(acc, AXIS)


@device_function
def first_index_of_f32(acc, acc_index, best, AXIS: tl.constexpr):
    # each lane holds the first index of its best value: the smallest among lanes holding the
    # overall best is the first index overall (NaN matches NaN)
    hit = (acc == tl.expand_dims(best, AXIS)) | ((acc != acc) & tl.expand_dims(best != best, AXIS))
    return tl.min(tl.where(hit, acc_index, 2**63 - 1), AXIS)


@device_function
def argmax_reduce_f32(acc, acc_index, AXIS: tl.constexpr):
    # two built-in reductions instead of tl.reduce over (value, index) pairs, which the
    # interpreter runs one element at a time
    best = max_reduce_f32(acc, AXIS)
    return best, first_index_of_f32(acc, acc_index, best, AXIS)


@device_function
def argmin_reduce_f32(acc, acc_index, AXIS: tl.constexpr):
    best = min_reduce_f32(acc, AXIS)
    return best, first_index_of_f32(acc, acc_index, best, AXIS)


# every jit helper above: a generated module's public function must not shadow one of them
HELPERS = frozenset({
    "sum_combine_f32", "prod_combine_f32", "max_combine_f32", "min_combine_f32",
    "argmax_combine_f32", "argmin_combine_f32", "strided_offsets", "sum_reduce_f32",
    "prod_reduce_f32", "max_reduce_f32", "min_reduce_f32", "first_index_of_f32",
    "argmax_reduce_f32", "argmin_reduce_f32",
})

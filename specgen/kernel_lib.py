"""Triton helpers that generated kernels import by name (``from specgen.kernel_lib import ...``).

They use only core ``tl`` operations (no libdevice), so the CPU tier's interpreter runs the very
code the GPU compiles. The math helpers take float32 or float64 (the math's type follows them;
constants are Python numbers, which take the tensor's type) and, for ``relu_f32``,
``minimum_f32`` and ``maximum_f32``, integers too; NaN propagates as in torch. The index helpers
at the end form the row-wise kernels' tiles and offsets. torch.compile re-emits a kernel with the
jit functions it calls under their own names, so they are imported unaliased, never as
``lib.x``, and an op may not be named like one (``families.common.OP_RESERVED``).
"""

import os

import triton
import triton.language as tl


def device_function(fn):
    """``triton.jit``; under the interpreter (TRITON_INTERPRET=1) the same function, rewritten as
    the interpreter rewrites device functions, minus its re-patching of ``triton.language`` at
    every call, which the kernel calling it has done already (0.15 ms a call: a chunked row-wise
    kernel calls the index helpers for every chunk, and took a third longer in the CPU tier).
    So under the interpreter a helper runs only inside a kernel, as on a GPU."""
    jitted = triton.jit(fn)
    if os.environ.get("TRITON_INTERPRET") != "1" or not hasattr(jitted, "rewrite"):
        return jitted
    return _InterpretedHelper(fn)


if os.environ.get("TRITON_INTERPRET") == "1":
    from triton.runtime.interpreter import InterpretedFunction

    class _InterpretedHelper(InterpretedFunction):
        def __call__(self, *args, **kwargs):
            return self.rewrite()(*args, **kwargs)

# globals a jit function reads must be constexpr
_SQRT_HALF = tl.constexpr(0.7071067811865476)
# -2 * sqrt(2 / pi) * log2(e): exp(-2 * sqrt(2 / pi) * v) is exp2 of this times v
_GELU_TANH_EXP2 = tl.constexpr(-2.302208198144325)


@device_function
def tanh_f32(x):
    if x.dtype == tl.float64:
        # float64 math (a branch taken at compile time): the series below is 4e-12 off at
        # |x| = 1/16. tanh(|x|) = -m / (2 + m) with m = expm1(z), z = -2|x|: exp(z) - 1 where
        # that does not cancel (exp(z) <= 1/2), else Kahan's (exp(z) - 1) * z / log(exp(z)),
        # whose quotient cancels exp's rounding; 2 ulps at most. Where exp(z) rounds to 1,
        # tanh(x) is x (which keeps -0.0)
        z = -2.0 * tl.abs(x)
        u = tl.exp(z)
        m = tl.where(u > 0.5, (u - 1.0) * (z / tl.log(u)), u - 1.0)
        t = -m / (2.0 + m)
        result = tl.where(u == 1.0, x, tl.where(x < 0, -t, t))
    else:
        # tanh(x) = sign(x) * (1 - e) / (1 + e) with e = exp(-2|x|), which never overflows; near
        # zero 1 - e cancels, so a short Taylor series takes over below |x| = 1/16
        e = tl.exp(-2.0 * tl.abs(x))
        large = (1.0 - e) / (1.0 + e)
        large = tl.where(x < 0, -large, large)
        x2 = x * x
        small = x * (1.0 + x2 * (-1.0 / 3.0 + x2 * (2.0 / 15.0 + x2 * (-17.0 / 315.0))))
        result = tl.where(tl.abs(x) < 0.0625, small, large)
    return result


@device_function
def relu_f32(x):
    # where(x < 0, 0, x) keeps NaN, as torch.relu does (maximum(x, 0) would drop it); the int 0
    # takes x's type, an integer one's too
    return tl.where(x < 0, 0, x)


@device_function
def gelu_f32(x):
    return 0.5 * x * (1.0 + tl.erf(x * _SQRT_HALF))


@device_function
def gelu_tanh_f32(x):
    # 0.5 x (1 + tanh(u)) = x * sigmoid(2u) = x / (1 + exp(-2u)), u = sqrt(2/pi) (x + 0.044715 x^3):
    # one exp2 and one division per element (a matmul epilogue runs it on every output), and no
    # cancellation in 1 + tanh(u) for negative x; +-inf and NaN come out as torch's
    return x / (1.0 + tl.exp2(x * (1.0 + 0.044715 * x * x) * _GELU_TANH_EXP2))


@device_function
def silu_f32(x):
    return x / (1.0 + tl.exp(-x))


@device_function
def log1p_f32(x):
    # log(1 + x) is inexact when 1 + x rounds; scaling by x / ((1 + x) - 1) cancels that error
    u = 1.0 + x
    return tl.where(u == 1.0, x, tl.log(u) * (x / (u - 1.0)))


@device_function
def softplus_f32(x):
    # torch.nn.functional.softplus with beta=1, threshold=20
    return tl.where(x > 20.0, x, log1p_f32(tl.exp(x)))


@device_function
def minimum_f32(a, b):
    return tl.minimum(a, b, propagate_nan=tl.PropagateNan.ALL)


@device_function
def maximum_f32(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@device_function
def add_pairs(a0, a1, b0, b1):
    # two sums in one reduction (one round of shuffles and shared memory, not two)
    return a0 + b0, a1 + b1


# the rounding casts keep the math's type (float32, or float64 for float64 data)
@device_function
def as_float32(x):
    return x.to(tl.float32).to(x.dtype)


@device_function
def round_to_float16(x):
    return x.to(tl.float16).to(x.dtype)


@device_function
def round_to_bfloat16(x):
    return x.to(tl.bfloat16).to(x.dtype)


@device_function
def round_to_promoted(x, TO: tl.constexpr):
    # where torch's type promotion converts an operand to a type narrower than the math's, the
    # host names it (TO; "" for none): x rounded to it and back, through float32 as torch converts
    # an integer or a float64 to a 16-bit float (specgen.promotion)
    if TO == "float16":
        x = x.to(tl.float32).to(tl.float16).to(x.dtype)
    elif TO == "bfloat16":
        x = x.to(tl.float32).to(tl.bfloat16).to(x.dtype)
    elif TO == "float32":
        x = x.to(tl.float32).to(x.dtype)
    return x


@device_function
def compensated_add(total, carry, value):
    # Kahan's step: carry holds what the last add lost (negated), taken off the next value, so a
    # program's column sums over thousands of blocks of rows stay within an ulp or two of exact
    # rather than losing sqrt(blocks) ulps of their largest running value
    value -= carry
    added = total + value
    carry = (added - total) - value
    return added, carry


# Index helpers of the row-wise kernels. A row-wise launch collapses a tensor's dims into row
# dims (at most 4) and column dims (at most 3); the kernels split a flat row or column index back
# into them, fastest first, and sum each coordinate times the tensor's stride. Each tensor's call
# repeats the divisions of the index; the compiler's common-subexpression pass keeps one of each.

@device_function
def tile_rows(block, n_rows, BLOCK_M: tl.constexpr, M_ALIGN: tl.constexpr):
    """The rows of block `block` as a [BLOCK_M, 1] tile: the row each lane addresses, and which
    of them exist (M_ALIGN: a power of two dividing n_rows)."""
    rows = block * BLOCK_M + tl.arange(0, BLOCK_M)[:, None]
    if M_ALIGN >= BLOCK_M:
        # whole blocks of rows: no row is past the end
        row_mask = tl.full([BLOCK_M, 1], True, tl.int1)
    else:
        row_mask = rows < n_rows
    # masked rows address row 0, so that no offset passes the end of a tensor (masked columns
    # stay within the tile margin the launcher adds when it picks the index width)
    row_id = tl.where(row_mask, rows, 0)
    # yet a block's rows are consecutive from a multiple of BLOCK_M, and a masked load or store
    # keeps each vector wholly in or past them: where a row stride is 1 (strided rows, the kept
    # axis contiguous) the loads run along it with a ragged row count too
    row_id = tl.max_contiguous(tl.multiple_of(row_id, [BLOCK_M, 1]), [BLOCK_M, 1])
    return row_id, row_mask


@device_function
def tile_columns(start, bound, BLOCK_N: tl.constexpr, N_ALIGN: tl.constexpr,
                 INDEX_64: tl.constexpr):
    """Columns start .. start + BLOCK_N as a [1, BLOCK_N] tile, and which of them are before
    `bound` (N_ALIGN: a power of two dividing the row's length; 1 where nothing is known)."""
    cols = start + tl.arange(0, BLOCK_N)[None, :]
    if INDEX_64:
        cols = cols.to(tl.int64)
    if N_ALIGN >= BLOCK_N:
        # the tiles cover the row exactly: no column is past its end
        col_mask = tl.full([1, BLOCK_N], True, tl.int1)
    else:
        col_mask = cols < bound
    return cols, col_mask


@device_function
def row_offset(row, ROW_DIMS: tl.constexpr, size_0, size_1, size_2,
               stride_0, stride_1, stride_2, stride_3):
    """A tensor's offset of flat row index `row` over its ROW_DIMS row dims (size_d: the dims'
    sizes, fastest first; the slowest dim's size is never needed)."""
    if ROW_DIMS == 1:
        offset = row * stride_0
    else:
        offset = (row % size_0) * stride_0
        rest = row // size_0
        if ROW_DIMS == 2:
            offset += rest * stride_1
        else:
            offset += (rest % size_1) * stride_1
            rest = rest // size_1
            if ROW_DIMS == 3:
                offset += rest * stride_2
            else:
                offset += (rest % size_2) * stride_2
                offset += (rest // size_2) * stride_3
    return offset


@device_function
def col_offset(col, COL_DIMS: tl.constexpr, size_0, size_1, stride_0, stride_1, stride_2):
    """A tensor's offset of flat column index `col` over its COL_DIMS column dims: row_offset's,
    over at most three (a fourth dim's size and stride are never read)."""
    return row_offset(col, COL_DIMS, size_0, size_1, 1, stride_0, stride_1, stride_2, 0)


# Helpers of a row-wise mean/variance pair (layer_norm's) and of column outputs. A chunked pass
# keeps a mean and squared deviations per lane (Welford) and merges the lanes once a row (Chan
# et al.): as exact as two passes, with no block-wide reduction inside the loop. A split launch
# merges its programs' partials the same way.

@device_function
def welford_step(run_mean, run_m2, x, mask, chunk):
    """Chunk `x` (the pass's `chunk`-th, from 0) into each lane's running mean and sum of squared
    deviations; masked lanes take their own mean, which leaves them unchanged."""
    value = tl.where(mask, x, run_mean)
    delta = value - run_mean
    # a lane inside the row has seen one element of every chunk so far (masks only cut the end
    # of a row): one reciprocal a chunk rather than a division an element
    run_mean += delta * (1.0 / tl.cast(chunk + 1, run_mean.dtype))
    run_m2 += delta * (value - run_mean)
    return run_mean, run_m2


@device_function
def _lane_sum(x, WHOLE: tl.constexpr):
    # per row ([BLOCK_M, 1]), or over the whole tile (a scalar: a split program's one row)
    if WHOLE:
        total = tl.sum(x)
    else:
        total = tl.sum(x, axis=1, keep_dims=True)
    return total


@device_function
def merge_lanes(run_mean, run_m2, span, BLOCK_N: tl.constexpr, WHOLE: tl.constexpr):
    """The mean and sum of squared deviations of the `span` elements the lanes' welford_step
    took in chunks of BLOCK_N: per row, or a scalar with WHOLE."""
    # elements each lane has seen: the chunks that reach it
    lane_n = ((span - tl.arange(0, BLOCK_N)[None, :] + BLOCK_N - 1) // BLOCK_N).to(run_mean.dtype)
    mean = _lane_sum(lane_n * run_mean, WHOLE) / tl.maximum(span, 1)
    deviation = run_mean - mean
    m2 = _lane_sum(run_m2 + lane_n * deviation * deviation, WHOLE)
    # the mean moved by the mean deviation from it: exact for a constant row, whose rounded sum
    # may miss the value by an ulp (then x - mean is exactly 0 there, as in torch, rather than an
    # ulp that rsqrt(var + eps) scales up); the squared deviations need no correction
    mean += _lane_sum(lane_n * deviation, WHOLE) / tl.maximum(span, 1)
    return mean, m2


@device_function
def merge_splits(ws_ptr, mean_slot, rows, n_rows, n_splits, splits, split_mask):
    """A split row's mean and sum of squared deviations from its programs' partials: their means,
    squared deviations and counts, in slots mean_slot, mean_slot + 1 and mean_slot + 2 of the
    workspace (slot-major, then row, then split)."""
    slots = ws_ptr + (mean_slot * n_rows + rows) * n_splits + splits
    part_mean = tl.load(slots, mask=split_mask, other=0.0)
    part_m2 = tl.load(slots + n_rows * n_splits, mask=split_mask, other=0.0)
    part_n = tl.load(slots + 2 * n_rows * n_splits, mask=split_mask, other=0.0)
    total = tl.maximum(tl.sum(part_n), 1.0)
    mean = tl.sum(part_n * part_mean) / total
    deviation = part_mean - mean
    m2 = tl.sum(part_m2 + part_n * deviation * deviation)
    mean += tl.sum(part_n * deviation) / total   # corrected as in merge_lanes
    return mean, m2


@device_function
def add_to_partials(part_ptr, carry_ptr, value, mask):
    """compensated_add of `value` to the column partials at `part_ptr`, whose carries are at
    `carry_ptr`: a chunked program's sums over its blocks of rows, kept in memory."""
    total, carry = compensated_add(tl.load(part_ptr, mask=mask, other=0.0),
                                   tl.load(carry_ptr, mask=mask, other=0.0), value)
    tl.store(part_ptr, total, mask=mask)
    tl.store(carry_ptr, carry, mask=mask)


@device_function
def small_ints_to_float32(q, SIGNED: tl.constexpr):
    # the int32 integers of a quantized weight (from bytes: -128 <= q < 256) as float32 without
    # an int-to-float conversion, which runs at a quarter of the ALU's rate (a decode GEMV
    # converts every weight element): q ORed into the mantissa of 2**23 is 2**23 + q exactly for
    # 0 <= q < 2**23, so an OR and a subtraction give q; from SIGNED bytes q is shifted into
    # [0, 384) first
    if SIGNED:
        biased = (q + 128) | 0x4B000000
        result = biased.to(tl.float32, bitcast=True) - 8388736.0
    else:
        biased = q | 0x4B000000
        result = biased.to(tl.float32, bitcast=True) - 8388608.0
    return result

"""Row-wise launches: the reduced dims, the (rows, N) view through strides, and the strategy choice.

A row-wise op reduces ``x`` over one axis (``dim``) or over its trailing dims (``normalized_shape``).
Every other dim is a row dim. Both groups are collapsed separately (dims that are contiguous in every
operand merge), so the kernels see ``rows`` rows of ``N`` elements, with up to ``ROW_RANK`` row dims
and ``COL_RANK`` reduced dims to split an index into. Nothing is copied.
"""

from __future__ import annotations

import functools
import operator
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import torch
from torch._prims_common import suggest_memory_format

from specgen.runtime import pointwise
from specgen.runtime.autograd import sibling
from specgen.runtime.checks import as_int, check_tensors
from specgen.runtime.context import note_launch, overrides, untraced
from specgen.runtime.launch import (choose_int64, launch, max_programs, multiprocessors,
                                   plan_cache)
from specgen.runtime.layout import cdiv, collapse, dense_strides, next_power_of_2, span
from specgen.runtime.op import FamilyRuntime, Op
from specgen.runtime.replay import empty, zeros

ROW_RANK = 4    # collapsed row dims a kernel splits a row id into
COL_RANK = 3    # collapsed reduced dims a kernel splits a column index into

STRATEGIES = ("single", "looped", "online", "split")
# auto: the whole row in registers up to this many elements (next power of two of N); at
# 16 elements a thread this is 32 warps, the most a program has
SINGLE_MAX = 16384
# forced single tile: the longest row one program may hold (past it a tile would not compile
# in reasonable time, and would spill most of its registers)
SINGLE_LIMIT = 1 << 16
# auto: rows at least this long are split over several programs when there are few rows
SPLIT_MIN = 16384
# auto: past the single tile, rows up to this long (next power of two) take the looped strategy
# even where the op has the online pattern. The looped max pass re-reads the row from L2, while
# the online update's rescaling costs an exp and several selects an element: at 1024x32768 bf16
# (H200) softmax took 42.9 us looped against 53.5 online, 4096x32768 144 against 193 (float32
# 80.5 / 86, log_softmax alike; logsumexp, which has no output pass, 39.6 / 37.7 at 1024x32768
# but 98.8 / 123.1 at 4096x32768). At 65536 they tie (bfloat16) or online wins (float32, 5-11%),
# and past it the rows in flight outgrow L2, the re-reads go to memory and online wins by 25-35%
# (tools/perf/sweep_rowwise.py --part long; docs/performance.md, item 000p)
LOOPED_MAX = 32768
# programs per multiprocessor a split launch aims for, so that few long rows still fill the GPU
SPLIT_PROGRAMS_PER_SM = 4
# single tile: elements a program moves when rows are short (several rows a program). Small
# programs: at 32768x1024 bf16 (H200) a row a program on 2 warps ran softmax / layer_norm /
# rms_norm in 36.6 / 38.7 / 38.2 us, 4 rows on 8 warps in 37.7 / 45.8 / 38.5 us (a row spread
# over more warps takes more shared-memory rounds per reduction; docs/performance.md, "Removed
# probes")
TILE_TARGET = 1024
# single tile: elements a thread holds, which sets num_warps
ELEMENTS_PER_THREAD = 16


# column outputs ([columns]): programs per multiprocessor. Each program keeps float32 sums of
# its rows' columns, and a second kernel adds up one row of them per program
COLUMN_PROGRAMS_PER_SM = 2
# that second kernel: a program per BLOCK_C columns (the widest block that still gives every
# multiprocessor a program; 8 float32 columns are one 32-byte sector), reading BLOCK_P rows of
# partials a step, COLUMNS_TILE elements of each output on 4 warps
COLUMN_BLOCKS = (128, 64, 32, 16, 8)
COLUMNS_TILE = 2048


# the most rows a single-tile program takes (BLOCK_M = TILE_TARGET // BLOCK_N, at least 1 column)
MAX_BLOCK_M = TILE_TARGET

# strided rows: the row tensor's fastest row dim is contiguous and its rows are strided
# (softmax(x, 0) of a row-major x, where a row's elements lie a whole row of x apart). A program
# that reads one row there loads an element a line; instead a program takes BLOCK_M rows side by
# side, so that its loads read runs of the contiguous kept axis, and a BLOCK_N chunk of the reduced
# axis at a time (kept_config), as the reduce family's outer tiles do. BLOCK_M: the widest of these
# that still gives KEPT_PROGRAMS_PER_SM programs a multiprocessor, else the narrowest (16 bf16
# rows are a 32-byte sector). H100, bf16, online tiles forced (docs/performance.md, item 000w):
# 32 x 128 on 8 warps was the fastest or near it at every shape tried (softmax(x, 0) of 4096x8192
# 93 us, 16 x 256 103, 64 x 64 114, 16 x 64 113, 32 x 32 154; of a 32x1024x1024 x over dim 1
# 73.5 us, 64 x 64 89; the derived backward 171 against 198); 64 rows a program were slower at
# every shape, and fewer programs than multiprocessors (64 at 4096x8192) were not tried
KEPT_BLOCK_M = (32, 16)
KEPT_PROGRAMS_PER_SM = 1
# elements of a chunked kept tile (BLOCK_M x BLOCK_N), on ELEMENTS_PER_THREAD a thread
KEPT_TILE = 4096
# auto: a single kept tile (the whole reduced axis of the narrowest BLOCK_M) up to this many
# elements; past it the chunked strategies run (online where the op has the pattern). At 512
# columns (16384 rows) the single tile and online tie (20.3 against 20.9 us); at 1024 a single
# tile holds 8 rows and took 142 us against online's 73.5
KEPT_SINGLE_MAX = 8192
# single kept tile: elements a thread holds (at 256 columns, 32 x 256 on 4 warps 12.2 us, on 16
# warps 14.9; at 512, 16 x 512 on 4 warps 20.3, on 16 warps 22.4)
KEPT_SINGLE_ELEMENTS_PER_THREAD = 64


def alignment(size: int, cap: int) -> int:
    """The largest power of two dividing ``size``, at most ``cap`` (0 for an empty size): a tile
    of a power-of-two extent at most this divides ``size``, so its masks are constant. 1 for a
    symbolic size (torch.compile with dynamic shapes): masks stay computed, and the graph takes
    no guard on the size's factors (Inductor cannot print a bitwise and of a symbol either)."""
    if not isinstance(size, int):
        return 1
    return min(size & -size, cap) if size > 0 else 0


def single_fits(n: int) -> bool:
    """Whether one program may hold a row of ``n`` elements (a forced single tile)."""
    return next_power_of_2(max(n, 1)) <= SINGLE_LIMIT


def as_shape(op: str, name: str, value: object) -> list[int]:
    """torch accepts an int or a sequence of ints for ``normalized_shape`` (numpy ints and
    one-element integer tensors too); under torch.compile with dynamic shapes its ints may be
    symbolic (``[x.shape[-1]]``)."""
    one = as_int(value, listed=True)
    if one is not None:
        return [one]
    if not isinstance(value, (torch.Size, list, tuple)):
        raise TypeError(f"{op}: argument '{name}' must be an int or a sequence of ints, "
                        f"got {type(value).__name__}")
    ints = [as_int(v, listed=True) for v in value]
    for position, (v, given) in enumerate(zip(ints, value)):
        if v is None:
            raise TypeError(f"{op}: argument '{name}' must be an int or a sequence of ints, "
                            f"but found element of type {type(given).__name__} at pos {position}")
    return ints


def reduced_by_dim(op: str, name: str, x: torch.Tensor, dim: object) -> tuple[int, ...]:
    """The reduced dims named by ``dim``: an int, or a list of ints for ops that take several
    (logsumexp). Negative counts from the end; a 0-dim x takes 0 or -1. A symbolic dim (a
    torch.compile'd call given several) is specialized: the kernels need to know their dims."""
    named = list(dim) if isinstance(dim, (list, tuple)) else [dim]
    dims = [as_int(d) for d in named]
    for d, given in zip(dims, named):
        if d is None:
            raise TypeError(f"{op}: argument '{name}' must be an int or a list of ints, "
                            f"got {type(given).__name__}")
    # operator.index specializes a symbolic dim, under dynamo too (int() keeps it symbolic there)
    dims = [operator.index(d) for d in dims]
    if not dims and x.dim() > 0:
        raise ValueError(f"{op}: argument '{name}' names no dim")
    rank = max(x.dim(), 1)
    reduced = []
    for d in dims:
        if not -rank <= d < rank:
            # IndexError and RuntimeError below: the types torch raises
            raise IndexError(f"{op}: argument '{name}' is {d}, out of range for a tensor of "
                             f"{x.dim()} dims (expected {-rank} to {rank - 1})")
        if d % rank in reduced:
            raise RuntimeError(f"{op}: argument '{name}' names dim {d % rank} more than once")
        reduced.append(d % rank)
    return () if x.dim() == 0 else tuple(sorted(reduced))


def reduced_by_shape(op: str, name: str, x: torch.Tensor, shape: Sequence[int]) -> tuple[int, ...]:
    """The trailing dims of ``x`` that ``normalized_shape`` names, checked as torch checks them."""
    shape = tuple(shape)
    if not shape:
        raise ValueError(f"{op}: argument '{name}' must have at least one dim, got []")
    if tuple(x.shape[x.dim() - len(shape):]) != shape or len(shape) > x.dim():
        raise ValueError(f"{op}: argument '{name}' is {list(shape)}, but the input's trailing "
                         f"dims are {list(x.shape[max(x.dim() - len(shape), 0):])}")
    return tuple(range(x.dim() - len(shape), x.dim()))


def check_like(op: str, x_name: str, x: torch.Tensor, tensors: Mapping[str, torch.Tensor]) -> None:
    """Element-wise companions of the row tensor (a residual) have exactly its shape."""
    for name, tensor in tensors.items():
        if tensor.shape != x.shape:
            raise ValueError(f"{op}: argument '{name}' has shape {tuple(tensor.shape)}, expected "
                             f"the shape of '{x_name}' {tuple(x.shape)}")


def check_along(op: str, x: torch.Tensor, reduced: tuple[int, ...],
                tensors: Mapping[str, torch.Tensor | None]) -> None:
    """Tensors read along each row (a weight, a bias) have the reduced shape."""
    expected = column_shape(x, reduced)
    for name, tensor in tensors.items():
        if tensor is not None and tuple(tensor.shape) != expected:
            raise ValueError(f"{op}: argument '{name}' has shape {tuple(tensor.shape)}, expected "
                             f"{expected} (the reduced dims of the input)")


def column_shape(x: torch.Tensor, reduced: tuple[int, ...]) -> tuple[int, ...]:
    """The shape of a column output (summed over the rows): the reduced dims', as check_along's
    (() for a 0-dim x, whose one element is its one row and its one column)."""
    return tuple(x.shape[d] for d in reduced)


def stand_ins(x: torch.Tensor, reduced: tuple[int, ...],
              *tensors: tuple[torch.Tensor | None, float]) -> tuple[torch.Tensor | None, ...]:
    """Each optional tensor read along the rows, or where omitted the constant it stands for as a
    tensor in x's dtype (for a derived backward op, which takes every tensor); still None where
    that dtype does not hold the value exactly (the forward computes with it in float32)."""
    out = []
    for tensor, value in tensors:
        if tensor is None and _holds(x.dtype, value):
            tensor = torch.full(column_shape(x, reduced), value, dtype=x.dtype, device=x.device)
        out.append(tensor)
    return tuple(out)


@functools.cache
def _holds(dtype: torch.dtype, value: float) -> bool:
    """Whether ``dtype`` holds ``value`` exactly (asked by every eager backward that stands in
    for an omitted tensor: answered once)."""
    return torch.tensor(value, dtype=dtype).item() == value


@functools.cache
def exact_cast(source: torch.dtype, target: torch.dtype) -> bool:
    """Whether every value of dtype ``source`` is one of ``target`` (bfloat16 and float16 to
    float32): a forward's dtype= cast to ``target`` then leaves x's values as they are, so its
    derived backward op, which computes without the cast, serves the call."""
    if source == target:
        return True
    wide, narrow = torch.finfo(target), torch.finfo(source)
    # more significand bits, a larger max and a smaller least normal: every normal and
    # subnormal value of the narrow dtype is a value of the wide one
    return (wide.eps <= narrow.eps and wide.max >= narrow.max
            and wide.smallest_normal <= narrow.smallest_normal)


def empty_columns(x: torch.Tensor, reduced: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A column output: zeros when x has no rows (no kernel writes it, and a sum over no rows is
    0), else to be written."""
    if 0 in row_shape(x, reduced):
        return zeros(column_shape(x, reduced), dtype, x.device)
    return empty(column_shape(x, reduced), dtype, x.device)


def row_shape(x: torch.Tensor, reduced: tuple[int, ...], keepdim: bool = False) -> tuple[int, ...]:
    """The shape of a per-row output: the input's shape without the reduced dims, or with them
    as 1 (keepdim)."""
    if keepdim:
        return tuple(1 if d in reduced else size for d, size in enumerate(x.shape))
    return tuple(size for d, size in enumerate(x.shape) if d not in reduced)


# the dims of a channels_last (4-D) and channels_last_3d (5-D) tensor, fastest first
_CHANNELS_LAST_ORDER = {torch.channels_last: (1, 3, 2, 0), torch.channels_last_3d: (1, 4, 3, 2, 0)}


def empty_in_memory_format(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device,
                           inputs: Sequence[torch.Tensor]) -> torch.Tensor:
    """An output in the memory format torch suggests for ``inputs``, as torch's rms_norm allocates
    its result (on CPU and CUDA): channels_last for a 4-D input laid out so (dense or not),
    channels_last_3d for 5-D, else contiguous. Several inputs: the format of their element-wise
    result, which is what rms_norm(x + residual) sees (``pointwise.output_strides``: TensorIterator's
    fast setup sets the strides of size-1 dims, which suggest_memory_format reads)."""
    if len(shape) not in (4, 5):
        # only 4-D and 5-D strides suggest a channels-last format: skip building the meta
        # tensor of several inputs' layout (a few us of a first call's backward)
        return empty(shape, dtype, device)
    like = inputs[0]
    if len(inputs) > 1:
        like = torch.empty_strided(shape, pointwise.output_strides(shape, inputs), device="meta")
    # Tensor.suggest_memory_format is C++ only; this is its Python mirror (torch's decompositions
    # use it), which also takes symbolic strides
    order = _CHANNELS_LAST_ORDER.get(suggest_memory_format(like))
    return empty(shape, dtype, device, None if order is None else dense_strides(shape, order))


@dataclass(frozen=True)
class RowSpace:
    """The (rows, N) view. Sizes and strides are fastest first and padded to the kernel ranks.

    ``elem_*``: one entry per element-wise tensor (outputs, then the row tensor and its companions);
    ``along_cols``: column strides of the tensors read along a row; ``row_out_rows``: row strides of
    the per-row outputs.
    """

    rows: int
    n: int
    row_dims: int
    col_dims: int
    row_sizes: tuple[int, ...]
    col_sizes: tuple[int, ...]
    elem_rows: tuple[tuple[int, ...], ...]
    elem_cols: tuple[tuple[int, ...], ...]
    along_cols: tuple[tuple[int, ...], ...]
    row_out_rows: tuple[tuple[int, ...], ...]

    @property
    def max_col_stride(self) -> int:
        strides = [abs(s) for group in self.elem_cols + self.along_cols for s in group]
        return max(strides, default=1) or 1

    def kernel_args(self) -> list[int]:
        """Sizes (but the outermost row and column dims'), then strides in the order the kernels
        declare them."""
        args = [*self.row_sizes[:-1], *self.col_sizes[:-1]]
        for rows, cols in zip(self.elem_rows, self.elem_cols):
            args += [*rows, *cols]
        for cols in self.along_cols:
            args += cols
        for rows in self.row_out_rows:
            args += rows
        return args


@plan_cache
def _collapsed(op: str, sizes: tuple[int, ...], strides: tuple[tuple[int, ...], ...], rank: int,
               what: str) -> tuple[int, tuple[int, ...], tuple[tuple[int, ...], ...]]:
    """Collapse one group of dims; returns (dims used, sizes, strides), fastest first, padded.
    Cached on its arguments: the reduced dims' group of a call at a new row count is most often
    one seen before (the row dims change, the reduced ones and their strides do not)."""
    if not strides:
        strides = (tuple(0 for _ in sizes),)
    space = collapse(sizes, strides) if sizes else None
    if space is None or not space.sizes:
        # no dims, or all of size 1: one index, stride irrelevant
        count = 0 if any(s == 0 for s in sizes) else 1
        return 1, (count,) + (1,) * (rank - 1), tuple((0,) * rank for _ in strides)
    used = len(space.sizes)
    if used > rank:
        raise ValueError(f"{op}: the operands' {what} dims collapse to {used} dims that cannot be "
                         f"merged (sizes {space.sizes}); at most {rank} are supported")
    pad = rank - used
    out_sizes = tuple(reversed(space.sizes)) + (1,) * pad
    out_strides = tuple(tuple(reversed(s)) + (0,) * pad for s in space.strides)
    return used, out_sizes, out_strides


def space_of(op: str, shape: tuple[int, ...], reduced: tuple[int, ...],
             elements: Sequence[tuple[int, ...]], along: Sequence[tuple[int, ...] | None],
             row_outputs: Sequence[tuple[int, ...]]) -> RowSpace:
    """The (rows, N) view of an x of ``shape`` and its operands, from each tensor's strides:
    ``elements`` have x's shape, ``along`` the reduced one (None: an omitted tensor)."""
    row_d = [d for d in range(len(shape)) if d not in reduced]
    row_sizes = tuple(shape[d] for d in row_d)
    col_sizes = tuple(shape[d] for d in reduced)
    elem_row_strides = [tuple(s[d] for d in row_d) for s in elements]
    # a per-row output has the row dims, or x's rank when it keeps the reduced dims (as 1)
    out_row_strides = [tuple(s[d] for d in row_d) if len(s) == len(shape) else tuple(s)
                       for s in row_outputs]
    row_dims, rsizes, rstrides = _collapsed(op, row_sizes,
                                            tuple(elem_row_strides + out_row_strides),
                                            ROW_RANK, "row")
    elem_col_strides = [tuple(s[d] for d in reduced) for s in elements]
    # along tensors have exactly the reduced shape; an omitted one (None) is never read
    along_strides = [tuple(s) if s is not None and reduced else (0,) * len(reduced)
                     for s in along]
    col_dims, csizes, cstrides = _collapsed(op, col_sizes,
                                            tuple(elem_col_strides + along_strides),
                                            COL_RANK, "reduced")
    rows = 1
    for size in row_sizes:
        rows *= size
    n = 1
    for size in col_sizes:
        n *= size
    count = len(elements)
    return RowSpace(rows, n, row_dims, col_dims, rsizes, csizes,
                    rstrides[:count], cstrides[:count], cstrides[count:count + len(along)],
                    rstrides[count:])


def choose_strategy(rows: int, n: int, online: bool, sms: int, kept: bool = False) -> str:
    """What ``strategy = "auto"`` runs for ``rows`` rows of ``n`` elements.

    Few long rows cannot fill the GPU one program per row: split them. Rows whose next power of
    two fits in registers are read once (single). Longer rows are re-read in chunks: one pass per
    dependent step (looped), or for the longest rows of an op with the max-then-sum-of-exp
    pattern one pass for both (online), whose extra work an element pays only once the looped
    re-reads no longer hit L2 (``LOOPED_MAX``).

    ``kept``: strided rows (``kept_layout``), which programs take many at a time (``kept_config``):
    single while the narrowest such tile holds whole rows in ``KEPT_SINGLE_MAX`` elements, else
    online where the op has the pattern (a program's rows outgrow L2 far sooner), else looped.
    """
    if n >= SPLIT_MIN and rows < sms:
        return "split"
    if kept:
        if min(KEPT_BLOCK_M) * next_power_of_2(max(n, 1)) <= KEPT_SINGLE_MAX:
            return "single"
        return "online" if online else "looped"
    if next_power_of_2(max(n, 1)) <= SINGLE_MAX:
        return "single"
    return "online" if online and next_power_of_2(n) > LOOPED_MAX else "looped"


def strategy(op: str, spec_strategy: str, available: Sequence[str], rows: int, n: int,
             device: torch.device, kept: bool = False) -> str:
    """The strategy of this launch: forced by ``runtime.override(strategy=...)``, by the spec, or
    chosen from the sizes (and ``kept``: whether the rows are strided, ``kept_layout``)."""
    forced = overrides().strategy or spec_strategy
    if forced != "auto":
        if forced not in available:
            raise ValueError(f"{op}: strategy '{forced}' is not available for this op "
                             f"(available: {', '.join(available)}); 'online' needs a max step "
                             f"followed by a sum of exp(x - max)")
        if forced == "single" and not single_fits(n):
            raise ValueError(f"{op}: strategy 'single' holds a whole row in one program; rows of "
                             f"{n} elements are longer than {SINGLE_LIMIT}")
        return forced
    return choose_strategy(rows, n, "online" in available, multiprocessors(device), kept)


def split_count(rows: int, n: int, block_n: int, device: torch.device) -> int:
    """Programs per row of a split launch: enough to fill the GPU, each with at least one chunk."""
    target = SPLIT_PROGRAMS_PER_SM * multiprocessors(device)
    return max(1, min(cdiv(target, max(rows, 1)), cdiv(n, block_n)))


def single_config(rows: int, n: int) -> dict[str, int]:
    """BLOCK_N, BLOCK_M and num_warps of a single-tile launch, chosen from the sizes.

    The row is one power-of-two tile; short rows share a program (``BLOCK_M`` of them) so that each
    program moves about ``TILE_TARGET`` elements; warps grow with the tile so that a thread holds
    about 16 elements, between 1 and 32 warps.
    """
    block_n = next_power_of_2(max(n, 1))
    cap = max(1, TILE_TARGET // block_n)
    # rows compared with the cap only, not rounded up unless fewer: under torch.compile with
    # dynamic shapes each comparison is a guard, and each power of two of the rows would have
    # been a graph of its own
    block_m = cap if cap == 1 or rows >= cap else next_power_of_2(max(rows, 1))
    num_warps = max(1, min(32, block_m * block_n // (32 * ELEMENTS_PER_THREAD)))
    return {"BLOCK_N": block_n, "BLOCK_M": block_m, "num_warps": num_warps}


def kept_layout(space: RowSpace, row_tensor: int) -> bool:
    """Whether the rows are strided: element-wise tensor ``row_tensor`` (the row tensor) steps
    its fastest row dim contiguously and its fastest reduced dim not (``KEPT_BLOCK_M``). Rows of
    one element are read contiguously either way."""
    return (space.n > 1 and space.elem_rows[row_tensor][0] == 1
            and space.elem_cols[row_tensor][0] != 1)


def kept_config(rows: int, n: int, strategy: str, sms: int) -> dict[str, int]:
    """BLOCK_M, BLOCK_N and num_warps of a single or chunked launch over strided rows.

    ``BLOCK_M`` rows side by side (the contiguous kept axis: the widest of ``KEPT_BLOCK_M`` that
    gives ``KEPT_PROGRAMS_PER_SM`` programs a multiprocessor, else the narrowest, and no more than
    the rows rounded up). A single tile holds their whole rows (fewer of them where rows are long,
    down to one: a forced single tile), about 64 elements a thread; a chunked one reads
    ``KEPT_TILE`` elements a step, about 16 a thread; 1 to 32 warps.
    """
    block_m = next((m for m in KEPT_BLOCK_M if rows >= m * KEPT_PROGRAMS_PER_SM * sms),
                   min(KEPT_BLOCK_M))
    # rows compared with the widths only (each comparison is a guard under dynamic shapes)
    if rows < block_m:
        block_m = next_power_of_2(max(rows, 1))
    if strategy == "single":
        block_n = next_power_of_2(max(n, 1))
        block_m = max(1, min(block_m, KEPT_SINGLE_MAX // block_n))
        per_thread = KEPT_SINGLE_ELEMENTS_PER_THREAD
    else:
        block_n = max(1, min(KEPT_TILE // block_m, next_power_of_2(max(n, 1))))
        per_thread = ELEMENTS_PER_THREAD
    num_warps = max(1, min(32, block_m * block_n // (32 * per_thread)))
    return {"BLOCK_N": block_n, "BLOCK_M": block_m, "num_warps": num_warps}


def columns_launch(n: int, device: torch.device) -> tuple[tuple[int], dict[str, int]]:
    """The grid and the BLOCK_C, BLOCK_P and num_warps of the kernel that adds up the column
    outputs' partials, for outputs of ``n`` columns. (With 64-column blocks a 4096-wide output had
    64 programs for 132 multiprocessors, each adding 264 rows: H200, 8.3 us for layer_norm's two.)"""
    sms = multiprocessors(device)
    block_c = next((b for b in COLUMN_BLOCKS if cdiv(n, b) >= sms), COLUMN_BLOCKS[-1])
    return (cdiv(n, block_c),), {"BLOCK_C": block_c, "BLOCK_P": COLUMNS_TILE // block_c,
                                        "num_warps": 4}


# ---- launching -------------------------------------------------------------------------------


@dataclass(frozen=True)
class LaunchPlan:
    """Everything a launch decides from sizes, strides, dtypes and the test overrides."""

    space: RowSpace
    strategy: str
    index_64: bool
    cap: int                      # most programs in a grid (a persistent launch loops)
    # BLOCK_N, BLOCK_M, num_warps the planner chose: a single-tile launch's, or a chunked one's
    # over strided rows (kept_config); None where the autotuner chooses (chunked, split)
    tile: dict | None
    splits: int                   # programs per row of a split launch
    # single and chunked kernels: whole tiles get constant masks (M_ALIGN, N_ALIGN: the largest
    # powers of two dividing the sizes, capped so that few values compile)
    masks: dict
    # single and chunked kernels: a grid capped below the row blocks loops over them
    row_loop: bool

    def column_workspace(self, count: int, device: torch.device,
                         dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The partial sums of ``count`` column outputs, in the kernels' math ``dtype`` (float32,
        float64 for float64), a row of them per program of a single or chunked launch (a chunked
        grid has at most a program a row), one per row of a split one (its programs write
        disjoint shares of it). A chunked program adds to its row block by block, a compensated
        sum whose carries follow the sums: those start as zeros."""
        if self.strategy == "single":
            parts = self.grid(self.tile)[0]
        elif self.strategy == "split":
            parts = self.space.rows
        else:
            shape = (max(1, min(self.space.rows, self.cap)), 2 * count, self.space.n)
            return zeros(shape, dtype, device)
        return empty((parts, count, self.space.n), dtype, device)

    def grid(self, meta: Mapping[str, int]) -> tuple[int]:
        """Row blocks (single, looped, online), or rows times splits (split)."""
        if self.strategy == "split":
            return (max(1, min(self.space.rows * self.splits, self.cap)),)
        return (max(1, min(cdiv(self.space.rows, meta["BLOCK_M"]), self.cap)),)


_plans: dict[tuple, LaunchPlan | None] = {}
PLAN_CACHE_SIZE = 4096


def launch_plan(op: str, spec_strategy: str, available: Sequence[str], indexing: str,
                max_block: int, max_chunk: int, row_outputs_only_need_rows: bool,
                x: torch.Tensor, reduced: tuple[int, ...], elements: Sequence[torch.Tensor],
                along: Sequence[torch.Tensor | None],
                row_outputs: Sequence[torch.Tensor], names: Sequence[str],
                columns: bool = False) -> LaunchPlan | None:
    """The launch of one call, or None when there is nothing to compute. Cached on plain tensors
    by everything it reads, so repeated calls skip the collapsing and the checks. ``names``: the
    arguments' names of ``elements``, ``along`` and ``row_outputs`` in that order (for errors).
    ``columns``: the op has column outputs (in ``along``), so its single and chunked grids are
    persistent, a few programs a multiprocessor, each summing many rows."""
    tensors = [*elements, *along, *row_outputs]
    # each tensor's metadata read once: the key, the collapsed view and the spans take it
    metas = tuple(None if t is None else (t.shape, t.stride(), t.dtype) for t in tensors)
    key = None
    if untraced(tensors):
        key = (op, reduced, x.device, overrides(), metas)
        try:
            if key in _plans:
                return _plans[key]
        except TypeError:  # a mapping config forced by the tests does not hash: plan uncached
            key = None
    count, along_count = len(elements), len(along)
    space = space_of(op, tuple(x.shape), reduced, [m[1] for m in metas[:count]],
                     [None if m is None else m[1] for m in metas[count:count + along_count]],
                     [m[1] for m in metas[count + along_count:]])
    plan = None
    # rows of length 0 still have per-row outputs
    if space.rows and (space.n or row_outputs_only_need_rows):
        kept = any(t is x and kept_layout(space, i) for i, t in enumerate(elements))
        chosen = strategy(op, spec_strategy, available, space.rows, space.n, x.device, kept)
        # int64 when any offset may pass 2**31 - 1: a tensor's span plus a tile of masked columns
        spans = {name: span(*m[:2]) for name, m in zip(names, metas) if m is not None}
        index_64 = choose_int64(op, indexing, spans, max_block * space.max_col_stride)
        if kept and (chosen == "single" or chosen != "split" and overrides().config is None):
            # strided rows: many a program (a config the tests force runs as forced)
            tile = kept_config(space.rows, space.n, chosen, multiprocessors(x.device))
        else:
            tile = single_config(space.rows, space.n) if chosen == "single" else None
        splits = (split_count(space.rows, space.n, overrides().split_chunk or max_chunk, x.device)
                  if chosen == "split" else 1)
        cap = (max_programs(x.device, "persistent", COLUMN_PROGRAMS_PER_SM) if columns
               else max_programs(x.device, "flat"))
        masks = {"M_ALIGN": alignment(space.rows, MAX_BLOCK_M),
                 "N_ALIGN": alignment(space.n, max_block)}
        # a loop over row blocks only where the grid is capped below them (a loop costs time
        # even when it runs once); an autotuned chunked kernel's BLOCK_M is the autotuner's, so
        # its rows stand in for its blocks (at least as many)
        blocks = cdiv(space.rows, tile["BLOCK_M"]) if tile else space.rows
        plan = LaunchPlan(space, chosen, index_64, cap, tile, splits, masks, cap < blocks)
    if key is not None:
        if len(_plans) >= PLAN_CACHE_SIZE:  # many distinct shapes: start over rather than grow
            _plans.clear()
        _plans[key] = plan
    return plan


@dataclass(frozen=True)
class Output:
    """An output of a row-wise op, as its implementation allocates it."""

    name: str
    # per_row (the reduced dims dropped, or kept as 1s), column (summed over the rows: the reduced
    # shape), contiguous, memory_format (as torch's rms_norm: the format torch suggests for the
    # tensors in `like`) or elementwise (as torch lays out an element-wise result of `like`)
    kind: str
    like: tuple[str, ...] = ()
    dtype_of: str | None = None    # the tensor whose dtype it takes (a derived gradient's)


@dataclass(frozen=True)
class Backward:
    """How an op's eager autograd calls the backward op derived from its spec."""

    op: str
    # the derived op's arguments: a forward argument's name, or the index of an output's gradient
    call: tuple[str | int, ...]
    results: tuple[str, ...]            # its results: the gradients of these forward tensors
    grads: tuple[str | None, ...]       # each forward argument's gradient among the results
    # the forward's dtype argument, which the derived op lacks: it serves a cast that leaves the
    # row tensor's values as they are
    dtype: str | None = None
    # optional tensors the derived op needs, each with the constant it stands for when omitted
    absent: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class Launch:
    """A row-wise op's launch data (its description's ``launch``): the roles of its arguments
    and outputs, and its strategies' bounds. Kernels (the module's KERNELS): ``single``,
    ``looped``, ``online`` (where the op has online passes), ``split`` (a tuple, one a pass),
    ``split_out``, ``columns`` (where it has column outputs)."""

    strategy: str                       # the spec's: auto, or one strategy forced
    strategies: tuple[str, ...]         # those its kernels implement
    max_block: int                      # the longest tile a program forms column offsets for
    max_chunk: int                      # the widest split chunk
    slots: int                          # partials a split launch keeps per row and split
    row_tensor: str
    dim: str | int | None               # the dim argument's name, or a fixed dim
    normalized_shape: str | None        # or the normalized_shape argument's name
    keepdim: str | None                 # the keepdim argument's name (per-row outputs)
    dtype: str | None                   # the dtype argument's name ([rows] dtype)
    finfo_eps: tuple[str, ...]          # float arguments whose None is the math type's epsilon
    like: tuple[str, ...]               # tensors shaped as the row tensor
    along: tuple[str, ...]              # tensors read along the rows (a weight)
    promoted: tuple[str, ...]           # tensors whose dtypes promote with the row tensor's
    inputs: tuple[str, ...]             # the kernels' input pointers, in order
    pointer_outputs: tuple[str, ...]    # then their output pointers
    launch_tensors: tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]  # launch_plan's lists
    optional: tuple[tuple[str, str], ...]   # optional tensors with their kernels' flag
    kernel_scalars: tuple[str, ...]
    dtype_key: tuple[str, ...]          # the tensors whose dtypes autotuning depends on
    compute_of: str                     # the tensor whose dtype sets the math's (compute_dtype)
    outputs: tuple[Output, ...]         # in allocation order (column outputs first)
    results: tuple[str, ...]            # what the implementation returns, in order
    fp_fusion: bool = True              # False for a derived op (terms that cancel: polynomial.py)
    derived_from: str | None = None     # the op this one is the backward of
    backward: Backward | None = None


class Rowwise(FamilyRuntime):
    """Row-wise ops: checks of the rows (dim or normalized shape, tensors alike or along them),
    the outputs' allocation, each strategy's launches, and the derived backward of their eager
    autograd; normalized shapes are spelled out as lists for the registered op."""

    def spell_out(self, op: Op, args: tuple) -> tuple:
        if not any(a.kind == "shape" for a in op.description.args):
            return args
        return tuple(as_shape(op.name, a.name, v) if a.kind == "shape" else v
                     for a, v in zip(op.description.args, args))

    def run(self, op: Op, args: tuple) -> torch.Tensor | tuple[torch.Tensor, ...]:
        spec: Launch = op.description.launch
        named = dict(zip((a.name for a in op.description.args), args))
        reduced = _checked(op, named)
        x = named[spec.row_tensor]
        if spec.dtype:
            # dtype=None keeps the input's
            out_dtype = x.dtype if named[spec.dtype] is None else named[spec.dtype]
        elif spec.promoted:
            # as torch's x + residual: bfloat16 and float32 give float32
            out_dtype = pointwise.result_dtype([x, *(named[n] for n in spec.promoted)])
        else:
            out_dtype = x.dtype
        keepdim = bool(named[spec.keepdim]) if spec.keepdim else False
        for out in spec.outputs:
            dtype = named[out.dtype_of].dtype if out.dtype_of else out_dtype
            if out.kind == "column":
                named[out.name] = empty_columns(x, reduced, dtype)
            elif out.kind == "per_row":
                named[out.name] = empty(row_shape(x, reduced, keepdim), dtype, x.device)
            elif out.kind == "elementwise":
                named[out.name] = pointwise.empty_output(x.shape, dtype, x.device,
                                                         [named[n] for n in out.like])
            elif out.kind == "memory_format":
                named[out.name] = empty_in_memory_format(x.shape, dtype, x.device,
                                                         [named[n] for n in out.like])
            else:
                named[out.name] = empty(x.shape, dtype, x.device)
        _launch(op, named, reduced)
        results = tuple(named[n] for n in spec.results)
        return results[0] if len(results) == 1 else results

    def backward(self, op: Op) -> Callable | None:
        if op.description.launch.backward is None:
            return None
        return _DerivedBackward(op)


RUNTIME = Rowwise()


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The math's type of the kernels for a tensor of ``dtype`` (their COMPUTE): float32 for the
    16- and 32-bit floats, as torch's opmath, float64 for float64."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _checked(op: Op, named: dict) -> tuple[int, ...]:
    """The checks of a call's tensors and rows (``Op.run`` checked its scalars); returns the
    reduced dims. An optional float argument of None becomes the machine epsilon of the math's
    type in ``named`` (float32, float64 for a float64 row tensor): torch's kernels take their
    opmath type's (its docs say the input's, which a 16-bit x would make 8000x larger)."""
    spec: Launch = op.description.launch
    tensors = {a.name: named[a.name] for a in op.description.args
               if a.kind == "tensor" and named[a.name] is not None}
    check_tensors(op.name, tensors, op.description.dtypes)
    x = named[spec.row_tensor]
    for name in spec.finfo_eps:
        if named[name] is None:
            named[name] = torch.finfo(compute_dtype(x.dtype)).eps
    if isinstance(spec.dim, str):
        reduced = reduced_by_dim(op.name, spec.dim, x, named[spec.dim])
    elif spec.dim is not None:
        reduced = reduced_by_dim(op.name, "dim", x, spec.dim)
    else:
        shape = as_shape(op.name, spec.normalized_shape, named[spec.normalized_shape])
        reduced = reduced_by_shape(op.name, spec.normalized_shape, x, shape)
    check_like(op.name, spec.row_tensor, x, {n: named[n] for n in spec.like})
    check_along(op.name, x, reduced, {n: named[n] for n in spec.along})
    return reduced


def _launch(op: Op, named: dict, reduced: tuple[int, ...]) -> None:
    spec: Launch = op.description.launch
    kernels = op.kernels
    x = named[spec.row_tensor]
    elem, along, row_out = ([named[n] for n in group] for group in spec.launch_tensors)
    columns = [o.name for o in spec.outputs if o.kind == "column"]
    plan = launch_plan(op.name, spec.strategy, spec.strategies, op.description.indexing,
                       spec.max_block, spec.max_chunk, bool(row_out), x, reduced, elem, along,
                       row_out, tuple(n for group in spec.launch_tensors for n in group),
                       columns=bool(columns))
    if plan is None:
        return
    space = plan.space
    # the kernels' math type (their COMPUTE), which their partials keep
    compute = compute_dtype(named[spec.compute_of].dtype)
    # column outputs: each program (split: each row) sums its rows into a row of partials, which
    # a last kernel adds up
    cols_ws = (plan.column_workspace(len(columns), x.device, compute),) if columns else ()
    # an omitted optional tensor is never read; the row tensor stands in for its pointer
    pointers = [x if named[n] is None else named[n] for n in spec.inputs]
    pointers += [named[n] for n in spec.pointer_outputs]
    args = (*pointers, *cols_ws, space.rows, space.n, *space.kernel_args(),
            *(named[n] for n in spec.kernel_scalars))
    names = [a.name for a in op.description.args]
    constexprs = {c: named[names[i]] for i, c in op.description.choice_positions}
    constexprs.update({flag: named[n] is not None for n, flag in spec.optional})
    constexprs.update(ROW_DIMS=space.row_dims, COL_DIMS=space.col_dims, INDEX_64=plan.index_64)
    # what autotuning depends on besides the constexprs (the autotuners' key: N and the dtypes)
    tune_key = (space.n, *(None if named[n] is None else named[n].dtype for n in spec.dtype_key))
    options = {} if spec.fp_fusion else {"fp_fusion": False}
    note_launch(op.name, plan.strategy, plan.index_64, rows=space.rows, n=space.n,
                row_loop=plan.row_loop, splits=plan.splits, tile=plan.tile)
    if plan.strategy == "single":
        # block sizes and warps come from the sizes (no config space)
        launch(kernels["single"], plan.grid(plan.tile), *args, **constexprs, **plan.masks,
               **plan.tile, ROW_LOOP=plan.row_loop, **options)
    elif plan.tile:
        # a chunked kernel over strided rows: the planner's tile, not the autotuner's (its
        # configs read one row a program)
        launch(kernels[plan.strategy].fn, plan.grid(plan.tile), *args, **constexprs,
               **plan.masks, **plan.tile, ROW_LOOP=plan.row_loop, **options)
    elif plan.strategy != "split":
        launch(kernels[plan.strategy], plan.grid, *args, tune_key=tune_key, **constexprs,
               **plan.masks, ROW_LOOP=plan.row_loop, **options)
    else:
        workspace = empty((spec.slots, space.rows, plan.splits), compute, x.device)
        constexprs["SPLITS_BLOCK"] = next_power_of_2(plan.splits)
        # the workspace goes by position: keyword arguments are part of the tuned-config key
        for kernel in (*kernels["split"], kernels["split_out"]):
            launch(kernel, plan.grid, *args, workspace, plan.splits, tune_key=tune_key,
                   **constexprs, **options)
    if columns:
        columns_grid, columns_meta = columns_launch(space.n, x.device)
        (ws,) = cols_ws
        launch(kernels["columns"], columns_grid, ws, *(named[n] for n in columns), ws.shape[0],
               ws.shape[1], space.n, **columns_meta, INDEX_64=plan.index_64, **options)


class _DerivedBackward:
    """An op's gradients by the backward op derived from its spec (None where it does not apply:
    the reference's gradient then serves), with the places of what the derived op takes and
    gives looked up once (every eager training step of the op calls this)."""

    def __init__(self, op: Op) -> None:
        spec: Launch = op.description.launch
        back: Backward = spec.backward
        index = {a.name: i for i, a in enumerate(op.description.args)}
        self.op = op
        self.x = index[spec.row_tensor]
        # each argument of the derived op: (True, an output's gradient) or (False, an argument)
        self.takes = tuple((True, a) if isinstance(a, int) else (False, index[a])
                           for a in back.call)
        # each forward argument's gradient among its results
        self.gives = tuple(None if g is None else back.results.index(g) for g in back.grads)
        self.dtype = index[back.dtype] if back.dtype else None
        self.absent = tuple((index[n], value) for n, value in back.absent)
        self.function: Callable | None = None

    def __call__(self, args: Sequence, grads: tuple) -> tuple | None:
        x = args[self.x]
        cast = None if self.dtype is None else args[self.dtype]
        if cast is not None and not exact_cast(x.dtype, cast):
            # the derived op computes without the cast: it serves one that leaves x's values as
            # they are (bfloat16 to float32), not one that rounds them
            return None
        if any(args[i] is None for i, _ in self.absent):
            # the derived op takes every tensor: an omitted one is the constant it stands for
            # (an eps of None resolves here to the value the derived op would give it)
            args = list(args)
            named = dict(zip((a.name for a in self.op.description.args), args))
            stood = stand_ins(x, _checked(self.op, named),
                              *((args[i], value) for i, value in self.absent))
            for (i, _), tensor in zip(self.absent, stood):
                if tensor is None:
                    return None  # a constant the input's dtype does not hold
                args[i] = tensor
        if self.function is None:
            self.function = sibling(self.op.module, self.op.description.launch.backward.op)
        found = self.function(*[grads[i] if grad else args[i] for grad, i in self.takes])
        found = found if isinstance(found, tuple) else (found,)
        return tuple(None if r is None else found[r] for r in self.gives)

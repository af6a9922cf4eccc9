"""Matmul launches: operand roles from named dims, batch broadcasting and folding, split-K, configs.

Every operand is described by the dims its spec declares: the A operand has ``M`` and ``K``, the
B operand ``K`` and ``N`` (or ``N, K`` for a linear weight), epilogue operands some of ``M`` and
``N``. A leading ``"..."`` marks batch dims that broadcast as in ``torch.matmul``; a leading
``"B"`` one batch dim that must match exactly (``torch.bmm``).

Everything here reads sizes and strides only, so it runs unchanged on the fake tensors that
``torch.compile`` traces a ``triton_op`` with.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import torch
import triton
import triton.testing

from specgen.quant import is_group_size
from specgen.runtime import tuned
from specgen.runtime.checks import check_interpreted_dot, check_tensors, is_real
from specgen.runtime.context import Overrides, interpreting, note_launch, overrides, untraced
from specgen.runtime.counters import launch_counters
from specgen.runtime.launch import (choose_int64, launch, max_programs, multiprocessors,
                                   shared_memory)
from specgen.runtime.op import FamilyRuntime, Op
from specgen.runtime.layout import (broadcast_shapes, cdiv, collapse, contiguous_strides,
                                    next_power_of_2, span, storage_span, strides_at)
from specgen.runtime.pointwise import result_dtype
from specgen.runtime.replay import empty, note_tuning, zeros

BATCH = ("...", "B")
# a split-K program should still loop over enough of K to keep its pipeline full
MIN_K_PER_SPLIT = 512
# auto split-K aims at this many programs per multiprocessor
SPLIT_PROGRAMS_PER_SM = 4
# split-K sums its slots in the split kernel's last program of a tile up to this many rows, in a
# second kernel above. On an H200 (docs/performance.md, 001q) one launch took int4's 16 x 4096 x
# 4096 from 19.0 to 17.7 us (a probe timing both), and int8_linear's 256 x 4096 x 4096 from 23.1
# to 39.9 us (two bench runs: one program summed a 128 x 128 tile's slots, where the reduce
# kernel spreads them over 512)
FUSED_SUM_ROWS = 16
# tl.dot needs every block dimension to be at least 16
MIN_DOT_BLOCK = 16
# the GEMV kernel's least columns of B a multiprocessor: a program of its space's narrowest
# block (4 columns) for each. The space's lead is 16 columns: at this bound its untuned launch
# fills a quarter of the multiprocessors (not timed against the split tiles there)
GEMV_COLUMNS_PER_SM = 4
# Hopper's wgmma works on 64-row tiles: configs with fewer rows are meant for problems that small
WGMMA_ROWS = 64
# a TMA descriptor's base address and every stride but the unit one are multiples of 16 bytes
TMA_ALIGN = 16


def _letters(dims: Sequence[str]) -> tuple[str, ...]:
    return tuple(d for d in dims if d not in BATCH)


@dataclass(frozen=True)
class View:
    """One tensor as the kernel indexes it: strides over the batch dims and over M, N, K."""

    batch: tuple[int, ...]
    m: int = 0
    n: int = 0
    k: int = 0
    g: int = 0      # a quantized B's per-group scales: along the groups of K


def _target(dims: Sequence[str], batch: tuple[int, ...], m: int, n: int,
            keeps: tuple[bool, bool]) -> tuple[int, ...]:
    """The shape an operand with ``dims`` broadcasts to (M or N absent where torch drops them)."""
    shape: list[int] = []
    for d in dims:
        if d in BATCH:
            shape += batch
        elif d == "M" and keeps[0]:
            shape.append(m)
        elif d == "N" and keeps[1]:
            shape.append(n)
    return tuple(shape)


def _view(shape: tuple[int, ...], strides: tuple[int, ...], dims: Sequence[str],
          batch: tuple[int, ...], m: int, n: int, keeps: tuple[bool, bool]) -> View:
    """A tensor of ``shape`` and ``strides`` broadcast to its target shape, its strides assigned
    to the batch dims and letters."""
    strides = list(strides_at(shape, strides, _target(dims, batch, m, n, keeps)))
    batched = dims[0] in BATCH
    batch_strides = tuple(strides[:len(batch)]) if batched else (0,) * len(batch)
    rest = strides[len(batch):] if batched else strides
    letters = {}
    for letter in _letters(dims):
        dropped = letter == "M" and not keeps[0] or letter == "N" and not keeps[1]
        letters[letter] = 0 if dropped else rest.pop(0)
    return View(batch_strides, m=letters.get("M", 0), n=letters.get("N", 0), k=letters.get("K", 0))


@dataclass(frozen=True)
class Problem:
    """What one call computes: sizes, the result's shape and every input's strides."""

    m: int
    n: int
    k: int
    batch: tuple[int, ...]          # the broadcast batch shape, slowest first
    shape: tuple[int, ...]          # the result's shape (torch.matmul drops the M/N of 1-D operands)
    keeps: tuple[bool, bool]        # whether the result has the M and the N dim
    views: Mapping[str, View]
    m_operands: frozenset[str]      # the inputs indexed by M (A, column vectors, residuals)

    def space(self, op: str, outputs: Mapping[str, tuple[int, ...]], rank: int) -> Space:
        """Folds batch dims into M where every operand allows it, collapses the rest to ``rank``
        (a ValueError naming ``op`` and the operands where they do not collapse that far).
        ``outputs``: each output's strides (of the result's shape)."""
        views = dict(self.views)
        for name, strides in outputs.items():
            views[name] = _view(self.shape, strides, ("...", "M", "N"), self.batch, self.m,
                                self.n, self.keeps)
        has_m = self.m_operands | set(outputs)
        m, batch = self.m, list(self.batch)
        # innermost batch dim first: a dim folds into M when it steps exactly over M rows in every
        # operand indexed by M, and not at all in the others (a linear weight, a bias); this turns
        # linear on (B, S, K) and matmul of (B, M, K) by (K, N) into one large GEMM
        while batch:
            d = len(batch) - 1
            ok = all(v.batch[d] == 0 for name, v in views.items() if name not in has_m) and (
                m == 1 or all(v.batch[d] == m * v.m for name, v in views.items() if name in has_m))
            if not ok:
                break
            views = {name: View(v.batch[:d], m=v.batch[d] if m == 1 and name in has_m else v.m,
                                n=v.n, k=v.k, g=v.g) for name, v in views.items()}
            m *= batch.pop()
        names = list(views)
        collapsed = collapse(tuple(batch), [views[name].batch for name in names])
        if len(collapsed.sizes) > rank:
            batched = ", ".join(f"'{name}'" for name in self.views if any(self.views[name].batch))
            raise ValueError(
                f"{op}: the batch dims {tuple(batch)} cannot be merged into {rank} or fewer for "
                f"the strides of {batched}; make some of them contiguous")
        pad = rank - len(collapsed.sizes)
        views = {name: View((0,) * pad + strides, views[name].m, views[name].n, views[name].k,
                            views[name].g)
                 for name, strides in zip(names, collapsed.strides)}
        return Space(m, self.n, self.k, (1,) * pad + collapsed.sizes, views)


@dataclass(frozen=True)
class Space:
    """The launch's sizes after folding: M, N, K, ``rank`` batch sizes and every tensor's strides."""

    m: int
    n: int
    k: int
    batch: tuple[int, ...]
    views: Mapping[str, View]

    @property
    def batch_count(self) -> int:
        count = 1
        for size in self.batch:
            count *= size
        return count

    def strides(self, name: str, letters: str, batched: bool = True) -> tuple[int, ...]:
        """The kernel's stride arguments of ``name``: batch strides (if it has batch dims), then
        one per letter."""
        view = self.views[name]
        return (view.batch if batched else ()) + tuple(getattr(view, letter) for letter in letters)

    def layout(self, a: str, b: str, outputs: Sequence[str]) -> str:
        """Which stride is 1 in each matrix operand: the layout part of the autotuning key."""
        def unit(name: str, letters: str) -> str:
            return next((l for l in letters if getattr(self.views[name], l) == 1), "s")
        parts = [f"{a}:{unit(a, 'mk')}", f"{b}:{unit(b, 'kn')}"]
        return ",".join(parts + [f"{o}:{unit(o, 'mn')}" for o in outputs])


def check_same_dtype(op: str, tensors: Mapping[str, torch.Tensor | None]) -> torch.dtype:
    """torch's matmuls take one dtype for all operands (no promotion): every tensor but the
    epilogue's promoted ones."""
    (first_name, first), *rest = [(n, t) for n, t in tensors.items() if t is not None]
    for name, tensor in rest:
        if tensor.dtype != first.dtype:
            raise TypeError(f"{op}: argument '{name}' has dtype {tensor.dtype}, but '{first_name}' "
                            f"has {first.dtype}; all operands must have the same dtype")
    return first.dtype


def _matrix(op: str, name: str, tensor: torch.Tensor, dims: Sequence[str]):
    """(batch shape, {letter: (size, stride)}, is a vector) of a matrix operand."""
    letters = _letters(dims)
    if dims[0] == "...":
        if tensor.dim() < 1:
            raise ValueError(f"{op}: argument '{name}' must have at least 1 dim, got a 0-dim tensor")
    elif tensor.dim() != len(dims):
        raise ValueError(f"{op}: argument '{name}' must be {len(dims)}-D ({' x '.join(dims)}), "
                         f"got shape {tuple(tensor.shape)}")
    if tensor.dim() == 1:
        # torch.matmul: a 1-D operand is a vector over K; its other dim is dropped from the result
        other = next(l for l in letters if l != "K")
        return (), {"K": (tensor.shape[0], tensor.stride(0)), other: (1, 0)}, True
    shape, strides = tuple(tensor.shape), tuple(tensor.stride())
    lead = len(shape) - 2
    info = {letter: (shape[lead + i], strides[lead + i]) for i, letter in enumerate(letters)}
    return (shape[:lead] if dims[0] in BATCH else ()), info, False


def _batch_strides(tensor: torch.Tensor, batch_t: tuple[int, ...], batch: tuple[int, ...]):
    lead = len(batch) - len(batch_t)
    return (0,) * lead + tuple(stride if size == full else 0 for size, stride, full
                               in zip(batch_t, tensor.stride()[:len(batch_t)], batch[lead:]))


def problem(op: str, tensors: Mapping[str, torch.Tensor | None],
            dims: Mapping[str, tuple[str, ...]], packed: int = 1,
            group: tuple[str, int, int] | None = None) -> Problem:
    """Sizes, result shape and operand strides, with a ValueError naming the argument at fault.
    ``packed``: elements a stored element of B holds along K (a quantized B); ``group``: the
    group-size argument's name and value, where operands have dims N, G."""
    a = next(name for name, d in dims.items() if "M" in d and "K" in d)
    b = next(name for name, d in dims.items() if "N" in d and "K" in d)
    batch_a, info_a, vector_a = _matrix(op, a, tensors[a], dims[a])
    batch_b, info_b, vector_b = _matrix(op, b, tensors[b], dims[b])
    (m, stride_am), (k, stride_ak) = info_a["M"], info_a["K"]
    (k_b, stride_bk), (n, stride_bn) = info_b["K"], info_b["N"]
    if k != k_b * packed:
        stored = f" (it stores {packed} elements of K a byte: K / {packed} = {k / packed:g})" \
            if packed > 1 else ""
        raise ValueError(f"{op}: '{a}' {tuple(tensors[a].shape)} and '{b}' "
                         f"{tuple(tensors[b].shape)} cannot be multiplied: K is {k} and "
                         f"{k_b * packed}{stored}")
    if "B" in (dims[a][0], dims[b][0]):
        if batch_a != batch_b:
            raise ValueError(f"{op}: '{a}' and '{b}' must have the same batch size, got "
                             f"{batch_a[0]} and {batch_b[0]}")
        batch = batch_a
    else:
        batch = broadcast_shapes(batch_a, batch_b)
        if batch is None:
            raise ValueError(f"{op}: the batch dims of '{a}' {batch_a} and '{b}' {batch_b} do not "
                             f"broadcast")
    keeps = (not vector_a, not vector_b)
    shape = batch + ((m,) if keeps[0] else ()) + ((n,) if keeps[1] else ())
    views = {
        a: View(_batch_strides(tensors[a], batch_a, batch), m=stride_am, k=stride_ak),
        b: View(_batch_strides(tensors[b], batch_b, batch), n=stride_bn, k=stride_bk),
    }
    for name, tensor in tensors.items():
        if name in (a, b) or tensor is None:
            continue
        if _letters(dims[name]) == ("N", "G"):
            views[name] = _group_view(op, name, tensor, n, k, group, len(batch))
            continue
        target = _target(dims[name], batch, m, n, keeps)
        if (_letters(dims[name]) == ("M",) and tensor.dim() == tensors[a].dim()
                and tensor.shape[-1] == 1):
            # a per-row operand as torch broadcasts one against the (..., M, N) product:
            # (..., M, 1), of A's rank (int8_linear's per-token scales); a 1-D A's one row
            # takes a (1,)
            tensor = tensor[..., 0]
        if broadcast_shapes(tuple(tensor.shape), target) != target:
            column = " or, of A's rank, (..., M, 1)" if _letters(dims[name]) == ("M",) else ""
            raise ValueError(f"{op}: argument '{name}' has shape {tuple(tensor.shape)}, which does "
                             f"not broadcast to {target} ({' x '.join(dims[name])}){column}")
        views[name] = _view(tuple(tensor.shape), tuple(tensor.stride()), dims[name], batch, m, n,
                            keeps)
    m_operands = frozenset(name for name in views if name != b and "M" in dims[name])
    return Problem(m, n, k, batch, shape, keeps, views, m_operands)


def _group_view(op: str, name: str, tensor: torch.Tensor, n: int, k: int,
                group: tuple[str, int, int], batch_rank: int) -> View:
    """A quantized B's per-group operand: (N, K / group size), no batch dims. ``group``: the
    group-size argument's name, its value and the least one the op takes."""
    arg, size, least = group
    if k % size:
        raise ValueError(f"{op}: K = {k} is not a multiple of {arg} = {size}")
    if tuple(tensor.shape) != (n, k // size):
        # (16, 4) where (16, 2) is expected: scales quantized at another group size
        fits = k // tensor.shape[1] if tensor.dim() == 2 and tensor.shape[1] else 0
        implied = (f" (which fits {arg}={fits})" if is_group_size(fits, least)
                   and fits * tensor.shape[1] == k and tensor.shape[0] == n else "")
        raise ValueError(f"{op}: argument '{name}' must have shape (N, K / {arg}) = "
                         f"{(n, k // size)}, got {tuple(tensor.shape)}{implied}")
    return View((0,) * batch_rank, n=tensor.stride(0), g=tensor.stride(1))


# --- launch decisions ------------------------------------------------------------------------


def split_k_factor(m: int, n: int, k: int, batch: int, sms: int, factors: Sequence[int]) -> int:
    """How many programs share one output tile's K loop (1: no split).

    Splitting pays when the output has too few tiles to fill the GPU and K is long: the decode
    shape 16 x 4096 x 4096 has 32 tiles of 16 x 128 for 132 multiprocessors. The factor is the
    largest allowed one that keeps about SPLIT_PROGRAMS_PER_SM programs per multiprocessor and
    MIN_K_PER_SPLIT of K per program.
    """
    tile_m = 16 if m <= 16 else 64
    tiles = batch * cdiv(m, tile_m) * cdiv(n, 128)
    if tiles >= sms:
        return 1
    best = 1
    for factor in sorted(factors):
        if factor > 1 and k // factor >= MIN_K_PER_SPLIT and tiles * factor <= SPLIT_PROGRAMS_PER_SM * sms:
            best = factor
    return best


@dataclass(frozen=True)
class Strategy:
    """``direct`` (one program per tile, fused epilogue), ``tma`` (the same on a persistent grid,
    A and B through TMA descriptors), ``gemv`` (a quantized B's columns against one row of A a
    program, on the CUDA cores) or a split-K reduction of ``factor``."""

    kind: str       # direct | tma | gemv | two_stage | atomic
    factor: int = 1

    @property
    def split(self) -> bool:
        """A split-K reduction (a workspace, and ticket counters or a second kernel), not a tile
        kernel."""
        return self.kind in ("two_stage", "atomic")


DIRECT, TMA, GEMV = Strategy("direct"), Strategy("tma"), Strategy("gemv")


def tile_strategy(m: int, device: torch.device, describable: bool) -> Strategy:
    """The kernel of one program per output tile: TMA's on Hopper for wgmma-sized problems whose
    operands its descriptors can describe (``describable``), else the direct kernel."""
    if (describable and m >= WGMMA_ROWS and device.type == "cuda" and not interpreting()
            and has_tma(device.index or 0)):
        return TMA
    return DIRECT


def strategy(mode: str, m: int, n: int, k: int, batch: int, device: torch.device,
             factors: Sequence[int], describable: bool = False, gemv: bool = False) -> Strategy:
    """The GEMV kernel for one row of A where the op has it (``gemv``: a quantized B), else the
    spec's split_k mode (auto | atomic | off) applied to the sizes, with the tile kernel where it
    does not split; tests may force one (a forced ``tma`` runs wherever its descriptors can
    describe the operands, ``describable``, and is the direct kernel elsewhere, as a forced
    ``gemv`` is for an op without that kernel)."""
    forced = overrides().strategy
    if forced is not None:
        kind, _, factor = forced.partition(":")
        if (kind == "tma" and not describable) or (kind == "gemv" and not gemv):
            return DIRECT
        return Strategy(kind, int(factor or 1))
    sms = multiprocessors(device)
    if gemv and m == 1 and n >= GEMV_COLUMNS_PER_SM * sms:
        # a decode GEMV reads the weight once at its bandwidth, where a 16-row dot tile (and
        # a split of K to fill the GPU with them) took 1.7x as long (docs/performance.md,
        # 001a); it does not split K, so a narrow B (fewer column blocks than multiprocessors)
        # keeps the split tiles (not measured: the GEMV was timed at 4096 and 8192 columns)
        return GEMV
    tile = tile_strategy(m, device, describable)
    if mode == "off":
        return tile
    factor = split_k_factor(m, n, k, batch, sms, factors)
    if factor == 1:
        return tile
    # atomic adds sum in no fixed order: torch.use_deterministic_algorithms(True) gets the
    # two-stage reduction, which sums the splits' slices in order
    atomic = mode == "atomic" and not torch.are_deterministic_algorithms_enabled()
    return Strategy("atomic" if atomic else "two_stage", factor)


@dataclass(frozen=True)
class TmaLayout:
    """How the TMA kernel's descriptors read A and B: each as stored (K-major or not), batch
    elements a single stride apart."""

    a_k_major: bool
    b_k_major: bool
    a_batch: int     # elements from one batch element of A to the next (a 16-byte multiple)
    b_batch: int

    @property
    def flags(self) -> dict:
        return {"A_K_MAJOR": self.a_k_major, "B_K_MAJOR": self.b_k_major}


def tma_layout(space: Space, a: str, b: str, element_size: int) -> TmaLayout | None:
    """How TMA descriptors can describe A and B, or None when they cannot.

    A descriptor needs a unit stride in its last dim and every other stride a positive multiple of
    16 bytes: each operand must be stored row- or column-major, with aligned rows, and its batch
    elements (bmm, batched matmul) must lie one stride apart (its batch dims nest, none
    broadcast). With one batch element, any aligned stride serves: it is never stepped over.
    """
    majors, batch_strides = [], []
    for name, other_letter in ((a, "m"), (b, "n")):
        view = space.views[name]
        k_stride, other = view.k, getattr(view, other_letter)
        k_major = k_stride == 1
        # the stride of the dim that is not contiguous: rows of the stored matrix
        rows = other if k_major else k_stride
        if not (k_major or other == 1) or rows <= 0 or rows * element_size % TMA_ALIGN:
            return None
        if space.batch_count == 1:
            stored_rows = getattr(space, other_letter) if k_major else space.k
            batch = rows * max(stored_rows, 1)
        else:
            batch = flat_batch_stride(view.batch, space.batch)
            if batch is None or batch <= 0 or batch * element_size % TMA_ALIGN:
                return None
        majors.append(k_major)
        batch_strides.append(batch)
    return TmaLayout(majors[0], majors[1], batch_strides[0], batch_strides[1])


def flat_batch_stride(strides: Sequence[int], sizes: Sequence[int]) -> int | None:
    """The one stride between consecutive batch elements (numbered row-major over ``sizes``), or
    None when the batch dims do not nest; 0 when there is one batch element."""
    dims = [(stride, size) for stride, size in zip(strides, sizes) if size != 1]
    for (outer, _), (inner, inner_size) in zip(dims, dims[1:]):
        if outer != inner * inner_size:
            return None
    return dims[-1][0] if dims else 0


@functools.cache
def has_tma(device_index: int) -> bool:
    """Hopper (sm_90) and later copy tiles with the Tensor Memory Accelerator."""
    return torch.cuda.get_device_capability(device_index)[0] >= 9


def tma_aligned(*tensors: torch.Tensor) -> bool:
    """Whether every tensor starts on a 16-byte boundary, as a TMA descriptor's base must (a call's
    property, not its plan's: a slice of an aligned tensor may start anywhere)."""
    return all(start_address(t) % TMA_ALIGN == 0 for t in tensors)


# 1.0's bits: the GEMV's word form puts each element's integer into them (an argument, so that
# ptxas takes it from a register and the mask and the XOR are one instruction)
ONE_BITS = 0x3F800000
# where B must start for the word form: what a replay's signature and torch.compile's alignment
# assumption record (a B 4 bytes in would share a recording with one a byte in, which words
# would read misaligned)
WORDS_ALIGN = 16


def words_fit(op: OpLayout, dtype: torch.dtype, b_dtype: torch.dtype,
              b_strides: Sequence[int], k: int, group: int | None) -> bool:
    """Whether a layout lets the GEMV kernel read a quantized B as 32-bit words (its WORDS,
    where B's start is on WORDS_ALIGN bytes too: ``reads_words``): B's bytes contiguous along
    K, each row and batch element on a word, K and the group whole words, unsigned bytes (signed
    ones where a byte is one element), and 16-bit activations. The word form's elements are
    1 + q / 2**s in float32, whose sums hold q's share to about 2**-17 of x's: relative errors
    near 5e-6 for zero-mean activations and up to 3e-5 at K = 32768 for nonnegative ones (bytes:
    1e-7), under a 16-bit result's rounding (5e-4 and more), not under float32's, so float32 and
    float64 activations keep bytes."""
    elements = op.gemv_words
    # B's stride arguments: its batch strides where it has them, then K's and N's
    *batch, stride_k, stride_n = b_strides
    signed_ok = op.packed == 1 and b_dtype == torch.int8
    # bool(): traced with symbolic sizes, the tests become guards and WORDS a plain constexpr
    return bool(op.gemv and dtype in (torch.float16, torch.bfloat16)
                and (b_dtype == torch.uint8 or signed_ok)
                and stride_k == 1 and k % elements == 0
                and (group is None or group % elements == 0)
                and all(stride % 4 == 0 for stride in (stride_n, *batch)))


def reads_words(plan: LaunchPlan, b: torch.Tensor) -> bool:
    """Whether this call's GEMV reads B as words: its plan's layout lets it (``words_fit``) and
    B starts on WORDS_ALIGN bytes (a call's property, as ``tma_fits``'s)."""
    return plan.words and start_address(b) % WORDS_ALIGN == 0


def start_address(t: torch.Tensor) -> int:
    """Where a tensor starts, for alignment checks. Traced calls see fake tensors without
    addresses (their data_ptr() is deprecated, to become an error): their offset into a
    (256-byte aligned) allocation decides."""
    return t.data_ptr() if is_real(t) else t.storage_offset() * t.element_size()


def input_precision(dtype: torch.dtype, allow_tf32: bool | None = None) -> str:
    """tl.dot's input_precision, a string constexpr (never None: torch.compile re-emits constexpr
    arguments as source). float32 follows ``allow_tf32``, by default torch's matmul precision
    setting (tf32 or ieee; ieee under the interpreter; convolutions pass cuDNN's). 16-bit operands get "tf32", what Triton's default (None) means on
    NVIDIA and what every tuned Triton matmul compiles with: the setting only concerns float32."""
    if dtype == torch.float64:
        return "ieee"
    if dtype != torch.float32:
        return "tf32"
    if interpreting():
        return "ieee"
    if allow_tf32 is None:
        allow_tf32 = torch.backends.cuda.matmul.allow_tf32
    return "tf32" if allow_tf32 else "ieee"


def precision_setting() -> tuple[bool, bool]:
    """The global state matmul launches depend on (part of a replay's call signature): the
    float32 precision setting, and whether deterministic algorithms are asked for (no atomic
    split-K then)."""
    return torch.backends.cuda.matmul.allow_tf32, torch.are_deterministic_algorithms_enabled()


def even_k(k: int, block_ks: Sequence[int]) -> bool:
    """K is a multiple of every BLOCK_K that may run (powers of two: of the largest), so no tile
    of K is partial and the kernels leave out the masked step for a partial last block."""
    return k % max(block_ks) == 0


def _fitted_block(block: int, size) -> int:
    """``block``, or the power of two at or above ``size`` (at least MIN_DOT_BLOCK) where that is
    smaller. The size is compared with the block and the minimum before it is rounded: under
    torch.compile with dynamic shapes each comparison is a guard, and rounding a size that
    passes the block, or one at most the minimum, would have been one guard, and one graph, per
    power of two."""
    if size >= block:
        return block
    if size <= MIN_DOT_BLOCK:
        return MIN_DOT_BLOCK
    return next_power_of_2(size)


@functools.cache
def prune_for(min_block_k: int) -> Callable:
    """``early_config_prune`` of kernels whose dots need longer K blocks: int8 operands (32 a
    dot on NVIDIA GPUs), and a packed B's (a dot per place in a byte, MIN_DOT_BLOCK each)."""
    return functools.partial(prune_configs, min_block_k=min_block_k)


def prune_configs(configs, named_args, min_block_k: int = MIN_DOT_BLOCK, **kwargs):
    """``early_config_prune`` of the matmul kernels: fit the tiles to the problem and the device.

    Block sizes larger than the (power-of-two rounded) problem only add masked work, so they are
    clamped and the configs that become equal merged: a 16-row problem tunes over 16-row tiles.
    Configs whose pipelined tiles exceed the shared memory, or whose accumulator would spill
    (more than 128 float32 registers per thread), are dropped unless nothing else is left; so are
    small-M configs (under WGMMA_ROWS rows) on problems with WGMMA_ROWS rows or more.
    """
    m, n, k = named_args["M"], named_args["N"], named_args["K"]
    a = next(v for v in named_args.values() if hasattr(v, "element_size"))
    limit = shared_memory(a.device)
    # a quantized B's K blocks each lie in one group of scales
    group = kwargs.get("GROUP_K")
    key = None
    if all(type(size) is int for size in (m, n, k)):
        # (symbolic sizes are not looked up: each comparison would be a guard)
        key = (id(configs), next_power_of_2(m), next_power_of_2(n), next_power_of_2(k),
               a.element_size(), limit, min_block_k, group)
        kept = _kept_configs.get(key)
        if kept is not None:
            return list(kept[1])

    def adjust(meta: dict) -> None:
        if group is not None:
            meta["BLOCK_K"] = min(meta["BLOCK_K"], group)
        meta["BLOCK_K"] = max(meta["BLOCK_K"], min_block_k)

    fitted = fit_tiles(configs, {"BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": k}, adjust)
    rows = min(WGMMA_ROWS, next_power_of_2(m))
    fitting = [c for c in fitted if tile_fits(c, a.element_size(), limit)]
    result = [c for c in fitting if c.kwargs["BLOCK_M"] >= rows] or fitting or fitted[:1]
    if key is not None:
        # the configs themselves kept too, so that their id is not another list's meanwhile
        _kept_configs[key] = (configs, tuple(result))
    return result


# (the configs' id, M, N and K rounded up to powers of two, the element size, the shared
# memory, the least BLOCK_K, the group) -> (the configs, those prune_configs keeps): it reads
# each size only through its power of two (blocks are powers of two: a size is at least one
# exactly when its power of two is), so the first call at a new size of a seen power of two
# skips the fitting (about 50 us on a CPU for a space of 10)
_kept_configs: dict[tuple, tuple[list, tuple]] = {}


def prune_gemv(configs, named_args, **kwargs):
    """``early_config_prune`` of the GEMV kernel: its blocks fitted to N and K, each K block
    whole groups of a quantized B's scales (GROUP_K) at least."""
    group = kwargs.get("GROUP_K")

    def adjust(meta: dict) -> None:
        if group is not None:
            meta["BLOCK_K"] = max(meta["BLOCK_K"], group)

    return fit_tiles(configs, {"BLOCK_N": named_args["N"], "BLOCK_K": named_args["K"]}, adjust)


def fit_tiles(configs, sizes: Mapping[str, int],
              adjust: Callable[[dict], None] | None = None) -> list[triton.Config]:
    """``configs`` with each block clamped to its problem size (``sizes``: block key -> size;
    ``_fitted_block``), then ``adjust``ed, the configs that became equal merged (the matmul and
    convolution families' pruning)."""
    fitted, seen = [], set()
    for config in configs:
        meta = dict(config.kwargs)
        for key, size in sizes.items():
            meta[key] = _fitted_block(meta[key], size)
        if adjust is not None:
            adjust(meta)
        point = (tuple(sorted(meta.items())), config.num_warps, config.num_stages)
        if point in seen:
            continue
        seen.add(point)
        fitted.append(triton.Config(meta, num_warps=config.num_warps,
                                    num_stages=config.num_stages))
    return fitted


def tile_fits(config: triton.Config, element_size: int, shared_limit: int) -> bool:
    """Whether a config's pipelined A and B tiles fit the shared memory and its accumulator the
    registers (``accumulator_fits``)."""
    meta = config.kwargs
    smem = (meta["BLOCK_M"] + meta["BLOCK_N"]) * meta["BLOCK_K"] * element_size * config.num_stages
    return smem <= shared_limit and accumulator_fits(config, element_size)


def accumulator_fits(config: triton.Config, element_size: int) -> bool:
    """Whether a config's BLOCK_M x BLOCK_N accumulator takes at most 128 registers a thread (a
    float64 one, of float64 operands, two a value)."""
    meta = config.kwargs
    words = 2 if element_size == 8 else 1
    return meta["BLOCK_M"] * meta["BLOCK_N"] * words // (32 * config.num_warps) <= 128


def workspace(strategy: Strategy, batch: int, m: int, n: int, device: torch.device,
              integer: bool = False, float64: bool = False) -> torch.Tensor:
    """Float32 partial sums of a split-K launch (int32 ones of an int8 product, exact; float64
    ones of float64 operands): one slice per split (two_stage), or one slice that every split
    adds into atomically (zeroed)."""
    dtype = torch.int32 if integer else torch.float64 if float64 else torch.float32
    if strategy.kind == "atomic":
        return zeros((batch, 1, m, n), dtype, device)
    return empty((batch, strategy.factor, m, n), dtype, device)


# --- launch plans: every decision a call's tensor metadata fixes, made once -----------------------


@dataclass(frozen=True, eq=False)
class OpLayout:
    """What a generated module tells ``launch_plan`` about its op and its kernels' arguments.

    Compared by identity: each generated module has one, and it keys the plan cache.
    """

    name: str
    dtypes: tuple[torch.dtype, ...]
    indexing: str
    dims: tuple[tuple[str, tuple[str, ...]], ...]   # the inputs in call order, with their dims
    outputs: tuple[str, ...]
    out_dtype: torch.dtype | None                   # None: the inputs' dtype
    promoted: tuple[str, ...]                       # epilogue operands of their own dtype
    a: str
    b: str
    epilogue: tuple[tuple[str, str, bool], ...]     # (name, letters, has batch strides), then outputs
    batched_ab: tuple[bool, bool]
    rank: int
    swizzle: str
    split_k: str
    split_factors: tuple[int, ...]
    block_ks: tuple[int, ...]
    own_dtypes: tuple[tuple[str, tuple[torch.dtype, ...]], ...] = ()   # not the op's dtypes
    integer_product: bool = False       # int8 A and B: an int32 accumulator and workspace
    min_block_k: int = MIN_DOT_BLOCK    # the least BLOCK_K its dots take (prune_for)
    out_dtype_arg: str | None = None    # the dtype argument that sets the output dtype
    # a quantized B ([dequant]; no TMA kernel)
    quantized: bool = False
    dequant_mode: str = ""              # channel | block | tile (families/matmul.py)
    packed: int = 1                     # elements a stored byte holds along K
    loop_inputs: tuple[str, ...] = ()   # the operands the K loop reads besides A and B
    group: str | None = None            # the group-size argument
    grouped: tuple[str, ...] = ()       # the operands indexed by its groups (dims N, G)
    gemv: bool = False                  # the module has the GEMV kernel (M = 1)
    gemv_words: int = 0                 # elements a 32-bit word of B holds (the GEMV's WORDS)
    gemv_sign_bits: int = 0             # their sign bits there, for signed bytes


def check_group(op: str, name: str, value: object, least: int) -> int:
    """The group-size argument of a quantized matmul (``is_group_size``), or ValueError."""
    if not is_group_size(value, least):
        raise ValueError(f"{op}: argument '{name}' must be a power of two of at least "
                         f"{least} (K elements per group of scales), got {value!r}")
    return value


@dataclass(frozen=True)
class LaunchPlan:
    """What a launch needs besides data pointers, decided from shapes, strides and dtypes."""

    shape: tuple[int, ...]          # the result's
    dtype: torch.dtype              # the result's
    empty: bool                     # nothing to compute
    strategy: Strategy
    index_64: bool
    layout: str
    precision: str
    even_k: bool
    m: int
    n: int
    k: int
    batch: int                      # batch elements the grid covers
    batch_shape: tuple[int, ...]    # the batch dims the kernels walk, after folding
    sizes: tuple[int, ...]          # kernel size arguments: M, N, K (, batch, inner batch sizes)
    ab_strides: tuple[int, ...]     # A's then B's stride arguments
    epilogue_strides: tuple[int, ...]  # the epilogue operands' then the outputs'
    swizzle2d: bool                 # column blocks on grid axis 1 (batch then on axis 2)
    batched: bool                   # batch elements on a grid axis
    # how the TMA kernel's descriptors read A and B, when they can
    tma: TmaLayout | None = None
    programs: int = 1               # the TMA kernel's grid cap: one program per multiprocessor
    # strategies to time against each other on the first eager call (auto split-K on a GPU)
    candidates: tuple[Strategy, ...] = ()
    group_strides: tuple[int, ...] = ()     # a quantized B's per-group operands' (N, G)
    # the GEMV kernel's word form: whether the layout lets it read B as words (``words_fit``),
    # and its one_bits argument (1.0's bits, with the elements' sign bits for signed bytes)
    words: bool = False
    one_bits: int = ONE_BITS

    @property
    def details(self) -> dict:
        """What ``note_launch`` records besides the strategy."""
        return dict(layout=self.layout, m=self.m, n=self.n, k=self.k, batch=self.batch_shape,
                    precision=self.precision)

    def grid(self, meta: Mapping) -> tuple[int, ...]:
        """The grid of the direct and split kernels (split: SPLIT_K programs per tile)."""
        batch = (min(self.batch, 65535),) if self.batched else ()
        rows = cdiv(self.m, meta["BLOCK_M"])
        cols = cdiv(self.n, meta["BLOCK_N"])
        splits = meta.get("SPLIT_K", 1)
        if self.swizzle2d:
            # column blocks past 65535 are looped over in the kernel
            return (rows * splits, min(cols, 65535)) + batch
        return (rows * cols * splits,) + batch

    def gemv_grid(self, meta: Mapping) -> tuple[int, ...]:
        """The GEMV kernel's grid: column blocks, then rows (each program loops over the rows
        past 65535), then batch elements."""
        batch = (min(self.batch, 65535),) if self.batched else ()
        return (cdiv(self.n, meta["BLOCK_N"]), min(self.m, 65535)) + batch

    def tma_grid(self, meta: Mapping) -> tuple[int]:
        """The persistent grid of the TMA kernel: its programs walk the output tiles (of every
        batch element)."""
        tiles = cdiv(self.m, meta["BLOCK_M"]) * cdiv(self.n, meta["BLOCK_N"])
        return (min(tiles * self.batch, self.programs),)

    def tma_fits(self, a: torch.Tensor, b: torch.Tensor) -> bool:
        """Whether this call's A and B can go through TMA: the plan's layouts allow it and both
        start on 16-byte boundaries (a call's property, not its plan's)."""
        return self.tma is not None and tma_aligned(a, b)

    @property
    def fused_sum(self) -> bool:
        """Whether the split kernel's last program of a tile sums the slots and applies the
        epilogue (FUSED_SUM_ROWS), else the reduce kernel."""
        return self.m <= FUSED_SUM_ROWS

    def reduce_grid(self, meta: Mapping) -> tuple[int, ...]:
        """The grid of the split-K reduction kernel: one program per output tile."""
        tiles = cdiv(self.m, meta["BLOCK_M"]) * cdiv(self.n, meta["BLOCK_N"])
        return (tiles,) + ((min(self.batch, 65535),) if self.batched else ())

    @property
    def tiles_at_most(self) -> int:
        """Output tiles of every batch element at the smallest tile a config can have: the
        split kernel's ticket counters (one a tile)."""
        return self.batch * cdiv(self.m, MIN_DOT_BLOCK) * cdiv(self.n, MIN_DOT_BLOCK)


def launch_plan(op: OpLayout, *tensors: torch.Tensor | None, group: int | None = None
                ) -> LaunchPlan:
    """Checks the arguments (``tensors`` as in ``op.dims``; ``group``, a quantized B's group
    size) and returns their launch plan.

    Plans are cached on sizes, strides and dtypes (and torch's TF32 setting and the test suite's
    overrides): a call on tensors of a seen layout costs one lookup, which matters because a
    decode-sized matmul runs in about 10 us, less than the Python that decides it.
    """
    named = {name: t for (name, _), t in zip(op.dims, tensors) if t is not None}
    own = dict(op.own_dtypes)
    for name, dtypes in own.items():
        if name in named:
            check_tensors(op.name, {name: named[name]}, dtypes)
    shared = {name: t for name, t in named.items() if name not in own}
    if shared:
        check_tensors(op.name, shared, op.dtypes)
    # (every dtype checked above: this checks the devices)
    device = check_tensors(op.name, named, tuple({t.dtype for t in named.values()}))
    check_interpreted_dot(op.name, named[op.a].dtype, device)
    forced = overrides()
    key = (op, device, torch.backends.cuda.matmul.allow_tf32,
           torch.are_deterministic_algorithms_enabled(), forced, group,
           *(None if t is None else (tuple(t.shape), tuple(t.stride()), t.dtype) for t in tensors))
    try:
        return _cached_plan(key)
    except TypeError:  # symbolic sizes (torch.compile, dynamic shapes) or a mapping config
        return _plan(op, tensors, device, group)


def _plan_of_key(key: tuple) -> LaunchPlan:
    op, device, _tf32, _deterministic, _forced, group, *metas = key
    # the plan reads metadata only: meta tensors stand in for the arguments
    tensors = [None if meta is None else torch.empty_strided(*meta[:2], dtype=meta[2], device="meta")
               for meta in metas]
    return _plan(op, tensors, device, group)


def _plan(op: OpLayout, tensors: Sequence[torch.Tensor | None], device: torch.device,
          group: int | None = None) -> LaunchPlan:
    """Every launch decision the arguments' metadata fixes."""
    named = dict(zip((name for name, _ in op.dims), tensors))
    dims = dict(op.dims)
    present = {name: t for name, t in named.items() if t is not None}
    own = dict(op.own_dtypes)
    shared = {n: t for n, t in present.items() if n not in op.promoted and n not in own}
    if shared:
        check_same_dtype(op.name, shared)
    # the dtype tl.dot multiplies in (a quantized B is converted to it)
    dtype = present[op.a].dtype
    prob = problem(op.name, named, dims, op.packed,
                   (op.group, group, op.min_block_k) if op.group else None)
    # outputs are allocated contiguous, as torch allocates matmul results (their strides
    # computed, not read off a meta tensor: allocating one took a few us)
    out_strides = contiguous_strides(prob.shape)
    space = prob.space(op.name, {name: out_strides for name in op.outputs}, op.rank)
    batch = space.batch_count
    forced = overrides()
    # a quantized B is unpacked in registers after a plain load, never through a descriptor;
    # float64 has no wgmma form: its dots are the pointer kernel's mma.sync (m8n8k4 f64)
    tma = None if op.quantized or dtype == torch.float64 else \
        tma_layout(space, op.a, op.b, dtype.itemsize)
    strategy_ = strategy(op.split_k, space.m, space.n, space.k, batch, device, op.split_factors,
                         tma is not None, op.gemv)
    spans = {name: storage_span(t) for name, t in present.items()}
    spans.update({name: span(prob.shape, out_strides) for name in op.outputs})
    if strategy_.split:
        slices = 1 if strategy_.kind == "atomic" else strategy_.factor
        workspace_shape = (batch, slices, space.m, space.n)
        spans["workspace"] = span(workspace_shape, contiguous_strides(workspace_shape))
    # only lanes inside M, N and K are dereferenced; masked lanes may form any offset
    index_64 = choose_int64(op.name, op.indexing, spans, 0)
    layout = space.layout(op.a, op.b, list(op.outputs))
    precision = input_precision(dtype)
    # a forced mapping config brings its own BLOCK_K; a forced config number picks from the space
    block_ks = [forced.config["BLOCK_K"]] if isinstance(forced.config, Mapping) else op.block_ks
    # as prune_configs fits them: at least the dots' least K, within one group
    block_ks = [max(block, op.min_block_k) for block in block_ks]
    if group is not None:
        block_ks = [min(block, group) for block in block_ks]
    sizes = (space.m, space.n, space.k) + ((batch, *space.batch[1:]) if op.rank else ())
    b_strides = space.strides(op.b, "kn", op.batched_ab[1])
    ab = space.strides(op.a, "mk", op.batched_ab[0]) + b_strides
    b_dtype = present[op.b].dtype
    group_strides = sum((space.strides(name, "ng", False) for name in op.grouped), ())
    epilogue: list[int] = []
    for name, letters, batched in op.epilogue:
        if name in space.views:
            epilogue += space.strides(name, letters, batched)
        else:   # an omitted optional operand
            epilogue += [0] * ((op.rank if batched else 0) + len(letters))
    timed = (strategy_.split and forced == Overrides() and device.type == "cuda"
             and not interpreting())
    return LaunchPlan(
        shape=prob.shape, dtype=_result_dtype(op, dtype, prob.shape, present),
        empty=space.m == 0 or space.n == 0 or batch == 0, strategy=strategy_,
        index_64=index_64, layout=layout, precision=precision,
        even_k=even_k(space.k, block_ks), m=space.m, n=space.n, k=space.k, batch=batch,
        batch_shape=space.batch, sizes=sizes, ab_strides=ab, group_strides=group_strides,
        epilogue_strides=tuple(epilogue),
        swizzle2d=op.swizzle == "swizzle2d", batched=op.rank > 0,
        tma=tma, programs=max_programs(device, "persistent", per_sm=1),
        candidates=(tile_strategy(space.m, device, tma is not None), strategy_) if timed else (),
        words=words_fit(op, dtype, b_dtype, b_strides, space.k, group),
        one_bits=ONE_BITS | (op.gemv_sign_bits if b_dtype == torch.int8 else 0))


def _result_dtype(op: OpLayout, dtype: torch.dtype, shape: tuple[int, ...],
                  present: Mapping[str, torch.Tensor]) -> torch.dtype:
    """The spec's output dtype, or the operands' ``dtype`` promoted with the promoted operands'
    as torch's element-wise ops promote ``F.linear(...) + residual``."""
    promoted = [present[name] for name in op.promoted if name in present]
    if op.out_dtype is not None or not promoted:
        return op.out_dtype or dtype
    # the matmul's result (its rank matters: a 0-dim operand does not promote a matrix)
    return result_dtype([torch.empty(shape, dtype=dtype, device="meta"), *promoted])


_cached_plan = functools.lru_cache(maxsize=4096)(_plan_of_key)
# (plan, dtype) -> the strategy that timed fastest on the first eager call
_settled: dict[tuple, Strategy] = {}


def settle(plan: LaunchPlan, tensors: Sequence[torch.Tensor | None], tma_fits: bool,
           run: Callable[[Strategy], None]) -> Strategy:
    """The strategy to launch. When split-K is a candidate (few output tiles, long K), the first
    eager call times it against the tile kernel, each autotuned, end to end (launch overhead
    included: a decode-sized matmul takes about as long as starting it), and keeps the faster,
    where autotuning is asked for (runtime/tuned.py); otherwise, and in traced calls, which cannot
    time, a call takes the choice made so far, else the heuristic's (the split). A call whose
    operands TMA cannot take (``tma_fits`` false: LaunchPlan.tma_fits) runs the direct kernel."""
    def usable(s: Strategy) -> Strategy:
        return DIRECT if s == TMA and not tma_fits else s
    if not plan.candidates:
        return usable(plan.strategy)
    key = (plan, next(t.dtype for t in tensors if t is not None), tma_fits)
    chosen = _settled.get(key)
    if chosen is None:
        if not untraced(tensors) or not tuned.autotuning():
            return usable(plan.strategy)
        note_tuning()
        times = {s: triton.testing.do_bench(lambda s=s: run(s), return_mode="median")
                 for s in map(usable, plan.candidates)}
        chosen = _settled[key] = min(times, key=times.get)
    return chosen


class Matmul(FamilyRuntime):
    """Matmuls with fused epilogues; the description's ``launch`` is the op's ``OpLayout``.
    Kernels: ``tile`` and ``tma`` (a tile of the output a program, the second reading A and B by
    TMA), ``split`` (split-K partial sums, which the last program of each tile sums before the
    epilogue up to FUSED_SUM_ROWS rows) and ``reduce`` (their sum and epilogue past it). The
    tile kernels take A, B, the epilogue inputs, the outputs, the plan's sizes and strides, the
    op's scalars, then its choices and a ``HAS_<NAME>`` flag for each optional input; the split
    kernel the same, with its workspace and ticket counters after the outputs."""

    doc_note = "computed by one fused kernel (two for a split-K launch of more than 16 rows)."

    def replay_state(self) -> Callable[[], object]:
        # float32 launches follow torch's matmul precision setting: a replay checks it is unchanged
        return precision_setting

    def run(self, op: Op, args: tuple) -> torch.Tensor | tuple[torch.Tensor, ...]:
        d = op.description
        layout: OpLayout = d.launch
        values = dict(zip((a.name for a in d.args), args))
        # in the layout's order (A, B, then the epilogue's), which may not be the signature's
        tensors = [values[name] for name, _ in layout.dims]
        group = None
        if layout.group is not None:
            group = check_group(op.name, layout.group, values[layout.group], layout.min_block_k)
        plan = launch_plan(layout, *tensors, group=group)
        # an output dtype argument (int8_linear's out_dtype; None: the plan's), else the plan's
        dtype = plan.dtype
        if layout.out_dtype_arg is not None and values[layout.out_dtype_arg] is not None:
            dtype = values[layout.out_dtype_arg]
        outs = tuple(empty(plan.shape, dtype, tensors[0].device) for _ in d.outputs)
        if not plan.empty:
            _launch(op, plan, args, outs, group)
        return outs[0] if len(outs) == 1 else outs


RUNTIME = Matmul()


def _launch(op: Op, plan: LaunchPlan, args: tuple, outs: tuple, group: int | None) -> None:
    d = op.description
    layout: OpLayout = d.launch
    named = {a.name: v for a, v in zip(d.args, args) if a.kind == "tensor"}
    a, b = named[layout.a], named[layout.b]
    strategy = settle(plan, tuple(named.values()), plan.tma_fits(a, b),
                      lambda strategy: _run(op, strategy, plan, args, named, outs, group))
    note_launch(op.name, strategy.kind, plan.index_64, split_k=strategy.factor, **plan.details)
    _run(op, strategy, plan, args, named, outs, group)


def _run(op: Op, strategy: Strategy, plan: LaunchPlan, args: tuple,
         named: Mapping[str, torch.Tensor | None], outs: tuple, group: int | None) -> None:
    d = op.description
    layout: OpLayout = d.launch
    kernels = op.kernels
    a, b = named[layout.a], named[layout.b]
    epilogue = [named[name] for name, _, _ in layout.epilogue if name not in layout.outputs]
    grouped = [named[name] for name in layout.grouped]
    # the group size is the GROUP_K constexpr, not a kernel scalar
    scalars = [args[i] for i in d.scalar_positions if d.args[i].name != layout.group]
    flags = d.choices_of(args)
    # an omitted optional input: its kernel flag (the family planner's Operand.flag) is off
    flags.update({f"HAS_{arg.name.upper()}": v is not None for arg, v in zip(d.args, args)
                  if arg.kind == "tensor" and arg.optional})
    common = {"LAYOUT": plan.layout, "INDEX_64": plan.index_64, "INPUT_PRECISION": plan.precision,
              "EVEN_K": plan.even_k}
    if group is not None:
        common["GROUP_K"] = group
    if layout.dequant_mode == "block":
        common["PER_TILE"] = plan.m >= WGMMA_ROWS
    # autotuning depends on the plan (sizes, layout) and the operands' dtype
    tune_key = (plan, a.dtype)
    if not strategy.split:
        # the tile kernels take the same arguments; TMA's adds how its descriptors read A and B
        tile_args = (a, b, *grouped, *epilogue, *outs, *plan.sizes, *plan.ab_strides,
                     *plan.group_strides, *plan.epilogue_strides, *scalars)
        if strategy.kind == "gemv":
            launch(kernels["gemv"], plan.gemv_grid, *tile_args, **flags, **common,
                   WORDS=reads_words(plan, b), one_bits=plan.one_bits, tune_key=tune_key)
        elif strategy.kind == "tma":
            batch = ({f"{layout.a}_stride_batch": plan.tma.a_batch,
                      f"{layout.b}_stride_batch": plan.tma.b_batch} if layout.rank else {})
            launch(kernels["tma"], plan.tma_grid, *tile_args, **flags, **common, **batch,
                   **plan.tma.flags, tune_key=tune_key)
        else:
            launch(kernels["tile"], plan.grid, *tile_args, **flags, **common, tune_key=tune_key)
        return
    # partial sums in the math's type: one slot per split (two-stage), or one zeroed slot
    # (atomic); the tile's last program sums them and applies the epilogue (the tickets say
    # which), or the reduce kernel does: that split kernel reads no tickets, and the workspace
    # stands in for them (no counters looked up, none allocated in a traced call)
    space = workspace(strategy, plan.batch, plan.m, plan.n, a.device, layout.integer_product,
                      a.dtype == torch.float64)
    tickets = launch_counters(a, plan.tiles_at_most) if plan.fused_sum else space
    launch(kernels["split"], plan.grid, a, b, *grouped, *epilogue, *outs, space, tickets,
           *plan.sizes, *plan.ab_strides, *plan.group_strides, *plan.epilogue_strides, *scalars,
           **flags, **common, SPLIT_K=strategy.factor, ATOMIC=strategy.kind == "atomic",
           FUSED=plan.fused_sum, tune_key=tune_key)
    if not plan.fused_sum:
        launch(kernels["reduce"], plan.reduce_grid, space, *epilogue, *outs, *plan.sizes[:2],
               *plan.sizes[3:], *plan.epilogue_strides, *scalars, **flags,
               INDEX_64=plan.index_64, SLOTS=space.shape[1], tune_key=tune_key)

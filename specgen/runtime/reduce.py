"""Axis reductions at launch: torch's dim rules, the (kept, reduced) split of a tensor, strategies.

A reduction sees its input as two collapsed index spaces: the kept dims (one output element each)
and the reduced dims (summed into it). Each is collapsed on its own, so any strides work without a
copy; the kernel decomposes a kept index and a reduced index into offsets. Everything here reads
sizes and strides only, so it also runs on the fake tensors torch.compile traces with.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass
from typing import Sequence

import torch

from specgen.runtime.checks import as_int, check_tensors
from specgen.runtime.context import note_launch, overrides
from specgen.runtime.dtypes import compute_dtype, torch_result
from specgen.runtime.launch import choose_int64, grid_size, launch, max_programs, plan_cache
from specgen.runtime.layout import Shape, cdiv, merge_dims, next_power_of_2, span
from specgen.runtime.op import FamilyRuntime, Op
from specgen.runtime.counters import launch_counters
from specgen.runtime.replay import empty, zeros

# dims each collapsed space may keep after merging; the kernel decomposes at most this many
# (reduce_lib.strided_offsets takes four sizes and strides)
MAX_DIMS = 4
STRATEGIES = ("inner", "outer", "split", "atomic", "last")
# what a program does with its tile's result (the kernel's STAGE)
FINAL = 0      # finish it and store it to out
PARTIAL = 1    # store it to row `split` of the partials (in the kernel's COMPUTE type)
ATOMIC = 2     # add it to the partials with an atomic (sum-like reductions)
LAST = 3       # PARTIAL, then the last program of the output tile combines the partials into out
# reductions whose partials carry an index too: they split in two launches
INDEX_COMBINES = ("argmax", "argmin")
# a split's length is a multiple of this many elements: where the reduced dim is the contiguous
# one, every split then starts 16-element aligned, and the kernel's split_size argument is
# specialized as divisible by 16, so loads vectorize (an odd split_size makes them scalar)
SPLIT_ALIGN = 16
# a split never hands a program fewer reduced elements than this
MIN_SPLIT_CHUNK = 64
# auto splits when the output tiles fill less than this share of a persistent grid
SPLIT_BELOW = 0.5


def every_dim(dim) -> bool:
    """Whether ``dim`` names every dim as None and () do (torch's errors tell them from a list of
    all the dims)."""
    return dim is None or (isinstance(dim, (tuple, list)) and len(dim) == 0)


def normalize_dims(op: str, dim, ndim: int, single: bool = False) -> tuple[int, ...]:
    """torch's rules: None or () reduce every dim, negatives wrap, a 0-dim tensor takes 0 and -1;
    numpy ints and one-element integer tensors are ints (not for a ``single`` dim: torch's argmax
    refuses a tensor), a symbolic dim is specialized."""
    if dim is None:
        return tuple(range(ndim))
    one = as_int(dim, tensors=not single, listed=not single)
    if single and one is None:
        raise TypeError(f"{op}: argument 'dim' must be an int or None, got {dim!r}")
    listed = list(dim) if one is None and isinstance(dim, (tuple, list)) else [dim]
    dims = [as_int(d, listed=True) for d in listed]
    if any(d is None for d in dims):
        raise TypeError(f"{op}: argument 'dim' must be an int, a tuple of ints or None, got {dim!r}")
    # operator.index specializes a symbolic dim, under dynamo too (int() keeps it symbolic there)
    dims = [operator.index(d) for d in dims]
    if len(dims) == 0:
        return tuple(range(ndim))
    bound = max(ndim, 1)
    wrapped = []
    for d in dims:
        if not -bound <= d < bound:
            # IndexError and RuntimeError below: the types torch raises
            raise IndexError(f"{op}: argument 'dim' is {d}, out of range for a tensor of "
                             f"{ndim} dims (expected in [{-bound}, {bound - 1}])")
        wrapped.append(d % bound)
    if len(set(wrapped)) != len(wrapped):
        raise RuntimeError(f"{op}: argument 'dim' names a dim twice: {dim!r}")
    return tuple(sorted(d for d in wrapped if d < ndim))


def output_shape(shape: Sequence[int], dims: Sequence[int], keepdim: bool) -> tuple[int, ...]:
    if keepdim:
        return tuple(1 if d in dims else size for d, size in enumerate(shape))
    return tuple(size for d, size in enumerate(shape) if d not in dims)


@dataclass(frozen=True)
class Space:
    """One collapsed index space, slowest dim first, with a stride tuple per tensor walking it."""

    sizes: tuple[int, ...]
    strides: tuple[tuple[int, ...], ...]

    @property
    def numel(self) -> int:
        return math.prod(self.sizes)

    def padded(self) -> "Space":
        """Exactly MAX_DIMS dims (at most that many: ``_plan`` checks): size-1 dims in front,
        which the kernel never decomposes."""
        pad = MAX_DIMS - len(self.sizes)
        return Space((1,) * pad + self.sizes, tuple((0,) * pad + s for s in self.strides))


def collapse_space(sizes: Sequence[int], strides: Sequence[Sequence[int]],
                   logical: bool) -> Space:
    """Drops size-1 dims and merges neighbours that are contiguous in every tensor.

    ``logical`` keeps the dims in their logical order (argmax/argmin return a flat index in that
    order); otherwise the dims are first sorted by the first tensor's strides, fastest last, so that
    dims a permutation separated can merge and the fastest dim is the one read contiguously.
    """
    dims = [d for d, size in enumerate(sizes) if size != 1]
    if not logical:
        dims.sort(key=lambda d: [-abs(s[d]) for s in strides])
    merged = merge_dims(tuple(sizes), strides, list(reversed(dims)))  # fastest first
    return Space(merged.sizes, merged.strides)


@dataclass(frozen=True)
class Problem:
    """A reduction after collapsing: kept space (x and out strides), reduced space (x strides)."""

    kept: Space
    reduced: Space

    @property
    def inner(self) -> bool:
        """The reduced dims are the faster ones in memory: rows are reduced along their length."""
        if not self.reduced.sizes:
            return False
        if not self.kept.sizes:
            return True
        return abs(self.reduced.strides[0][-1]) <= abs(self.kept.strides[0][-1])


def problem(x: torch.Tensor, out: torch.Tensor, dims: Sequence[int], keepdim: bool,
            logical: bool) -> Problem:
    return problem_of(tuple(x.shape), tuple(x.stride()), tuple(out.stride()), dims, keepdim,
                      logical)


def problem_of(shape: Shape, strides: Shape, out_strides: Shape, dims: Sequence[int],
               keepdim: bool, logical: bool) -> Problem:
    """``problem`` from x's sizes and strides and out's strides."""
    ndim = len(shape)
    kept_dims = [d for d in range(ndim) if d not in dims]
    if not keepdim:  # out has only the kept dims: spread its strides back over x's dims
        spread = dict(zip(kept_dims, out_strides))
        out_strides = tuple(spread.get(d, 0) for d in range(ndim))
    kept = collapse_space([shape[d] for d in kept_dims],
                          [[strides[d] for d in kept_dims], [out_strides[d] for d in kept_dims]],
                          logical=False)
    reduced = collapse_space([shape[d] for d in dims], [[strides[d] for d in dims]], logical)
    return Problem(kept, reduced)


@dataclass(frozen=True)
class Strategy:
    name: str       # inner | outer | split | atomic | last
    tiles: str      # which config list tiles the kernel: "inner" (long rows) or "outer" (wide)
    splits: int     # programs sharing one output tile's reduced range (1: no second level)
    split_size: int  # reduced elements per split


def choose(op: str, prob: Problem, device: torch.device, launch: str, combine: str,
           split_block_k: dict[str, int]) -> Strategy:
    """The strategy for a reduction: forced by ``override(strategy=...)`` or picked from sizes.

    One-level strategies give each output tile one program that loops over the whole reduced range
    (``inner``: tiles read along the reduced dim; ``outer``: tiles read along the kept dim, looping
    over the reduced one). When the output tiles cannot fill the machine (a full reduction, a few
    long columns), ``split`` cuts the reduced range among programs that write partials a
    second kernel combines (deterministic), and ``atomic`` adds them into a zeroed buffer instead
    (sum-like reductions only). ``last`` is the split in one launch: the last program to finish a
    slice of an output tile (an atomic ticket per tile) combines its partials. The index
    reductions' partials carry indices, which it does not combine: their splits run in two
    launches.
    """
    forced = overrides().strategy
    if forced is not None and forced not in STRATEGIES:
        raise ValueError(f"{op}: unknown strategy {forced!r}; expected one of {STRATEGIES}")
    if forced == "atomic" and combine != "sum":
        raise ValueError(f"{op}: strategy 'atomic' needs a sum reduction, this one is '{combine}'")
    tiles = "inner" if prob.inner else "outer"
    if forced in ("inner", "outer"):
        return Strategy(forced, forced, 1, max(prob.reduced.numel, 1))
    num_red = prob.reduced.numel
    target = max_programs(device, "persistent")
    # output tiles of the narrowest config, whose splits fill the machine with ``target``
    # programs; wider tiles run fewer, longer programs, which tuning weighs. (Planning for the
    # widest tile instead made 8x as many programs of the narrow tiles the tuner picks: H200,
    # sum(x, 0) of 32768x1024 bf16 in 36.5 us, against 27.1 us with 4 programs per SM;
    # tools/perf/sweep_reduce.py --part wide)
    kept_tiles = math.ceil(prob.kept.numel / split_block_k[tiles])
    splits = target // max(kept_tiles, 1)
    if forced is None:
        if splits < 2 or kept_tiles >= SPLIT_BELOW * target or num_red < 2 * MIN_SPLIT_CHUNK:
            return Strategy(tiles, tiles, 1, max(num_red, 1))
        # deterministic like split, without its second launch: as fast as atomics plus a cast
        forced = "last"
    if forced == "last" and combine in INDEX_COMBINES:
        forced = "split"
    # a forced split splits even a small input (the test suite reaches the second level that way)
    splits = max(1, min(max(splits, 2), math.ceil(num_red / MIN_SPLIT_CHUNK)))
    split_size = max(SPLIT_ALIGN * math.ceil(num_red / (splits * SPLIT_ALIGN)), 1)
    return Strategy(forced, tiles, math.ceil(num_red / split_size) if num_red else 1, split_size)


def check_nonempty(op: str, name: str, x: torch.Tensor, dims: Sequence[int], dim,
                   index: bool) -> None:
    """max, min and the arg reductions have no identity to return for an empty reduction; the
    error types are torch's (a reduction of every dim of an empty tensor: IndexError for the arg
    reductions, RuntimeError for amax and amin)."""
    if every_dim(dim) and x.numel() == 0:
        raise (IndexError if index else RuntimeError)(
            f"{op}: argument '{name}' is empty; give a dim to reduce (this reduction has no "
            f"identity)")
    for d in dims:
        if x.shape[d] == 0:
            raise IndexError(f"{op}: argument '{name}' has size 0 in reduced dim {d}; this "
                             f"reduction has no identity")


def kept_args(kept: Space) -> list[int]:
    """Kernel arguments of the kept space: sizes of dims 1-3, x strides, out strides (4 dims each)."""
    kept = kept.padded()
    return [*kept.sizes[1:], *kept.strides[0], *kept.strides[1]]


def reduced_args(reduced: Space) -> list[int]:
    """Kernel arguments of the reduced space: sizes of dims 1-3, x strides (4 dims)."""
    reduced = reduced.padded()
    return [*reduced.sizes[1:], *reduced.strides[0]]


def dims_of(space: Space) -> int:
    """How many dims the kernel decomposes (at least one, of size 1 when the space is empty)."""
    return max(1, len(space.sizes))


def partials_problem(prob: Problem, splits: int) -> Problem:
    """The second level of a split: a dense (splits, kept) buffer reduced over splits."""
    sizes = prob.kept.sizes
    dense = [math.prod(sizes[i + 1:]) for i in range(len(sizes))]
    kept = Space(sizes, (tuple(dense), prob.kept.strides[1]))
    return Problem(kept, Space((splits,), ((max(prob.kept.numel, 1),),)))


@dataclass(frozen=True)
class Level:
    """One launch of the reduce kernel: its scalar arguments, constexprs and grid."""

    tiles: str                # which config list tiles it: "inner" or "outer"
    args: tuple[int, ...]   # num_kept ... count, then the kept and reduced space arguments
    kept_dims: int
    red_dims: int
    stage: int
    level: int                # 1: reads x; 2: reads the partials of a split launch
    num_kept: int
    splits: int
    cap: int

    def grid(self, meta: dict) -> tuple[int]:
        return (grid_size(cdiv(self.num_kept, meta["BLOCK_K"]) * self.splits, self.cap),)


@dataclass(frozen=True)
class ReduceLaunch:
    """Everything a reduction's launches need beyond the tensors, cached on sizes and strides."""

    strategy: Strategy
    index_64: bool
    part_rows: int            # rows of the partials buffer (0: none)
    num_kept: int
    first: Level
    second: Level | None      # the combine of the partials (split and atomic)

    @property
    def counters(self) -> int:
        """Tickets a ``last`` launch takes, indexed by kept tile: one per kept element, enough
        for tiles of any width the tuner picks."""
        return self.num_kept if self.strategy.name == "last" else 0


def plan_launch(op: str, indexing: str, launch: str, combine: str, logical: bool,
                split_block_k: dict[str, int], max_tile: int, name: str, x: torch.Tensor,
                out: torch.Tensor, dims: tuple[int, ...], keepdim: bool) -> ReduceLaunch | None:
    """The launches of a reduction of ``x`` (the argument ``name``) into ``out`` (None: the
    output is empty).

    Cached on sizes and strides (and the test suite's overrides), so repeated calls on one layout
    skip collapsing, the strategy choice and the index-width arithmetic.
    """
    return _plan(op, indexing, launch, combine, logical, tuple(sorted(split_block_k.items())),
                 max_tile, name, tuple(x.shape), tuple(x.stride()), tuple(out.shape),
                 tuple(out.stride()), dims, keepdim, overrides(), x.device)


@plan_cache
def _plan(op, indexing, launch, combine, logical, split_block_k, max_tile, name, shape, strides,
          out_shape, out_strides, dims, keepdim, _overrides, device) -> ReduceLaunch | None:
    prob = problem_of(shape, strides, out_strides, dims, keepdim, logical)
    for space, what in ((prob.kept, "kept"), (prob.reduced, "reduced")):
        if len(space.sizes) > MAX_DIMS:
            raise ValueError(f"{op}: argument '{name}' has {len(space.sizes)} {what} dims that do "
                             f"not merge (their strides skip elements); at most {MAX_DIMS} kept "
                             f"and {MAX_DIMS} reduced are supported: pass {name}.contiguous()")
    num_kept, num_red = prob.kept.numel, prob.reduced.numel
    if num_kept == 0:
        return None
    # the element count of the whole reduction, for finish expressions (mean's acc / N): a
    # split launch's later levels reduce fewer partials than that
    count = num_red
    strategy = choose(op, prob, device, launch, combine, dict(split_block_k))
    cap = max_programs(device, launch)
    # the kept and reduced indices too: an expanded input (stride 0) has more elements than its
    # storage, and a split's reduced range starts at split * split_size
    spans = {name: span(shape, strides), "out": span(out_shape, out_strides),
             "kept elements": num_kept, "reduced elements": num_red}

    def level(problem: Problem, tiles: str, splits: int, split_size: int, stage: int,
              number: int) -> Level:
        args = (problem.kept.numel, problem.reduced.numel, splits, split_size, count,
                *kept_args(problem.kept), *reduced_args(problem.reduced))
        return Level(tiles, args, dims_of(problem.kept), dims_of(problem.reduced), stage, number,
                     problem.kept.numel, splits, cap)

    if strategy.name in ("inner", "outer"):
        index_64 = choose_int64(op, indexing, spans, max_tile)
        first = level(prob, strategy.tiles, 1, max(num_red, 1), FINAL, 1)
        return ReduceLaunch(strategy, index_64, 0, num_kept, first, None)
    atomic = strategy.name == "atomic"
    # atomics add every split into one row; a split writes a row per split
    rows = 1 if atomic else strategy.splits
    index_64 = choose_int64(op, indexing, {**spans, "part": rows * num_kept}, max_tile)
    stage = {"atomic": ATOMIC, "split": PARTIAL, "last": LAST}[strategy.name]
    first = level(prob, strategy.tiles, strategy.splits, strategy.split_size, stage, 1)
    if strategy.name == "last":
        return ReduceLaunch(strategy, index_64, rows, num_kept, first, None)
    # second level: the partials, a dense (rows, kept) buffer, reduced over its rows
    second_prob = partials_problem(prob, rows)
    second = level(second_prob, "inner" if second_prob.inner else "outer", 1, rows, FINAL, 2)
    return ReduceLaunch(strategy, index_64, rows, num_kept, first, second)


def fitting_tiles(configs: list, named_args: dict, **kwargs) -> list:
    """``early_config_prune`` of the reduce kernels: no tile much larger than the problem.

    A full reduction keeps one element: a tile of 4 or 16 kept rows would mask most of its lanes;
    rows of 1024 would mask most of a 16384-long chunk. Configs up to the kept count and the
    split's length (each rounded up to a power of two) stay; where none does, the smallest tiles.
    """
    widest_k = next_power_of_2(max(named_args["num_kept"], 1))
    widest_r = next_power_of_2(max(min(named_args["split_size"], named_args["num_red"]), 1))
    fitting = [c for c in configs
               if c.kwargs["BLOCK_K"] <= widest_k and c.kwargs["BLOCK_R"] <= widest_r]
    if fitting:
        return fitting
    smallest = min(c.kwargs["BLOCK_K"] * c.kwargs["BLOCK_R"] for c in configs)
    return [c for c in configs if c.kwargs["BLOCK_K"] * c.kwargs["BLOCK_R"] == smallest]


@dataclass(frozen=True)
class Launch:
    """A reduce op's launch data (its description's ``launch``)."""

    combine: str                    # sum, prod, max, min, argmax, argmin
    schedule: str                   # "flat" or "persistent"
    split_block_k: dict[str, int]   # the narrowest output tile of each tile family
    max_tile: int                   # the widest tile a program may cover

    @property
    def index(self) -> bool:
        return self.combine in INDEX_COMBINES


class Reduce(FamilyRuntime):
    """Reductions of the op's tensor (its first argument) over ``dim`` (its second), ``keepdim``
    third. Kernels: ``inner`` and ``outer`` (two tile families of one kernel), and for a sum
    ``atomic_inner`` and ``atomic_outer`` (the same, zeroing their partials between tuning
    trials). Each takes x, out and two workspace pointers (two more for an index reduction),
    the op's float, int and bool scalars but keepdim, then the level's sizes and strides."""

    def spell_out(self, op: Op, args: tuple) -> tuple:
        x, dim = args[0], args[1]
        d = op.description
        cast_name, cast = next(((a.name, v) for a, v in zip(d.args, args) if a.kind == "dtype"),
                               (None, None))
        if isinstance(cast, torch.dtype) and not cast.is_floating_point and \
                isinstance(x, torch.Tensor):
            _check_integer_cast(op, args, cast_name, cast)
        if op.description.launch.index:
            if dim is not None:
                normalize_dims(op.name, dim, x.dim(), single=True)
            return args
        # the registered op takes a list of ints: check and spell out an int or a tuple here
        dim = None if every_dim(dim) else list(normalize_dims(op.name, dim, x.dim()))
        return (x, dim, *args[2:])

    def run(self, op: Op, args: tuple) -> torch.Tensor:
        d = op.description
        spec: Launch = d.launch
        x, dim, keepdim = args[:3]
        name = d.args[0].name
        device = check_tensors(op.name, {name: x}, d.dtypes)
        dims = normalize_dims(op.name, dim, x.dim(), single=spec.index)
        if spec.combine not in ("sum", "prod"):
            check_nonempty(op.name, name, x, dims, dim, spec.index)
        dtype_arg = next((v for a, v in zip(d.args, args) if a.kind == "dtype"), None)
        if x.dtype.is_floating_point and (dtype_arg is None or dtype_arg.is_floating_point):
            # torch returns reductions contiguous, and indices as int64
            dtype = torch.int64 if spec.index else x.dtype if dtype_arg is None else dtype_arg
        else:
            # an integer or bool x or dtype=: torch's answer (a sum of int32 or bool is int64,
            # mean refuses an integer x without a floating dtype=), before any launch
            dtype = torch_result(op.name, op.reference, args, d.tensor_positions,
                                 tuple(a.name for a in d.args))
            if dtype == torch.bool and spec.combine == "sum":
                # torch's bool sum saturates (an or); the kernel's would count in uint8 and wrap
                raise TypeError(f"{op.name}: a sum into bool (dtype=torch.bool, or a bool "
                                f"result) is not supported; sum into an integer dtype and "
                                f"compare with 0")
        out = empty(output_shape(x.shape, dims, keepdim), dtype, device)
        # the kernels' scalars: the spec's, after x, dim and keepdim (which shape the launch)
        scalars = tuple(args[i] for i in d.scalar_positions if i > 2)
        _launch(op, name, x, dims, keepdim, scalars, out)
        return out


RUNTIME = Reduce()


def _check_integer_cast(op: Op, args: tuple, name: str, cast: torch.dtype) -> None:
    """An integer or bool dtype= (one of the op's dtypes): torch's sum and prod take one, its
    mean does not (a TypeError here, naming the floating ones); an integer result has no
    gradient (a RuntimeError, as torch's "Autograd not support dtype")."""
    d = op.description
    try:
        torch_result(op.name, op.reference, args, d.tensor_positions,
                     tuple(a.name for a in d.args))
    except Exception:
        floating = ", ".join(str(t).removeprefix("torch.") for t in d.dtypes
                             if t.is_floating_point)
        raise TypeError(f"{op.name}: argument '{name}' is {cast}; supported: {floating}") \
            from None
    x = args[0]
    if x.requires_grad and torch.is_grad_enabled():
        raise RuntimeError(f"{op.name}: argument '{d.args[0].name}' requires grad, but the "
                           f"result's dtype {cast} has none (as in torch)")


def _launch(op: Op, name: str, x: torch.Tensor, dims: tuple[int, ...], keepdim: bool,
            scalars: tuple, out: torch.Tensor) -> None:
    spec: Launch = op.description.launch
    plan = plan_launch(op.name, op.description.indexing, spec.schedule, spec.combine, spec.index,
                       spec.split_block_k, spec.max_tile, name, x, out, dims, keepdim)
    if plan is None:
        return  # the output is empty: nothing to compute
    strategy = plan.strategy
    dtypes = (x.dtype, out.dtype)
    kernels = op.kernels
    # partials are in the kernel's COMPUTE type: the values' (x's for argmax and argmin), the
    # result's for the rest (float32, float64, an integer result's own)
    part_dtype = compute_dtype(x.dtype if spec.index else out.dtype)

    def run(kernel, level: Level, pointers: tuple) -> None:
        launch(kernel, level.grid, *pointers, *scalars, *level.args, KEPT_DIMS=level.kept_dims,
               RED_DIMS=level.red_dims, STAGE=level.stage, LEVEL=level.level,
               INDEX_64=plan.index_64, tune_key=(plan, level, dtypes))

    if plan.counters:
        # one launch: partials, and the last program of each output tile combines them into out
        part = empty((plan.part_rows, plan.num_kept), part_dtype, x.device)
        counters = launch_counters(x, plan.counters)
        note_launch(op.name, strategy.name, plan.index_64, splits=strategy.splits)
        run(kernels[strategy.tiles], plan.first, (x, out, part, counters))
        return
    if plan.second is None:
        note_launch(op.name, strategy.name, plan.index_64)
        run(kernels[strategy.tiles], plan.first, (x, out, out, out) + (out, out) * spec.index)
        return
    if spec.combine == "sum":
        atomic = strategy.name == "atomic"
        if atomic and part_dtype in (torch.uint8, torch.int8, torch.int16):
            # Triton's atomics take no integer narrower than 32 bits: a sum into one (dtype=
            # torch.uint8) adds int32 partials, whose low bits, kept by the cast to out, wrap as
            # its own sum does
            part_dtype = torch.int32
        part = (zeros if atomic else empty)((plan.part_rows, plan.num_kept), part_dtype,
                                            x.device)
        note_launch(op.name, strategy.name, plan.index_64, splits=strategy.splits)
        run(kernels[("atomic_" if atomic else "") + strategy.tiles], plan.first,
            (x, out, part, part))
        second = (part, out, part, part)
    else:
        part = empty((plan.part_rows, plan.num_kept), part_dtype, x.device)
        note_launch(op.name, strategy.name, plan.index_64, splits=plan.part_rows)
        if spec.index:
            part_index = empty((plan.part_rows, plan.num_kept), torch.int64, x.device)
            run(kernels[strategy.tiles], plan.first, (x, out, part, part, out, part_index))
            second = (part, out, part, part, part_index, part_index)
        else:
            run(kernels[strategy.tiles], plan.first, (x, out, part, part))
            second = (part, out, part, part)
    run(kernels[plan.second.tiles], plan.second, second)

"""Launch-time decisions shared by every family: index width, grid size, configs, test hooks."""

from __future__ import annotations

import contextlib
import functools
import operator
from typing import Callable, Iterator, Mapping, Sequence, TypeVar

import torch
import triton
from torch.library import wrap_triton
from torch.utils._python_dispatch import _disable_current_modes

from specgen.runtime import replay
from specgen.runtime import tuned as frozen_tables
from specgen.runtime.context import (ensure_allocator, interpreting, launch_logs, overrides,
                                     untraced)
from specgen.runtime.layout import span, storage_span

T = TypeVar("T")

INT32_MAX = 2**31 - 1
# programs per multiprocessor in a persistent launch: enough to hide latency, few enough to loop
PERSISTENT_PROGRAMS_PER_SM = 4
# the multiprocessor count assumed where there is no GPU: an H100's (and an H200's)
NOMINAL_SMS = 132


def use_int64(op: str, indexing: str, tensors: Mapping[str, torch.Tensor], max_tile: int) -> bool:
    """Whether a launch over ``tensors`` needs the int64 specialization (see ``choose_int64``)."""
    return choose_int64(op, indexing, {n: storage_span(t) for n, t in tensors.items()}, max_tile)


def choose_int64(op: str, indexing: str, spans: Mapping[str, int], max_tile: int) -> bool:
    """Whether a launch needs the int64 specialization.

    The int32 one is safe while every offset a program forms fits: the storage span of each
    tensor plus one tile of masked lanes past the end. ``indexing`` is the spec's choice ("auto",
    "int32" or "int64"), possibly overridden by the test suite.
    """
    mode = overrides().indexing or indexing
    # each span against the limit, joined by `|`: under torch.compile with dynamic shapes the
    # result stays an expression of the sizes, where picking the largest span first compared
    # sizes with each other (a guard, and a graph of its own each time it flips)
    too_large = {name: span + max_tile > INT32_MAX for name, span in spans.items()}
    needs_64 = functools.reduce(operator.or_, too_large.values(), False)
    if mode == "int32" and needs_64:
        name = next(name for name, large in too_large.items() if large)
        raise ValueError(
            f"{op}: indexing is forced to int32, but '{name}' spans {spans[name]:,} elements, "
            f"more than 2**31 - 1 can address; set indexing = \"auto\" or \"int64\" in the spec")
    return mode == "int64" or needs_64


def plan_cache(plan: Callable[..., T]) -> Callable[..., T]:
    """``plan`` cached on its arguments, which hold what it reads (sizes, strides, the device,
    the test suite's overrides): repeated calls on one layout skip the planning. Symbolic sizes
    (torch.compile with dynamic shapes) do not hash: those calls plan uncached."""
    cached = functools.lru_cache(maxsize=4096)(plan)

    @functools.wraps(plan)
    def lookup(*key):
        try:
            return cached(*key)
        except TypeError:
            return plan(*key)
    return lookup


@functools.lru_cache(maxsize=None)
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def multiprocessors(device: torch.device) -> int:
    """The device's multiprocessor count; where there are none (the interpreter, planner tests on
    meta tensors) an H100's, so that the CPU tier plans grids and splits as the GPU tier does."""
    return _sm_count(device.index or 0) if device.type == "cuda" else NOMINAL_SMS


def shared_memory(device: torch.device) -> int:
    """The most shared memory a program may take on ``device`` (bytes); unbounded where there is
    no GPU (the interpreter): config pruning then keeps what the GPU tier would try first."""
    if device.type != "cuda":
        return 1 << 30
    return _device_shared_memory(device.index or 0)


@functools.lru_cache(maxsize=None)
def _device_shared_memory(device_index: int) -> int:
    return triton.runtime.driver.active.utils.get_device_properties(device_index)["max_shared_mem"]


def max_programs(device: torch.device, launch: str,
                 per_sm: int = PERSISTENT_PROGRAMS_PER_SM) -> int:
    """The most programs a grid-stride launch starts: all tiles (flat) or ``per_sm`` per SM."""
    return capped_programs(per_sm * multiprocessors(device), launch)


def capped_programs(programs: int, launch: str = "persistent") -> int:
    """``programs``, the most a persistent launch starts, unless the tests' overrides say
    otherwise: no cap (``launch="flat"``: a program a tile) or ``max_programs``, so that a tiny
    input still loops."""
    forced = overrides()
    if (forced.launch or launch) == "flat":
        return INT32_MAX
    if forced.max_programs is not None:
        return forced.max_programs
    return programs


def grid_size(num_tiles: int, cap: int) -> int:
    return max(1, min(num_tiles, cap))


def configs(space: Sequence[Mapping[str, int]],
            interpreter_first: Mapping[str, int] | None = None) -> list[triton.Config]:
    """Autotune configs from a spec's config space: all of them, under the interpreter too, where
    the property suite forces each in turn (``launch`` runs the first there when none is forced).
    ``interpreter_first`` leads the space under the interpreter only: a tile sized for the CPU
    tier's tiny inputs, which a GPU need not time."""
    if interpreter_first is not None and interpreting():
        space = (interpreter_first, *space)
    configs = []
    for point in space:
        meta = {k: v for k, v in point.items() if k not in ("num_warps", "num_stages")}
        configs.append(triton.Config(meta, num_warps=point.get("num_warps", 4),
                                     num_stages=point.get("num_stages", 1)))
    return configs


_watches: list[list] = []


@contextlib.contextmanager
def watch_autotuned() -> Iterator[list]:
    """Collects (kernel, args, kwargs) of every autotuned launch inside the block (specgen tune:
    the kernels a call starts and the arguments their configs are pruned for)."""
    seen: list = []
    _watches.append(seen)
    try:
        yield seen
    finally:
        _watches.remove(seen)


# (kernel, launch key) -> the config autotuning chose, so later launches skip the autotuner.
# Bounded: when full it is emptied, and the next launches find their configs in the autotuners'
# own caches (a little slower, never re-tuned).
_tuned: dict[tuple, triton.Config] = {}
_TUNED_LIMIT = 8192


def launch(kernel: triton.runtime.Autotuner | triton.runtime.JITFunction, grid, *args,
           tune_key: tuple = (), fp_fusion: bool = True, **kwargs) -> None:
    """Starts an autotuned kernel (or a plain jit kernel whose launcher chose its meta-parameters).

    ``tune_key`` identifies what autotuning depends on (the launcher passes its cached launch plan
    and the tensors' dtypes); once a key is tuned, launches call the chosen config directly, which
    saves the autotuner's per-call bookkeeping. When the tests force a config, that config runs
    without tuning, so the property suite checks every point of a config space. On plain tensors
    the kernel starts directly: ``wrap_triton`` exists for tracing, and its eager dispatch costs
    about a millisecond a call. A plain jit kernel (``kwargs`` carry its block sizes and
    ``num_warps``) is only started, directly or through ``wrap_triton`` as above.

    ``fp_fusion=False`` compiles a direct launch without contracting a multiply and an add into
    an FMA: a derived gradient subtracts terms that cancel (layer_norm's ``g * w - sum(g * w) /
    N``), and an FMA rounds only one of them. Traced launches compile as Inductor does.

    A config Triton finds past the GPU's resources as it starts (the prune's estimate missed)
    gives way to the next the prune keeps, unless it was forced; a traced launch leaves that to
    Inductor's compilation.

    A launch runs on its tensors' GPU, whichever is current (Triton launches on the current one;
    torch's ops switch to their inputs'), and launches nothing for meta tensors: a call on them
    computes its outputs' shapes, dtypes and strides, as torch's meta kernels do.
    """
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    direct = untraced(tensors)
    if not direct and interpreting() and torch.compiler.is_compiling():
        # Triton's interpreter runs a kernel on its tensors' data, which torch.compile's fake
        # tensors do not have (torch raises "Cannot access data pointer" from deep inside)
        raise RuntimeError(f"{_name(kernel)}: torch.compile of specgen ops needs a GPU; "
                           f"TRITON_INTERPRET=1 runs kernels on real tensors only")
    if direct and tensors:
        device = tensors[0].device
        if device.type == "meta":
            return
        if device.type == "cuda" and device.index != torch._C._cuda_getDevice():
            with torch.cuda.device(device):
                return launch(kernel, grid, *args, tune_key=tune_key, fp_fusion=fp_fusion,
                              **kwargs)
    if launch_logs():
        _note_kernel(kernel)
    ensure_allocator()
    # compile options: not part of any tuning key (traced launches leave them to Inductor)
    options = {} if fp_fusion or not direct else {"enable_fp_fusion": False}
    if not isinstance(kernel, triton.runtime.Autotuner):
        # no config space: nothing to tune, cache or force
        if not direct:
            wrap_triton(kernel)[grid](*args, **kwargs)
            return
        kwargs = {**kwargs, **options}
        compiled = kernel[grid](*args, **kwargs)
        replay.note_launch(kernel, grid, args, kwargs, compiled)
        return
    key = (kernel, tune_key, tuple(sorted(kwargs.items())))
    try:
        tuned = _tuned.get(key)
    except TypeError:  # symbolic sizes (torch.compile with dynamic shapes): nothing to look up
        key = tuned = None
    frozen = None
    knobs = overrides()
    forced = knobs.config
    if forced is None and knobs.kernel_configs:
        forced = dict(knobs.kernel_configs).get(frozen_tables.kernel_id(kernel))
    for watch in _watches:
        watch.append((kernel, args, kwargs))
    if forced is not None:
        config = forced_config(kernel, args, kwargs, forced)
    elif direct and tuned is not None:
        config = tuned
    elif interpreting():
        # timing configs there measures numpy, not a GPU: the first that fits runs, untimed
        # (after the cache lookup, which the interpreter never fills: a tuned GPU launch reads
        # no environment variable)
        config = forced_config(kernel, args, kwargs, 0)
    elif direct and not frozen_tables.autotuning():
        # tuned ahead of time for this GPU (specgen tune; runtime/tuned.py), else the family's
        # heuristic, the first config the prune keeps: no autotuning, no first-call stall
        config = untuned_config(kernel, args, kwargs, tensors)
        if key is not None:
            _keep_tuned(key, config)
    elif direct and shares_storage(args):
        # an output that is also an input (add(x, y, out=x)): each of the autotuner's trials
        # would update it once more, so they run on stand-ins, then the chosen config runs here.
        # A launch cannot tell outputs from inputs: two inputs that share memory (add(x, x))
        # tune on stand-ins too, once per tuning key
        if tune_on_stand_ins(kernel, grid, args, kwargs, key):
            replay.note_tuning()
            config = _tuned[key]
        else:  # no stand-ins (a CUDA graph being captured): the first config that fits, untimed
            config = forced_config(kernel, args, kwargs, 0)
    elif not direct and (tuned is not None
                         or (frozen := _frozen_traced(kernel, args, kwargs, tensors, key))
                         is not None
                         or kernel.reset_to_zero or key is not None
                         and (not frozen_tables.autotuning()
                              or tune_on_stand_ins(kernel, grid, args, kwargs, key))):
        # traced (torch.compile), a kernel runs the config an eager launch takes (the table's,
        # the heuristic's, or the one eager autotuning chose), so that a compiled graph computes
        # what eager calls do, bit for bit; where autotuning is asked for, a launch eager has not
        # tuned is tuned here, on stand-ins. Left to Inductor, which tunes by its own
        # benchmarking, H200, rms_norm 1024x32768 bf16 took 4096-wide chunks on 16 warps (41.6 us
        # of device time) where ours took 8192 on 32 (34.8 us; tools/perf/compiled_ops.py). Inductor
        # benchmarks without a kernel's reset_to_zero hook, so atomic targets would keep every
        # trial's sums: such a kernel runs the first config that fits when eager has not tuned it
        config = tuned or _tuned.get(key) or frozen or forced_config(kernel, args, kwargs, 0)
        if key is not None and key not in _tuned:
            _keep_tuned(key, config)
    else:
        (kernel if direct else wrap_triton(kernel))[grid](*args, **kwargs, **options)
        if direct:
            replay.note_tuning()
            _keep_tuned(key, kernel.best_config)
        return
    fn = kernel.fn
    if not direct:
        wrap_triton(fn)[grid](*args, **kwargs, **frozen_tables.entry_config(config))
        return
    started = {**kwargs, **frozen_tables.entry_config(config), **options}
    try:
        compiled = fn[grid](*args, **started)
    except triton.runtime.OutOfResources as err:
        if forced is not None:
            # a forced config runs as asked or fails: the tests and specgen tune force configs
            # to check and time those very ones
            raise
        failed = config
        config, compiled = _start_another(kernel, grid, args, kwargs, options, failed, err)
        started = {**kwargs, **frozen_tables.entry_config(config), **options}
        if key is not None and _tuned.get(key) is failed:
            # (the untuned and table paths cache their config before it starts)
            _keep_tuned(key, config)
    replay.note_launch(fn, grid, args, started, compiled)


def _start_another(kernel, grid, args, kwargs, options, failed: triton.Config,
                   err: Exception) -> tuple[triton.Config, object]:
    """Starts the first config the kernel's prune keeps that Triton finds within the GPU's
    resources, ``failed`` being past them, as autotuning passes over such a config. A prune's
    estimate was measured against Triton's count at some cases under some Triton versions (the
    attention prune's: 3.6 and 3.8), and the count moves with the arguments' alignment and the
    version; an estimate that drifts costs a compilation here, not the call."""
    for config in pruned_configs(kernel, args, kwargs):
        meta = frozen_tables.entry_config(config)
        if meta == frozen_tables.entry_config(failed):
            continue
        try:
            return config, kernel.fn[grid](*args, **kwargs, **meta, **options)
        except triton.runtime.OutOfResources:
            continue
    err.add_note(f"{_name(kernel)}: no config its prune keeps fits the GPU either")
    raise err


def untuned_config(kernel, args, kwargs, tensors) -> triton.Config:
    """A launch's config where nothing autotunes: its table's, else the first its prune keeps."""
    kept = pruned_configs(kernel, args, kwargs)
    return _frozen(kernel, args, kwargs, tensors, kept) or kept[0]


def _frozen(kernel, args, kwargs, tensors, kept=None) -> triton.Config | None:
    """The table's config for this launch, where the kernel's prune keeps it for these arguments
    (a table of an older GPU, or an entry tuned at another size, may hold tiles that do not fit);
    ``kept``: that prune's result, where the caller has it."""
    if not tensors or tensors[0].device.type != "cuda":
        return None
    kept = pruned_configs(kernel, args, kwargs) if kept is None else kept
    allowed = [frozen_tables.entry_config(c) for c in kept]
    config = frozen_tables.lookup(kernel, args, kwargs, tensors[0].device, allowed)
    entry = None if config is None else frozen_tables.entry_config(config)
    return kept[allowed.index(entry)] if entry in allowed else None


def _frozen_traced(kernel, args, kwargs, tensors, key) -> triton.Config | None:
    """A traced launch's table config (concrete sizes only), kept for the eager launches too."""
    if key is None or not all(type(n) is int for t in tensors for n in t.shape):
        return None
    config = _frozen(kernel, args, kwargs, tensors)
    if config is not None:
        _keep_tuned(key, config)
    return config


def _function(kernel):
    """The Python function a kernel was written as, under its Autotuner, JITFunction or the
    interpreter's wrapper (whose own module is Triton's)."""
    while hasattr(kernel, "fn"):
        kernel = kernel.fn
    return kernel


def _name(kernel) -> str:
    return _function(kernel).__name__


def _note_kernel(kernel) -> None:
    """Adds the kernel's name to the latest launch decision of each open log, where that
    decision is its op's (a generated module's kernels are its op's): a kernel launched before
    its op's decision (cross_entropy's target check) is not counted to another op's."""
    function = _function(kernel)
    op = function.__module__.rpartition(".")[2]
    for log in launch_logs():
        if log and log[-1].op == op:
            log[-1].kernels.append(function.__name__)


def tune_on_stand_ins(kernel: triton.runtime.Autotuner, grid, args: Sequence, kwargs: Mapping,
                      key: tuple) -> bool:
    """Tunes a launch as an eager one would be, on real tensors that stand in for its own (same
    device, dtype, sizes, strides and storage offset; random floats, zero integers, so that an
    index read from them stays in range), and keeps the config under ``key``: a traced launch's
    tensors are the tracer's, and an eager launch's outputs may be its inputs too. False, tuning
    nothing, where the launch cannot be repeated for real: symbolic sizes (dynamic shapes), a
    tensor off the GPU, a stream being captured into a CUDA graph. The stand-ins take as much
    memory as the launch's own tensors, for the time of the tuning."""
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    scalars = [a for a in (*args, *kwargs.values()) if not isinstance(a, torch.Tensor)]
    if (not tensors or not torch.cuda.is_available()
            or any(t.device.type != "cuda" for t in tensors)
            or not all(type(v) in (int, float, bool, str, type(None)) for v in scalars)
            or not all(type(n) is int for t in tensors for n in (*t.shape, *t.stride(),
                                                                t.storage_offset()))
            or torch.cuda.is_current_stream_capturing()):
        return False
    # outside the tracer's modes (fake tensors, proxies, functionalization): real allocations
    with _disable_current_modes():
        made: dict[int, torch.Tensor] = {}
        real = [stand_in(a, made) if isinstance(a, torch.Tensor) else a for a in args]
        kernel[grid](*real, **kwargs)
    _keep_tuned(key, kernel.best_config)
    return True


def shares_storage(args: Sequence) -> bool:
    """Whether two tensor arguments are views of one storage (or one tensor is passed twice)."""
    storages = [a.untyped_storage().data_ptr() for a in args
                if isinstance(a, torch.Tensor) and a.numel() > 0]
    return len(set(storages)) < len(storages)


def _keep_tuned(key: tuple, config: triton.Config) -> None:
    if len(_tuned) >= _TUNED_LIMIT:
        _tuned.clear()
    _tuned[key] = config


def stand_in(tensor: torch.Tensor, made: dict[int, torch.Tensor]) -> torch.Tensor:
    """A real tensor laid out as ``tensor``; one per tensor (``made``, by id), so that a tensor
    passed as two arguments stays one."""
    if id(tensor) not in made:
        size, stride, offset = tuple(tensor.shape), tensor.stride(), tensor.storage_offset()
        storage = torch.empty(offset + span(size, stride), dtype=tensor.dtype,
                              device=tensor.device)
        if tensor.dtype.is_floating_point:
            storage.normal_()
        else:
            storage.zero_()
        made[id(tensor)] = storage.as_strided(size, stride, offset)
    return made[id(tensor)]


def forced_config(kernel: triton.runtime.Autotuner, args: Sequence, kwargs: Mapping,
                  forced: int | Mapping[str, int]) -> triton.Config:
    """The config ``override(config=...)`` makes ``kernel`` run.

    A number picks from the configs the kernel's ``early_config_prune`` keeps for these arguments,
    as autotuning would (a config of the space may not fit the device's shared memory). A mapping
    gives the meta-parameters themselves; those the kernel does not take are left out and those it
    does not give come from the kernel's first config, so one mapping serves kernels with
    different tile parameters (a loss kernel's chunk beside its one-config helper kernels).
    """
    if isinstance(forced, Mapping):
        params = kernel.fn.arg_names
        meta = {**kernel.configs[0].kwargs, **{k: v for k, v in forced.items() if k in params}}
        return triton.Config(meta, num_warps=forced.get("num_warps", 4),
                             num_stages=forced.get("num_stages", 1))
    configs = pruned_configs(kernel, args, kwargs)
    return configs[forced % len(configs)]


def pruned_configs(kernel: triton.runtime.Autotuner, args: Sequence,
                   kwargs: Mapping) -> list[triton.Config]:
    """The configs ``kernel`` would tune over for these arguments: those its ``early_config_prune``
    keeps (tiles fitted to the problem and the device), else all."""
    if kernel.early_config_prune is None:
        return kernel.configs
    return kernel.early_config_prune(kernel.configs, dict(zip(kernel.arg_names, args)), **kwargs)

"""Eager calls replayed from a recording: the host path of a repeated call in a few microseconds.

An eager call of a generated op checks its arguments, plans its launch (collapsed layouts, the
strategy, index width, grid), allocates its outputs and starts one or more Triton kernels. On the
GPU machines that Python costs 60-200 us a call, several times the kernel of a 4096x4096 softmax,
while torch's own eager ops cost about 10 us. Everything that work decides is a function of the
call's *signature*: each tensor's shape, strides, dtype, device and 16-byte alignment (Triton
specializes pointers on it), which tensors are passed twice, the scalar arguments, the test
overrides and any state a family names (matmul: the float32 precision setting). So the second
call with a signature records what the implementation does, and later calls replay it:

- the allocations, made through ``empty``/``zeros``/``full`` below while a recording runs, and
  the long-lived buffers it looked up (``persistent``: looked up again by each replay);
- each launch: the kernel Triton compiled, the grid, and the arguments, tensors among them named
  by where they come from (input i or allocation j);
- the result: which allocations (or inputs) the implementation returned.

A recording becomes a Python function written for it (``Replay.run``, as Inductor writes a
graph's wrapper): ``torch.empty_strided`` with the recorded layout for each plain allocation and,
on a GPU, each launch through torch's launcher of Triton cubins (``_StaticCudaLauncher``, what
Inductor launches its kernels with) on the kernel's non-constant arguments, tensors passed as
their data pointers. A launch that launcher cannot start (one that asks for scratch memory, a
tensor descriptor, a cluster; no such launcher in this torch) goes through Triton's own
(``CompiledKernel.run``), as does every launch while a profiler's launch hooks are installed or
another GPU is current. Under the interpreter a replayed launch calls the kernel again through
Triton with the recorded arguments, so the CPU tier runs the same recording, argument mapping and
written function.

The signature is written out in each op's public function (``key_source``: one tuple, no loop)
and computed by ``Replays.lookup`` for the families' inner replays; both give the same key.

A call that autotunes is not recorded (the next one is). A recording that meets anything else (a
tensor argument that is neither an input nor a recorded allocation) is dropped, and the signature
always takes the full path. Value-dependent work cannot be replayed and stays outside the recorded
implementation (the cross-entropy target check reads a flag the replayed kernels wrote); an
implementation that does such work on an allocation a launch then reads calls ``refuse``. Replays
serve untraced eager calls (those that need a gradient through the kept call of their
signature, ``Replays.keep``, whose autograd.Function replays its own launches); traced and
mode-wrapped calls go through ``torch.ops.specgen.*``.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import inspect
import math
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import torch
import triton
from triton import knobs

from specgen.runtime import context, native

# signatures kept per op; past it the cache starts over (a workload with ever new shapes)
CACHE_SIZE = 1024

_SEEN = object()       # seen once: the next call with this signature is recorded
_NO_REPLAY = object()  # its recording failed: always take the full path


class _Recording:
    """What one implementation call did, gathered while it runs."""

    def __init__(self) -> None:
        self.allocations: list[_Allocation] = []
        self.launches: list[tuple] = []
        self.tuned = False  # a launch autotuned: record the next call instead
        self.refused = ""   # why this call cannot be replayed (``refuse``), or ""


@dataclass(frozen=True)
class _Allocation:
    """One allocation of a recorded call: the tensor it made, how to make another, and, for a
    plain ``empty``, its layout (a replay then calls ``torch.empty_strided`` itself)."""

    tensor: torch.Tensor
    remake: Callable[[], torch.Tensor]
    layout: tuple | None = None   # (shape, strides, dtype, device, poisoned)


_active = threading.local()
# how many calls with a signature run before one is recorded: by then any autotuning, split-K
# timing and compilation it triggers are done; tests set 0 (see ``record_at_once``)
_calls_before_recording = 1


def _recording() -> _Recording | None:
    return getattr(_active, "recording", None)


@contextlib.contextmanager
def _record() -> Iterator[_Recording]:
    recording = _Recording()
    _active.recording = recording
    try:
        yield recording
    finally:
        _active.recording = None


@contextlib.contextmanager
def record_at_once() -> Iterator[None]:
    """Records the first call of each signature (tests: the next call is then a replay)."""
    global _calls_before_recording
    saved, _calls_before_recording = _calls_before_recording, 0
    try:
        yield
    finally:
        _calls_before_recording = saved


# ---- allocations (every output and workspace of an implementation goes through these) ----------


def empty(shape: Sequence[int], dtype: torch.dtype, device: torch.device,
          strides: Sequence[int] | None = None) -> torch.Tensor:
    shape = tuple(shape)
    if strides is None:
        def make():
            return torch.empty(shape, dtype=dtype, device=device)
    else:
        strides = tuple(strides)

        def make():
            return torch.empty_strided(shape, strides, dtype=dtype, device=device)
    # the test suite: NaN where no kernel writes (an int's minimum, a bool's True), so that a store a kernel
    # misses fails the comparison rather than passing on whatever the memory held. The
    # overrides key replays: a recording made here is replayed poisoned
    poison = context.overrides().poison
    tensor = _poisoned(make()) if poison else make()
    return _note(tensor, lambda: _poisoned(make()) if poison else make(),
                 (shape, tensor.stride(), tensor.dtype, tensor.device, poison))


def _poisoned(tensor: torch.Tensor) -> torch.Tensor:
    value = (math.nan if tensor.is_floating_point() else True if tensor.dtype == torch.bool
             else torch.iinfo(tensor.dtype).min)
    return tensor.fill_(value)


def full(shape: Sequence[int], value: float, dtype: torch.dtype,
         device: torch.device) -> torch.Tensor:
    """A filled allocation (``zeros`` for atomic targets, a constant for an empty reduction)."""
    shape = tuple(shape)
    tensor = torch.full(shape, value, dtype=dtype, device=device)
    return _note(tensor, lambda: torch.full(shape, value, dtype=dtype, device=device))


def zeros(shape: Sequence[int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return full(shape, 0, dtype, device)


def persistent(tensor: torch.Tensor, lookup: Callable[[], torch.Tensor]) -> torch.Tensor:
    """A buffer that outlives calls (reduce's ticket counters, one set per stream): a replay
    finds its buffer with ``lookup`` again, which may give another tensor (on another stream)."""
    return _note(tensor, lookup)


def _note(tensor: torch.Tensor, remake: Callable[[], torch.Tensor],
          layout: tuple | None = None) -> torch.Tensor:
    recording = _recording()
    if recording is not None:
        recording.allocations.append(_Allocation(tensor, remake, layout))
    return tensor


# ---- launches ------------------------------------------------------------------------------------


def note_launch(fn: Any, grid: Any, args: Sequence, kwargs: dict, compiled: Any) -> None:
    """Called by ``launch.launch`` after it started ``fn`` (a JITFunction) directly, on the GPU
    it made current (the tensors'), which the recording keeps: the compiled kernel is loaded
    for that GPU alone."""
    recording = _recording()
    if recording is not None:
        device = None if compiled is None else triton.runtime.driver.active.get_current_device()
        recording.launches.append((fn, grid, tuple(args), dict(kwargs), compiled, device))


def note_tuning() -> None:
    """Called when a launch autotunes: its trial runs are not part of the call, so a recording
    taken now would not be what later calls do."""
    recording = _recording()
    if recording is not None:
        recording.tuned = True


def refuse(reason: str) -> None:
    """Called where an implementation does work a recording cannot hold (a torch op writing an
    allocation a launch then reads): the signature is never replayed."""
    recording = _recording()
    if recording is not None:
        recording.refused = recording.refused or reason


# ---- replaying -------------------------------------------------------------------------------------


class _Slots:
    """Where each tensor of a recorded call comes from: ("in", i) or ("buf", j)."""

    def __init__(self, inputs: Sequence[torch.Tensor | None], recording: _Recording) -> None:
        self._by_id = {}
        for j, allocation in enumerate(recording.allocations):
            self._by_id[id(allocation.tensor)] = ("buf", j)
        for i, tensor in enumerate(inputs):
            if tensor is not None:
                self._by_id.setdefault(id(tensor), ("in", i))

    def find(self, tensor: torch.Tensor) -> tuple[str, int] | None:
        return self._by_id.get(id(tensor))


# Triton's scalar parameter types as torch's launcher codes them (Inductor's table, less the
# 16-bit floats: a Python float is an fp32 parameter, and a 16-bit one would be read from the
# first two bytes of a float32)
_TYPE_CODES = {"i1": "i", "i8": "b", "i16": "h", "i32": "i", "i64": "l", "u1": "I", "u8": "B",
               "u16": "H", "u32": "I", "u64": "K", "fp32": "f", "f32": "f", "fp64": "d"}


@dataclass(frozen=True)
class StaticLaunch:
    """A compiled kernel as torch's ``_StaticCudaLauncher`` starts it: the loaded function, its
    warps and shared memory, and its parameters (the launch's arguments at ``positions``, then
    ``scratch`` null pointers), each coded in ``types``."""

    function: int
    num_warps: int
    shared: int
    types: str
    positions: tuple[int, ...]
    scratch: int


def static_launch(arg_names: Sequence[str], compiled: Any,
                  values: Sequence[Any]) -> StaticLaunch | str:
    """How ``compiled`` starts with a bare driver launch on ``values`` (every parameter of the
    kernel, in order), as the C++ core and torch's launcher of Triton cubins start it, or why it
    cannot: the parameters are those Triton did not make constants (constexprs, and the
    arguments it specialized, an int equal to 1 or a None), then one null pointer for each
    scratch area the kernel takes (Triton 3.3 and later: global, then profile), as Inductor
    passes them."""
    metadata, src = compiled.metadata, getattr(compiled, "src", None)
    if src is None or not isinstance(getattr(src, "signature", None), dict):
        return "no source signature"
    if (getattr(metadata, "num_ctas", 1) != 1 or getattr(metadata, "launch_pdl", False)
            or getattr(metadata, "launch_cooperative_grid", False)
            or getattr(metadata, "tensordesc_meta", None)):
        return "a cluster, a programmatic-dependent or cooperative launch, or tensor descriptors"
    if getattr(metadata, "global_scratch_size", 0) or getattr(metadata, "profile_scratch_size", 0):
        return "scratch memory"
    constants = {(arg_names.index(k),) if isinstance(k, str) else tuple(k)
                 for k in (getattr(src, "constants", None) or {})}
    types, positions = "", []
    for i, name in enumerate(arg_names):
        kind = src.signature.get(name, src.signature.get(i))
        if kind is None:
            return f"parameter {name} is not in the signature"
        if kind == "constexpr" or (i,) in constants:
            continue
        if kind.startswith("*"):
            if not isinstance(values[i], torch.Tensor):
                return f"pointer parameter {name} is not a tensor"
            types += "O"
        elif kind in _TYPE_CODES and type(values[i]) in (int, float, bool):
            types += _TYPE_CODES[kind]
        else:
            return f"parameter {name} of type {kind}"
        positions.append(i)
    scratch = hasattr(metadata, "global_scratch_size") + hasattr(metadata, "profile_scratch_size")
    return StaticLaunch(compiled.function, metadata.num_warps, metadata.shared,
                        types + "O" * scratch, tuple(positions), scratch)


def _static_launcher():
    """torch's launcher of Triton cubins (Inductor's), where this torch has one (CUDA builds)."""
    if torch.version.hip is not None:
        return None
    return getattr(torch._C, "_StaticCudaLauncher", None)


@dataclass(frozen=True)
class _Launch:
    """One recorded launch: the argument list with its tensor positions left to fill."""

    fn: Any                                  # the JITFunction (interpreter: InterpretedFunction)
    grid: tuple[int, int, int]
    args: tuple                              # every kernel parameter, in order; tensors as None
    slots: tuple[tuple[int, str, int], ...]  # (position, "in"/"buf", index)
    options: tuple[tuple[str, Any], ...]     # num_warps, num_stages, ...
    compiled: Any                            # the CompiledKernel it ran (None under the interpreter)
    device: int | None                       # the CUDA device it ran on
    stream: Callable[[int], int] | None      # Triton's current-stream query
    static: StaticLaunch | None = None       # its start through torch's launcher, where it has one

    def __call__(self, inputs: Sequence[torch.Tensor], buffers: Sequence[torch.Tensor]) -> None:
        """The launch through Triton: its launcher (GPU) or the interpreter."""
        args = list(self.args)
        for position, source, index in self.slots:
            args[position] = inputs[index] if source == "in" else buffers[index]
        compiled = self.compiled
        # a kernel that asks Triton for global memory at launch needs its allocator (per thread)
        context.ensure_allocator()
        if compiled is not None and not _launch_hooked() and torch._C._cuda_getDevice() == self.device:
            # what JITFunction.run does once it has found the compiled kernel; with no launch
            # hooks installed (profilers install some) there is no launch metadata to build
            compiled.run(*self.grid, self.stream(self.device), compiled.function,
                         compiled.packed_metadata, None, None, None, *args)
            return
        if self.device is not None and torch._C._cuda_getDevice() != self.device:
            # recorded on another GPU than the current one: launch there, as the recording did
            with torch.cuda.device(self.device):
                self.fn[self.grid](*args, **dict(self.options))
            return
        self.fn[self.grid](*args, **dict(self.options))


def _launch_hooked() -> bool:
    """Whether a profiler (or anything) installed Triton launch hooks, which only Triton's own
    launcher calls. Triton 3.6 and later hold them in (usually empty) chains; earlier ones
    used None."""
    enter, leave = knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook
    return bool(getattr(enter, "calls", enter) or getattr(leave, "calls", leave))


def _launch_from(slots: _Slots, fn: Any, grid: Any, args: tuple, kwargs: dict,
                 compiled: Any, device: int | None) -> _Launch | str:
    """The replayable form of one recorded launch, or why there is none."""
    names = set(fn.arg_names)
    params = {k: v for k, v in kwargs.items() if k in names}
    options = tuple(sorted((k, v) for k, v in kwargs.items() if k not in names))
    bound = inspect.signature(fn.fn).bind(*args, **params)
    bound.apply_defaults()
    values = list(bound.arguments.values())
    if callable(grid):
        grid = grid(dict(bound.arguments))
    grid = tuple(grid) + (1,) * (3 - len(grid))
    static = None
    if compiled is not None:
        static = static_launch(fn.arg_names, compiled, values)
        static = static if isinstance(static, StaticLaunch) else None
    filled = []
    for position, value in enumerate(values):
        if isinstance(value, torch.Tensor):
            source = slots.find(value)
            if source is None:
                return f"{fn.__name__}: argument {fn.arg_names[position]} is neither an input nor " \
                       "an allocation of the call"
            filled.append((position, *source))
            values[position] = None
    stream = None if compiled is None else triton.runtime.driver.active.get_current_stream
    return _Launch(fn, grid, tuple(values), tuple(filled), options, compiled, device, stream,
                   static)


@dataclass(frozen=True)
class Replay:
    """A recorded call: allocate, launch, return. ``run`` is the function written for it
    (``replay_source``), taking the call's tensors as arguments; ``generic`` does the same from
    the data, launching through Triton; calling a replay with a tuple of tensors runs ``run``."""

    # (remake, layout): layout (shape, strides, dtype, device, poisoned) for a plain ``empty``
    allocations: tuple[tuple[Callable[[], torch.Tensor], tuple | None], ...]
    launches: tuple[_Launch, ...]
    result: tuple[tuple[str, int], ...]   # where each returned tensor comes from
    single: bool                          # the implementation returned one tensor, not a tuple
    arity: int                            # the call's tensors (inputs)

    def __post_init__(self) -> None:
        # the generic path refers to the replay's parts, not to the replay: the C++ core holds
        # it, and a cycle through the core's capsule would never be collected
        generic = functools.partial(_generic, self.allocations, self.launches, self.result,
                                    self.single)
        source, scope = replay_source(self)
        object.__setattr__(self, "source", source)   # what the Python path runs (tools, tests)
        object.__setattr__(self, "generic", generic)
        built = native.module()
        if built is None:
            scope["_generic"] = generic
            exec(compile(source, "<specgen replay>", "exec"), scope)
            run = scope["replay"]
        else:
            run = _native_replay(self, built, generic)
        object.__setattr__(self, "run", run)

    def __call__(self, inputs: Sequence[torch.Tensor | None]) -> Any:
        return self.run(*inputs)


def _generic(allocations: tuple, launches: tuple, result: tuple, single: bool,
             inputs: Sequence[torch.Tensor | None]) -> Any:
    """A replay from its data, every launch through Triton (``_Launch.__call__``)."""
    buffers = [make() for make, _ in allocations]
    for launch in launches:
        launch(inputs, buffers)
    found = tuple(inputs[i] if source == "in" else buffers[i] for source, i in result)
    return found[0] if single else found


def _direct(replay: Replay) -> tuple[dict[int, _Launch], int | None]:
    """The launches a replay starts itself rather than through Triton (by id), and their GPU:
    those with a static form, where they all run on one GPU (else none)."""
    direct = {id(launch): launch for launch in replay.launches if launch.static is not None}
    devices = {launch.device for launch in direct.values()}
    return (direct, devices.pop()) if len(devices) == 1 else ({}, None)


def _parameters(launch: _Launch) -> list[tuple[str, str, object]]:
    """A direct launch's kernel parameters in order, each (type code, source, value): source
    "i" or "b" with the index of the input or allocation whose data pointer it is, or "v" with
    the constant (None for a scratch area's null pointer)."""
    static = launch.static
    slots = {position: (source[0], index) for position, source, index in launch.slots}
    parameters = [(code, *slots.get(position, ("v", launch.args[position])))
                  for code, position in zip(static.types, static.positions)]
    return parameters + [("O", "v", None)] * static.scratch


def replay_source(replay: Replay) -> tuple[str, dict[str, Any]]:
    """The source of a replay's function and the names it reads: the inputs as its parameters,
    each plain allocation as ``torch.empty_strided`` of its recorded layout, each launch torch's
    launcher of Triton cubins can start as one call of it (tensors as their data pointers), the
    others through Triton (``_Launch.__call__``); on a GPU, while launch hooks are installed or
    another device is current, the generic path instead."""
    scope: dict[str, Any] = {"_empty_strided": torch.empty_strided, "_poisoned": _poisoned}
    inputs = "(" + "".join(f"i{i}, " for i in range(replay.arity)) + ")"
    lines = [f"def replay({', '.join(f'i{i}' for i in range(replay.arity))}):"]
    direct, device = _direct(replay) if _static_launcher() is not None else ({}, None)
    if direct:
        scope.update(_runtime=knobs.runtime, _hooked=_launch_hooked,
                     _device=torch._C._cuda_getDevice,
                     _launch_kernel=_static_launcher()._launch_kernel)
        fallback = [("_runtime.launch_enter_hook.calls or _runtime.launch_exit_hook.calls"
                     if _hooks_are_chains() else "_hooked()")]
        if torch.cuda.device_count() > 1:  # one GPU is always the current one
            fallback.append(f"_device() != {device}")
        lines += [f"    if {' or '.join(fallback)}:",
                  f"        return _generic({inputs})"]
    for j, (make, layout) in enumerate(replay.allocations):
        if layout is None:
            scope[f"_remake_{j}"] = make
            lines.append(f"    b{j} = _remake_{j}()")
        else:
            shape, strides, dtype, where, poisoned = layout
            scope[f"_dtype_{j}"], scope[f"_device_{j}"] = dtype, where
            made = (f"_empty_strided({shape!r}, {tuple(strides)!r}, dtype=_dtype_{j}, "
                    f"device=_device_{j})")
            lines.append(f"    b{j} = _poisoned({made})" if poisoned else f"    b{j} = {made}")
    buffers = "(" + "".join(f"b{j}, " for j in range(len(replay.allocations))) + ")"
    for k, launch in enumerate(replay.launches):
        if id(launch) not in direct:
            scope[f"_launch_{k}"] = launch
            lines.append(f"    _launch_{k}({inputs}, {buffers})")
            continue
        args = []
        for n, (_, source, value) in enumerate(_parameters(launch)):
            if source != "v":
                args.append(f"{source}{value}.data_ptr()")
            elif value is None or type(value) in (int, bool):
                args.append(repr(value))
            else:  # a float: by name (inf and nan have no literal)
                scope[f"_arg_{k}_{n}"] = value
                args.append(f"_arg_{k}_{n}")
        static = launch.static
        scope[f"_stream_{k}"] = launch.stream
        grid = ", ".join(map(str, launch.grid))
        lines += [f"    _launch_kernel({static.function}, {grid}, {static.num_warps}, "
                  f"{static.shared}, {static.types!r},",
                  f"                   ({', '.join(args)},), _stream_{k}({device}))"]
    names = [f"{'i' if source == 'in' else 'b'}{i}" for source, i in replay.result]
    lines.append(f"    return {names[0]}" if replay.single else f"    return ({', '.join(names)},)")
    return "\n".join(lines) + "\n", scope


def _hooks_are_chains() -> bool:
    """Whether Triton holds its launch hooks in chains (3.6 and later), whose lists a replay
    reads directly."""
    return all(hasattr(getattr(knobs.runtime, hook), "calls")
               for hook in ("launch_enter_hook", "launch_exit_hook"))


# the type codes of StaticLaunch.types as C types: a constant parameter's bytes as the C cast
# gives them (a float beyond float32's range becomes inf, as in Triton's launcher)
_C_TYPES = {"i": ctypes.c_int32, "l": ctypes.c_int64, "b": ctypes.c_int8, "h": ctypes.c_int16,
            "B": ctypes.c_uint8, "H": ctypes.c_uint16, "I": ctypes.c_uint32,
            "K": ctypes.c_uint64, "f": ctypes.c_float, "d": ctypes.c_double}


def packed(code: str, value: int | float) -> int:
    """A constant kernel parameter of type ``code`` (``StaticLaunch.types``) as the 8-byte slot
    the driver reads it from, little-endian, as an unsigned int."""
    return int.from_bytes(bytes(_C_TYPES[code](value)).ljust(8, b"\0"), "little")


def _native_replay(replay: Replay, built: Any, generic: Callable) -> Callable:
    """``replay`` as the C++ core's callable (native.cpp): the same allocations, launches and
    result as ``replay_source`` writes, each constant parameter's bytes in its 8-byte slot
    (little-endian); ``generic`` serves calls the core cannot launch. The core holds the
    launches, whose compiled kernels must stay loaded while it may start them."""
    allocations = [(make, (), (), None, None) if layout is None or layout[4]
                   else (None, *layout[:4]) for make, layout in replay.allocations]
    # the driver's launches, where Triton's hooks are lists the core can read
    direct, device = _direct(replay) if _hooks_are_chains() else ({}, None)
    launches = []
    for launch in replay.launches:
        if id(launch) not in direct:
            launches.append((launch, 0, (1, 1, 1), 0, 0, ()))
            continue
        parameters = [(source, value) if source != "v"
                      else ("v", 0 if value is None else packed(code, value))
                      for code, source, value in _parameters(launch)]
        static = launch.static
        launches.append((None, static.function, launch.grid, 32 * static.num_warps, static.shared,
                         parameters))
    result = [(source == "buf", index) for source, index in replay.result]
    hooks = knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook
    return built.replay(allocations, launches, result, replay.single, replay.arity,
                        -1 if device is None else device,
                        *(hook.calls if direct else [] for hook in hooks),
                        generic, replay.launches)


def _replay_from(inputs: Sequence[torch.Tensor | None], recording: _Recording,
                 result: Any) -> Replay | str:
    if recording.refused:
        return recording.refused
    slots = _Slots(inputs, recording)
    launches = []
    for recorded in recording.launches:
        launch = _launch_from(slots, *recorded)
        if isinstance(launch, str):
            return launch
        launches.append(launch)
    single = isinstance(result, torch.Tensor)
    sources = []
    for tensor in (result,) if single else result:
        source = slots.find(tensor) if isinstance(tensor, torch.Tensor) else None
        if source is None:
            return "the result is not an allocation or an input of the call"
        sources.append(source)
    return Replay(tuple((a.remake, a.layout) for a in recording.allocations), tuple(launches),
                  tuple(sources), single, len(inputs))


# ---- signatures -------------------------------------------------------------------------------------


def key_source(tensors: Sequence[str], scalars: Sequence[tuple[str, bool]],
               state: str) -> tuple[list[str], str]:
    """A call's signature as Python: (conditions, expression). Where the conditions hold (nothing
    traces or watches launches, no plain scalar is a tensor, and the tensors' part, which it binds
    to ``_key``, is not None), the expression is the key: the tensors' part (``tensor_key``, or
    its C++ twin), each scalar with its type (``1`` and ``1.0`` hash alike), the test overrides
    (None when none is forced) and ``state``. ``scalars``: (name, plain), a plain scalar (float,
    int, bool, str, dtype) keyed as it is, any other through ``_scalar_key``. Names read: those
    of ``key_scope``."""
    condition = ["not _logs", "not _tracing()"]
    # a tensor given as a scalar (a 0-dim dim) would hash by identity while its value may change
    condition += [f"not isinstance({name}, _T)" for name, plain in scalars if plain]
    condition.append(f"(_key := _tensor_key({', '.join(tensors)})) is not None")
    parts = ["_key"]
    parts += [f"(type({name}), {name})" if plain else f"_scalar_key({name})"
              for name, plain in scalars]
    parts += ["_ctx.overrides_key", state]
    return condition, "(" + ", ".join(parts) + ")"


def key_scope() -> dict[str, Any]:
    """The names ``key_source``'s code reads."""
    built = native.module()
    return {"_T": torch.Tensor, "_logs": context.launch_logs(), "_tracing": context.tracing,
            "_ctx": context, "_scalar_key": _scalar_key,
            "_tensor_key": tensor_key if built is None else built.key}


def tensor_key(*tensors: object) -> tuple | None:
    """The tensors' part of a call's signature: each tensor's shape, strides, dtype, device,
    16-byte alignment (Triton specializes pointers on it) and whether it needs a gradient here
    (grad mode on and ``requires_grad``: such a call is served by its differentiable replay,
    ``Replays.keep``), None for an omitted one, then which tensors are one (a recording names
    one input for both: ``add(a, a)`` must not serve ``add(b, c)``). None where the call is not
    keyed: a tensor subclass other than a parameter (fake tensors; ``context.PLAIN_TENSORS``), or
    a layout other than strided (sparse tensors, which the full path refuses).
    native.cpp's ``key`` is the same in C++."""
    grad = torch.is_grad_enabled()
    parts: list = []
    for t in tensors:
        if t is None:
            parts.append(None)
            continue
        if type(t) not in context.PLAIN_TENSORS or t.layout is not torch.strided:
            return None
        parts += (t.shape, t.stride(), t.dtype, t.device, not t.data_ptr() & 15,
                  grad and t.requires_grad)
    parts += [a is b for i, a in enumerate(tensors) for b in tensors[i + 1:]]
    return tuple(parts)


def _scalar_key(value: object) -> object:
    """A scalar argument's part of a signature: its type and value, a sequence's elements each
    with its type; unhashable (the call is not keyed) where a tensor is among them."""
    kind = type(value)
    if kind in _PLAIN:
        return kind, value
    listed = kind in (list, tuple, torch.Size)
    if any(isinstance(e, torch.Tensor) for e in (value if listed else (value,))):
        return _UNKEYED
    if listed:
        value = tuple((type(e), e) for e in value)
    return kind, value


# scalar types whose value is its own key (the common scalars of a call)
_PLAIN = frozenset({int, float, bool, str, type(None), torch.dtype})
_UNKEYED = ([],)  # unhashable: a key holding it fails the lookup, and the call is not keyed


@functools.lru_cache(maxsize=None)
def _generic_key(n_tensors: int, n_scalars: int) -> Callable[..., tuple | None]:
    """The signature of a call of ``n_tensors`` tensors (any may be None) and ``n_scalars``
    scalars of any kind, as ``key_source`` writes it: ``key(*tensors, *scalars, state)``."""
    tensors = [f"t{i}" for i in range(n_tensors)]
    scalars = [(f"s{i}", False) for i in range(n_scalars)]
    condition, expression = key_source(tensors, scalars, "None if _state is None else _state()")
    params = ", ".join(tensors + [name for name, _ in scalars] + ["_state"])
    source = (f"def signature({params}):\n"
              f"    if not ({' and '.join(condition)}):\n"
              f"        return None\n"
              f"    return {expression}\n")
    scope = key_scope()
    exec(compile(source, f"<specgen signature {n_tensors} {n_scalars}>", "exec"), scope)
    return scope["signature"]


@dataclass(frozen=True)
class _Kept:
    """A kept function (``Replays.keep``), called with a tuple of tensors as a ``Replay`` is."""

    run: Callable

    def __call__(self, inputs: Sequence[torch.Tensor | None]) -> Any:
        return self.run(*inputs)


class Replays:
    """One op's recordings, by call signature."""

    def __init__(self, op: str, state: Callable[[], object] | None = None) -> None:
        self.op = op
        self.state = state  # global settings the op's planning reads (part of the signature)
        self._entries: dict[tuple, object] = {}
        # the recorded signatures' replay functions (``Replay.run``, taking the tensors as
        # arguments): what the public function looks up
        self.ready: dict[tuple, Callable] = {}
        self.failures: dict[tuple, str] = {}  # why a signature is not replayed (tools, tests)
        self.replayed = 0                     # calls served by a replay (tests, tools)

    def lookup(self, tensors: Sequence[object], scalars: Sequence[object]
               ) -> tuple[tuple | None, Callable | None]:
        """The call's signature (None when it must take the traced path or cannot be keyed) and
        its replay, if one was recorded."""
        key = _generic_key(len(tensors), len(scalars))(*tensors, *scalars, self.state)
        if key is None:
            return None, None
        try:
            found = self.ready.get(key)
        except TypeError:  # a mapping config forced by the tests, a tensor among the scalars
            return None, None
        if found is None:
            return key, None
        self.replayed += 1
        return key, self._entries[key]

    def recorded(self, tensors: Sequence[object], scalars: Sequence[object]) -> Callable | None:
        """The replay recorded for a call's signature, if any (not counted as a replayed call:
        a caller that keeps it counts its own calls)."""
        key = _generic_key(len(tensors), len(scalars))(*tensors, *scalars, self.state)
        try:
            return None if key is None else self.ready.get(key)
        except TypeError:  # an unhashable scalar: the call is not keyed
            return None

    def keep(self, key: tuple, run: Callable) -> None:
        """Serves later calls of ``key`` with ``run`` (taking the call's tensors): a call that
        needs a gradient, whose checks this signature passed (``autograd.bound_call``)."""
        self._make_room()
        self._entries[key] = _Kept(run)
        self.ready[key] = run

    def record(self, key: tuple | None, impl: Callable, tensors: Sequence[torch.Tensor | None],
               *args: object) -> Any:
        """Runs ``impl(*args)``, recording it when this signature was seen once before."""
        entry = self._entries.get(key) if key is not None else _NO_REPLAY
        if entry is _NO_REPLAY or _recording() is not None:
            return impl(*args)
        if entry is None and _calls_before_recording:
            self._make_room()
            self._entries[key] = _SEEN
            return impl(*args)
        with _record() as recording:
            result = impl(*args)
        if recording.tuned:
            self._entries[key] = _SEEN
            return result
        replay = _replay_from(tensors, recording, result)
        if isinstance(replay, str):
            self.failures[key] = replay
            replay = _NO_REPLAY
        else:
            self.ready[key] = replay.run
        self._entries[key] = replay
        return result

    def _make_room(self) -> None:
        """Past ``CACHE_SIZE`` signatures the cache starts over (ever new shapes)."""
        if len(self._entries) >= CACHE_SIZE:
            self._entries.clear()
            self.ready.clear()
            self.failures.clear()

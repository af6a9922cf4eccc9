"""Eager calls replayed from a recording: the host path of a repeated call in a few microseconds.

An eager call of a generated op checks its arguments, plans its launch (collapsed layouts, the
strategy, index width, grid), allocates its outputs and starts one or more Triton kernels. On the
GPU machines that Python costs 60-200 us a call, several times the kernel of a 4096x4096 softmax,
while torch's own eager ops cost about 10 us. Everything that work decides is a function of the
call's *signature*: each tensor's shape, strides, dtype, device and 16-byte alignment (Triton
specializes pointers on it), the scalar arguments, the test overrides and any state a family names
(matmul: the float32 precision setting). So the second call with a signature records what the
implementation does, and later calls replay it:

- the allocations, made through ``empty``/``zeros``/``full`` below while a recording runs, and
  the long-lived buffers it looked up (``persistent``: looked up again by each replay);
- each launch: the kernel Triton compiled, the grid, and the arguments, tensors among them named
  by where they come from (input i or allocation j);
- the result: which allocations (or inputs) the implementation returned.

A call that autotunes is not recorded (the next one is). A recording that meets anything else (a
tensor argument that is neither an input nor a recorded allocation) is dropped, and the signature
always takes the full path. Value-dependent work cannot be replayed and stays outside the recorded implementation (the
cross-entropy target check reads a flag the replayed kernels wrote). Replays are only for plain
eager calls: traced, differentiated or mode-wrapped calls go through ``torch.ops.specgen.*``.

Under the interpreter a replayed launch calls the kernel again through Triton with the recorded
arguments, so the CPU tier exercises the same recording and argument mapping; on a GPU it calls
the compiled kernel's launcher directly, as ``JITFunction.run`` does after its cache lookup.
"""

from __future__ import annotations

import contextlib
import inspect
import math
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import torch
import triton
from triton import knobs

from specgen.runtime import context

# signatures kept per op; past it the cache starts over (a workload with ever new shapes)
CACHE_SIZE = 1024

_SEEN = object()       # seen once: the next call with this signature is recorded
_NO_REPLAY = object()  # its recording failed: always take the full path


class _Recording:
    """What one implementation call did, gathered while it runs."""

    def __init__(self) -> None:
        self.allocations: list[tuple[torch.Tensor, Callable[[], torch.Tensor]]] = []
        self.launches: list[tuple] = []
        self.tuned = False  # a launch autotuned: record the next call instead


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
    if context.overrides().poison:
        # the test suite: NaN where no kernel writes (an int's minimum), so that a store a kernel
        # misses fails the comparison rather than passing on whatever the memory held. The
        # overrides key replays: a recording made here is replayed poisoned
        unpoisoned = make

        def make():
            return _poisoned(unpoisoned())
    return _note(make(), make)


def _poisoned(tensor: torch.Tensor) -> torch.Tensor:
    value = math.nan if tensor.is_floating_point() else torch.iinfo(tensor.dtype).min
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


def _note(tensor: torch.Tensor, remake: Callable[[], torch.Tensor]) -> torch.Tensor:
    recording = _recording()
    if recording is not None:
        recording.allocations.append((tensor, remake))
    return tensor


# ---- launches ------------------------------------------------------------------------------------


def note_launch(fn: Any, grid: Any, args: Sequence, kwargs: dict, compiled: Any) -> None:
    """Called by ``launch.launch`` after it started ``fn`` (a JITFunction) directly."""
    recording = _recording()
    if recording is not None:
        recording.launches.append((fn, grid, tuple(args), dict(kwargs), compiled))


def note_tuning() -> None:
    """Called when a launch autotunes: its trial runs are not part of the call, so a recording
    taken now would not be what later calls do."""
    recording = _recording()
    if recording is not None:
        recording.tuned = True


# ---- replaying -------------------------------------------------------------------------------------


class _Slots:
    """Where each tensor of a recorded call comes from: ("in", i) or ("buf", j)."""

    def __init__(self, inputs: Sequence[torch.Tensor | None], recording: _Recording) -> None:
        self._by_id = {}
        for j, (tensor, _) in enumerate(recording.allocations):
            self._by_id[id(tensor)] = ("buf", j)
        for i, tensor in enumerate(inputs):
            if tensor is not None:
                self._by_id.setdefault(id(tensor), ("in", i))

    def find(self, tensor: torch.Tensor) -> tuple[str, int] | None:
        return self._by_id.get(id(tensor))


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

    def __call__(self, inputs: Sequence[torch.Tensor], buffers: Sequence[torch.Tensor]) -> None:
        args = list(self.args)
        for position, source, index in self.slots:
            args[position] = inputs[index] if source == "in" else buffers[index]
        compiled = self.compiled
        # a kernel that asks Triton for global memory at launch needs its allocator (per thread)
        context.ensure_allocator()
        if compiled is not None and _no_launch_hooks() and torch._C._cuda_getDevice() == self.device:
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


def _no_launch_hooks() -> bool:
    # Triton 3.6 and later hold the hooks in (usually empty) chains; earlier ones used None
    enter, leave = knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook
    return not getattr(enter, "calls", enter) and not getattr(leave, "calls", leave)


def _launch_from(slots: _Slots, fn: Any, grid: Any, args: tuple, kwargs: dict,
                 compiled: Any) -> _Launch | str:
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
    filled = []
    for position, value in enumerate(values):
        if isinstance(value, torch.Tensor):
            source = slots.find(value)
            if source is None:
                return f"{fn.__name__}: argument {fn.arg_names[position]} is neither an input nor " \
                       "an allocation of the call"
            filled.append((position, *source))
            values[position] = None
    device = stream = None
    if compiled is not None:
        driver = triton.runtime.driver.active
        device, stream = driver.get_current_device(), driver.get_current_stream
    return _Launch(fn, grid, tuple(values), tuple(filled), options, compiled, device, stream)


@dataclass(frozen=True)
class Replay:
    """A recorded call: allocate, launch, return."""

    allocations: tuple[Callable[[], torch.Tensor], ...]
    launches: tuple[_Launch, ...]
    result: tuple[tuple[str, int], ...]   # where each returned tensor comes from
    single: bool                          # the implementation returned one tensor, not a tuple

    def __call__(self, inputs: Sequence[torch.Tensor | None]) -> Any:
        buffers = [make() for make in self.allocations]
        for launch in self.launches:
            launch(inputs, buffers)
        result = tuple(inputs[i] if source == "in" else buffers[i] for source, i in self.result)
        return result[0] if self.single else result


def _replay_from(inputs: Sequence[torch.Tensor | None], recording: _Recording,
                 result: Any) -> Replay | str:
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
    return Replay(tuple(make for _, make in recording.allocations), tuple(launches),
                  tuple(sources), single)


class Replays:
    """One op's recordings, by call signature."""

    def __init__(self, op: str, state: Callable[[], object] | None = None) -> None:
        self.op = op
        self.state = state  # global settings the op's planning reads (part of the signature)
        self._entries: dict[tuple, object] = {}
        self.failures: dict[tuple, str] = {}  # why a signature is not replayed (tools, tests)
        self.replayed = 0                     # calls served by a replay (tests, tools)

    def lookup(self, tensors: Sequence[object], scalars: Sequence[object]
               ) -> tuple[tuple | None, Replay | None]:
        """The call's signature (None when it must take the traced path or cannot be keyed) and
        its replay, if one was recorded."""
        key = self._key(tensors, scalars)
        if key is None:
            return None, None
        try:
            entry = self._entries.get(key)
        except TypeError:  # a mapping config forced by the tests, an unhashable scalar
            return None, None
        if isinstance(entry, Replay):
            self.replayed += 1
            return key, entry
        return key, None

    def record(self, key: tuple | None, impl: Callable, tensors: Sequence[torch.Tensor | None],
               *args: object) -> Any:
        """Runs ``impl(*args)``, recording it when this signature was seen once before."""
        entry = self._entries.get(key) if key is not None else _NO_REPLAY
        if entry is _NO_REPLAY or _recording() is not None:
            return impl(*args)
        if entry is None and _calls_before_recording:
            if len(self._entries) >= CACHE_SIZE:
                self._entries.clear()
                self.failures.clear()
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
        self._entries[key] = replay
        return result

    def _key(self, tensors: Sequence[object], scalars: Sequence[object]) -> tuple | None:
        # every eager call computes this: the common cases first, no call that can be avoided
        if context.launches_watched() or context.tracing():
            return None
        grad = torch.is_grad_enabled()
        signature = []
        for t in tensors:
            if t is None:
                signature.append(None)
            elif type(t) is not torch.Tensor or grad and t.requires_grad:
                return None
            else:
                signature.append((t.shape, t.stride(), t.dtype, t.device, t.data_ptr() % 16 == 0))
        # one tensor passed as two arguments is recorded as one input (slots go by identity):
        # such a call has a signature of its own, its pattern of repeats
        repeats = None
        if len(tensors) > 1:
            ids = [id(t) for t in tensors if t is not None]
            if len(set(ids)) < len(ids):
                repeats = tuple(map(ids.index, ids))
        values = []
        for v in scalars:
            kind = type(v)
            if kind in _PLAIN:
                values.append((kind, v))
                continue
            listed = kind in (list, tuple, torch.Size)
            # a tensor given as a scalar (a 0-dim dim) hashes by identity, and its value may
            # change in place: such a call is not keyed
            if any(isinstance(e, torch.Tensor) for e in (v if listed else (v,))):
                return None
            if listed:
                v = tuple((type(e), e) for e in v)
            values.append((kind, v))
        return (tuple(signature), repeats, tuple(values), context.overrides(),
                self.state() if self.state is not None else None)


# scalar types whose value is its own key (the common scalars of a call)
_PLAIN = frozenset({int, float, bool, str, type(None), torch.dtype})

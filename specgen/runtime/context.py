"""The calling context of a launch: what traces the call, the test suite's forced choices, open
launch logs, Triton's allocator. Read by the launcher and by replays (both import this module;
neither imports the other's state)."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from typing import Iterator, Mapping

import torch
import triton
from torch.autograd import forward_ad
from torch.overrides import _get_current_function_mode_stack
from torch.utils._device import DeviceContext
from triton.runtime import _allocation


# read once, at import (set TRITON_INTERPRET before importing specgen): Triton decides whether a
# jit function is interpreted when it is decorated, which for the generated kernels is at their
# import too; and a launch asks several times (reading the environment costs a few us each)
_INTERPRETING = os.environ.get("TRITON_INTERPRET") == "1"


def interpreting() -> bool:
    return _INTERPRETING


@dataclass(frozen=True)
class Overrides:
    """Knobs the test suite turns to reach every specialization on small inputs.

    Frozen and hashable, so launch-plan caches key on it directly (a mapping ``config`` does not
    hash: such calls take the uncached path)."""

    indexing: str | None = None      # force "int32" or "int64" over the spec's choice
    launch: str | None = None        # force "flat" or "persistent"
    max_programs: int | None = None  # cap a persistent grid (so a tiny input still loops)
    strategy: str | None = None      # force a family's strategy (e.g. a reduction's)
    # plan a row-wise split for chunks this wide rather than the widest (tiny rows then take
    # several splits a row, and the second stage combines several partials)
    split_chunk: int | None = None
    poison: bool = False             # fill every allocation with NaN first (replay.empty)
    # run config number k of an autotuned kernel (of those its early_config_prune keeps), no
    # tuning; or a mapping of meta-parameters, in the space or not (small tiles on small inputs)
    config: int | Mapping[str, int] | None = None
    # config number k of the kernels named (``tuned.kernel_id``: "module:function"), as pairs;
    # the others launch as usual (``specgen tune`` searches one kernel's space at a time)
    kernel_configs: tuple[tuple[str, int], ...] = ()


_DEFAULT = Overrides()
_overrides = _DEFAULT
# the overrides as a replay's signature holds them: None when none is forced (cheaper to hash
# and compare than the dataclass, on every keyed call)
overrides_key: Overrides | None = None


@contextlib.contextmanager
def override(**knobs) -> Iterator[None]:
    """``with override(indexing="int64"):`` runs the enclosed launches with forced choices."""
    global _overrides, overrides_key
    saved = _overrides
    _overrides = Overrides(**{**saved.__dict__, **knobs})
    overrides_key = None if _overrides == _DEFAULT else _overrides
    try:
        yield
    finally:
        _overrides = saved
        overrides_key = None if saved == _DEFAULT else saved


def overrides() -> Overrides:
    return _overrides


@dataclass(frozen=True)
class Launch:
    """A launch decision (``kernel``: the strategy or kernel kind the launcher chose) and the
    names of the jit functions it then started (``kernels``, filled in by ``launch``)."""

    op: str
    kernel: str
    index_bits: int
    details: Mapping[str, object] = field(default_factory=dict)
    kernels: list[str] = field(default_factory=list)


_launch_logs: list[list[Launch]] = []


@contextlib.contextmanager
def record_launches() -> Iterator[list[Launch]]:
    """Collects a ``Launch`` for every kernel started inside the block (tests and tools)."""
    log: list[Launch] = []
    _launch_logs.append(log)
    try:
        yield log
    finally:
        _launch_logs.remove(log)


def launch_logs() -> list[list[Launch]]:
    """The open ``record_launches`` logs (the launcher adds each kernel's name to them)."""
    return _launch_logs


def launches_watched() -> bool:
    """Whether a ``record_launches`` block is open (replays are off then: the log must see the
    launch decisions)."""
    return bool(_launch_logs)


def note_launch(op: str, kernel: str, index_64: bool, **details) -> None:
    for log in _launch_logs:
        log.append(Launch(op, kernel, 64 if index_64 else 32, details))



# tensors whose calls run directly: plain tensors, and parameters (an nn.Module's weights), which
# torch's C++ treats as plain tensors too; any other subclass (fake tensors, functional tensors,
# user subclasses with __torch_function__ or __torch_dispatch__) goes through the dispatcher
PLAIN_TENSORS = frozenset({torch.Tensor, torch.nn.Parameter})


def untraced(tensors) -> bool:
    """Plain tensors (``PLAIN_TENSORS``), and nothing tracing (``tracing``)."""
    return not tracing() and all(type(t) in PLAIN_TENSORS for t in tensors if t is not None)


def tracing() -> bool:
    """Whether something traces or rewrites calls: torch.compile/export, a dispatch mode, a
    torch.func transform or forward-mode AD, or a function mode other than a default device.
    (Under vmap the registered op batches; ``checks.check_tensor_types`` refuses the transforms
    that differentiate.) A default-device context (``torch.set_default_device``,
    ``with torch.device(...)``) does neither: it only places factory calls that name no device,
    and every allocation of an implementation names one, so such calls keep the direct path and
    their replays."""
    # is_compiling first: under dynamo the C queries after it cannot be traced
    if (torch.compiler.is_compiling() or torch._C._len_torch_dispatch_stack() > 0
            or transforms_active()):
        return True
    if not torch._C._is_torch_function_mode_enabled():
        return False
    return not all(type(mode) is DeviceContext for mode in _get_current_function_mode_stack())


def transforms_active() -> bool:
    """Whether a torch.func transform (vmap, grad, jvp, ...) or a forward-mode AD level is active:
    one call and one attribute read, cheap enough for every call."""
    return torch._C._are_functorch_transforms_active() or forward_ad._current_level >= 0


def runs_eagerly(*tensors: torch.Tensor | None) -> bool:
    """True when nothing traces or differentiates this call, so a generated function may run its
    op's implementation directly and skip the dispatcher (some 40 us a call).

    torch.compile and export, dispatch and function modes and tensor subclasses (fake tensors
    among them) go through ``torch.ops.specgen.*`` instead; eager autograd (``untraced`` but
    an input requires grad) runs the implementation inside an ``autograd.Function``
    (``differentiable_call``), also without the dispatcher.
    """
    if not untraced(tensors):
        return False
    return not torch.is_grad_enabled() or not any(t is not None and t.requires_grad for t in tensors)



def _scratch(size: int, alignment: int, stream: int | None) -> torch.Tensor:
    """Global memory a kernel asks Triton for at launch (the TMA matmul's device-side
    descriptors): triton's allocator protocol, served by torch's caching allocator, whose 512-byte
    alignment covers any asked for."""
    # the current device: launch() makes it the launch's tensors' own
    return torch.empty(size, dtype=torch.int8, device="cuda")


def ensure_allocator() -> None:
    """Sets triton's launch-time allocator to torch's unless one is set. Triton keeps it in a
    context variable, which every new thread starts without: checked before every launch (a
    lookup), so a call from any thread finds it."""
    if isinstance(_allocation._allocator.get(), _allocation.NullAllocator):
        triton.set_allocator(_scratch)

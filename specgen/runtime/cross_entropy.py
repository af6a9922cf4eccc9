"""Row-wise launches of the cross_entropy family (one program per row, grid-stride over rows),
the validating mode and its eager target check.

By default no call reads anything back from the device: a row whose target is neither a class
nor ignore_index gets a NaN loss and a NaN gradient row. In validating mode (``validating()``, or
``SPECGEN_VALIDATE=1`` in the environment) an eager call also runs a target-check kernel and
reads its verdict, raising for the first bad row: a device-to-host sync, by design.
"""

from __future__ import annotations

import contextlib
import os
import threading
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Iterator

import torch

from specgen.runtime.launch import choose_int64, grid_size, max_programs, plan_cache
from specgen.runtime.context import overrides
from specgen.runtime.layout import span

# programs per multiprocessor: a 128k-vocabulary row is 256 KB of bf16, so one row per program
# up to 32 per SM keeps the most loads in flight (H200, 4096 x 128256: 274 us at 32 per SM,
# 291 at 8, 385 at 4 with 2048-wide chunks; docs/performance.md, "Removed probes")
PROGRAMS_PER_SM = 32


@dataclass(frozen=True)
class RowsLaunch:
    index_64: bool
    grid: tuple[int]


def plan_rows(op: str, indexing: str, max_tile: int, n_rows: int,
              tensors: dict[str, torch.Tensor]) -> RowsLaunch:
    """Index width and grid of a launch over ``n_rows`` rows of ``tensors`` (None entries skipped).

    Cached on sizes and strides, so repeated calls on one layout skip the span arithmetic.
    """
    metas = tuple((name, tuple(t.shape), tuple(t.stride())) for name, t in tensors.items()
                  if t is not None)
    device = next(t.device for t in tensors.values() if t is not None)
    return _plan(op, indexing, max_tile, n_rows, metas, overrides(), device)


@plan_cache
def _plan(op, indexing, max_tile, n_rows, metas, _overrides, device) -> RowsLaunch:
    index_64 = choose_int64(op, indexing, {name: span(size, stride) for name, size, stride in metas},
                            max_tile)
    cap = max_programs(device, "persistent", PROGRAMS_PER_SM)
    return RowsLaunch(index_64, (grid_size(n_rows, cap),))


# the environment variable that turns validating mode on for the whole process ("1", or any value
# but "" and "0"); read once, when this module is imported: a call must not pay for reading it
VALIDATE_ENV = "SPECGEN_VALIDATE"


def _validate_from_environment() -> bool:
    return os.environ.get(VALIDATE_ENV, "").strip() not in ("", "0")


_environment_validates = _validate_from_environment()
# set by ``validating``; None: the environment decides. A context variable, so that a block in one
# thread (or task) does not switch another's calls
_validating: ContextVar[bool | None] = ContextVar("specgen_validating", default=None)


@contextlib.contextmanager
def validating(enabled: bool = True) -> Iterator[None]:
    """``with specgen.runtime.validating():`` eager calls inside the block check their arguments'
    values on the device and raise for a bad one, reading the verdict back (a sync per call).

    Today that is cross_entropy's targets: a target outside [0, C) that is not ignore_index
    raises ``ValueError("cross_entropy: target[i] is t, outside [0, C) and not ignore_index
    (...)")``, where by default that row's loss and gradient are NaN. ``validating(False)`` turns
    the mode off inside the block, over ``SPECGEN_VALIDATE=1``. Traced calls (torch.compile)
    never read back: they give the NaN in either mode.
    """
    token = _validating.set(bool(enabled))
    try:
        yield
    finally:
        _validating.reset(token)


def validates() -> bool:
    """Whether calls now run in validating mode (``validating``, else ``SPECGEN_VALIDATE``)."""
    forced = _validating.get()
    return _environment_validates if forced is None else forced


class TargetVerdict:
    """The target-check kernel's verdict (first bad row + 1, or 0; then that row's target), read
    without waiting for the kernels queued after it. Validating mode only: by default no call
    makes one.

    On a GPU the two words are copied to pinned host memory right after the check kernel and an
    event is recorded there; ``check`` waits on that event only, so the host reads the verdict
    while the loss kernel (queued before the wait) runs, rather than after it.
    """

    # per thread and device: a pinned pair and an event, reused call after call (each call waits
    # on its event before it returns, so the next one finds them free)
    _local = threading.local()

    def __init__(self, error: torch.Tensor) -> None:
        self.event = None
        if error.device.type != "cuda":
            # meta tensors hold no targets to check (None), the interpreter's are on the host
            self.host = None if error.device.type == "meta" else error
            return
        buffers = self._local.__dict__.setdefault("buffers", {})
        if error.device not in buffers:
            buffers[error.device] = (torch.empty(2, dtype=torch.int64, device="cpu",
                                                 pin_memory=True),
                                     torch.cuda.Event())
        self.host, self.event = buffers[error.device]
        self.host.copy_(error, non_blocking=True)
        self.event.record(torch.cuda.current_stream(error.device))

    def check(self, op: str, n_classes: int, ignore_index: int) -> None:
        """Raises for the first row whose target is neither a class nor ignore_index."""
        if self.host is None:
            return
        if self.event is not None:
            self.event.synchronize()
        row, value = self.host.tolist()
        if row:
            raise ValueError(f"{op}: target[{row - 1}] is {value}, outside [0, {n_classes}) and "
                             f"not ignore_index ({ignore_index})")

"""The cross_entropy family's runtime: its launches (one program per row, grid-stride over
rows), the validating mode and its eager target check, and its ops' host path (``RUNTIME``).

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
from typing import Iterator, Optional

import torch

from specgen.runtime.autograd import op_function, reference_grads
from specgen.runtime.checks import check_no_grad, check_tensor_types, check_tensors
from specgen.runtime.context import note_launch, overrides, runs_eagerly, untraced
from specgen.runtime.launch import choose_int64, grid_size, launch, max_programs, plan_cache
from specgen.runtime.layout import span
from specgen.runtime.op import FamilyRuntime, Op
from specgen.runtime.registry import triton_op
from specgen.runtime.replay import Replays, empty, full

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
    """Whether calls now run in validating mode (``validating``, else ``SPECGEN_VALIDATE``).
    Never while dynamo traces (it cannot trace a ContextVar, and a traced call reads nothing
    back anyway: a bad row's loss is NaN there)."""
    if torch.compiler.is_compiling():
        return False
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


# ---- the family's ops -------------------------------------------------------------------------

# as torch: class indices are int64
TARGET_DTYPES = (torch.int64,)


@dataclass(frozen=True)
class Launch:
    """A cross_entropy op's launch data (its description's ``launch``)."""

    max_tile: int    # the widest chunk of a row: masked lanes past the row's end form offsets


@dataclass
class _State:
    """Per op: the replays of its backward and of its target check, and the autograd Function
    its untraced calls apply (named for the op, so that a grad_fn names it)."""

    backward_replays: Replays
    target_replays: Replays
    function: type


class CrossEntropy(FamilyRuntime):
    """Cross entropy of (N, C) logits against class targets (the family's fixed signature:
    logits, target, weight, ignore_index, reduction, label_smoothing). The registered operator
    returns the loss, each row's logsumexp and the loss's denominator, what the backward kernel
    reads; the public function returns the loss. Kernels: ``forward``, ``finish`` (a "mean" or
    "sum" over the rows), ``backward`` and ``targets`` (validating mode's check)."""

    doc_note = "for (N, C) logits and (N,) targets; differentiable in logits."

    public_output = 0

    def replays_serve(self) -> bool:
        # in validating mode a replayed call checks its targets too (Op.call)
        return not validates()

    def setup(self, op: Op) -> _State:
        return _State(Replays(op.name + " backward"), Replays(op.name + " targets"),
                      op_function(op.name, _EagerAutograd))

    def register(self, op: Op) -> None:
        def forward(logits: torch.Tensor, target: torch.Tensor,
                    weight: Optional[torch.Tensor] = None, ignore_index: int = -100,
                    reduction: str = "mean", label_smoothing: float = 0.0
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            _check_inputs(op, logits, target, weight, ignore_index, reduction, label_smoothing)
            return _target_checked(op, lambda: _forward(op, logits, target, weight, ignore_index,
                                                        reduction, label_smoothing),
                                   target, logits.shape[1], ignore_index)

        def backward(grad_loss: torch.Tensor, logits: torch.Tensor, target: torch.Tensor,
                     weight: Optional[torch.Tensor], lse: torch.Tensor, denom: torch.Tensor,
                     ignore_index: int, reduction: str, label_smoothing: float) -> torch.Tensor:
            return _backward(op, grad_loss, logits, target, weight, lse, denom, ignore_index,
                             reduction, label_smoothing)

        forward.__name__, backward.__name__ = f"_{op.name}", f"_{op.name}_backward"
        forward.__module__ = backward.__module__ = op.module
        registered = triton_op(f"specgen::{op.name}", mutates_args=())(forward)
        triton_op(f"specgen::{op.name}_backward", mutates_args=())(backward)
        backward_operator = getattr(torch.ops.specgen, f"{op.name}_backward")

        def setup_context(ctx, inputs, output):
            logits, target, weight, ignore_index, reduction, label_smoothing = inputs
            _, lse, denom = output
            # lse and denom are saved for the backward, not differentiable outputs: without this
            # they report requires_grad=True and a loss built on them gets a zero gradient
            ctx.mark_non_differentiable(lse, denom)
            ctx.save_for_backward(logits, target, weight, lse, denom)
            ctx.options = (ignore_index, reduction, label_smoothing)

        def autograd_backward(ctx, grad_loss, grad_lse, grad_denom):
            logits, target, weight, lse, denom = ctx.saved_tensors
            grad = None
            if ctx.needs_input_grad[0] and torch.is_grad_enabled():
                grad = _differentiable_grad(op, grad_loss, logits, target, weight, ctx.options)
            elif ctx.needs_input_grad[0]:
                grad = backward_operator(grad_loss, logits, target, weight, lse, denom,
                                         *ctx.options)
            return grad, None, None, None, None, None

        registered.register_autograd(autograd_backward, setup_context=setup_context)
        op.operator = getattr(torch.ops.specgen, op.name)

    def call(self, op: Op, key: tuple | None, args: tuple, out: object = None) -> torch.Tensor:
        logits, target, weight, ignore_index, reduction, label_smoothing = args
        check_tensor_types(op.name, {"logits": logits, "target": target, "weight": weight},
                           optional=("weight",))
        check_no_grad(op.name, {"weight": weight},
                      "the loss is differentiable in logits only (as torch's nll_loss)")
        # scalars are checked here too, so that a traced call raises the eager error (the
        # dispatcher raises its own RuntimeError, and takes an int for a bool)
        args = op.check_scalars(args, taken=True)
        args = (*args[:5], float(args[5]))
        # untraced calls run the implementation directly (through the op's autograd Function
        # when the logits need a gradient); traced ones (torch.compile, modes, subclasses) go
        # through the registered op, whose autograd formula is the same backward kernel
        if runs_eagerly(logits, target, weight):
            return _eager_forward(op, *args)[0]
        if untraced([logits, target, weight]):
            return op.state.function.apply(op, *args)
        return op.operator(*args)[0]


RUNTIME = CrossEntropy()


def _check_inputs(op: Op, logits, target, weight, ignore_index, reduction, label_smoothing):
    name = op.name
    device = check_tensors(name, {"logits": logits}, op.description.dtypes)
    check_tensor_types(name, {"target": target, "weight": weight}, optional=("weight",))
    op.check_scalars((logits, target, weight, ignore_index, reduction, label_smoothing))
    if logits.dim() != 2:
        raise ValueError(f"{name}: argument 'logits' must be 2-D (rows, classes), "
                         f"got shape {tuple(logits.shape)}")
    if target.dtype not in TARGET_DTYPES:
        raise TypeError(f"{name}: argument 'target' must hold class indices (int64), "
                        f"got {target.dtype}")
    if target.shape != logits.shape[:1]:
        raise ValueError(f"{name}: argument 'target' must have shape ({logits.shape[0]},), "
                         f"got {tuple(target.shape)}")
    if target.device != device:
        raise ValueError(f"{name}: 'target' is on {target.device}, 'logits' on {device}")
    if weight is not None:
        check_tensors(name, {"logits": logits, "weight": weight}, op.description.dtypes)
        if weight.dtype != logits.dtype:
            # torch raises too (expected scalar type ... but found ...)
            raise TypeError(f"{name}: argument 'weight' has dtype {weight.dtype}, 'logits' "
                            f"{logits.dtype}; they must match")
        if weight.shape != logits.shape[1:]:
            raise ValueError(f"{name}: argument 'weight' must have shape ({logits.shape[1]},), "
                             f"got {tuple(weight.shape)}")
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"{name}: argument 'label_smoothing' must be in [0, 1], "
                         f"got {label_smoothing}")
    if logits.shape[1] == 0 and logits.shape[0] > 0:
        raise ValueError(f"{name}: argument 'logits' has no classes")
    return device


def _targets(op: Op, target: torch.Tensor, n_classes: int, ignore_index: int) -> torch.Tensor:
    """The target check's verdict on the device: the first bad row + 1 (0: none), its target."""
    error = empty((2,), torch.int64, target.device)
    # its own launch decision, so that a launch log shows the check (and counts its kernel to it)
    note_launch(op.name, "targets", True)
    launch(op.kernels["targets"], (1,), target, error, target.shape[0], n_classes,
           target.stride(0), ignore_index)
    return error


def _start_target_check(op: Op, target, n_classes, ignore_index) -> TargetVerdict | None:
    """Queues the target check (replayed when its signature repeats) and the read of its verdict:
    validating mode only.

    None for traced calls: there is no data to read, and a compiled graph must not sync; a bad
    row's loss is NaN there.
    """
    if target.numel() == 0 or not runs_eagerly(target):
        return None
    replays = op.state.target_replays
    tensors, options = (target,), (n_classes, ignore_index)
    key, replay = replays.lookup(tensors, options)
    if replay is not None:
        return TargetVerdict(replay(tensors))
    return TargetVerdict(replays.record(key, lambda *a: _targets(op, *a), tensors, target,
                                        *options))


def _target_checked(op: Op, run, target, n_classes, ignore_index):
    """``run()`` (the forward's launches); in validating mode between queuing the target check
    and reading its verdict: the read waits for the check kernel, not for the loss kernel queued
    after it. By default nothing is read back (a bad row's loss is NaN)."""
    if not validates():
        return run()
    verdict = _start_target_check(op, target, n_classes, ignore_index)
    result = run()
    if verdict is not None:
        verdict.check(op.name, n_classes, ignore_index)
    return result


def _forward(op: Op, logits, target, weight, ignore_index, reduction, label_smoothing):
    """The loss and what the backward needs (each row's logsumexp, the loss's denominator), on
    checked inputs: no value-dependent host work, so that repeated eager calls can replay it."""
    device = logits.device
    n_rows, n_classes = logits.shape
    # what the kernels keep is in their math's type: float32, float64 for float64 logits
    math = torch.float64 if logits.dtype == torch.float64 else torch.float32
    lse = empty((n_rows,), math, device)
    row_loss = empty((n_rows,), logits.dtype if reduction == "none" else math, device)
    if n_rows == 0:
        # torch's loss over no rows: an empty "none", NaN for "mean", 0 for "sum"
        loss = row_loss if reduction == "none" else full(
            (), float("nan") if reduction == "mean" else 0.0, logits.dtype, device)
        return loss, lse, full((), 1.0, math, device)
    # the forward kernel writes the denominator (1, or the finish kernel's weight sum)
    denom = empty((), math, device)
    loss = row_loss if reduction == "none" else empty((), logits.dtype, device)
    row_weight = empty((n_rows,), math, device)
    plan = plan_rows(op.name, op.description.indexing, op.description.launch.max_tile, n_rows,
                     {"logits": logits, "target": target, "weight": weight})
    note_launch(op.name, "forward", plan.index_64)
    launch(op.kernels["forward"], plan.grid,
           logits, target, weight if weight is not None else logits, row_loss, lse, row_weight,
           denom, n_rows, n_classes, logits.stride(0), logits.stride(1), target.stride(0),
           weight.stride(0) if weight is not None else 0, row_loss.stride(0), ignore_index,
           float(label_smoothing), HAS_WEIGHT=weight is not None, SMOOTH=label_smoothing > 0.0,
           INDEX_64=plan.index_64, tune_key=(plan, n_classes, logits.dtype, row_loss.dtype))
    if reduction != "none":
        launch(op.kernels["finish"], (1,), row_loss, row_weight, loss, denom, n_rows,
               MEAN=reduction == "mean")
    return loss, lse, denom


def _backward(op: Op, grad_loss, logits, target, weight, lse, denom, ignore_index, reduction,
              label_smoothing) -> torch.Tensor:
    grad = empty(logits.shape, logits.dtype, logits.device)
    n_rows, n_classes = logits.shape
    if grad.numel() == 0:
        return grad
    plan = plan_rows(op.name, op.description.indexing, op.description.launch.max_tile, n_rows,
                     {"logits": logits, "grad": grad, "target": target, "weight": weight})
    note_launch(op.name, "backward", plan.index_64)
    # "none" has a gradient per row; "mean" and "sum" one for the whole loss (stride 0)
    grad_loss_stride = grad_loss.stride(0) if reduction == "none" else 0
    launch(op.kernels["backward"], plan.grid,
           grad, grad_loss, logits, target, weight if weight is not None else logits, lse, denom,
           n_rows, n_classes, logits.stride(0), logits.stride(1), grad.stride(0), grad.stride(1),
           target.stride(0), weight.stride(0) if weight is not None else 0, grad_loss_stride,
           ignore_index, float(label_smoothing), HAS_WEIGHT=weight is not None,
           SMOOTH=label_smoothing > 0.0, INDEX_64=plan.index_64,
           tune_key=(plan, n_classes, logits.dtype, grad_loss.dtype))
    return grad


def _differentiable_grad(op: Op, grad_loss, logits, target, weight, options):
    """The logits' gradient for a backward that builds a graph (``create_graph=True``, grad
    mode on): torch's autograd of the reference, differentiable again, as the kernel's is not.

    A bad row (a target neither a class nor ignore_index) gets NaN, as from the kernels; it reads
    class 0 meanwhile, as they do, where torch's reference would raise (or assert on a GPU)."""
    ignore_index = options[0]
    bad = ((target < 0) | (target >= logits.shape[1])) & (target != ignore_index)
    args = (logits, torch.where(bad, 0, target), weight, *options)
    grad = reference_grads(op.reference, args, [0], [grad_loss])[0]
    return grad.masked_fill(bad[:, None], float("nan"))


def _eager_forward(op: Op, logits, target, weight, ignore_index, reduction, label_smoothing):
    """The forward of an untraced call, replayed when its signature repeats, with its target check
    queued first in validating mode."""
    tensors, options = (logits, target, weight), (ignore_index, reduction, label_smoothing)
    key, replay = op.replays.lookup(tensors, options)
    if replay is None:
        # before any launch, the target check's too (a replayed signature was checked already)
        _check_inputs(op, *tensors, *options)

        def run():
            return op.replays.record(key, lambda *a: _forward(op, *a), tensors, *tensors,
                                     *options)
    else:
        def run():
            return replay(tensors)
    return _target_checked(op, run, target, logits.shape[1], ignore_index)


class _EagerAutograd(torch.autograd.Function):
    """Untraced calls that need the gradient: the registered op's kernels without the dispatcher
    and custom-op autograd (about 150 us of host time a call on the H200 host, half the forward
    kernel), both directions replayed when their signatures repeat."""

    @staticmethod
    def forward(ctx, op, logits, target, weight, ignore_index, reduction, label_smoothing):
        loss, lse, denom = _eager_forward(op, logits, target, weight, ignore_index, reduction,
                                          label_smoothing)
        ctx.save_for_backward(logits, target, weight, lse, denom)
        ctx.op = op
        ctx.options = (ignore_index, reduction, label_smoothing)
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        op = ctx.op
        if torch.is_grad_enabled():
            logits, target, weight, _, _ = ctx.saved_tensors
            grad = _differentiable_grad(op, grad_loss, logits, target, weight, ctx.options)
            return None, grad, None, None, None, None, None
        replays = op.state.backward_replays
        tensors = (grad_loss, *ctx.saved_tensors)
        key, replay = replays.lookup(tensors, ctx.options)
        if replay is not None:
            grad = replay(tensors)
        else:
            grad = replays.record(key, lambda *a: _backward(op, *a), tensors, *tensors,
                                  *ctx.options)
        return None, grad, None, None, None, None, None

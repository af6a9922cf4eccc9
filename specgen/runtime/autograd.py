"""Backward of the generated ops: torch's autograd of the op's reference, at the saved inputs.

Every op whose family has no backward kernel of its own differentiates its spec's ``reference``
(torch ops): the forward runs our kernels, the backward runs the reference again on the saved
inputs and back-propagates through it. So every op, an author's fused ones included, has exactly
torch's gradient. Two paths, as for the forward:
- an untraced call (eager code) runs its plain eager call (replayed when its signature repeats)
  inside the op's subclass of ``_ByReference``, an autograd.Function (grad_fn
  ``Specgen<Op>Backward``), and its backward takes ``torch.autograd.grad``
  of the recomputed reference: no dispatcher, no custom-op autograd, no torch.func (on the H200
  host those cost several times the kernels of a 4096x4096 softmax's forward and backward);
- a traced call (torch.compile, modes, subclasses) goes through the registered op, whose
  autograd formula takes ``torch.autograd.grad`` of the recomputed reference as well, which
  AOTAutograd traces into the backward graph, where Inductor fuses it (``torch.func.vjp``
  under a functorch transform only).
The price in eager code is the recompute and torch's own backward kernels (docs/design.md,
"Backward"). A row-wise op whose spec derives a backward op (specgen/families/rowwise_backward.py)
passes it as ``backward``: an untraced call's gradients then come from that op's kernel, and
the reference serves what it does not cover.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Sequence

import torch

from specgen.runtime.context import transforms_active


def _save(ctx, args: Sequence[object]) -> None:
    # tensors through save_for_backward (version-checked: an in-place change before the backward
    # raises), everything else as it came
    ctx.save_for_backward(*(a if isinstance(a, torch.Tensor) else None for a in args))
    ctx.scalars = tuple(None if isinstance(a, torch.Tensor) else a for a in args)


def _saved(ctx) -> list[object]:
    return [s if t is None else t for t, s in zip(ctx.saved_tensors, ctx.scalars)]


def reference_grads(reference: Callable, args: Sequence[object], wanted: Sequence[int],
                    grads: Sequence[torch.Tensor | None]) -> dict[int, torch.Tensor]:
    """The gradients of ``reference(*args)`` with respect to ``args[i]`` for each ``i`` in
    ``wanted``, given the gradients of its outputs (None: that output was not used)."""
    # torch.autograd.grad of the recompute, eager or traced (AOTAutograd traces it as it traces
    # any backward); torch.func.vjp only under a functorch transform (vmap), which autograd.grad
    # cannot serve: torch 2.11's AOTAutograd mis-traces torch.func.vjp with symbolic sizes
    # (F.linear of a 3-D input with a bias: "Attempting to use FunctionalTensor on its own")
    if not transforms_active():
        return _autograd_grads(reference, args, wanted, grads)
    return _vjp_grads(reference, args, wanted, grads)


def _autograd_grads(reference, args, wanted, grads):
    create_graph = torch.is_grad_enabled()
    # the recompute reads fresh views of the wanted inputs: its graph hangs off the inputs
    # through them, so a backward under create_graph (grad mode on here) is differentiable
    # again, and autograd.grad stops at them. Given the inputs themselves it would run on into
    # the graph that made them: a gradient input computed from the op's output (the grad of
    # (y * y).sum()) leads back to x through the op, a path the outer backward takes itself,
    # and whose saved tensors the nested call would free
    args = list(args)
    with torch.enable_grad():
        for i in wanted:
            # (an input that needs no gradient of its own: a derived op's reference, called
            # as a plain function, still differentiates with respect to it). `[...]`, an alias
            # with the input's own strides: view_as recomputes a size-1 dim's stride, and torch
            # 2.13's CPU conv2d backward gives a wrong weight gradient for the strides it makes
            # of a channels_last (1, 4, 1, 2) input, (4, 1, 8, 4) for (8, 1, 8, 4), in every dtype
            args[i] = (args[i][...] if args[i].requires_grad
                       else args[i].detach().requires_grad_())
        outputs = reference(*args)
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    found = grads_of(outputs, [args[i] for i in wanted], grads, create_graph)
    return dict(zip(wanted, found))


def grads_of(outputs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor],
             cotangents: Sequence[torch.Tensor | None],
             create_graph: bool = False) -> tuple[torch.Tensor, ...]:
    """d(outputs . cotangents)/d(inputs), zeros where nothing depends on an input (torch gives
    None there, our backwards zeros): outputs without a cotangent or that need no grad (a
    reference constant in its inputs, ``torch.where(x > 0, 2.0, 1.0)``) are left out."""
    used = [(o, g) for o, g in zip(outputs, cotangents) if g is not None and o.requires_grad]
    if not used:
        return tuple(torch.zeros_like(t) for t in inputs)
    return torch.autograd.grad([o for o, _ in used], inputs, [g for _, g in used],
                               create_graph=create_graph, allow_unused=True,
                               materialize_grads=True)


def _vjp_grads(reference, args, wanted, grads):
    def forward(*primals):
        call = list(args)
        for i, primal in zip(wanted, primals):
            call[i] = primal
        return reference(*call)

    outputs, vjp = torch.func.vjp(forward, *(args[i] for i in wanted))
    if isinstance(outputs, tuple):
        cotangents = tuple(torch.zeros_like(o) if g is None else g for g, o in zip(grads, outputs))
    else:
        cotangents = torch.zeros_like(outputs) if grads[0] is None else grads[0]
    return dict(zip(wanted, vjp(cotangents)))


def _backward(ctx, reference: Callable, grads) -> tuple:
    """The gradient of each argument of ``ctx``'s call (the registered operator's)."""
    args = _saved(ctx)
    wanted = [i for i, need in enumerate(ctx.needs_input_grad) if need]
    found = reference_grads(reference, args, wanted, grads)
    return tuple(found.get(i) for i in range(len(args)))


def differentiate_by_reference(op: str, reference: Callable) -> None:
    """Registers the backward of ``op`` (a qualified name, ``specgen::add``) as the gradient of
    ``reference``, which takes the op's arguments in its order."""

    def backward(ctx, *grads):
        return _backward(ctx, reference, grads)

    torch.library.register_autograd(op, backward,
                                    setup_context=lambda ctx, inputs, output: _save(ctx, inputs))


# how many forwards of a kept call look for its plain call's replay before it stops looking
_INNER_TRIES = 3


class Call:
    """An untraced differentiable call but for its tensors: the op's public function, its
    reference and derived backward, its other arguments, and for a replayed signature
    (``replays``: the op's) the replay of its plain call, once one is recorded (``inner``)."""

    __slots__ = ("function", "reference", "derived", "args", "positions", "replays", "inner",
                 "misses")

    def __init__(self, function: Callable, reference: Callable, derived: Callable | None,
                 args: Sequence[object], positions: Sequence[int], replays=None) -> None:
        self.function, self.reference, self.derived = function, reference, derived
        # the tensors' places left empty: a kept replay must not hold its first call's tensors
        self.args = tuple(None if i in positions else a for i, a in enumerate(args))
        self.positions = tuple(positions)
        self.replays = replays
        self.inner = None
        self.misses = 0

    def arguments(self, tensors: Sequence[torch.Tensor | None]) -> list[object]:
        args = list(self.args)
        for i, tensor in zip(self.positions, tensors):
            args[i] = tensor
        return args

    def forward(self, tensors: Sequence[torch.Tensor | None]):
        """The plain call (grad mode is off). A replayed signature's plain call has a signature
        of its own, the same at every call of this one: its replay, once recorded, serves the
        later calls without the public function's lookup."""
        if self.inner is not None:
            return self.inner(*tensors)
        result = self.function(*self.arguments(tensors))
        if self.replays is not None and self.misses < _INNER_TRIES:
            scalars = [a for i, a in enumerate(self.args) if i not in self.positions]
            self.inner = self.replays.recorded(tensors, scalars)
            # a plain call recorded at its second sighting is found by the second try; one that
            # is never recorded (no replay for it) stops the lookups
            self.misses += self.inner is None
        return result

    def backward(self, tensors: Sequence[torch.Tensor | None], needed: Sequence[bool],
                 grads: tuple) -> tuple:
        """Each tensor's gradient where ``needed``: by the derived backward where it gives every
        one needed, else through the reference."""
        args = self.arguments(tensors)
        found = None if self.derived is None else self.derived(args, grads)
        if found is None or any(need and found[i] is None
                                for i, need in zip(self.positions, needed)):
            wanted = [i for i, need in zip(self.positions, needed) if need]
            by_reference = reference_grads(self.reference, args, wanted, grads)
            found = [by_reference.get(i) for i in range(len(args))]
        return tuple(found[i] if need else None for i, need in zip(self.positions, needed))


class _ByReference(torch.autograd.Function):
    @staticmethod
    def forward(ctx, call, *tensors):
        ctx.save_for_backward(*tensors)
        ctx.call = call
        # grad mode is off in here: the public function takes its plain eager path
        return call.forward(tensors)

    @staticmethod
    def backward(ctx, *grads):
        return (None, *ctx.call.backward(ctx.saved_tensors, ctx.needs_input_grad[1:], grads))


def differentiable_call(function: Callable, reference: Callable, args: Sequence[object],
                        positions: Sequence[int], backward: Callable | None = None):
    """``function(*args)`` (a generated op's public function, its arguments in the op's order;
    ``positions``: its tensors') for an untraced call whose inputs need a gradient: its plain
    eager call, differentiated through ``reference``, or by ``backward(args, output_grads)``
    where that gives every needed gradient (a sequence in argument order; None: it does not
    apply to these arguments)."""
    call = Call(function, reference, backward, args, positions)
    return _by_reference_of(function.__name__).apply(call, *(args[i] for i in positions))


def op_function(op: str, base: type[torch.autograd.Function]) -> type[torch.autograd.Function]:
    """A subclass of ``base`` named for ``op`` (``Specgen<Op>``): torch names a grad_fn after its
    Function's class, so an output of softmax shows grad_fn=<SpecgenSoftmaxBackward>."""
    camel = "".join(part.capitalize() for part in op.split("_"))
    return type(f"Specgen{camel}", (base,), {})


def differentiable_replay(function: Callable, reference: Callable, args: Sequence[object],
                          positions: Sequence[int], backward: Callable | None = None,
                          replays=None) -> Callable:
    """``differentiable_call(function, reference, args, positions, backward)`` for a later call
    of the same signature (runtime/replay.py: the same layouts, the same inputs needing a
    gradient, the same scalars), as a function of its tensors alone: the checks the first call
    passed hold for it, and its other arguments are these. ``replays``: the op's, where its
    plain call's replay may serve the forward (``Call.forward``)."""
    call = Call(function, reference, backward, args, positions, replays)
    return functools.partial(_by_reference_of(function.__name__).apply, call)


def bound_call(apply: Callable, leading: Sequence[object], args: Sequence[object],
               tensor_positions: Sequence[int], name: str, one_tuple: bool = False) -> Callable:
    """``apply(*leading, *args)`` as a function of the tensors at ``tensor_positions`` of
    ``args``, the other arguments bound as they are (their values, not this call's tensors):
    a Python function written for it, so that a replayed call costs one call. ``one_tuple``: its
    result in a 1-tuple (an operator whose public function picks its first result)."""
    scope = {"_apply": apply, **{f"_l{i}": value for i, value in enumerate(leading)},
             **{f"_s{i}": arg for i, arg in enumerate(args) if i not in tensor_positions}}
    exec(_replay_code(len(leading), len(args), tuple(tensor_positions), one_tuple, name), scope)
    return scope["replay"]


@functools.lru_cache(maxsize=1024)
def _replay_code(leading: int, count: int, tensor_positions: tuple[int, ...], one_tuple: bool,
                 name: str):
    """The compiled ``replay`` function of ``bound_call`` (its text depends on the positions
    alone; compiling took a first call some 90 us)."""
    names = [f"_l{i}" for i in range(leading)]
    names += [f"t{i}" if i in tensor_positions else f"_s{i}" for i in range(count)]
    params = ", ".join(f"t{i}" for i in tensor_positions)
    result = f"_apply({', '.join(names)})"
    source = (f"def replay({params}):\n"
              f"    return {f'({result},)' if one_tuple else result}\n")
    return compile(source, f"<specgen {name} differentiable replay>", "exec")


@functools.cache
def _by_reference_of(op: str) -> type[torch.autograd.Function]:
    return op_function(op, _ByReference)


def reference_vjp(forward: Callable, primals: tuple, cotangents: tuple):
    """The vector-Jacobian product of ``forward`` at ``primals`` (the reference of a derived
    backward op): a tensor for one primal, else a tuple. Differentiable again (grad mode on), as
    torch.func's."""
    found = reference_grads(forward, primals, range(len(primals)), cotangents)
    grads = tuple(found[i] for i in range(len(primals)))
    return grads[0] if len(grads) == 1 else grads


@functools.cache
def sibling(module: str, op: str) -> Callable:
    """The public function of ``op``, generated into the package of ``module`` (``__name__`` of
    a generated module: a package's, or a top-level one's in an author's folder)."""
    package = module.rpartition(".")[0]
    return getattr(importlib.import_module(f"{package}.{op}" if package else op), op)

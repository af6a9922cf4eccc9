"""Backward of the generated ops: torch's autograd of the op's reference, at the saved inputs.

Every op whose family has no backward kernel of its own registers ``differentiate_by_reference``:
the forward runs our kernels, the backward recomputes the spec's ``reference`` (torch ops) at the
saved inputs and takes its vector-Jacobian product with ``torch.func.vjp``. So every op, an
author's fused ones included, has exactly torch's gradient, and under torch.compile AOTAutograd
traces the recompute and the backward into the backward graph, where Inductor fuses them. The
price in eager code is a forward recompute and torch's own backward kernels (docs/design.md,
"Backward").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch


def _setup_context(ctx, inputs, output) -> None:
    # tensors through save_for_backward (version-checked: an in-place change before the backward
    # raises), everything else as it came
    ctx.save_for_backward(*(a if isinstance(a, torch.Tensor) else None for a in inputs))
    ctx.scalars = tuple(None if isinstance(a, torch.Tensor) else a for a in inputs)


def reference_grads(reference: Callable, args: Sequence[object], wanted: Sequence[int],
                    grads: Sequence[torch.Tensor | None]) -> dict[int, torch.Tensor]:
    """The gradients of ``reference(*args)`` with respect to ``args[i]`` for each ``i`` in
    ``wanted``, given the gradients of its outputs (None: that output was not used)."""

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


def differentiate_by_reference(op: str, reference: Callable) -> None:
    """Registers the backward of ``op`` (a qualified name, ``specgen::add``) as the
    vector-Jacobian product of ``reference``, which takes the op's arguments in its order."""

    def backward(ctx, *grads):
        args = [s if t is None else t for t, s in zip(ctx.saved_tensors, ctx.scalars)]
        wanted = [i for i, need in enumerate(ctx.needs_input_grad) if need]
        found = reference_grads(reference, args, wanted, grads)
        return tuple(found.get(i) for i in range(len(args)))

    torch.library.register_autograd(op, backward, setup_context=_setup_context)

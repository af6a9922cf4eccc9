"""The gradient check (``tests/test_autograd.py``; an author's package the same way): an op's
backward against the float64 reference's own autograd, for every floating input at once, with
fresh random output gradients."""

from __future__ import annotations

import math

from contextlib import nullcontext

import torch
from hypothesis import assume

from specgen.runtime import OpInfo, override
from specgen.runtime.autograd import grads_of
from specgen.testing.core import (Case, Layout, Observe, assert_matches, make_tensor,
                                  nearby_errors, outputs)

PATHS = ("function", "op", "traced")


def check_grad(info: OpInfo, case: Case, seed: int, path: str = "function") -> None:
    """Calls the op on ``case`` with its floating tensors requiring grad, back-propagates random
    gradients of its floating outputs, and asserts each input's gradient matches.

    ``path``: how the call is made, each taking its own way through runtime/autograd.py:
    "function" (``generated.<name>`` in eager code), "op" (``torch.ops.specgen.<name>``), or
    "traced" (the function under a function mode, which takes the traced path, as under
    torch.compile: the registered op, differentiated by torch.func)."""
    name = info.name
    floating = [k for k, v in case.args.items()
                if isinstance(v, torch.Tensor) and v.is_floating_point()]

    # an input torch refuses a gradient for (cross_entropy's weight) must be refused as well
    for k in list(floating):
        try:
            info.reference(**{**case.args, k: case.args[k].detach().requires_grad_()})
        except RuntimeError as err:
            # torch 2.11's CUDA layer_norm backward, differentiated again (a derived op's
            # reference is its vector-Jacobian product), returns a weight gradient of the wrong
            # shape for a normalized_shape of several size-1 dims: there is no reference to
            # compare with, and the example is discarded (CPU computes it, and is checked)
            assume("returned an invalid gradient" not in str(err))
            try:
                info.function(**{**case.args, k: case.args[k].detach().requires_grad_()})
            except RuntimeError as err:
                assert f"'{k}'" in str(err), f"{name}: the error does not name '{k}': {err}"
            else:
                raise AssertionError(f"{name}: torch refuses a gradient for '{k}', {name} does not")
            floating.remove(k)
    if not floating:
        return

    # the drawn tensors themselves (layout kept: strides, offsets, stride-0 dims), as leaves
    ours = {k: case.args[k].detach().requires_grad_() for k in floating}
    call = {"function": info.function, "op": info.op, "traced": info.function}[path]
    # the case's forced strategy and config reach the backward too (a derived backward op's)
    # allocations start as NaN (check_case's poison), the backward's gradients too
    with override(**case.overrides, poison=True):
        with Observe() if path == "traced" else nullcontext():
            # the registered op may return more (cross_entropy's saved statistics) after them
            # (the registered operator takes its own forms of some arguments: Case.op_args)
            args = case.op_args if path == "op" and case.op_args else case.args
            results = outputs(call(**{**args, **ours}))[:len(info.outputs)]
        differentiable = [o for o in results if o.is_floating_point()]
        if not differentiable:
            # an index result (argmax) is not differentiable: torch gives it no grad_fn either
            assert not any(o.requires_grad for o in results), \
                f"{name}: an index result requires grad"
            return
        cotangents = [make_tensor(o.shape, o.dtype, Layout.contiguous(o.dim()), seed=seed + i,
                                  device=o.device)
                      for i, o in enumerate(differentiable)]
        with Observe() if path == "traced" else nullcontext():
            # every result of ours must be differentiable: autograd.grad raises where one is not
            got = torch.autograd.grad(differentiable, list(ours.values()), cotangents,
                                      allow_unused=True, materialize_grads=True)

    # float64: the reference's arguments (a resolved eps, a dtype= cast) on upcast leaves
    reference_args = case.reference_args or case.args
    want = _reference_grads(info, case.args, reference_args, floating, cotangents, wide=True)
    # (an empty input has no element to bound; torch's CUDA layer_norm backward returns a
    # gradient of the wrong shape for an empty contiguous input)
    empty = any(case.args[k].numel() == 0 for k in floating)
    nearby = nearby_errors(
        0 if empty else case.nearby, len(floating), case.args, reference_args,
        lambda args, args64: (_reference_grads(info, args, args, floating, cotangents),
                              _reference_grads(info, args, args64, floating, cotangents,
                                               wide=True)))

    # torch's own gradient at the drawn dtypes bounds ill-conditioned elements. It has two paths,
    # autograd and torch.func (the one our backward takes), whose float16 CPU matmuls round
    # differently: each element may be off by as much as the worse of the two
    try:
        by_autograd = _reference_grads(info, case.args, case.args, floating, cotangents)
        by_func = _func_grads(info, case.args, floating, cotangents)
    except RuntimeError as err:
        if "returned an invalid gradient" not in str(err):
            raise
        # torch 2.11's CUDA layer_norm backward returns an empty bias gradient for a bias
        # without a weight over many rows: torch's own result at these dtypes comes from its CPU
        # kernels instead
        cpu_args, cpu_cotangents = _on_cpu(case.args), _on_cpu(cotangents)
        by_autograd, by_func = (
            [g.to(got[0].device) for g in grads] for grads in (
                _reference_grads(info, cpu_args, cpu_args, floating, cpu_cotangents),
                _func_grads(info, cpu_args, floating, cpu_cotangents)))

    for k, grad, grad64, grad_a, grad_f, near in zip(floating, got, want, by_autograd, by_func,
                                                      nearby):
        assert grad.dtype == grad_a.dtype, f"{name} grad {k}: dtype"
        worse = torch.where((grad_a.double() - grad64).abs() >= (grad_f.double() - grad64).abs(),
                            grad_a, grad_f)
        # where torch's gradient overflows (float16 and its large intermediates), ours may too
        # (the reference path runs torch's backward; a derived kernel, where its float16 result
        # overflows): there it must equal torch's
        overflow = torch.zeros_like(grad, dtype=torch.bool)
        for theirs in (grad_a, grad_f):
            overflow |= ~theirs.isfinite() & ((grad == theirs) | grad.isnan() & theirs.isnan())
        grad64 = torch.where(overflow, grad.double(), grad64)
        tolerances = case.tolerances
        if case.grad_tolerances is not None:
            # every gradient as precise as the least precise input the backward computes from
            # (ALiBi's float32 slopes get theirs from float16 scores)
            rtol, atol = max(case.grad_tolerances[case.args[name].dtype] for name in floating)
            largest = max(1.0, grad64.abs().max().item()) if grad64.numel() else 1.0
            atol *= largest * math.sqrt(case.grad_sums.get(k, 1))
            tolerances = {dtype: (rtol, atol) for dtype in case.grad_tolerances}
        assert_matches(grad, grad64, f"{name} grad {k}", tolerances, worse, near)


def _reference_grads(info: OpInfo, args: dict, reference_args: dict, floating: list[str],
                     cotangents, wide: bool = False) -> tuple[torch.Tensor, ...]:
    """The reference's gradients by autograd with respect to ``floating``: those of ``args``
    as leaves (layouts kept), the rest of its arguments from ``reference_args``. ``wide``: in
    float64, every floating tensor upcast."""
    def dtype(t):
        return torch.float64 if wide else t.dtype

    device = args[floating[0]].device
    if wide:
        # float64 on the CPU: torch 2.11's CUDA layer_norm and rms_norm backwards drop or
        # misshape a gradient on some layouts (a bias without a weight over many rows: an empty
        # or a zero gradient; a normalized_shape of several size-1 dims: a weight gradient of
        # the wrong shape); the CPU's kernels are the reference
        args, reference_args, cotangents = (_on_cpu(args), _on_cpu(reference_args),
                                            _on_cpu(cotangents))
    leaves = {k: args[k].detach().to(dtype(args[k])).requires_grad_() for k in floating}
    call = {k: leaves[k] if k in leaves else
            v.to(dtype(v)) if isinstance(v, torch.Tensor) and v.is_floating_point() else v
            for k, v in reference_args.items()}
    results = [o for o in outputs(info.reference(**call)) if o.is_floating_point()]
    grads = grads_of(results, list(leaves.values()), [c.to(dtype(c)) for c in cotangents])
    return tuple(g.to(device) for g in grads)


def _on_cpu(values):
    """``values`` (a dict of arguments or a list of tensors) with every tensor on the CPU, its
    layout kept."""
    def move(v):
        return v.detach().to("cpu") if isinstance(v, torch.Tensor) else v
    if isinstance(values, dict):
        return {k: move(v) for k, v in values.items()}
    return [move(v) for v in values]


def _func_grads(info: OpInfo, args: dict, floating: list[str], cotangents):
    """The reference's gradient by ``torch.func.vjp`` (zeros for an unused input, as autograd's)."""

    def reference(*primals):
        results = outputs(info.reference(**{**args, **dict(zip(floating, primals))}))
        return tuple(o for o in results if o.is_floating_point())

    _, vjp = torch.func.vjp(reference, *(args[k] for k in floating))
    return vjp(tuple(cotangents))

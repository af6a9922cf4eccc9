"""Argument checks run before any launch; each error names the op, the argument and the problem."""

from __future__ import annotations

import numbers
import operator
from typing import Mapping, Sequence

import torch
from torch._C._functorch import TransformType
from torch.autograd import forward_ad

from specgen.runtime.context import interpreting, transforms_active
from specgen.runtime.layout import broadcast_shapes, has_internal_overlap, storage_span

DTYPE_NAMES = {dtype: str(dtype).removeprefix("torch.") for dtype in (
    torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.bool, torch.uint8,
    torch.int8, torch.int16, torch.int32, torch.int64)}


def _dtype_list(dtypes: Sequence[torch.dtype]) -> str:
    return ", ".join(DTYPE_NAMES.get(d, str(d)) for d in dtypes)


def check_tensor_types(op: str, tensors: Mapping[str, object],
                       optional: Sequence[str] = (), differentiable: bool = True) -> None:
    """TypeError for a non-tensor where a tensor is required (``None`` omits an ``optional``);
    NotImplementedError for a tensor under torch.func.grad, or under forward-mode AD where the
    op has a gradient (argmax's indices have none: they come out the same)."""
    for name, value in tensors.items():
        if not isinstance(value, torch.Tensor) and not (value is None and name in optional):
            raise TypeError(f"{op}: argument '{name}' must be a torch.Tensor, "
                            f"got {type(value).__name__}")
    # the cheap test first: every eager call makes it
    if transforms_active() and not torch.compiler.is_compiling():
        levels = {i.level(): i.key() for i in torch._C._functorch.get_interpreter_stack() or ()}
        for name, value in tensors.items():
            if value is not None:
                _check_transforms(op, name, value, differentiable, levels)


# what the registered op cannot serve: torch's custom-op autograd is an autograd.Function that
# torch.func.grad refuses, and it has no jvp, so forward-mode AD through it would drop the
# tangent without a word. vmap batches the registered op.
_GRAD = "torch.func.grad (or vjp, jacrev)"
_FORWARD_AD = "forward-mode AD (torch.func.jvp, jacfwd, torch.autograd.forward_ad)"
_REVERSE_MODE = ("specgen ops differentiate in reverse mode, with torch.autograd (.backward(), "
                 "torch.autograd.grad), and run under torch.func.vmap")


def _check_transforms(op: str, name: str, tensor: torch.Tensor, differentiable: bool,
                      levels: Mapping[int, TransformType]) -> None:
    """``levels``: the active torch.func transforms by level; a wrapped tensor names its own."""
    refused = {TransformType.Grad: _GRAD}
    if differentiable:
        refused[TransformType.Jvp] = _FORWARD_AD
        if forward_ad._current_level >= 0 and forward_ad.unpack_dual(tensor).tangent is not None:
            raise NotImplementedError(f"{op}: argument '{name}' carries a tangent of "
                                      f"{_FORWARD_AD}; {_REVERSE_MODE}")
    while torch._C._functorch.is_functorch_wrapped_tensor(tensor):
        transform = levels.get(torch._C._functorch.maybe_get_level(tensor))
        if transform in refused:
            raise NotImplementedError(f"{op}: argument '{name}' is traced by {refused[transform]}; "
                                      f"{_REVERSE_MODE}")
        tensor = torch._C._functorch.get_unwrapped(tensor)


# why check_no_grad refuses an out= call: the public function's out= and the registered out= op
OUT_NOT_DIFFERENTIABLE = "a call with out= is not differentiable (as in torch)"


def check_no_grad(op: str, tensors: Mapping[str, torch.Tensor | None], why: str) -> None:
    """RuntimeError, as torch raises, for an argument that requires grad (grad mode on) in a call
    torch does not differentiate through it; ``why`` says which rule."""
    if not torch.is_grad_enabled():
        return
    for name, tensor in tensors.items():
        if tensor is not None and tensor.requires_grad:
            raise RuntimeError(f"{op}: argument '{name}' requires grad, but {why}")


def check_tensors(op: str, tensors: Mapping[str, torch.Tensor],
                  dtypes: Sequence[torch.dtype]) -> torch.device:
    """Same device for all, a device the kernels run on, a supported dtype. Returns the device.

    Non-tensors never get here: public functions reject them first (``check_tensor_types``) and
    the registered op's schema rejects them for direct ``torch.ops`` calls."""
    first_name, first = next(iter(tensors.items()))
    for name, tensor in tensors.items():
        if tensor.dtype not in dtypes:
            raise TypeError(f"{op}: argument '{name}' has dtype {tensor.dtype}; "
                            f"supported: {_dtype_list(dtypes)}")
    check_same_device(op, first_name, first.device, tensors)
    device = first.device
    if device.type not in ("cuda", "meta") and not interpreting():
        raise ValueError(f"{op}: argument '{first_name}' is on {device}; specgen kernels run on "
                         f"CUDA tensors (or on CPU tensors under TRITON_INTERPRET=1)")
    return device


def check_interpreted_dot(op: str, dtype: torch.dtype, device: torch.device) -> None:
    """Refuses a bfloat16 ``tl.dot`` under Triton's interpreter, which multiplies its raw bit
    patterns: errors of 1e9, silently (meta tensors launch nothing and pass)."""
    if interpreting() and dtype == torch.bfloat16 and device.type != "meta":
        raise NotImplementedError(
            f"{op}: Triton's interpreter (TRITON_INTERPRET=1) computes a bfloat16 matrix product "
            f"wrongly; run bfloat16 inputs on a GPU, or use float16 or float32 under the "
            f"interpreter")


def check_same_device(op: str, first_name: str, device: torch.device,
                      tensors: Mapping[str, torch.Tensor]) -> None:
    """Every tensor on ``device``, the first argument's (``first_name``)."""
    for name, tensor in tensors.items():
        if tensor.device != device:
            raise ValueError(f"{op}: arguments '{first_name}' ({device}) and '{name}' "
                             f"({tensor.device}) are on different devices")


def broadcast_shape(op: str, tensors: Mapping[str, torch.Tensor]) -> tuple[int, ...]:
    shape = broadcast_shapes(*(tuple(t.shape) for t in tensors.values()))
    if shape is None:
        listed = ", ".join(f"'{n}' {tuple(t.shape)}" for n, t in tensors.items())
        raise ValueError(f"{op}: shapes do not broadcast: {listed}")
    return shape


def check_choice(op: str, name: str, value: object, choices: Sequence[str]) -> None:
    if value not in choices:
        allowed = ", ".join(repr(c) for c in choices)
        raise ValueError(f"{op}: argument '{name}' must be one of {allowed}, got {value!r}")


def as_int(value: object, tensors: bool = True, listed: bool = False) -> int | torch.SymInt | None:
    """``value`` as torch's argument parser takes an int (a Python or numpy int, torch.compile's
    symbolic int, a 0-dim integer tensor where ``tensors``), or None where it is none (a bool, a
    float). ``listed``: an int list or one of its ints (a reduction's dims, a normalized_shape),
    where torch takes any one-element tensor of an integer or bool dtype."""
    if type(value) is int or isinstance(value, torch.SymInt):
        return value   # the common case first; a symbolic int stays symbolic (also under dynamo)
    if isinstance(value, torch.Tensor):
        integral = not (value.is_floating_point() or value.is_complex())
        taken = value.numel() == 1 if listed else value.dim() == 0 and value.dtype != torch.bool
        return int(value) if tensors and integral and taken else None
    # numpy's ints are Integral, its bool is not; tested before converting, as dynamo cannot
    # trace an operator.index that raises
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return operator.index(value)
    return None


def as_scalar(op: str, name: str, value: object, kind: type, optional: bool = False) -> object:
    """A scalar argument as the op takes it, or TypeError. As torch's argument parser: an int
    passes for a float and a bool for nothing else; numpy scalars and 0-dim tensors pass, as
    Python numbers (a kernel launch takes no numpy scalar); torch.compile's symbolic ints and
    floats pass unchanged. ``optional``: None passes too."""
    if optional and value is None:
        return None
    if kind is bool:
        result = value if isinstance(value, bool) else None
    elif type(value) in (int, float) and kind is float:
        result = value
    else:
        result = as_int(value)
        if result is None and kind is float and not isinstance(value, bool):
            result = _as_float(value)
    if result is None:
        kind_of = type(value)
        # numpy.bool is no bool: name the module where it is not a builtin
        got = (kind_of.__name__ if kind_of.__module__ == "builtins"
               else f"{kind_of.__module__}.{kind_of.__qualname__}")
        raise TypeError(f"{op}: argument '{name}' must be {kind.__name__}, got {got}")
    return result


def _as_float(value: object) -> float | torch.SymFloat | None:
    if isinstance(value, torch.SymFloat):
        return value
    if isinstance(value, torch.Tensor):
        real = not (value.is_complex() or value.dtype == torch.bool)
        return float(value) if value.dim() == 0 and real else None
    return float(value) if isinstance(value, numbers.Real) else None


def check_dtype_arg(op: str, name: str, value: object, dtypes: Sequence[torch.dtype],
                    optional: bool = True) -> None:
    """A ``dtype=`` argument: None (the input's dtype) where ``optional``, or one of the op's
    dtypes."""
    if value is None and optional:
        return
    if value is None:
        raise TypeError(f"{op}: argument '{name}' must be a torch.dtype, got None")
    if not isinstance(value, torch.dtype):
        raise TypeError(f"{op}: argument '{name}' must be a torch.dtype or None, "
                        f"got {type(value).__name__}")
    if value not in dtypes:
        raise TypeError(f"{op}: argument '{name}' is {value}; supported: {_dtype_list(dtypes)}")


def is_real(tensor: torch.Tensor) -> bool:
    """Real memory to compare (fake tensors under torch.compile have no data pointer)."""
    from torch._subclasses.fake_tensor import is_fake
    return tensor.device.type != "meta" and not is_fake(tensor)


def _byte_range(tensor: torch.Tensor) -> tuple[int, int]:
    start = tensor.data_ptr()
    return start, start + storage_span(tensor) * tensor.element_size()


def _overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two real, non-empty tensors of one storage share a byte range (conservative:
    views that interleave without sharing an element count as overlapping)."""
    if a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr():
        return False
    a_start, a_end = _byte_range(a)
    b_start, b_end = _byte_range(b)
    return a_start < b_end and b_start < a_end


def check_out(op: str, name: str, out: torch.Tensor, shape: tuple[int, ...],
              device: torch.device, dtypes: Sequence[torch.dtype],
              inputs: Mapping[str, torch.Tensor]) -> None:
    """An ``out=`` tensor must match, must not overlap itself, and may alias an input only exactly.

    Exact aliasing (``add(x, y, out=x)``) is what torch allows for element-wise ops: every element
    is read and written by the same lane. Partial overlap would make the result depend on timing.
    """
    if tuple(out.shape) != shape:
        raise ValueError(f"{op}: '{name}' has shape {tuple(out.shape)}, expected {shape}")
    if out.device != device:
        raise ValueError(f"{op}: '{name}' is on {out.device}, the inputs on {device}")
    if out.dtype not in dtypes:
        raise TypeError(f"{op}: '{name}' has dtype {out.dtype}; supported: {_dtype_list(dtypes)}")
    # overlaps are RuntimeErrors, as torch raises them ("unsupported operation: ...")
    if has_internal_overlap(out):
        raise RuntimeError(f"{op}: '{name}' has elements that share memory (stride "
                           f"{out.stride()}); an output must not overlap itself")
    if not is_real(out) or out.numel() == 0:
        return
    for input_name, tensor in inputs.items():
        if tensor is None or tensor.numel() == 0 or not is_real(tensor):
            continue
        if not _overlap(tensor, out):
            continue
        exact = (tensor.data_ptr() == out.data_ptr() and tensor.shape == out.shape
                 and tensor.stride() == out.stride() and tensor.dtype == out.dtype)
        if not exact:
            raise RuntimeError(f"{op}: '{name}' overlaps input '{input_name}' in memory; an output "
                               f"may only be the very same tensor as an input, not part of one")


def check_outs_disjoint(op: str, outs: Mapping[str, torch.Tensor]) -> None:
    """The ``out=`` tensors of a multi-output op must not share memory: each element of each is
    written by one lane, and two outputs at one address would keep whichever lane wrote last.
    Compared by byte ranges, as inputs are in ``check_out``: views that interleave without
    sharing an element (``t[:, ::2]`` and ``t[:, 1::2]``) are refused too."""
    real = [(name, out) for name, out in outs.items() if is_real(out) and out.numel() > 0]
    for i, (name, out) in enumerate(real):
        for other_name, other in real[:i]:
            if _overlap(other, out):
                raise RuntimeError(f"{op}: outputs '{other_name}' and '{name}' overlap in memory; "
                                   f"each output needs memory of its own")

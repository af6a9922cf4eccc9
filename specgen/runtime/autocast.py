"""torch.autocast for generated ops: a spec's ``autocast`` policy, applied as torch applies the
policy of the op's torch counterpart (the op lists of aten/src/ATen/autocast_mode.h).

A public function applies it first, before its replay lookup and its checks, so that eager calls,
their replays and traced calls agree: dynamo traces these calls and guards on the autocast state.
The policies:

- "lower" (torch's matmuls, linear): every floating input that is not float64 is cast to the
  autocast dtype of its device type;
- "float32" (torch's norms, logsumexp, losses): those inputs are cast to float32; an op with a
  ``dtype=`` argument (softmax, log_softmax, sum, prod) gets ``dtype=float32`` instead when none
  is given and its first input is such a tensor, so that it reads its input as it is (torch's
  ``fp32_set_opt_dtype``).

As in torch, a cast copies (a tensor already in its target dtype is passed as it is), a tensor on
a device type whose autocast is off is left alone, and calls with ``out=`` are not autocast.
"""

from __future__ import annotations

import torch


def following(policy: str, operator: str) -> str:
    """``policy`` where this torch autocasts ``operator`` on CUDA, else "none": for a policy
    torch's lists took up in some release (rms_norm's float32: torch 2.13 has it, 2.11 not)."""
    return policy if torch._C._dispatch_has_kernel_for_dispatch_key(operator, "AutocastCUDA") \
        else "none"


def active() -> bool:
    """Whether autocast is on for any device type: one call, cheap enough for every call."""
    return torch._C._is_any_autocast_enabled()



def _target(t: object, policy: str) -> torch.dtype | None:
    """The dtype torch's autocast casts ``t`` to under ``policy``, or None where it leaves ``t``
    alone: not a floating tensor (argument checks report non-tensors later), float64, or on a
    device type whose autocast is off."""
    if not isinstance(t, torch.Tensor) or not t.is_floating_point() or t.dtype == torch.float64:
        return None
    device_type = t.device.type
    if not torch.is_autocast_enabled(device_type):
        return None
    return torch.get_autocast_dtype(device_type) if policy == "lower" else torch.float32


def cast(policy: str, *tensors: object) -> tuple[object, ...]:
    """``tensors`` as torch's autocast passes them to an op of ``policy`` (None stays None)."""
    targets = [_target(t, policy) for t in tensors]
    return tuple(t if target is None else t.to(target) for t, target in zip(tensors, targets))


def result_dtype(x: object, dtype: torch.dtype | None) -> torch.dtype | None:
    """``dtype``, or float32 where torch's autocast sets an unset ``dtype=`` argument: the first
    input ``x`` is a tensor autocast would cast to float32."""
    if dtype is None and _target(x, "float32") is not None:
        return torch.float32
    return dtype

"""Weight quantization in the formats the quantized linear ops take (specs/int8_weight_linear.toml,
specs/int4_weight_linear.toml, specs/int8_linear.toml), and the dequantization that defines them.

- int8, symmetric per output channel: ``w[n, k] ~ qweight[n, k] * scales[n]``, qweight int8
  (N, K) in [-127, 127], scales (N,); activations for ``int8_linear`` the same way per token
  (``quantize_int8_per_token``: float32 scales (..., 1)).
- int4, asymmetric per group of ``group_size`` K elements: ``w[n, k] ~ (q[n, k] - zeros[n, g]) *
  scales[n, g]`` with g = k // group_size, q in [0, 15] packed two a byte along K (element 2c in
  the low nibble of byte c, 2c + 1 in the high one): qweight uint8 (N, K // 2), scales and zeros
  (N, K // group_size).

Scales and zero points have the weight's dtype, as the ops take them (the activations' dtype);
the integers are computed against the stored (rounded) scales, so dequantizing gives the
weight each integer stands for.
"""

from __future__ import annotations

import torch

INT8_MAX = 127
INT4_MAX = 15
GROUP_SIZES = (32, 64, 128, 256)


def is_group_size(value: object, least: int) -> bool:
    """Whether ``value`` is a group size a quantized matmul takes: an int, a power of two (a K
    block lies in one group: BLOCK_K is clamped to it), at least the least BLOCK_K its dots
    take (``least``). The launch checks a call's (runtime.matmul.check_group), the parser a
    group argument's default."""
    return type(value) is int and value >= least and not value & (value - 1)


def _check_weight(w: object, what: str) -> torch.Tensor:
    if not isinstance(w, torch.Tensor) or w.dim() != 2 or not w.is_floating_point():
        got = f"a {w.dim()}-D {w.dtype} tensor" if isinstance(w, torch.Tensor) else type(w).__name__
        raise ValueError(f"{what}: expected a 2-D floating weight (N, K), got {got}")
    return w


def quantize_int8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(qweight int8 (N, K), scales (N,) in w's dtype): each output channel scaled so that its
    largest magnitude is 127."""
    w = _check_weight(w, "quantize_int8")
    qweight, scales = _symmetric_int8_rows(w, w.dtype)
    return qweight, scales[:, 0]


def quantize_int8_per_token(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(x_int8 (..., K), x_scale (..., 1) float32): activations for ``int8_linear``, each row
    (token) scaled so that its largest magnitude is 127, as ``quantize_int8`` scales a weight's
    output channels."""
    if not isinstance(x, torch.Tensor) or x.dim() == 0 or not x.is_floating_point():
        got = f"a {x.dim()}-D {x.dtype} tensor" if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"quantize_int8_per_token: expected a floating tensor (..., K), got {got}")
    return _symmetric_int8_rows(x, torch.float32)


def _symmetric_int8_rows(t: torch.Tensor, scale_dtype: torch.dtype
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row of ``t`` (along its last dim) as int8 in [-127, 127] and its scale (..., 1) in
    ``scale_dtype``, the integers computed against the stored (rounded) scale."""
    wide = t.float()
    # an all-zero row keeps a scale of 1 (its integers are 0 whatever the scale)
    amax = wide.abs().amax(dim=-1, keepdim=True)
    scale = torch.where(amax > 0, amax / INT8_MAX, torch.ones_like(amax)).to(scale_dtype)
    q = torch.round(wide / scale.float()).clamp(-INT8_MAX, INT8_MAX)
    return q.to(torch.int8), scale


def quantize_int4(w: torch.Tensor, group_size: int = 128
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(qweight uint8 (N, K // 2), scales (N, K // group_size), zeros (N, K // group_size)):
    each group's range [min, max] (widened to hold 0) mapped onto 0..15."""
    w = _check_weight(w, "quantize_int4")
    n, k = w.shape
    if group_size not in GROUP_SIZES:
        raise ValueError(f"quantize_int4: group_size must be one of {GROUP_SIZES}, got {group_size!r}")
    if k % group_size:
        raise ValueError(f"quantize_int4: K = {k} is not a multiple of group_size = {group_size}")
    groups = w.float().reshape(n, k // group_size, group_size)
    low = groups.amin(dim=2).clamp(max=0)
    high = groups.amax(dim=2).clamp(min=0)
    span = high - low
    scales = torch.where(span > 0, span / INT4_MAX, torch.ones_like(span)).to(w.dtype)
    zeros = torch.round(-low / scales.float()).clamp(0, INT4_MAX).to(w.dtype)
    q = torch.round(groups / scales.float()[..., None]) + zeros.float()[..., None]
    q = q.clamp(0, INT4_MAX).to(torch.uint8).reshape(n, k)
    return pack_int4(q), scales, zeros


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """(N, K) values in 0..15 as (N, K // 2) bytes: element 2c in the low nibble of byte c."""
    return (q[:, 0::2] | (q[:, 1::2] << 4)).to(torch.uint8)


def unpack_int4(qweight: torch.Tensor) -> torch.Tensor:
    """The (N, K) uint8 values 0..15 of a packed (N, K // 2) int4 weight."""
    low, high = qweight & 0xF, qweight >> 4
    return torch.stack((low, high), dim=-1).reshape(qweight.shape[0], 2 * qweight.shape[1])


def dequantize_int8(qweight: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """The weight int8 ``qweight`` (N, K) and ``scales`` (N,) stand for, in the scales' dtype
    (scales of shape (1,) are one scale for every channel, as the op takes them too)."""
    return qweight.to(scales.dtype) * scales.reshape(-1, 1)


def dequantize_int4(qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
                    group_size: int) -> torch.Tensor:
    """The (N, K) weight a packed int4 ``qweight`` with per-group ``scales`` and ``zeros`` stands
    for, in the scales' dtype."""
    n, groups = scales.shape
    q = unpack_int4(qweight).to(scales.dtype).reshape(n, groups, group_size)
    return ((q - zeros[..., None]) * scales[..., None]).reshape(n, groups * group_size)

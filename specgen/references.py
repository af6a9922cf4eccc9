"""Torch computations a spec's reference may call as ``ref.<name>``, where torch's own function
takes less than the op does. Each is made of torch ops, so autograd gives torch's gradient."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch._prims_common import suggest_memory_format


def prod(x: torch.Tensor, dim: int | Sequence[int] | None = None, keepdim: bool = False,
         dtype: torch.dtype | None = None) -> torch.Tensor:
    """``torch.prod`` over an int, a sequence of ints or None (every dim; also an empty
    sequence), as ``torch.sum`` takes dims; torch.prod takes one int. One dim at a time, so its
    gradient is torch.prod's, exact at zeros and negative values (exp(sum(log x)) is NaN there)."""
    if dim is None or not isinstance(dim, int) and len(dim) == 0:
        dims = range(x.dim())
    else:
        dims = [dim] if isinstance(dim, int) else dim
    if x.dim() == 0:
        # torch.prod of the one element (its dtype= and autocast's as for any dims)
        return torch.prod(x, dtype=dtype)
    # the highest dim first: without keepdim, the lower dims keep their positions; dtype= on
    # each, as torch.prod's (under autocast an unset one is float32 in each, as in torch.prod)
    for d in sorted({d % x.dim() for d in dims}, reverse=True):
        x = torch.prod(x, d, keepdim=keepdim, dtype=dtype)
    return x


def rms_norm(x: torch.Tensor, normalized_shape: Sequence[int], weight: torch.Tensor | None = None,
             eps: float | None = None) -> torch.Tensor:
    """``F.rms_norm`` spelled out in torch ops: the same math (16-bit inputs in float32, times
    the weight, the result in x's dtype and suggested memory format), with no
    ``normalized_shape`` in any op. torch 2.11's AOTAutograd bakes a symbolic
    ``normalized_shape`` (``x.shape[-1]`` under dynamic shapes) into the CUDA backward graph of
    ``aten._fused_rms_norm`` as a garbage int, so a traced backward through the reference raised
    "Expected weight to be of same shape as normalized_shape"."""
    dims = tuple(range(-len(normalized_shape), 0))
    wide = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    if eps is None:
        eps = torch.finfo(wide.dtype).eps   # F.rms_norm's default: its math dtype's
    out = wide * torch.rsqrt(wide.pow(2).mean(dims, keepdim=True) + eps)
    if weight is not None:
        out = out * weight
    # x's dtype whatever the weight's, as F.rms_norm returns
    return out.to(x.dtype).contiguous(memory_format=torch._prims_common.suggest_memory_format(x))


def _attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
               scale: float | None, score=None, visible=None) -> torch.Tensor:
    """softmax(score(query @ key.T * scale) where visible) @ value, in the inputs' dtype; a row
    that sees no key gives zeros (as torch's math backend). ``score(s, i, j)`` and
    ``visible(i, j)`` take the query rows ``i`` and key columns ``j`` as broadcasting indices;
    ``score`` sees the heads' dim as the scores' third from last."""
    length, keys = query.shape[-2], key.shape[-2]
    if scale is None:
        scale = 1.0 / math.sqrt(query.shape[-1]) if query.shape[-1] else 1.0
    s = torch.matmul(query, key.transpose(-2, -1)) * scale
    i = torch.arange(length, device=query.device)[:, None]
    j = torch.arange(keys, device=query.device)[None, :]
    if score is not None:
        s = score(s, i, j)
    if visible is not None:
        # (L, S), or any shape that broadcasts against the scores (a bound per batch element)
        seen = visible(i, j)
        s = s.masked_fill(~seen, float("-inf"))
        weights = torch.softmax(s, dim=-1)
        weights = torch.where(seen.any(-1, keepdim=True), weights, 0.0)
    else:
        weights = torch.softmax(s, dim=-1)
    return torch.matmul(weights, value)


def _causal(is_causal: bool):
    return (lambda i, j: j <= i) if is_causal else None


def softcap_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      softcap: float, is_causal: bool = False,
                      scale: float | None = None) -> torch.Tensor:
    """Attention whose scores are soft-capped (Gemma 2): s = softcap * tanh(s / softcap); a
    softcap of 0 leaves them as they are (FlashAttention's softcap=0.0)."""
    capped = None if softcap == 0 else lambda s, i, j: softcap * torch.tanh(s / softcap)
    return _attention(query, key, value, scale, score=capped, visible=_causal(is_causal))


def alibi_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    slopes: torch.Tensor, is_causal: bool = False,
                    scale: float | None = None) -> torch.Tensor:
    """Attention with ALiBi biases: s = s - slopes[h] * |i - j|, a slope per query head."""
    def score(s, i, j):
        return s - slopes.to(s.dtype)[:, None, None] * (i - j).abs().to(s.dtype)
    return _attention(query, key, value, scale, score=score, visible=_causal(is_causal))


def sliding_window_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                             window: int, scale: float | None = None) -> torch.Tensor:
    """Causal attention over the last ``window`` keys: query i sees keys i - window < j <= i."""
    return _attention(query, key, value, scale,
                      visible=lambda i, j: (j <= i) & (j > i - window))


def decode_attention(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                     cache_seqlens: torch.Tensor, scale: float | None = None,
                     enable_gqa: bool = False) -> torch.Tensor:
    """Attention of the last ``L`` queries of each batch element against its KV cache: batch b
    uses keys ``[0, cache_seqlens[b])``, query row i sees keys ``j <= cache_seqlens[b] - L + i``
    (bottom-right aligned); a batch element with no keys gives zeros."""
    heads, heads_kv = query.shape[-3], key_cache.shape[-3]
    if enable_gqa and heads != heads_kv:
        key_cache = key_cache.repeat_interleave(heads // heads_kv, dim=-3)
        value_cache = value_cache.repeat_interleave(heads // heads_kv, dim=-3)
    # (B, 1, 1, 1) lengths: each batch element's own bound
    lengths = cache_seqlens.reshape(-1, 1, 1, 1).to(query.device)
    return _attention(query, key_cache, value_cache, scale,
                      visible=lambda i, j: j <= lengths - query.shape[-2] + i)


def scaled_dot_product_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                                 attn_mask: torch.Tensor | None = None, dropout_p: float = 0.0,
                                 is_causal: bool = False, scale: float | None = None,
                                 enable_gqa: bool = False) -> torch.Tensor:
    """torch's scaled_dot_product_attention through its math backend: torch's semantics on every
    device and layout, and its gradient for every argument. On CUDA its flash and efficient
    backends need a mask's last dim contiguous and refuse a mask's gradient; and a backward
    through them (our ops differentiate through their reference) was 7x further from the
    float64 gradient than torch's own call, on a float16 case of odd strides (H100, torch 2.11;
    the cause not found)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.MATH):
        return torch.nn.functional.scaled_dot_product_attention(
            query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
            scale=scale, enable_gqa=enable_gqa)


def int8_weight_linear(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                       bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ (qweight * scales[:, None]).T + bias``: an int8 weight, per-channel scales."""
    from specgen.quant import dequantize_int8
    return torch.nn.functional.linear(x, dequantize_int8(qweight, scales), bias)


def int4_weight_linear(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                       zeros: torch.Tensor, group_size: int = 128,
                       bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ w.T + bias``, w the packed int4 weight dequantized per group (specgen.quant)."""
    from specgen.quant import dequantize_int4
    return torch.nn.functional.linear(x, dequantize_int4(qweight, scales, zeros, group_size), bias)


def int8_linear(x: torch.Tensor, x_scale: torch.Tensor, qweight: torch.Tensor,
                w_scale: torch.Tensor, bias: torch.Tensor | None = None,
                out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """W8A8: the int8 product (in float64, exact below 2**53), times the per-token scales
    ``x_scale`` ((..., 1), of x's rank, or (...,)) and the per-channel ``w_scale``, plus bias, in out_dtype."""
    if x_scale.dim() != x.dim():    # (..., M) rather than (..., M, 1): a column as well
        x_scale = x_scale[..., None]
    wide = torch.float64 if x_scale.dtype == torch.float64 else torch.float32
    product = x.to(torch.float64) @ qweight.to(torch.float64).T
    y = product.to(wide) * x_scale.to(wide) * w_scale.to(wide)
    if bias is not None:
        y = y + bias.to(wide)
    # (aten's _to_copy rather than Tensor.to: the registered op's backward, traced by
    # AOTAutograd, may hand the dtype argument back as its ScalarType number)
    return torch.ops.aten._to_copy.default(y, dtype=out_dtype)


def _as_float(t: torch.Tensor) -> torch.Tensor:
    """``t`` in float32 with its strides (``t.float()`` lays a tensor with gaps out in the
    format its strides suggest, which for an ambiguous shape, a (2, 1, 1, 1) weight of strides
    (2, 1, 2, 1), changes the format torch's convolution picks)."""
    return torch.empty_strided(t.shape, t.stride(), dtype=torch.float32,
                               device=t.device).copy_(t)


def conv2d(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           stride=1, padding=0, dilation=1, groups: int = 1) -> torch.Tensor:
    """torch's conv2d, also taking padding as the registered operator spells it out: four ints,
    (top, bottom, left, right), which may differ ("same" with an even filter)."""
    if isinstance(padding, (list, tuple)) and len(padding) == 4:
        top, bottom, left, right = padding
        if top != bottom or left != right:
            input = torch.nn.functional.pad(input, (left, right, top, bottom))
            padding = 0
        else:
            padding = (top, left)
    if input.device.type == "cpu" and weight.dim() == 4:
        # torch 2.13's CPU backward (slow_conv2d) raises "grad_weight must be contiguous" for a
        # weight whose strides are not its memory format's own (a (1, 2, 1, 2) weight with
        # strides (4, 1, 2, 2) beside a channels-last input); the op's backward goes through
        # this reference. A copy in the same format keeps torch's output format, where the copy
        # still reads as that format: a (2, 1, 1, 1) weight of strides (2, 1, 2, 1) reads
        # channels-last, its copy, strides (1, 1, 1, 1), contiguous (and backward takes it as is)
        fmt = suggest_memory_format(weight)
        if weight.stride() != torch.empty_like(weight, memory_format=fmt).stride():
            copy = weight.clone(memory_format=fmt)
            if suggest_memory_format(copy) == fmt:
                weight = copy
    if input.device.type == "cpu" and input.dtype in (torch.float16, torch.bfloat16):
        # torch 2.13's CPU float16 convolution computes a wrong weight gradient for a batch of
        # one whose batch stride is not the dense one (a channels-last x.view_as(x), which
        # autograd through this reference makes), e.g. off by 9.5 for a (1, 4, 2, 2) input
        # with groups=2; float32 has no such bug (and rounds once, at the end)
        dtype = input.dtype
        return torch.nn.functional.conv2d(
            _as_float(input), _as_float(weight), None if bias is None else bias.float(), stride,
            padding, dilation, groups).to(dtype)
    return torch.nn.functional.conv2d(input, weight, bias, stride, padding, dilation, groups)

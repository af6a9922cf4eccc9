"""torch.autocast's policies for the shipped ops' torch counterparts, and the arguments torch's
autocast hands on under them: what tests/test_autocast.py and the GPU tier check our ops against.
Written out from torch (the CUDA op lists of aten/src/ATen/autocast_mode.h), not read from the
specs, so that a spec declaring another policy fails.
"""

import torch

# torch.autocast's policy for each op's torch counterpart; an op not named runs as it is:
# "lower": floating inputs (not float64) cast to the autocast dtype (torch's matmuls; a fused
#   matmul takes its matmul's policy);
# "float32": those inputs cast to float32 (layer_norm, rms_norm, logsumexp, and cross_entropy,
#   whose log_softmax and nll_loss torch runs in float32);
# "float32 dtype": an unset dtype= set to float32 when the first input is such a tensor
#   (softmax, log_softmax, sum, prod: torch's fp32_set_opt_dtype)
TORCH_POLICY = {
    "mm": "lower", "bmm": "lower", "matmul": "lower", "addmm": "lower", "linear": "lower",
    "linear_gelu": "lower", "linear_residual": "lower",
    "layer_norm": "float32", "logsumexp": "float32",
    "cross_entropy": "float32",
    "softmax": "float32 dtype", "log_softmax": "float32 dtype", "sum": "float32 dtype",
    "prod": "float32 dtype",
    "scaled_dot_product_attention": "lower",
    # attention variants written as specs: their references' matmuls take torch's "lower"
    "softcap_attention": "lower", "alibi_attention": "lower", "sliding_window_attention": "lower",
    "decode_attention": "lower",
    # weight-only quantized linears: their references end in F.linear, which autocast casts (the
    # integer weight is left as it is; int8_linear, all integers and float32 scales, is not cast)
    "int8_weight_linear": "lower", "int4_weight_linear": "lower",
    # convolutions: torch autocasts conv2d, and the fused one's reference starts with it
    "conv2d": "lower", "conv2d_bias_silu": "lower",
}
# rms_norm joined torch's float32 list after torch 2.11: its policy is the running torch's
if torch._C._dispatch_has_kernel_for_dispatch_key("aten::rms_norm", "AutocastCUDA"):
    TORCH_POLICY["rms_norm"] = "float32"

# the arguments torch's autocast leaves as they are: linear_residual's reference is
# F.linear(x, weight, bias) + residual, and autocast casts F.linear's arguments, not the `+`'s
UNCAST = {"linear_residual": {"residual"},
          # ALiBi's slopes meet the scores after the matmul, which is what autocast casts
          "alibi_attention": {"slopes"}}


def _eligible(value) -> bool:
    return isinstance(value, torch.Tensor) and value.is_floating_point() and \
        value.dtype != torch.float64


def torch_autocast_args(name: str, args: dict, dtype: torch.dtype) -> dict:
    """The arguments torch's autocast hands on to ``name``'s counterpart under ``dtype``."""
    policy = TORCH_POLICY.get(name)
    if policy is None:
        return args
    if policy == "float32 dtype":
        first = next(iter(args.values()))
        if args.get("dtype") is None and _eligible(first):
            return {**args, "dtype": torch.float32}
        return args
    target = dtype if policy == "lower" else torch.float32
    kept = UNCAST.get(name, set())
    return {k: v.to(target) if _eligible(v) and k not in kept else v for k, v in args.items()}


def supported(info, case, dtype: torch.dtype) -> bool:
    """Whether the op takes the dtypes autocast casts ``case``'s inputs to."""
    cast_args = torch_autocast_args(info.name, case.args, dtype)
    return all(v.dtype in info.dtypes for v in cast_args.values() if _eligible(v))

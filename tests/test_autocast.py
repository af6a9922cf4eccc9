"""torch.autocast: every op's inputs are cast as torch's autocast casts its torch counterpart's.

``TORCH_POLICY`` (specgen/testing/autocast.py) is torch's, written out rather than read from the
specs, so that a spec declaring another policy fails. The same policies apply under CPU autocast
(torch's own CPU lists differ: its softmax stays bfloat16 there); the GPU tier checks each op
against torch's CUDA autocast of its reference, eager and compiled
(tests/gpu/test_autocast_gpu.py).
"""

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import generated
from specgen import testing
from specgen.runtime import interpreting, override
from specgen.testing.autocast import TORCH_POLICY, supported, torch_autocast_args
from specgen.testing.core import outputs


def autocast_dtypes(name: str):
    """The interpreter computes a bfloat16 ``tl.dot`` wrongly (upstream does not support it):
    matmuls cast to bfloat16 run in the GPU tier only."""
    if interpreting() and TORCH_POLICY.get(name) == "lower":
        return st.just(torch.float16)
    return st.sampled_from([torch.bfloat16, torch.float16])


def test_every_policy_is_torchs():
    """The specs' policies are torch's, op by op (the behaviour is checked below)."""
    declared = {name: info.autocast for name, info in generated.REGISTRY.items()}
    expected = {name: TORCH_POLICY.get(name, "none").split()[0] for name in declared}
    assert declared == expected


@pytest.mark.parametrize("name", sorted(generated.REGISTRY))
@settings(max_examples=4)
@given(data=st.data())
def test_autocast_casts_as_torch(name, data):
    """A call under autocast is the call on the arguments torch's autocast would pass: the same
    results, bit for bit, with the same dtypes."""
    info = generated.REGISTRY[name]
    dtype = data.draw(autocast_dtypes(name), label="autocast dtype")
    case = testing.draw_case(data, info)
    assume(supported(info, case, dtype))
    cast_args = torch_autocast_args(name, case.args, dtype)
    with override(**case.overrides):
        with torch.autocast(testing.device(), dtype=dtype):
            got = outputs(case.call(info))
        want = outputs(info.function(**cast_args))
    for output, g, w in zip(info.outputs, got, want):
        assert g.dtype == w.dtype, f"{name} {output}: {g.dtype} under autocast, torch's {w.dtype}"
        torch.testing.assert_close(g, w, rtol=0, atol=0, equal_nan=True)


def test_gradients_reach_the_uncast_inputs():
    """Under autocast a float32 weight's gradient is float32, and is the gradient through its
    cast (torch's autocast casts with a differentiable ``to``)."""
    device = testing.device()
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(6, 8, generator=generator).to(device).requires_grad_()
    weight = torch.randn(5, 8, generator=generator).to(device).requires_grad_()
    with torch.autocast(device, dtype=torch.float16):
        out = generated.linear(x, weight)
    assert out.dtype == torch.float16
    grad = torch.randn(6, 5, generator=generator).to(device, torch.float16)
    got = torch.autograd.grad(out, (x, weight), grad)
    want = torch.autograd.grad(generated.linear(x.half(), weight.half()), (x, weight), grad)
    for g, w in zip(got, want):
        assert g.dtype == torch.float32
        torch.testing.assert_close(g, w, rtol=0, atol=0)
    # a float32 policy: layer_norm of a bfloat16 input gives float32, its gradient bfloat16
    x16 = torch.randn(6, 8, generator=generator).to(device, torch.bfloat16).requires_grad_()
    with torch.autocast(device, dtype=torch.bfloat16):
        normed = generated.layer_norm(x16, (8,))
    assert normed.dtype == torch.float32
    (grad_x,) = torch.autograd.grad(normed, x16, torch.ones_like(normed))
    assert grad_x.dtype == torch.bfloat16


@pytest.mark.parametrize("name", ["scaled_dot_product_attention", "decode_attention"])
def test_float64_attention_is_left_alone(name):
    """torch's autocast casts no float64 tensor (its attention then computes in float64): a
    float64 attention call under autocast is the call outside it, bit for bit, forward and
    backward, float64 throughout."""
    device = testing.device()
    generator = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 4, 5, 16, generator=generator, dtype=torch.float64).to(device)
               .requires_grad_() for _ in range(3))
    extra = (torch.tensor([5, 3], device=device),) if name == "decode_attention" else ()
    op = getattr(generated, name)
    grad = torch.randn(2, 4, 5, 16, generator=generator, dtype=torch.float64).to(device)
    with torch.autocast(device, dtype=torch.float16):
        got = op(q, k, v, *extra)
        theirs = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    want = op(q, k, v, *extra)
    assert got.dtype == theirs.dtype == torch.float64
    assert torch.equal(got, want)
    for g, w in zip(torch.autograd.grad(got, (q, k, v), grad),
                    torch.autograd.grad(want, (q, k, v), grad)):
        assert g.dtype == torch.float64 and torch.equal(g, w)

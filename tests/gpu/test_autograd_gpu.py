"""GPU tier: gradients through graphs compiled by torch.compile (Inductor), static and dynamic
shapes. AOTAutograd traces each op's backward (runtime/autograd.py: the reference's
vector-Jacobian product, or cross_entropy's kernel) into the backward graph."""

import pytest
import torch
import torch.nn.functional as F

import generated
from specgen import testing

pytestmark = pytest.mark.gpu


def _block(ops, x, residual, norm_weight, weight, bias, target):
    """A transformer-like block of every differentiable family: a fused residual norm, a fused
    linear + gelu, a layer norm, a softmax, a reduction and the loss."""
    hidden, normed = ops.add_rms_norm(x, residual, norm_weight, 1e-6)
    h = ops.layer_norm(ops.linear_gelu(normed, weight, bias), [weight.shape[0]])
    probs = ops.softmax(ops.mul(h, hidden[:, : weight.shape[0]]), -1)
    return ops.cross_entropy(h, target) + ops.sum(probs * h, None)


class _Torch:
    """The same block in torch, for the float64 reference and torch's own gradient."""
    add_rms_norm = staticmethod(lambda x, r, w, eps: (x + r, F.rms_norm(x + r, [x.shape[-1]], w, eps)))
    layer_norm = staticmethod(F.layer_norm)
    linear_gelu = staticmethod(lambda x, w, b: F.gelu(F.linear(x, w, b), approximate="tanh"))
    mul = staticmethod(torch.mul)
    softmax = staticmethod(torch.softmax)
    cross_entropy = staticmethod(F.cross_entropy)
    sum = staticmethod(lambda x, dim: x.sum())


def _inputs(rows, width, out_width, seed):
    generator = torch.Generator(device="cpu").manual_seed(seed)

    def leaf(*shape, scale=1.0):
        t = (torch.rand(*shape, generator=generator, dtype=torch.float64) * 2 - 1) * scale
        return t.float().cuda().requires_grad_()

    target = torch.randint(0, out_width, (rows,), generator=generator).cuda()
    return [leaf(rows, width), leaf(rows, width), leaf(width, scale=2.0),
            leaf(out_width, width, scale=width ** -0.5), leaf(out_width), target]


def _grads(fn, inputs):
    loss = fn(*inputs)
    leaves = [t for t in inputs if t.is_floating_point()]
    return torch.autograd.grad(loss, leaves)


@pytest.mark.parametrize("dynamic", [False, True])
def test_compiled_block_gradients(dynamic):
    torch._dynamo.reset()
    compiled = torch.compile(lambda *a: _block(generated, *a), dynamic=dynamic, fullgraph=True)
    for seed, (rows, width, out_width) in enumerate([(64, 96, 80), (48, 160, 72)]):
        inputs = _inputs(rows, width, out_width, seed)
        got = _grads(compiled, inputs)
        eager = _grads(lambda *a: _block(generated, *a), inputs)
        own = _grads(lambda *a: _block(_Torch, *a), inputs)
        wide = [t.detach().double().requires_grad_() if t.is_floating_point() else t
                for t in inputs]
        want = _grads(lambda *a: _block(_Torch, *a), wide)
        for i, (g, e, o, w) in enumerate(zip(got, eager, own, want)):
            what = f"grad of input {i}, {rows}x{width}, dynamic={dynamic}"
            testing.assert_matches(g, w, what + " (compiled)", torch_result=o)
            testing.assert_matches(e, w, what + " (eager)", torch_result=o)

"""GPU tier: the ops inside graphs compiled with dynamic shapes (symbolic sizes), which
torch.compile also picks by itself when a compiled function meets a second shape."""

import pytest
import torch
import torch.nn.functional as F

import generated

pytestmark = pytest.mark.gpu


def _randn(*shape):
    return torch.randn(*shape, device="cuda", dtype=torch.bfloat16)


def _target(logits):
    return torch.arange(logits.shape[0], device="cuda") % logits.shape[1]


# (op, its input's two shapes, a float64 reference); every family, and the row-wise and reduce
# strategies whose planning reads sizes (masks, loops, splits)
CASES = {
    "add": (lambda x: generated.add(x, x), [(37, 300), (53, 410)],
            lambda x: x + x),
    # the third shape leaves the power-of-two bucket the graph's block sizes were planned for
    "softmax": (lambda x: generated.softmax(x, -1), [(37, 300), (53, 410), (20, 1000)],
                lambda x: torch.softmax(x, -1)),
    "layer_norm, looped": (lambda x: generated.layer_norm(x, [x.shape[-1]]),
                           [(64, 20000), (96, 24000)],
                           lambda x: F.layer_norm(x, [x.shape[-1]])),
    "rms_norm, split": (lambda x: generated.rms_norm(x, [x.shape[-1]]),
                        [(4, 200000), (6, 240000)],
                        lambda x: F.rms_norm(x, [x.shape[-1]])),
    "sum over rows": (lambda x: generated.sum(x, 0), [(3000, 64), (5000, 96)],
                      lambda x: x.sum(0)),
    "argmax": (lambda x: generated.argmax(x, 1), [(37, 300), (53, 410)],
               lambda x: x.argmax(1)),
    "mm": (lambda a: generated.mm(a, a.t()), [(128, 64), (192, 96)],
           lambda a: a @ a.t()),
    "cross_entropy": (lambda x: generated.cross_entropy(x, _target(x)),
                      [(37, 300), (53, 410)],
                      lambda x: F.cross_entropy(x, _target(x))),
    # a fused epilogue, the weight a slice of the input (N = 64 rows of it)
    "linear_gelu": (lambda x: generated.linear_gelu(x, x[:64]), [(128, 64), (192, 96)],
                    lambda x: F.gelu(F.linear(x, x[:64]))),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_dynamic_shapes_compile(case):
    fn, shapes, reference = CASES[case]
    torch._dynamo.reset()
    compiled = torch.compile(fn, dynamic=True, fullgraph=True)
    for shape in shapes:
        x = _randn(*shape)
        got = compiled(x)
        want = reference(x.double())
        if want.dtype == torch.int64:
            assert torch.equal(got, want)
        else:
            # one bf16 rounding of the output (2**-8 relative) plus float32 sums, as the row-wise
            # GPU tests allow: an absolute 1e-3, so that softmax's small values are checked too
            torch.testing.assert_close(got.double(), want, rtol=1.6e-2, atol=1e-3)


def test_dynamic_shapes_compile_backward():
    # cross_entropy's backward kernel through a graph compiled with dynamic shapes (the other ops'
    # backward: tests/gpu/test_autograd_gpu.py)
    torch._dynamo.reset()
    compiled = torch.compile(lambda x: generated.cross_entropy(x, _target(x)), dynamic=True,
                             fullgraph=True)
    for shape in [(37, 300), (53, 410)]:
        x = _randn(*shape).requires_grad_()
        compiled(x).backward()
        x64 = x.detach().double().requires_grad_()
        F.cross_entropy(x64, _target(x64)).backward()
        # the mean's gradients are about 1 / (rows * classes): an absolute bound far below them
        torch.testing.assert_close(x.grad.double(), x64.grad, rtol=1.6e-2, atol=1e-7)


# (op of x and one scalar, three values of it, a float64 reference): a compiled function called
# with a second value of an int makes it symbolic (automatic dynamic), a float stays specialized
# (torch 2.11 and 2.13); the ops take both
SCALAR_CASES = {
    "cross_entropy, ignore_index": (
        lambda x, i: generated.cross_entropy(x[0], _target(x[0]), ignore_index=i), (1, 2, 3),
        lambda x, i: F.cross_entropy(x[0], _target(x[0]), ignore_index=i)),
    "softmax, dim": (lambda x, d: generated.softmax(x, d), (0, 1, 2),
                     lambda x, d: torch.softmax(x, d)),
    "sum, dim": (lambda x, d: generated.sum(x, d), (0, 1, 2), lambda x, d: x.sum(d)),
    "layer_norm, eps": (lambda x, e: generated.layer_norm(x, [x.shape[-1]], eps=e),
                        (1e-5, 0.5, 2.0), lambda x, e: F.layer_norm(x, [x.shape[-1]], eps=e)),
}


@pytest.mark.parametrize("case", sorted(SCALAR_CASES))
def test_scalars_that_change_between_compiled_calls(case):
    fn, values, reference = SCALAR_CASES[case]
    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True)
    x = _randn(6, 7, 300)
    for value in values:
        got = compiled(x, value)
        torch.testing.assert_close(got.double(), reference(x.double(), value), rtol=1.6e-2,
                                   atol=1e-3)

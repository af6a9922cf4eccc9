"""Every registered op's backward against the float64 reference's autograd, over drawn shapes,
layouts and dtypes (the cases of tests/test_ops.py), and the autograd rules torch keeps.

Ops without a backward kernel of their own differentiate their reference (runtime/autograd.py),
so these cases check what reaches the backward: the saved inputs, the argument order, which
inputs get a gradient, outputs left unused. Row-wise ops whose spec derives a backward op
(softmax, log_softmax, the norms) run its kernel in eager backward passes, under the case's forced
strategy.
"""

import re

import pytest
import torch
from hypothesis import given, note, settings
from hypothesis import strategies as st

import generated
from specgen import runtime as rt
from specgen import testing
from specgen.runtime import rowwise


def _check_gradients(name, data):
    info = generated.REGISTRY[name]
    case = testing.draw_case(data, info)
    path = data.draw(st.sampled_from(testing.PATHS))
    note(f"path: {path}")
    testing.check_grad(info, case, seed=data.draw(st.integers(0, 2**31 - 1)), path=path)


_ATTENTION = [n for n in sorted(generated.REGISTRY)
              if generated.REGISTRY[n].family == "attention"]


@pytest.mark.parametrize("name", [n for n in sorted(generated.REGISTRY) if n not in _ATTENTION])
@given(data=st.data())
def test_gradients_match_reference(name, data):
    _check_gradients(name, data)


# an attention case compiles kernels of its own nearly every example (head dims, dtypes, masks
# and tiles are constexprs): 200-420 s an op on the GPU tier (H200, 2026-11-29), its longest
# tests, left running past a device call's end. Each op's examples are split over SHARDS tests
# (the profile's count in all), which pytest-xdist runs side by side
SHARDS = 4


@pytest.mark.parametrize("name, shard", [pytest.param(n, k, id=f"{n}-{k}of{SHARDS}")
                                         for n in _ATTENTION for k in range(1, SHARDS + 1)])
@settings(max_examples=-(-settings().max_examples // SHARDS))
@given(data=st.data())
def test_attention_gradients_match_reference(name, shard, data):
    _check_gradients(name, data)


def _leaf(*shape, dtype=torch.float32, seed=0):
    generator = torch.Generator().manual_seed(seed)
    x = torch.rand(*shape, generator=generator, dtype=torch.float64) * 6 - 3
    return x.to(dtype).to(testing.device()).requires_grad_()


@pytest.mark.parametrize("op", ["softmax", "layer_norm"])
def test_double_backward_matches_torch(op):
    # the backward is torch ops, so create_graph differentiates it again
    x, w = _leaf(4, 7), _leaf(7, seed=1)
    grad_y = _leaf(4, 7, seed=2).detach()
    calls = {"softmax": (lambda f, x: f(x, -1), generated.softmax, torch.softmax),
             "layer_norm": (lambda f, x: f(x, [7], w), generated.layer_norm,
                            torch.nn.functional.layer_norm)}
    call, ours, theirs = calls[op]
    results = []
    for f in (ours, theirs):
        grad_x, = torch.autograd.grad(call(f, x), x, grad_y, create_graph=True)
        results.append(torch.autograd.grad(grad_x.square().sum(), (x, w), allow_unused=True,
                                           materialize_grads=True))
    for got, want in zip(*results):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("op", ["softmax", "layer_norm", "logsumexp", "gelu"])
def test_double_backward_through_a_gradient_that_reads_the_output(op):
    # the first gradient's output gradient is computed from y ((y * y * c).sum()), so the second
    # backward reaches x through that output gradient too, and through the op again: the
    # recomputed reference must not run on into that path itself (it freed the op's saved
    # tensors, and the second backward raised) - derived backward ops and by-reference ones alike
    F = torch.nn.functional
    calls = {"softmax": (lambda f, x, w: f(x, -1), generated.softmax, torch.softmax),
             "layer_norm": (lambda f, x, w: f(x, [7], w), generated.layer_norm, F.layer_norm),
             "logsumexp": (lambda f, x, w: f(x, -1, True), generated.logsumexp, torch.logsumexp),
             "gelu": (lambda f, x, w: f(x), generated.gelu, F.gelu)}
    call, ours, theirs = calls[op]
    x, w = _leaf(4, 7), _leaf(7, seed=1)
    c, r = _leaf(4, 7, seed=2).detach(), _leaf(4, 7, seed=3).detach()
    x64, w64 = (t.detach().double().requires_grad_() for t in (x, w))
    results = []
    for f, x_, w_ in ((ours, x, w), (theirs, x64, w64)):
        y = call(f, x_, w_)
        grad_x, = torch.autograd.grad((y * y * c.to(y.dtype)[..., :y.shape[-1]]).sum(), x_,
                                      create_graph=True)
        results.append(torch.autograd.grad((grad_x * r.to(grad_x.dtype)).sum(), (x_, w_),
                                           allow_unused=True, materialize_grads=True))
    for got, want in zip(*results):
        testing.assert_matches(got, want, f"{op} second-order gradient")


@pytest.mark.parametrize("path", ["function", "op"])
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_cross_entropy_double_backward_matches_torch(path, reduction):
    # its first backward is a kernel, not differentiable again: a backward that builds a graph
    # (a gradient penalty) takes the reference's gradient instead
    F = torch.nn.functional
    logits = _leaf(5, 9)
    target = torch.tensor([0, 3, 8, -100, 2], device=logits.device)
    weight = _leaf(9, seed=1).detach().abs() + 0.5
    calls = {"function": generated.cross_entropy,
             "op": lambda *args, **options: torch.ops.specgen.cross_entropy(
                 *args, -100, options["reduction"], options["label_smoothing"])[0]}
    logits64 = logits.detach().double().requires_grad_()
    results = []
    for f, x, w in ((calls[path], logits, weight), (F.cross_entropy, logits64, weight.double())):
        loss = f(x, target, w, reduction=reduction, label_smoothing=0.1).sum()
        grad, = torch.autograd.grad(loss, x, create_graph=True)
        assert grad.requires_grad
        results.append(torch.autograd.grad(loss + 10 * grad.square().sum(), x)[0])
    testing.assert_matches(*results, f"cross_entropy ({path}) gradient of a gradient penalty")


_TRANSFORM_CALLS = {
    "relu": lambda x: generated.relu(x),
    "softmax": lambda x: generated.softmax(x, -1),
    "sum": lambda x: generated.sum(x, 0),
    "layer_norm": lambda x: generated.layer_norm(x, [x.shape[-1]]),
    "mm": lambda x: generated.mm(x[None], x[:, None]),
    "cross_entropy": lambda x: generated.cross_entropy(
        x[None], torch.tensor([1], device=x.device)),
}
_TORCH_CALLS = {
    "relu": torch.relu,
    "softmax": lambda x: torch.softmax(x, -1),
    "sum": lambda x: x.sum(0),
    "layer_norm": lambda x: torch.nn.functional.layer_norm(x, [x.shape[-1]]),
    "mm": lambda x: x[None] @ x[:, None],
    "cross_entropy": lambda x: torch.nn.functional.cross_entropy(
        x[None], torch.tensor([1], device=x.device)),
}


@pytest.mark.parametrize("op", sorted(_TRANSFORM_CALLS))
def test_forward_mode_ad_and_func_grad_raise(op):
    # torch's custom-op autograd has no jvp (forward AD through the registered op would drop the
    # tangent without a word) and torch.func.grad refuses its autograd.Function
    from torch.autograd import forward_ad
    x = _leaf(5).detach()
    call = _TRANSFORM_CALLS[op]
    first = "a" if op == "mm" else "logits" if op == "cross_entropy" else "x"
    with forward_ad.dual_level():
        dual = forward_ad.make_dual(x, torch.ones_like(x))
        with pytest.raises(NotImplementedError,
                           match=f"{op}: argument '{first}' carries a tangent"):
            call(dual)
        # a tensor without a tangent at an active level is an ordinary call
        testing.assert_matches(call(x), _TORCH_CALLS[op](x.double()), f"{op} at a dual level")
    with pytest.raises(NotImplementedError,
                       match=f"argument '{first}' is traced by torch.func.grad"):
        torch.func.grad(lambda t: call(t).sum())(x)
    with pytest.raises(NotImplementedError, match="carries a tangent of forward-mode AD"):
        torch.func.jvp(call, (x,), (torch.ones_like(x),))


@pytest.mark.parametrize("op", sorted(_TRANSFORM_CALLS))
def test_vmap_batches_the_registered_op(op):
    # a vmap-wrapped tensor is a plain torch.Tensor to type(): it must take the registered op
    # (batched by torch), not the direct path, which reads its data pointer
    x = _leaf(3, 5).detach()
    got = torch.func.vmap(_TRANSFORM_CALLS[op])(x)
    want = torch.func.vmap(_TORCH_CALLS[op])(x.double())
    testing.assert_matches(got, want, f"vmap of {op}")


def test_argmax_has_no_gradient_to_refuse_under_forward_mode_ad():
    from torch.autograd import forward_ad
    x = _leaf(2, 7).detach()
    with forward_ad.dual_level():
        dual = forward_ad.make_dual(x, torch.ones_like(x))
        index = generated.argmax(dual, 1)
        assert forward_ad.unpack_dual(index).tangent is None
    assert torch.equal(index, torch.argmax(x, 1))


def test_saved_input_changed_in_place_raises():
    x = _leaf(3, 5)
    hidden = x * 2
    y = generated.rms_norm(hidden, [5])
    hidden.add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


@pytest.mark.parametrize("grad_of", ["x", "out"])
def test_out_with_grad_raises_as_torch(grad_of):
    x, y = _leaf(3, 4), _leaf(3, 4, seed=1).detach()
    out = torch.empty(3, 4, device=x.device)
    if grad_of == "out":
        x, out = x.detach(), out.requires_grad_()
    with pytest.raises(RuntimeError):
        torch.add(x, y, out=out)
    name = "out[0]" if grad_of == "out" else "x"
    with pytest.raises(RuntimeError, match=re.escape(
            f"add: argument '{name}' requires grad, but a call with out= is not differentiable")):
        generated.add(x, y, out=out)
    # the registered out= op called directly: the same rule, where it would otherwise write out
    # with no gradient to show for it
    name = "out" if grad_of == "out" else "x"
    with pytest.raises(RuntimeError, match=re.escape(
            f"add_out: argument '{name}' requires grad, but a call with out= is not differentiable")):
        torch.ops.specgen.add_out(out, x, y)
    # under no_grad torch writes out=, and so do we
    with torch.no_grad():
        generated.add(x, y, out=out)
        testing.assert_matches(out, (x.double() + y.double()), "add out= under no_grad")
        out.fill_(float("nan"))
        torch.ops.specgen.add_out(out, x, y)
        testing.assert_matches(out, (x.double() + y.double()), "add_out under no_grad")


def test_cross_entropy_weight_with_grad_raises_as_torch():
    logits, weight = _leaf(4, 3).detach(), _leaf(3, seed=1).abs()
    target = torch.tensor([0, 1, 2, 1], device=logits.device)
    with pytest.raises(RuntimeError, match="not differentiable with respect to argument 'weight'"):
        torch.nn.functional.cross_entropy(logits, target, weight)
    with pytest.raises(RuntimeError, match="argument 'weight' requires grad"):
        generated.cross_entropy(logits, target, weight)
    with torch.no_grad():
        loss = generated.cross_entropy(logits, target, weight)
    want = torch.nn.functional.cross_entropy(logits.double(), target, weight.detach().double())
    testing.assert_matches(loss, want, "cross_entropy with a weight under no_grad")


def test_cross_entropy_saved_outputs_are_not_differentiable():
    # the registered op returns the loss, each row's logsumexp and the loss's denominator; the
    # last two reported requires_grad=True and a loss built on them got a zero gradient
    logits = _leaf(4, 3)
    target = torch.tensor([0, 1, 2, 1], device=logits.device)
    loss, lse, denom = torch.ops.specgen.cross_entropy(logits, target, None, -100, "mean", 0.0)
    assert loss.requires_grad and not lse.requires_grad and not denom.requires_grad


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64])
@pytest.mark.parametrize("eps", [None, 1e-6])
def test_reference_rms_norm_is_torchs(dtype, eps):
    # add_rms_norm's reference spells F.rms_norm out (a symbolic normalized_shape broke torch
    # 2.11's traced CUDA backward of aten._fused_rms_norm): same values, dtype and layout
    from specgen import references
    x = _leaf(2, 3, 4, 4, dtype=dtype).detach().to(memory_format=torch.channels_last)
    for weight in (None, _leaf(4, seed=1).detach(), _leaf(4, dtype=dtype, seed=2).detach()):
        want = torch.nn.functional.rms_norm(x, (4,), weight, eps)
        got = references.rms_norm(x, (4,), weight, eps)
        assert got.dtype == want.dtype and got.stride() == want.stride()
        torch.testing.assert_close(got, want)   # CUDA fuses it: an ulp apart there


def test_the_recompute_keeps_the_inputs_strides():
    # a drawn case (hypothesis, on the CPU tier): a grouped conv2d of a channels_last (1, 4, 1, 2)
    # input and (2, 2, 1, 1) weight as .to(memory_format=torch.channels_last) lays them out.
    # Recomputed on view_as views, whose size-1 batch dim gets the stride 4, torch's CPU
    # backward gave every element of the weight's gradient wrong
    dev = testing.device()

    def laid_out(values, shape, strides):
        data = torch.tensor(values, dtype=torch.float64, device=dev).reshape(shape)
        return torch.empty_strided(shape, strides, dtype=torch.float64, device=dev).copy_(data)

    x = laid_out([2.82, 1.25, -0.24, 2.53, 0.87, 1.75, -1.93, -0.89], (1, 4, 1, 2), (8, 1, 8, 4))
    w = laid_out([-2.63, -1.65, -1.59, -1.94], (2, 2, 1, 1), (2, 1, 2, 2))
    grad = laid_out([1.54, -0.29, -2.18, 0.57], (1, 2, 1, 2), (4, 2, 2, 1))
    results = []
    for f in (generated.conv2d, torch.nn.functional.conv2d):
        x_, w_ = x.detach().requires_grad_(), w.detach().requires_grad_()
        results.append(torch.autograd.grad(f(x_, w_, None, 1, 0, 1, 2), (x_, w_), grad))
    for got, want in zip(*results):
        torch.testing.assert_close(got, want)


def test_an_unused_output_gets_a_zero_gradient():
    # add_rms_norm returns (x + residual, rms_norm(x + residual)): back-propagating the norm
    # alone must still reach x and residual through it
    x, residual, weight = _leaf(3, 6), _leaf(3, 6, seed=1), _leaf(6, seed=2)
    _, normed = generated.add_rms_norm(x, residual, weight)
    got = torch.autograd.grad(normed.sum(), (x, residual, weight))
    x64, r64, w64 = (t.detach().double().requires_grad_() for t in (x, residual, weight))
    want = torch.autograd.grad(torch.nn.functional.rms_norm(x64 + r64, [6], w64, 1e-6).sum(),
                               (x64, r64, w64))
    for g, w in zip(got, want):
        testing.assert_matches(g, w, "add_rms_norm grad through the norm")


def test_an_eager_output_names_its_op_in_grad_fn():
    # each op applies its own autograd.Function, as torch's ops have their own nodes
    x, residual, weight = _leaf(3, 6), _leaf(3, 6, seed=1), _leaf(6, seed=2)
    names = {type(generated.softmax(x, -1).grad_fn).__name__,
             type(generated.gelu(x).grad_fn).__name__,
             type(generated.add_rms_norm(x, residual, weight)[1].grad_fn).__name__,
             type(generated.cross_entropy(x, torch.tensor([0, 5, 2], device=x.device)).grad_fn).__name__}
    assert names == {"SpecgenSoftmaxBackward", "SpecgenGeluBackward", "SpecgenAddRmsNormBackward",
                     "SpecgenCrossEntropyBackward"}


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_a_derived_backward_runs_its_own_kernel(op):
    # an eager backward of an op whose spec derives a backward op launches that op's kernel (the
    # derived ops are checked as ops by tests/test_ops.py, and here through their forward)
    x, grad_y = _leaf(4, 7), _leaf(4, 7, seed=1).detach()
    y = getattr(generated, op)(x, -1)
    with rt.record_launches() as launches:
        got, = torch.autograd.grad(y, x, grad_y)
    assert [launch.op for launch in launches] == [f"{op}_backward"]
    x64 = x.detach().double().requires_grad_()
    want, = torch.autograd.grad(getattr(torch, op)(x64, -1), x64, grad_y.double())
    testing.assert_matches(got, want, f"{op} grad x")
    # a dtype= cast that leaves x's values as they are (bfloat16 to float32): the derived op,
    # given the output's gradient in float32, returns x's in bfloat16
    x16 = _leaf(4, 7, dtype=torch.bfloat16, seed=2)
    y = getattr(generated, op)(x16, -1, dtype=torch.float32)
    with rt.record_launches() as launches:
        got, = torch.autograd.grad(y, x16, grad_y)
    assert [launch.op for launch in launches] == [f"{op}_backward"]
    assert got.dtype == torch.bfloat16
    x64 = x16.detach().double().requires_grad_()
    want, = torch.autograd.grad(getattr(torch, op)(x64, -1), x64, grad_y.double())
    testing.assert_matches(got, want, f"{op} grad x with dtype=float32")
    # one that rounds x (float32 to float16) is not what the derived op computes: the reference
    # serves
    x64 = x.detach().double().requires_grad_()
    y = getattr(generated, op)(x, -1, dtype=torch.float16)
    with rt.record_launches() as launches:
        got, = torch.autograd.grad(y, x, grad_y.half())
    assert launches == []
    want, = torch.autograd.grad(getattr(torch, op)(x64, -1, dtype=torch.float16), x64,
                                grad_y.half())
    testing.assert_matches(got, want.float(), f"{op} grad x with dtype=")


@pytest.mark.parametrize("op", ["layer_norm", "rms_norm", "add_rms_norm"])
def test_weight_gradients_come_from_the_derived_kernel(op):
    # a weight's (and bias's) gradient sums over the rows: the derived op's column outputs, in
    # its one launch, also with the weight (and bias) omitted: the derived op, which takes every
    # tensor, reads the constants they stand for
    x, residual, w, b = _leaf(5, 9), _leaf(5, 9, seed=1), _leaf(9, seed=2), _leaf(9, seed=3)
    grad_y = _leaf(5, 9, seed=4).detach()
    F = torch.nn.functional
    calls = {
        "layer_norm": ((x, w, b), lambda x, w, b: generated.layer_norm(x, [9], w, b),
                       lambda x, w, b: F.layer_norm(x, [9], w, b)),
        "rms_norm": ((x, w), lambda x, w: generated.rms_norm(x, [9], w),
                     lambda x, w: F.rms_norm(x, [9], w)),
        "add_rms_norm": ((x, residual, w), lambda x, r, w: generated.add_rms_norm(x, r, w)[1],
                         lambda x, r, w: F.rms_norm(x + r, [9], w, 1e-6)),
    }
    inputs, ours, theirs = calls[op]
    y = ours(*inputs)
    with rt.record_launches() as launches:
        got = torch.autograd.grad(y, inputs, grad_y)
    assert [launch.op for launch in launches] == [f"{op}_backward"]
    leaves64 = [t.detach().double().requires_grad_() for t in inputs]
    want = torch.autograd.grad(theirs(*leaves64), leaves64, grad_y.double())
    for i, (g, w64) in enumerate(zip(got, want)):
        testing.assert_matches(g, w64, f"{op} grad of input {i}")
    if op == "add_rms_norm":
        return  # its weight is required
    y = ours(x, *(None for _ in inputs[1:]))
    with rt.record_launches() as launches:
        got, = torch.autograd.grad(y, x, grad_y)
    assert [launch.op for launch in launches] == [f"{op}_backward"]
    want, = torch.autograd.grad(theirs(leaves64[0], *(None for _ in inputs[1:])), leaves64[0],
                                grad_y.double())
    testing.assert_matches(got, want, f"{op} grad x without a weight")


def test_an_omitted_tensor_stands_in_as_its_constant_where_the_dtype_holds_it():
    x = torch.randn(3, 4, 5, dtype=torch.bfloat16, device=testing.device())
    w = torch.randn(4, 5, dtype=torch.bfloat16, device=testing.device())
    given, ones, zeros = rowwise.stand_ins(x, (1, 2), (w, 1.0), (None, 1.0), (None, 0.0))
    assert given is w
    assert ones.shape == zeros.shape == (4, 5) and ones.dtype == x.dtype
    assert bool((ones == 1).all()) and bool((zeros == 0).all())
    # bfloat16 does not hold 0.1, which the forward computes with in float32: no stand-in (the
    # reference's gradient serves)
    assert rowwise.stand_ins(x, (1, 2), (None, 0.1)) == (None,)


@pytest.mark.parametrize("op", ["layer_norm", "rms_norm", "add_rms_norm"])
def test_weight_gradient_of_bfloat16_rows_is_float32(op):
    # a float32 weight under bfloat16 rows: torch's gradient is float32, summed over the rows in
    # float32; it was allocated as the rows' dtype, so every value came back rounded to bfloat16
    x, residual = _leaf(64, 16, dtype=torch.bfloat16), _leaf(64, 16, dtype=torch.bfloat16, seed=1)
    weight, bias = _leaf(16, seed=2), _leaf(16, seed=3)
    grad_out = _leaf(64, 16, dtype=torch.bfloat16, seed=4).detach()
    args, params = {"layer_norm": ((x, [16], weight, bias), {"weight": weight, "bias": bias}),
                    "rms_norm": ((x, [16], weight), {"weight": weight}),
                    "add_rms_norm": ((x, residual, weight), {"weight": weight})}[op]
    info = generated.REGISTRY[op]

    def normed(result):   # add_rms_norm returns (x + residual, the norm)
        return result[-1] if isinstance(result, tuple) else result

    ours = torch.autograd.grad(normed(info.function(*args)), list(params.values()), grad_out)
    double = {id(t): t.detach().double().requires_grad_() for t in (x, residual, weight, bias)}
    want = torch.autograd.grad(normed(info.reference(*(double.get(id(a), a) for a in args))),
                               [double[id(t)] for t in params.values()], grad_out.double())
    for name, got, expected in zip(params, ours, want):
        assert got.dtype == torch.float32, f"{op}: grad of {name} is {got.dtype}"
        error = ((got.double() - expected).abs().max() / expected.abs().max()).item()
        assert error < 1e-5, f"{op}: grad of {name} off by {error:.2e} (bfloat16 rounding: ~4e-3)"


@pytest.mark.parametrize("x_dtype, residual_dtype", [(torch.bfloat16, torch.float32),
                                                     (torch.float32, torch.float16),
                                                     (torch.float16, torch.bfloat16)])
def test_add_rms_norm_promotes_as_x_plus_residual(x_dtype, residual_dtype):
    # a float32 residual stream under bfloat16 activations: x + residual is float32 in torch, and
    # so are both results; each gradient takes its input's dtype. Both were x's dtype before.
    x, residual = _leaf(8, 16, dtype=x_dtype), _leaf(8, 16, dtype=residual_dtype, seed=1)
    weight = _leaf(16, dtype=torch.bfloat16, seed=2)
    hidden, out = generated.add_rms_norm(x, residual, weight)
    want_hidden, want_out = generated.REGISTRY["add_rms_norm"].reference(x, residual, weight)
    assert (hidden.dtype, out.dtype) == (want_hidden.dtype, want_out.dtype)
    double = [t.detach().double().requires_grad_() for t in (x, residual, weight)]
    hidden64, out64 = generated.REGISTRY["add_rms_norm"].reference(*double)
    testing.assert_matches(hidden, hidden64, "hidden")
    testing.assert_matches(out, out64, "out")
    grad_hidden, grad_out = _leaf(8, 16, seed=3).detach(), _leaf(8, 16, seed=4).detach()
    grads = torch.autograd.grad((hidden, out), (x, residual, weight), (grad_hidden, grad_out))
    want = torch.autograd.grad((hidden64, out64), double, (grad_hidden.double(), grad_out.double()))
    for name, got, expected, tensor in zip(("x", "residual", "weight"), grads, want,
                                           (x, residual, weight)):
        assert got.dtype == tensor.dtype, name
        testing.assert_matches(got, expected, f"grad of {name}")

"""The derivative rules of specgen/derive.py against torch's autograd, and the backward ops the
row-wise family derives from its specs (their kernels are checked as ops by tests/test_ops.py)."""

import ast
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import generated
from specgen import build, derive, polynomial, testing
from specgen.families import rowwise_backward
from specgen.expr import FUNCTIONS



def _rounded(dtype):
    # a cast of the expression language rounds the value and passes the gradient through
    return lambda t: t + (t.to(dtype).double() - t).detach()


def _where(condition, a, b):
    return torch.where(condition, torch.as_tensor(a, dtype=torch.float64),
                       torch.as_tensor(b, dtype=torch.float64))


# each function of the expression language as torch computes it (float64 here)
TORCH = {
    "where": _where, "exp": torch.exp, "exp2": torch.exp2, "log": torch.log,
    "log2": torch.log2, "sqrt": torch.sqrt, "rsqrt": torch.rsqrt, "abs": torch.abs,
    "erf": torch.erf, "sigmoid": torch.sigmoid, "minimum": torch.minimum,
    "maximum": torch.maximum, "tanh": torch.tanh, "relu": torch.relu, "gelu": F.gelu,
    "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"), "silu": F.silu,
    "softplus": F.softplus, "float32": _rounded(torch.float32),
    "float16": _rounded(torch.float16), "bfloat16": _rounded(torch.bfloat16),
}

EXPRESSIONS = [
    "exp(x) * y", "exp2(x) + log2(x * x + 1)", "log(x * x + 1) / y", "sqrt(x * x + 1)",
    "rsqrt(x * x + 1) * y", "abs(x) - y", "erf(x * y)", "sigmoid(x) * tanh(y)", "relu(x) * y",
    "gelu(x)", "gelu_tanh(x)", "silu(x * y)", "softplus(x * 10)", "minimum(x, y)",
    "maximum(x * 2, y)", "where(x > 0, x * y, y)", "x ** 3 - x ** -2", "x / y", "-x + y",
    "float16(x) * y", "bfloat16(x * y) + float32(x)",
]


def evaluate(tree: ast.expr, values: dict) -> torch.Tensor:
    result = eval(derive.source(tree), {**TORCH, **values})
    return result if isinstance(result, torch.Tensor) else torch.full_like(values["x"], result)


def test_every_function_has_a_rule_checked_here():
    checked = {n.func.id for e in EXPRESSIONS for n in ast.walk(derive.parse(e))
               if isinstance(n, ast.Call)}
    assert checked == set(FUNCTIONS) == set(TORCH)


@pytest.mark.parametrize("source", EXPRESSIONS)
@pytest.mark.parametrize("name", ["x", "y"])
def test_partial_matches_autograd(source, name):
    generator = torch.Generator().manual_seed(0)
    # away from 0 and from each other: the kinks of relu, abs, minimum and maximum
    x = (torch.rand(64, generator=generator, dtype=torch.float64) * 2 + 0.25)
    x = torch.where(torch.arange(64) % 2 == 0, x, -x)
    y = x.flip(0) * 1.37 + 0.1
    values = {"x": x.clone().requires_grad_(), "y": y.clone().requires_grad_()}
    tree = derive.parse(source)
    want, = torch.autograd.grad(evaluate(tree, values).sum(), values[name], allow_unused=True,
                                materialize_grads=True)
    got = evaluate(derive.partial(tree, name), {"x": x, "y": y})
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-9)


def test_constants_fold():
    assert derive.source(derive.partial(derive.parse("x * y + 3"), "z")) == "0.0"
    assert derive.source(derive.partial(derive.parse("x - y"), "y")) == "-1.0"
    assert derive.source(derive.partial(derive.parse("2 * x"), "x")) == "2"


def test_non_differentiable_expression_is_refused():
    with pytest.raises(derive.NotDifferentiable):
        derive.partial(ast.parse("x[0]", mode="eval").body, "x")


# ---- sums of products (specgen/polynomial.py) -------------------------------------------------


ROOT = Path(__file__).resolve().parent.parent


def _spec(name):
    return build.load_spec(ROOT / "specs" / f"{name}.toml", ROOT)


def _backward_of(name):
    return rowwise_backward.backward_spec(_spec(name))


def test_a_shift_has_no_adjoint():
    # softmax's and log_softmax's max only shifts exp: its adjoint is 0 as a polynomial, so the
    # derived op counts no ties and sums one product of the row beyond the forward's steps
    for name in ("softmax", "log_softmax"):
        steps = [s.name for s in _backward_of(name).body.steps]
        assert steps == ["max", "sum", "sum_0"], (name, steps)


def test_a_deviation_from_the_mean_sums_to_zero():
    # layer_norm's var reads x - mean, whose sum over the row is sum(x) - N * mean = 0: mean's
    # adjoint through var vanishes, and the derived op sums only g * w and (x - mean) * g * w
    steps = {s.name: s.of.source for s in _backward_of("layer_norm").body.steps}
    assert "x - mean" not in steps.values(), steps
    assert list(steps) == ["mean", "var", "sum_0", "sum_1"], steps
    # only where the known sums cancel exactly: sum(x) = N * m, not 2 * N * m or unknown
    atoms = polynomial.Atoms({"x"}, polynomial.spec_sums([derive.parse("x - m")], {"x"}), {"m", "N"})
    (deviation,) = atoms.expand(derive.parse("x - m"))
    (x,) = atoms.expand(derive.parse("x"))
    for known, vanishes in (("N * m", True), ("2 * N * m", False), (None, False)):
        sums = {} if known is None else {x: atoms.expand(derive.parse(known))}
        assert rowwise_backward._sums_to_zero(deviation, atoms, sums) == vanishes, known


def test_terms_that_cancel_are_subtracted_before_they_are_scaled():
    # layer_norm: rsqrt(var + eps) * (g * w - sum(g * w) / N) + ..., so that a row of one element
    # gets exactly 0 (written as the chain rule builds it: two products rounded apart, 1e-4 on
    # an H200). float16 inputs, whose products are exact in float32: a GPU contracts
    # g * w - sum / N into an FMA, which keeps one rounding of a float32 product
    derived = _backward_of("layer_norm")
    grad_x = next(o for o in derived.body.outputs if o.name == "grad_x").expr.source
    assert grad_x.startswith("rsqrt(var + eps) * (-(sum_1 * (1.0 / N)) + grad_out * weight)"), grad_x
    half = {"device": testing.device(), "dtype": torch.float16}
    x, g = torch.tensor([[2.8203]], **half), torch.tensor([[-2.7949]], **half)
    w = torch.tensor([-2.6328], **half)
    got, _, _ = generated.layer_norm_backward(x, w, torch.zeros(1, **half), g, [1])
    assert got.item() == 0.0


def test_polynomials_combine_and_cancel():
    atoms = polynomial.Atoms({"x"}, set(), {"s", "N"})
    e = atoms.expand(derive.parse("exp(x - m) / s - exp(x - m) * s / (s * s)"))
    assert e == {}
    p = atoms.expand(derive.parse("(x + 1) * (x - 1) / N"))
    assert derive.source(atoms.tree(p)) == "-(1.0 / N) + x ** 2 * (1.0 / N)"

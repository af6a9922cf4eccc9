"""The derivative rules of specgen/derive.py against torch's autograd, and the backward ops the
row-wise family derives from its specs (their kernels are checked as ops by tests/test_ops.py)."""

import ast

import pytest
import torch
import torch.nn.functional as F

from specgen import derive
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

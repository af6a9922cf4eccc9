"""Symbolic derivatives of the expression language (``specgen.expr``), for derived backward kernels.

``partial(tree, name)`` is the partial derivative of a validated expression tree with respect to
one of the names it reads (the others held constant), as a new tree in the same language, so the
planners parse and emit it as any spec expression. Each rule gives torch's gradient of the
function the kernels compute, at the points where torch defines one by convention: relu and abs
give 0 at 0, minimum and maximum split a tie evenly, a rounding cast passes the gradient through.
Constant zeros and ones are folded as the tree is built, so that a term no name reaches vanishes
and a derived kernel computes nothing it does not need.
"""

from __future__ import annotations

import ast

LN2 = 0.6931471805599453
SQRT_HALF = 0.7071067811865476
INV_SQRT_2PI = 0.3989422804014327
TWO_OVER_SQRT_PI = 1.1283791670955126
SQRT_2_OVER_PI = 0.7978845608028654
GELU_TANH_C = 0.044715


class NotDifferentiable(Exception):
    """The expression uses something without a derivative rule here."""


def parse(source: str) -> ast.expr:
    return ast.parse(source, mode="eval").body


def const(value: float) -> ast.expr:
    return ast.Constant(value)


def value(node: ast.expr) -> float | None:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return float(node.value)
    return None


def is_zero(node: ast.expr) -> bool:
    return value(node) == 0.0


def add(a: ast.expr, b: ast.expr) -> ast.expr:
    if is_zero(a):
        return b
    if is_zero(b):
        return a
    return ast.BinOp(a, ast.Add(), b)


def neg(a: ast.expr) -> ast.expr:
    if value(a) is not None:
        return const(-value(a))
    if isinstance(a, ast.UnaryOp) and isinstance(a.op, ast.USub):
        return a.operand
    return ast.UnaryOp(ast.USub(), a)


def sub(a: ast.expr, b: ast.expr) -> ast.expr:
    if is_zero(b):
        return a
    if is_zero(a):
        return neg(b)
    return ast.BinOp(a, ast.Sub(), b)


def mul(a: ast.expr, b: ast.expr) -> ast.expr:
    if is_zero(a) or is_zero(b):
        return const(0.0)
    for one, other in ((a, b), (b, a)):
        if value(one) == 1.0:
            return other
        if value(one) == -1.0:
            return neg(other)
    return ast.BinOp(a, ast.Mult(), b)


def div(a: ast.expr, b: ast.expr) -> ast.expr:
    if is_zero(a):
        return const(0.0)
    if value(b) == 1.0:
        return a
    return ast.BinOp(a, ast.Div(), b)


def call(name: str, *args: ast.expr) -> ast.expr:
    return ast.Call(ast.Name(name, ast.Load()), list(args), [])


def power(base: ast.expr, exponent: int) -> ast.expr:
    if exponent == 0:
        return const(1.0)
    if exponent == 1:
        return base
    return ast.BinOp(base, ast.Pow(), const(exponent) if exponent > 0
                     else ast.UnaryOp(ast.USub(), const(-exponent)))


def where(condition: ast.expr, a: ast.expr, b: ast.expr) -> ast.expr:
    if is_zero(a) and is_zero(b):
        return const(0.0)
    return call("where", condition, a, b)


def compare(a: ast.expr, op: ast.cmpop, b: ast.expr) -> ast.expr:
    return ast.Compare(a, [op], [b])


def indicator(condition: ast.expr) -> ast.expr:
    """1.0 where ``condition`` holds, else 0.0."""
    return call("where", condition, const(1.0), const(0.0))


def int_exponent(node: ast.expr) -> int:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -int_exponent(node.operand)
    return node.value


def partial(tree: ast.expr, name: str) -> ast.expr:
    """d tree / d name, every other name held constant."""
    if isinstance(tree, ast.Constant):
        return const(0.0)
    if isinstance(tree, ast.Name):
        return const(1.0 if tree.id == name else 0.0)
    if isinstance(tree, ast.UnaryOp):
        inner = partial(tree.operand, name)
        return neg(inner) if isinstance(tree.op, ast.USub) else inner
    if isinstance(tree, ast.BinOp):
        return _binop(tree, name)
    if isinstance(tree, ast.IfExp):
        # a test of a choice argument, resolved when the kernel compiles: each branch its own
        body, orelse = partial(tree.body, name), partial(tree.orelse, name)
        if is_zero(body) and is_zero(orelse):
            return const(0.0)
        return ast.IfExp(tree.test, body, orelse)
    if isinstance(tree, ast.Call):
        return _call(tree, name)
    raise NotDifferentiable(f"'{ast.unparse(tree)}' has no derivative")


def _binop(tree: ast.BinOp, name: str) -> ast.expr:
    a, b = tree.left, tree.right
    if isinstance(tree.op, ast.Pow):
        n = int_exponent(b)
        return mul(mul(const(n), power(a, n - 1)), partial(a, name))
    da, db = partial(a, name), partial(b, name)
    if isinstance(tree.op, ast.Add):
        return add(da, db)
    if isinstance(tree.op, ast.Sub):
        return sub(da, db)
    if isinstance(tree.op, ast.Mult):
        return add(mul(da, b), mul(a, db))
    # a / b: da / b - a db / b**2
    return sub(div(da, b), div(mul(a, db), mul(b, b)))


def _call(tree: ast.Call, name: str) -> ast.expr:
    function = tree.func.id
    if function == "where":
        condition, a, b = tree.args
        return where(condition, partial(a, name), partial(b, name))
    if function in ("minimum", "maximum"):
        a, b = tree.args
        da, db = partial(a, name), partial(b, name)
        if is_zero(da) and is_zero(db):
            return const(0.0)
        # torch: the gradient goes to the smaller (larger) operand, half to each on a tie
        first = ast.Lt() if function == "minimum" else ast.Gt()
        return where(compare(a, ast.Eq(), b), mul(const(0.5), add(da, db)),
                     where(compare(a, first, b), da, db))
    (u,) = tree.args
    du = partial(u, name)
    if is_zero(du):
        return du
    return mul(_slope(function, u, tree), du)


def _slope(function: str, u: ast.expr, value: ast.expr) -> ast.expr:
    """d function(u) / du, in terms of u (and ``value``, the call itself)."""
    if function == "exp":
        return value
    if function == "exp2":
        return mul(value, const(LN2))
    if function == "log":
        return div(const(1.0), u)
    if function == "log2":
        return div(const(1.0), mul(u, const(LN2)))
    if function == "sqrt":
        return div(const(0.5), value)
    if function == "rsqrt":
        return mul(const(-0.5), power(value, 3))
    if function == "abs":
        # torch: sign(u), 0 at 0
        return where(compare(u, ast.Gt(), const(0.0)), const(1.0),
                     where(compare(u, ast.Lt(), const(0.0)), const(-1.0), const(0.0)))
    if function == "erf":
        return mul(const(TWO_OVER_SQRT_PI), call("exp", neg(mul(u, u))))
    if function == "sigmoid":
        return mul(value, sub(const(1.0), value))
    if function == "tanh":
        return sub(const(1.0), mul(value, value))
    if function == "relu":
        return indicator(compare(u, ast.Gt(), const(0.0)))
    if function == "gelu":
        cdf = mul(const(0.5), add(const(1.0), call("erf", mul(u, const(SQRT_HALF)))))
        pdf = mul(const(INV_SQRT_2PI), call("exp", mul(const(-0.5), mul(u, u))))
        return add(cdf, mul(u, pdf))
    if function == "gelu_tanh":
        # torch's gelu(approximate="tanh") backward
        u2 = mul(u, u)
        t = call("tanh", mul(const(SQRT_2_OVER_PI), add(u, mul(const(GELU_TANH_C), mul(u2, u)))))
        inner = mul(const(SQRT_2_OVER_PI), add(const(1.0), mul(const(3 * GELU_TANH_C), u2)))
        return add(mul(const(0.5), add(const(1.0), t)),
                   mul(mul(mul(const(0.5), u), sub(const(1.0), mul(t, t))), inner))
    if function == "silu":
        s = call("sigmoid", u)
        return mul(s, add(const(1.0), mul(u, sub(const(1.0), s))))
    if function == "softplus":
        # torch's softplus(beta=1, threshold=20): the identity past the threshold
        return where(compare(u, ast.Gt(), const(20.0)), const(1.0), call("sigmoid", u))
    if function in ("float32", "float16", "bfloat16"):
        # a rounding cast: torch's .to() passes the gradient through
        return const(1.0)
    raise NotDifferentiable(f"{function}() has no derivative rule")


def substitute(tree: ast.expr, values: dict[str, ast.expr]) -> ast.expr:
    """``tree`` with each name in ``values`` replaced by its tree (earlier outputs inlined)."""

    class _Inline(ast.NodeTransformer):
        def visit_Name(self, node: ast.Name) -> ast.expr:
            return values.get(node.id, node)

    return _Inline().visit(parse(ast.unparse(tree)))


def source(tree: ast.expr) -> str:
    return ast.unparse(ast.fix_missing_locations(tree))


def vjp_reference(reference: str, params: list[str], primals: list[str],
                  cotangents: list[str]) -> str:
    """The reference of a derived backward op: torch's vector-Jacobian product of the forward's
    ``reference`` (a function of ``params``) at ``primals``, given ``cotangents``."""
    return (f"rt.reference_vjp(lambda {', '.join(params)}: {reference}, "
            f"({''.join(f'{p}, ' for p in primals)}), "
            f"({''.join(f'{c}, ' for c in cotangents)}))")


def grad_name(name: str) -> str:
    """A derived backward's name for the gradient of ``name`` (an output's, given; a tensor's,
    computed), in every family that derives one."""
    return f"grad_{name}"

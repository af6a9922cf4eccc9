"""The expression language of spec entries: ``compute`` and ``epilogue`` outputs, reduce ``map``
and ``finish``, row-wise ``reduce`` steps and ``columns``.

An expression is Python syntax parsed with ``ast`` and checked against a whitelist: arithmetic,
comparisons, ``and``/``or``/``not``, integer powers, the functions in ``FUNCTIONS``, declared names,
and ``a if choice == "value" else b`` on a choice argument (resolved at compile time). Everything
else (attributes, subscripts, keywords, lambdas, unknown names) is a spec error naming the culprit.

Validated trees are emitted as Triton source by rewriting the tree and calling ``ast.unparse``,
which also takes care of operator precedence. All math is float32: operands are upcast on load.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Mapping

from specgen import promotion
from specgen.errors import Where

# name -> (arity, Triton callee). Bare callees are jit helpers from ``specgen.kernel_lib``.
FUNCTIONS: dict[str, tuple[int, str]] = {
    "where": (3, "tl.where"),
    "exp": (1, "tl.exp"),
    "exp2": (1, "tl.exp2"),
    "log": (1, "tl.log"),
    "log2": (1, "tl.log2"),
    "sqrt": (1, "tl.sqrt"),
    "rsqrt": (1, "tl.rsqrt"),
    "abs": (1, "tl.abs"),
    "erf": (1, "tl.erf"),
    "sigmoid": (1, "tl.sigmoid"),
    "minimum": (2, "minimum_f32"),
    "maximum": (2, "maximum_f32"),
    "tanh": (1, "tanh_f32"),
    "relu": (1, "relu_f32"),
    "gelu": (1, "gelu_f32"),
    "gelu_tanh": (1, "gelu_tanh_f32"),
    "silu": (1, "silu_f32"),
    "softplus": (1, "softplus_f32"),
    # casts round to the named type; the value stays float32 for the math that follows
    "float32": (1, "as_float32"),
    "float16": (1, "round_to_float16"),
    "bfloat16": (1, "round_to_bfloat16"),
}

MAX_POWER = 16

_BINOPS = {ast.Add, ast.Sub, ast.Mult, ast.Div, ast.Pow}
_CMPOPS = {ast.Lt, ast.LtE, ast.Gt, ast.GtE, ast.Eq, ast.NotEq}


@dataclass(frozen=True)
class Symbol:
    """A name an expression may use. ``kind`` is tensor, scalar, bool (a bool scalar: a
    condition), choice, value (a computed one) or host (an argument no kernel reads, named so
    that the error for reading one says why)."""

    name: str
    kind: str
    choices: tuple[str, ...] = ()


@dataclass(frozen=True, eq=False)
class Expr:
    """A validated expression: its source text and the names it reads."""

    source: str
    tree: ast.expr
    names: frozenset[str]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Expr) and other.source == self.source

    def __hash__(self) -> int:
        return hash(self.source)


# how deep an expression may nest (400 added terms are 400 levels): the validator
# and the emitter walk it recursively, and no kernel needs more; steps split a longer one
MAX_DEPTH = 100


def quoted(source: str, limit: int = 80) -> str:
    """An expression as an error message quotes it: shortened past ``limit`` characters."""
    source = source.strip()
    return repr(source if len(source) <= limit else source[:limit - 5] + " ... ")


def parse_expr(source: str, where: Where, symbols: Mapping[str, Symbol],
               out_of_scope: Mapping[str, str] | None = None, condition: bool = False) -> Expr:
    """A validated expression over ``symbols``; ``out_of_scope`` maps names that exist in the spec
    but not here to the reason, which the error for using one gives. ``condition``: the entry is
    a condition (an attention mask), not a value."""
    try:
        tree = ast.parse(source.strip(), mode="eval").body
    except SyntaxError as err:
        raise where.error(f"not a valid expression: {quoted(source)} ({err.msg})") from None
    except (RecursionError, MemoryError):
        raise where.error(f"not a valid expression: {quoted(source)} (nested deeper than "
                          f"Python's parser follows; at most {MAX_DEPTH} levels)") from None
    depth = _depth(tree)
    if depth > MAX_DEPTH:
        raise where.error(f"{quoted(source)} nests {depth} levels deep, more than "
                          f"{MAX_DEPTH}: split it into steps (each key of the table may read "
                          f"the ones before it)")
    names: set[str] = set()
    _Validator(where, symbols, names, out_of_scope or {}).check(tree)
    if condition:
        if not _is_condition(tree, symbols):
            raise where.error(f"{quoted(source)} is a value, and this entry is a condition: a "
                              f"comparison such as j <= i, or and/or/not of comparisons")
    elif _is_condition(tree, symbols):
        raise where.error(f"'{source.strip()}' is a condition (a bool), and every expression "
                          f"gives a float value: write where({source.strip()}, 1.0, 0.0)")
    return Expr(source.strip(), tree, frozenset(names))


def _depth(tree: ast.AST) -> int:
    """How deep ``tree`` nests, counted without recursion (a deep tree is what is measured)."""
    deepest, stack = 0, [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in ast.iter_child_nodes(node)
                     if not isinstance(child, ast.expr_context))
    return deepest


def _is_condition(node: ast.expr, symbols: Mapping[str, Symbol]) -> bool:
    """Comparisons, bool arguments and and/or/not of them: the bools that where() and the logic
    operators take."""
    if isinstance(node, ast.Name):
        return node.id in symbols and symbols[node.id].kind == "bool"
    return (isinstance(node, (ast.Compare, ast.BoolOp))
            or isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not))


class _Validator:
    def __init__(self, where: Where, symbols: Mapping[str, Symbol], names: set[str],
                 out_of_scope: Mapping[str, str]):
        self.where = where
        self.symbols = symbols
        self.names = names
        self.out_of_scope = out_of_scope

    def fail(self, message: str):
        raise self.where.error(message)

    def check(self, node: ast.AST) -> None:
        method = getattr(self, f"_check_{type(node).__name__}", None)
        if method is None:
            self.fail(f"'{ast.unparse(node)}' is not allowed in an expression "
                      f"({type(node).__name__} is not part of the expression language)")
        method(node)

    def _check_Constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, bool) or not isinstance(node.value, (int, float)):
            self.fail(f"constant {node.value!r} is not allowed: only numbers (strings only in "
                      f"'choice == \"value\"' tests)")

    def _check_Name(self, node: ast.Name) -> None:
        symbol = self.symbols.get(node.id)
        if symbol is None:
            if node.id in FUNCTIONS:
                self.fail(f"'{node.id}' is a function; call it as {node.id}(...)")
            if node.id in self.out_of_scope:
                self.fail(f"name '{node.id}' cannot be used here: {self.out_of_scope[node.id]}")
            declared = ", ".join(sorted(n for n, s in self.symbols.items()
                                        if s.kind != "host")) or "none"
            self.fail(f"name '{node.id}' is used but not declared (declared: {declared})")
        if symbol.kind == "host":
            self.fail(f"name '{node.id}' cannot be used here: a host argument (it shapes or "
                      f"types the outputs on the host, and no kernel reads it)")
        if symbol.kind == "choice":
            self.fail(f"choice argument '{node.id}' can only be tested with "
                      f"'{node.id} == \"value\"' in 'a if ... else b'")
        self.names.add(node.id)

    def _check_UnaryOp(self, node: ast.UnaryOp) -> None:
        if not isinstance(node.op, (ast.USub, ast.UAdd, ast.Not)):
            self.fail(f"operator in '{ast.unparse(node)}' is not allowed")
        self.check(node.operand)
        if isinstance(node.op, ast.Not):
            self.need_condition(node.operand, "'not' takes")
        else:
            self.need_value(node.operand, f"'{ast.unparse(node.op).strip() or '-'}' takes")

    def need_value(self, node: ast.expr, who: str) -> None:
        # Triton computes a comparison (and takes a bool argument) as int1, which exp, -, + and
        # * refuse or misread: a condition becomes a value through where(), as in torch's
        # x.float()
        if _is_condition(node, self.symbols):
            text = ast.unparse(node)
            self.fail(f"'{text}' is a condition (a bool), and {who} a value: write "
                      f"where({text}, 1.0, 0.0)")

    def need_condition(self, node: ast.expr, who: str) -> None:
        # a float is not a bool: Triton's logic operators are bitwise and refuse floats, and
        # torch.where refuses a float condition
        if not _is_condition(node, self.symbols):
            self.fail(f"'{ast.unparse(node)}': {who} a condition (a comparison such as x > 0, or "
                      f"and/or/not of comparisons), not a value")

    def _check_BinOp(self, node: ast.BinOp) -> None:
        if type(node.op) not in _BINOPS:
            self.fail(f"operator in '{ast.unparse(node)}' is not allowed; "
                      f"use + - * / and integer powers **")
        if isinstance(node.op, ast.Pow):
            exponent = _int_constant(node.right)
            if exponent is None or abs(exponent) > MAX_POWER:
                self.fail(f"'{ast.unparse(node)}': only integer constant powers up to "
                          f"{MAX_POWER} are allowed (use exp/log for others)")
            self.check(node.left)
            self.need_value(node.left, "'**' takes")
            return
        self.check(node.left)
        self.check(node.right)
        self.need_value(node.left, "arithmetic takes")
        self.need_value(node.right, "arithmetic takes")

    def _check_BoolOp(self, node: ast.BoolOp) -> None:
        for value in node.values:
            self.check(value)
            self.need_condition(value, "'and' and 'or' take")

    def _check_Compare(self, node: ast.Compare) -> None:
        if len(node.ops) != 1 or type(node.ops[0]) not in _CMPOPS:
            self.fail(f"'{ast.unparse(node)}': only single comparisons < <= > >= == != are allowed")
        self.check(node.left)
        self.check(node.comparators[0])
        self.need_value(node.left, "a comparison takes")
        self.need_value(node.comparators[0], "a comparison takes")

    def _check_IfExp(self, node: ast.IfExp) -> None:
        test = node.test
        ok = (isinstance(test, ast.Compare) and len(test.ops) == 1
              and isinstance(test.ops[0], (ast.Eq, ast.NotEq))
              and isinstance(test.left, ast.Name)
              and isinstance(test.comparators[0], ast.Constant)
              and isinstance(test.comparators[0].value, str))
        symbol = self.symbols.get(test.left.id) if ok else None
        if symbol is None or symbol.kind != "choice":
            self.fail(f"'{ast.unparse(node)}': a conditional must test a choice argument, "
                      f"as in 'a if mode == \"fast\" else b'; use where(cond, a, b) on values")
        value = test.comparators[0].value
        if value not in symbol.choices:
            self.fail(f"'{ast.unparse(test)}': '{value}' is not a value of choice "
                      f"'{symbol.name}' (one of: {', '.join(symbol.choices)})")
        self.names.add(symbol.name)
        self.check(node.body)
        self.check(node.orelse)
        self.need_value(node.body, "a conditional gives")
        self.need_value(node.orelse, "a conditional gives")

    def _check_Call(self, node: ast.Call) -> None:
        if not isinstance(node.func, ast.Name):
            self.fail(f"'{ast.unparse(node.func)}' is not allowed as a function; "
                      f"allowed: {', '.join(sorted(FUNCTIONS))}")
        name = node.func.id
        if name not in FUNCTIONS:
            self.fail(f"unknown function '{name}'; allowed: {', '.join(sorted(FUNCTIONS))}")
        if node.keywords:
            self.fail(f"'{ast.unparse(node)}': keyword arguments are not allowed")
        arity = FUNCTIONS[name][0]
        if len(node.args) != arity:
            self.fail(f"'{ast.unparse(node)}': {name} takes {arity} argument(s), "
                      f"got {len(node.args)}")
        for arg in node.args:
            self.check(arg)
        if name == "where":
            self.need_condition(node.args[0], "where's first argument must be")
        for arg in node.args[1:] if name == "where" else node.args:
            self.need_value(arg, f"{name} takes")


def _int_constant(node: ast.expr) -> int | None:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = _int_constant(node.operand)
        return None if inner is None else -inner
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    return None


def helpers(expr: Expr) -> set[str]:
    """The ``specgen.kernel_lib`` functions ``expr``'s emitted code calls."""
    called = {node.func.id for node in ast.walk(expr.tree) if isinstance(node, ast.Call)}
    return {FUNCTIONS[name][1] for name in called if not FUNCTIONS[name][1].startswith("tl.")}


# an integer literal where the math may be an integer type: of the type a kernel sets for them
# (INT_MATH: int64 for integer data, the math's type for float data; templates/_macros.py.jinja)
TYPED_INT = "tl.full([], {}, INT_MATH)"


def emit(expr: Expr | ast.expr, names: Mapping[str, str], integers: bool = False,
         typed_ints: bool = False) -> str:
    """Triton source for ``expr``; ``names`` maps spec names to the kernel's variable names.
    ``integers``: integer literals stay integers (index arithmetic, as an attention mask's);
    ``typed_ints``: they take ``TYPED_INT``'s type (a kernel whose math may be an integer type),
    else they are written as floats."""
    tree = expr.tree if isinstance(expr, Expr) else expr
    tree = _Emitter(names, integers, typed_ints).visit(_copy(tree))
    return ast.unparse(ast.fix_missing_locations(tree))


def _copy(tree: ast.expr) -> ast.expr:
    return ast.parse(ast.unparse(tree), mode="eval").body


class _Emitter(ast.NodeTransformer):
    def __init__(self, names: Mapping[str, str], integers: bool = False,
                 typed_ints: bool = False):
        self.names = names
        self.integers = integers
        self.typed_ints = typed_ints

    def visit_Name(self, node: ast.Name) -> ast.expr:
        return ast.Name(self.names.get(node.id, node.id), ast.Load())

    def visit_Call(self, node: ast.Call) -> ast.expr:
        if node.func.id == promotion.CONVERTED:   # a site promotion.wrap_sites wrapped
            return ast.Call(node.func, [self.visit(node.args[0]), node.args[1]], [])
        callee = FUNCTIONS[node.func.id][1]
        return ast.Call(_dotted(callee), [self.visit(arg) for arg in node.args], [])

    def visit_BinOp(self, node: ast.BinOp) -> ast.expr:
        if not isinstance(node.op, ast.Pow):
            return self.generic_visit(node)
        # x ** n is unrolled into products: Triton has no power operator on tensors
        base = self.visit(node.left)
        exponent = _int_constant(node.right)
        if exponent == 0:
            return self.visit(ast.Constant(1))
        product = base
        for _ in range(abs(exponent) - 1):
            product = ast.BinOp(product, ast.Mult(), base)
        return ast.BinOp(ast.Constant(1.0), ast.Div(), product) if exponent < 0 else product

    def visit_BoolOp(self, node: ast.BoolOp) -> ast.expr:
        # element-wise logic on boolean tensors is bitwise in Triton
        op = ast.BitAnd() if isinstance(node.op, ast.And) else ast.BitOr()
        values = [self.visit(value) for value in node.values]
        result = values[0]
        for value in values[1:]:
            result = ast.BinOp(result, op, value)
        return result

    def visit_Constant(self, node: ast.Constant) -> ast.expr:
        # an integer literal left as it is would make Triton compute in int32 (where(x > 0, 1,
        # 0) is an int32 tensor, stored as its bits into a bfloat16 output; 100000 * 100000
        # wraps): a float where all math is, else TYPED_INT's type, as torch takes x * 4 of an
        # int64 x in int64
        if type(node.value) is int and not self.integers:
            if self.typed_ints:
                return ast.parse(TYPED_INT.format(node.value), mode="eval").body
            return ast.Constant(float(node.value))
        return node

    def visit_UnaryOp(self, node: ast.UnaryOp) -> ast.expr:
        operand = self.visit(node.operand)
        if isinstance(node.op, ast.UAdd):
            return operand      # Triton's tensors have no unary +
        op = ast.Invert() if isinstance(node.op, ast.Not) else node.op
        return ast.UnaryOp(op, operand)


def _dotted(path: str) -> ast.expr:
    head, *rest = path.split(".")
    node: ast.expr = ast.Name(head, ast.Load())
    for part in rest:
        node = ast.Attribute(node, part, ast.Load())
    return node

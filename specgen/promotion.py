"""Torch's type promotion inside a pointwise expression: where an operand is converted.

Torch computes ``x + s * t`` as two ops: ``s * t`` in its own dtype, then ``+``, which converts
each operand to the two's common dtype (int32 6147 beside float16 is 6148.0). A kernel that does
all its math in one type (COMPUTE: float32 for 16- and 32-bit results) matches torch only if it
rounds an operand where torch's conversion narrows it. The generator wraps every operand that
such a conversion may narrow (a *site*: an operand of ``+ - * /``, a comparison, ``where``,
``minimum`` or ``maximum`` that reads a tensor) in ``round_to_promoted(value, CONVERT_k)``; on each call
the host works out the dtypes torch gives each node for the call's tensors (their dtypes, and
which are 0-dim: torch.result_type's rules) and names the type each site rounds to, or none.

Intermediates are otherwise kept in COMPUTE (gelu of a float16 is not rounded to float16 before
its use), as torch.compile keeps them. Scalars and constants are never rounded (torch computes
``x * 0.1`` with 0.1 in float32 for a float16 ``x``). Both sides walk the expression with
``sites``: the generator numbers what the host names.
"""

from __future__ import annotations

import ast
import copy
from typing import Iterator, Mapping, Sequence

import torch

# the kernel_lib helper a site's operand is wrapped in, and its constexprs' prefix
CONVERTED = "round_to_promoted"
CONVERT_PREFIX = "CONVERT_"

_ARITHMETIC = (ast.Add, ast.Sub, ast.Mult, ast.Div)
# functions whose value operands torch promotes together (where's first argument is its condition)
_PROMOTING_CALLS = {"where": (1, 2), "minimum": (0, 1), "maximum": (0, 1)}
# functions whose result keeps its operand's dtype (the others give a float: float32 of an integer)
_SAME_DTYPE_CALLS = {"abs", "relu"}
CASTS = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def promoted_operands(node: ast.AST) -> tuple[ast.expr, ...]:
    """The operands of ``node`` that torch converts to a common dtype (none if ``node`` does not
    promote)."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, _ARITHMETIC):
        return node.left, node.right
    if isinstance(node, ast.Compare):
        return node.left, node.comparators[0]
    if isinstance(node, ast.Call) and node.func.id in _PROMOTING_CALLS:
        return tuple(node.args[i] for i in _PROMOTING_CALLS[node.func.id])
    return ()


def sites(tree: ast.AST, tensors: frozenset[str] | set[str]) -> Iterator[ast.expr]:
    """The operands of ``tree`` a conversion may narrow, in a fixed order (each before the sites
    inside it; left to right): promoted operands that read a name in ``tensors``."""
    operands = promoted_operands(tree)
    for child in ast.iter_child_nodes(tree):
        if any(child is operand for operand in operands) and _reads(child, tensors):
            yield child
        yield from sites(child, tensors)


def _reads(tree: ast.AST, names: frozenset[str] | set[str]) -> bool:
    return any(isinstance(n, ast.Name) and n.id in names for n in ast.walk(tree))


def wrap_sites(tree: ast.expr, tensors: frozenset[str] | set[str], first: int = 0
               ) -> tuple[ast.expr, int]:
    """``tree`` with its sites wrapped in ``round_to_promoted(site, CONVERT_k)``, numbered from
    ``first`` (``tree`` itself is left as it was); and the number after the last."""
    tree = copy.deepcopy(tree)
    numbers = {id(site): first + k for k, site in enumerate(sites(tree, tensors))}

    class Wrapper(ast.NodeTransformer):
        def visit(self, node):
            number = numbers.get(id(node))
            node = super().visit(node)
            if number is None:
                return node
            return ast.Call(ast.Name(CONVERTED, ast.Load()),
                            [node, ast.Name(f"{CONVERT_PREFIX}{number}", ast.Load())], [])

    return ast.fix_missing_locations(Wrapper().visit(tree)), first + len(numbers)


# A node's value as torch types it: a meta tensor (shape (1,) for a tensor with dimensions, ()
# for a 0-dim one, which torch.result_type ranks lower) or a Python number (a scalar or a
# constant: "wrapped", ranked lowest).
Value = torch.Tensor | float | int | bool


def conversions(expressions: Sequence[tuple[str, ast.expr]], leaves: Mapping[str, Value],
                result: torch.dtype, compute: torch.dtype) -> tuple[str, ...]:
    """For each site of ``expressions`` (``(output, tree)`` in order; a later one may read an
    earlier output, a tensor of the result's dtype), the dtype torch's conversion rounds it to
    where that is narrower than ``compute`` and changes a value of the operand's dtype, else "".
    ``leaves``: each name's value (``leaf``)."""
    values = dict(leaves)
    tensors = {name for name, value in values.items() if isinstance(value, torch.Tensor)}
    found: list[str] = []
    for output, tree in expressions:
        site_ids = {id(site) for site in sites(tree, tensors)}
        typer = _Typer(values, site_ids, compute, found)
        typer.value(tree)
        dims = any(isinstance(v, torch.Tensor) and v.dim() for v in leaves.values())
        values[output] = leaf(result, dims)
        tensors.add(output)
    return tuple(found)


def leaf(dtype: torch.dtype, has_dims: bool = True) -> torch.Tensor:
    """A tensor name's value for ``conversions``: its dtype, and whether it has dimensions."""
    return torch.empty((1,) if has_dims else (), dtype=dtype, device="meta")


def scalar(value: object) -> Value:
    """A scalar argument's value for ``conversions``: its Python type (float, int, bool: torch
    promotes a float argument given as 1 as an int), or a choice's string."""
    if isinstance(value, str):
        return value
    return {float: 0.5, int: 1, bool: True}.get(value, 0.5)


class _Typer:
    """Walks a tree in ``sites``' order, typing each node as torch does and noting each site's
    conversion in ``found``."""

    def __init__(self, values, site_ids, compute, found):
        self.values, self.site_ids, self.compute, self.found = values, site_ids, compute, found

    def value(self, node: ast.AST) -> Value:
        typed, slots = {}, {}
        for child in ast.iter_child_nodes(node):
            if not isinstance(child, ast.expr):
                continue
            if id(child) in self.site_ids:   # numbered before the sites inside it, as in sites()
                slots[id(child)] = len(self.found)
                self.found.append("")
            typed[id(child)] = self.value(child)
        operands = promoted_operands(node)
        if operands:
            common = _common([typed[id(o)] for o in operands])
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
                common = _true_division(common)
            for operand in operands:
                if id(operand) in slots:
                    self.found[slots[id(operand)]] = _narrowing(typed[id(operand)], common,
                                                                self.compute)
        return self._node_value(node, typed, operands)

    def _node_value(self, node, typed, operands) -> Value:
        def of(child):
            return typed[id(child)]

        if isinstance(node, ast.Name):
            return self.values.get(node.id, 0.5)   # a choice (tested at compile time)
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, (ast.Compare, ast.BoolOp)) or (
                isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not)):
            return _like(torch.bool, list(typed.values()))
        if isinstance(node, ast.UnaryOp):
            return of(node.operand)
        if isinstance(node, ast.BinOp):
            if isinstance(node.op, ast.Pow):
                return of(node.left)
            common = _common([of(o) for o in operands])
            return _true_division(common) if isinstance(node.op, ast.Div) else common
        if isinstance(node, ast.IfExp):   # on a choice: the branch its value takes
            chosen = _choice_test(node.test, self.values)
            if chosen is None:
                return _common([of(node.body), of(node.orelse)])
            return of(node.body) if chosen else of(node.orelse)
        if isinstance(node, ast.Call):
            name = node.func.id
            if name == "where":   # ranked with its condition too (a tensor of scalars' type)
                common = _common([of(o) for o in operands])
                condition = of(node.args[0])
                if not isinstance(condition, torch.Tensor):
                    return common
                dtype = common.dtype if isinstance(common, torch.Tensor) else (
                    torch.get_default_dtype() if isinstance(common, float) else
                    torch.bool if isinstance(common, bool) else torch.int64)
                return _like(dtype, [common, condition])
            if name in _PROMOTING_CALLS:
                return _common([of(o) for o in operands])
            argument = of(node.args[0])
            if name in CASTS:
                return _like(CASTS[name], [argument])
            if name in _SAME_DTYPE_CALLS:
                return argument
            return _floating(argument)
        raise TypeError(f"promotion: no rule for {ast.dump(node)}")


def _choice_test(test: ast.expr, values: Mapping[str, Value]) -> bool | None:
    """``mode == "v"`` (or ``!=``) of a choice whose value ``values`` holds, else None."""
    if not (isinstance(test, ast.Compare) and isinstance(test.left, ast.Name)
            and isinstance(values.get(test.left.id), str)):
        return None
    equal = values[test.left.id] == test.comparators[0].value
    return equal if isinstance(test.ops[0], ast.Eq) else not equal


def _common(values: list[Value]) -> Value:
    """What torch gives an op of ``values`` (torch.result_type), ranked as the highest of them:
    a tensor, or a Python number where none is one."""
    common = values[0]
    for other in values[1:]:
        if isinstance(common, torch.Tensor) or isinstance(other, torch.Tensor):
            common = _like(torch.result_type(common, other), [common, other])
        else:
            common = 0.5 if isinstance(common, float) or isinstance(other, float) else 1
    return common


def _like(dtype: torch.dtype, values: list[Value]) -> Value:
    """A value of ``dtype`` ranked as the highest of ``values``."""
    tensors = [v for v in values if isinstance(v, torch.Tensor)]
    if not tensors:
        return True if dtype == torch.bool else 0.5 if dtype.is_floating_point else 1
    return leaf(dtype, any(t.dim() for t in tensors))


def _true_division(value: Value) -> Value:
    """``/`` converts integer operands to the default float dtype first."""
    if isinstance(value, torch.Tensor) and not value.dtype.is_floating_point:
        return _like(torch.get_default_dtype(), [value])
    return float(value) if not isinstance(value, torch.Tensor) else value


def _floating(value: Value) -> Value:
    """A float function's result: a float operand's dtype, else the default float dtype."""
    if isinstance(value, torch.Tensor):
        return value if value.dtype.is_floating_point else _like(torch.get_default_dtype(), [value])
    return 0.5


def _narrowing(operand: Value, common: Value, compute: torch.dtype) -> str:
    """The dtype an operand of ``operand``'s type is rounded to when converted to ``common``'s,
    where that is a float narrower than ``compute`` that does not hold every value of the
    operand's dtype; else ""."""
    if not (isinstance(operand, torch.Tensor) and isinstance(common, torch.Tensor)):
        return ""
    source, target = operand.dtype, common.dtype
    if source == target or not target.is_floating_point or not compute.is_floating_point:
        return ""
    if torch.finfo(target).bits >= torch.finfo(compute).bits or _holds(target, source):
        return ""
    return str(target).removeprefix("torch.")


def _holds(target: torch.dtype, source: torch.dtype) -> bool:
    """Whether float dtype ``target`` holds every value of ``source`` exactly."""
    if source == torch.bool:
        return True
    digits = _significand_bits(target)
    if source.is_floating_point:
        return (_significand_bits(source) <= digits
                and torch.finfo(source).max <= torch.finfo(target).max
                and torch.finfo(source).tiny >= torch.finfo(target).tiny)
    info = torch.iinfo(source)
    return max(info.max, -info.min).bit_length() <= digits


def _significand_bits(dtype: torch.dtype) -> int:
    return {torch.float16: 11, torch.bfloat16: 8, torch.float32: 24, torch.float64: 53}[dtype]

"""Expressions as sums of products, for the derived backward kernels (rowwise_backward.py).

A derived gradient is a sum of terms, each a product of per-row values (a step, 1 / N, a
function of steps such as ``rsqrt(var + eps)``) and element values (tensors, ``x - mean``,
``exp(x - max)``). Written out as the chain rule builds it, its terms cancel only after each is
rounded: layer_norm's gradient over a row of one element is ``rstd * g * w - rstd * g * w``
with the two products rounded differently (an FMA contracts one), about 1e-4 where torch's
formula gives 0. As sums of products the derivation can

- sum an adjoint's element factors over the row one at a time, ``sum(rstd * g * w) =
  rstd * sum(g * w)``, and reuse a forward step that already sums one (softmax's sum of exps);
- cancel terms exactly: softmax's max is a shift whose adjoint is ``-S / s + S * s / s**2``,
  which is 0 as polynomials, so its kernel computes neither that adjoint nor the tie count;
- group a gradient's terms by their per-row factors, ``rstd * (g * w - sum(g * w) / N)``, so
  that what cancels is subtracted before it is scaled, as in torch's hand-written formulas.

Atoms are subtrees kept whole, keyed by their ``ast.dump``: names, calls, and the sums the spec
itself wrote over elements (``x - mean`` is computed element-wise first; expanding it into
``x`` and ``-mean`` would cancel after scaling). Sums and products made by the derivation are
expanded, up to ``MAX_TERMS`` terms a product (a larger one stays whole).
"""

from __future__ import annotations

import ast

from specgen import derive

MAX_TERMS = 64

Monomial = tuple[tuple[str, int], ...]   # (atom key, exponent), sorted by key
Poly = dict[Monomial, float]


def _times(a: Monomial, b: Monomial) -> Monomial:
    powers = dict(a)
    for key, exponent in b:
        powers[key] = powers.get(key, 0) + exponent
    return tuple(sorted((k, e) for k, e in powers.items() if e != 0))


def product(a: Poly, b: Poly) -> Poly:
    out: Poly = {}
    for ma, ca in a.items():
        for mb, cb in b.items():
            m = _times(ma, mb)
            out[m] = out.get(m, 0.0) + ca * cb
    return {m: c for m, c in out.items() if c != 0.0}


def total(*polys: Poly) -> Poly:
    out: Poly = {}
    for poly in polys:
        for m, c in poly.items():
            out[m] = out.get(m, 0.0) + c
    return {m: c for m, c in out.items() if c != 0.0}


def scaled(poly: Poly, factor: float) -> Poly:
    return {m: c * factor for m, c in poly.items()} if factor != 0.0 else {}


def constant(value: float) -> Poly:
    return {(): value} if value != 0.0 else {}


class Atoms:
    """The atoms of one derivation: their trees, which read an element, which are reductions."""

    def __init__(self, element_names: set[str], spec_sums: set[str], reductions: set[str]):
        self.element_names = element_names  # tensors and output gradients
        self.spec_sums = spec_sums          # dumps of the element sums the spec wrote
        self.reductions = set(reductions)   # names of per-row sums (steps, counts, N)
        self.trees: dict[str, ast.expr] = {}
        self.elementwise: set[str] = set()

    def atom(self, tree: ast.expr) -> Poly:
        key = ast.dump(tree)
        if key not in self.trees:
            self.trees[key] = tree
            if any(isinstance(n, ast.Name) and n.id in self.element_names
                   for n in ast.walk(tree)):
                self.elementwise.add(key)
        return {((key, 1),): 1.0}

    def name(self, name: str) -> Poly:
        return self.atom(ast.Name(name, ast.Load()))

    def is_reduction(self, key: str) -> bool:
        tree = self.trees[key]
        return isinstance(tree, ast.Name) and tree.id in self.reductions

    # ---- trees to polynomials ----

    def expand(self, tree: ast.expr) -> Poly:
        value = derive.value(tree)
        if value is not None:
            return constant(value)
        if isinstance(tree, ast.UnaryOp) and isinstance(tree.op, (ast.USub, ast.UAdd)):
            inner = self.expand(tree.operand)
            return scaled(inner, -1.0) if isinstance(tree.op, ast.USub) else inner
        if isinstance(tree, ast.BinOp):
            return self._binop(tree)
        return self.atom(tree)

    def _binop(self, tree: ast.BinOp) -> Poly:
        if isinstance(tree.op, (ast.Add, ast.Sub)):
            if ast.dump(tree) in self.spec_sums:
                return self.atom(tree)
            return self._terms(tree)
        if isinstance(tree.op, ast.Mult):
            left, right = self.expand(tree.left), self.expand(tree.right)
            if len(left) * len(right) > MAX_TERMS:
                return self.atom(tree)
            return product(left, right)
        if isinstance(tree.op, ast.Div):
            denominator = self.expand(tree.right)
            if len(denominator) != 1:
                return product(self.expand(tree.left), self.power(self.atom(tree.right), -1))
            return product(self.expand(tree.left), self.power(denominator, -1))
        if isinstance(tree.op, ast.Pow):
            exponent = derive.int_exponent(tree.right)
            base = self.expand(tree.left)
            if len(base) == 1:
                return self.power(base, exponent)
            if 0 < exponent <= 3 and len(base) ** exponent <= MAX_TERMS:
                out = constant(1.0)
                for _ in range(exponent):
                    out = product(out, base)
                return out
        return self.atom(tree)

    def _terms(self, tree: ast.BinOp) -> Poly:
        right = self.expand(tree.right)
        return total(self.expand(tree.left),
                     scaled(right, -1.0) if isinstance(tree.op, ast.Sub) else right)

    def opened(self, key: str) -> Poly | None:
        """A spec-written element sum (``x - mean``, an atom) as the sum of its terms; None for
        any other atom."""
        return self._terms(self.trees[key]) if key in self.spec_sums else None

    @staticmethod
    def power(single: Poly, exponent: int) -> Poly:
        """A one-term polynomial to an integer power."""
        (monomial, coefficient), = single.items()
        return {tuple((k, e * exponent) for k, e in monomial): coefficient ** exponent}

    # ---- splitting and writing out ----

    def split(self, monomial: Monomial) -> tuple[Monomial, Monomial]:
        """(its per-row factors, its element factors)."""
        row = tuple((k, e) for k, e in monomial if k not in self.elementwise)
        return row, tuple((k, e) for k, e in monomial if k in self.elementwise)

    def monomial_tree(self, monomial: Monomial) -> ast.expr:
        return self.tree({monomial: 1.0})

    def tree(self, poly: Poly) -> ast.expr:
        """``poly`` written out, its terms grouped by the per-row factors they share that are not
        reductions (``rstd``, not ``N`` or a sum): each group's factor multiplies the sum of its
        terms, so that what cancels inside is subtracted before it is scaled."""
        groups: dict[Monomial, Poly] = {}
        for monomial, coefficient in poly.items():
            factor = tuple((k, e) for k, e in monomial
                           if k not in self.elementwise and not self.is_reduction(k))
            rest = tuple((k, e) for k, e in monomial if (k, e) not in factor)
            groups.setdefault(factor, {})[rest] = coefficient
        out = derive.const(0.0)
        for factor in sorted(groups):
            inner = self._plain(groups[factor])
            if factor:
                inner = derive.mul(self._plain({factor: 1.0}), inner)
            out = derive.add(out, inner)
        return out

    def _plain(self, poly: Poly) -> ast.expr:
        out = derive.const(0.0)
        for monomial in sorted(poly):
            coefficient = poly[monomial]
            term = self._term(monomial, abs(coefficient))
            out = derive.sub(out, term) if coefficient < 0 else derive.add(out, term)
        return out

    def _term(self, monomial: Monomial, coefficient: float) -> ast.expr:
        numerator = derive.const(coefficient)
        denominator = derive.const(1.0)
        for key, exponent in monomial:
            factor = derive.power(self.trees[key], abs(exponent))
            if exponent > 0:
                numerator = derive.mul(numerator, factor)
            else:
                denominator = derive.mul(denominator, factor)
        if derive.value(denominator) is None and not any(
                k in self.elementwise for k, e in monomial if e < 0):
            # a per-row divisor: one reciprocal a row, a product an element
            return derive.mul(numerator, derive.div(derive.const(1.0), denominator))
        return derive.div(numerator, denominator)


def spec_sums(trees: list[ast.expr], element_names: set[str]) -> set[str]:
    """The dumps of the sums in ``trees`` that read an element (kept whole)."""
    sums = set()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)) and any(
                    isinstance(n, ast.Name) and n.id in element_names for n in ast.walk(node)):
                sums.add(ast.dump(node))
    return sums

"""The backward of a row-wise op, derived from its spec: a row-wise op, built and tested as any.

A row-wise op computes reductions r_1..r_K over a row (each a sum, max or min of an element
expression f_k of the row's tensors and the earlier r), then element outputs h_o. Given the
gradient g_o of each output, the gradient of a full-shape input t at element j is

    dt_j = sum_o g_o,j dh_o,j/dt_j + sum_k a_k D_k,j df_k,j/dt_j

where a_k, the adjoint of r_k, is itself a sum over the row, taken last reduction first:

    a_k = sum_i (sum_o g_o,i dh_o,i/dr_k + sum_(m > k) a_m D_m,i df_m,i/dr_k)

and D_k,j is how r_k moves with f_k,j: its scale for a sum; for a max or min, 1 / (the count of
elements equal to it) where f_k,j equals it, as torch's amax splits its gradient among ties. So
the backward is a row-wise op: the forward's steps again, a count per max or min whose adjoint
is not zero, sums over the row for the adjoints, then the gradients as element outputs. The
adjoints and gradients are computed as sums of products (specgen/polynomial.py): each adjoint
is a per-row polynomial in sums of element factors, terms cancel exactly, and each gradient is
written grouped by its per-row factors. It gets every strategy, layout and index width of the
family, and the property suite checks it against torch's vector-Jacobian product of the
forward's reference. The forward's eager autograd calls it (docs/design.md, "Backward").

A tensor read along the rows (a weight, a bias) has the same element-wise gradient, summed over
the rows: the derived op's column outputs ([columns]), which its kernels sum as they go.

Derived for the ops whose outputs are all element-wise and whose step scales read no step; others
keep the backward by reference. The derived op takes every tensor (the forward passes an omitted
optional one as the constant it stands for, where x's dtype holds it), and leaves out a forward's
dtype argument: it serves calls whose dtype= cast leaves x's values as they are (bfloat16 x,
dtype=float32, as attention code calls softmax), given the output's gradient in that dtype; a
cast that rounds x (float32 to float16) takes the reference's gradient.
"""

from __future__ import annotations

import ast
import dataclasses

from specgen import derive, polynomial
from specgen.derive import NotDifferentiable, grad_name
from specgen.errors import Where
from specgen.families import rowwise
from specgen.model import OpSpec, TensorArg
from specgen.polynomial import Poly
from specgen.table import Table

SUFFIX = "_backward"


def derived_specs(spec: OpSpec) -> tuple[OpSpec, ...]:
    """The ops derived from a row-wise spec at the spec stage: its backward, where it has one."""
    derived = backward_spec(spec)
    return () if derived is None else (derived,)


def backward_spec(spec: OpSpec) -> OpSpec | None:
    """The derived backward op of a row-wise ``spec``, or None where none is derived. Cached: a
    build asks twice (the op's module calls it, and the derived op is built as one more spec)."""
    body: rowwise.RowwiseBody = spec.body
    scales_read_steps = any(s.scale is not None and s.scale.names & _steps(body)
                            for s in body.steps)
    if body.derived_from is not None or body.row_outputs or scales_read_steps:
        return None
    tensors = [t.name for t in spec.tensors]
    outputs = [o.name for o in body.outputs]
    taken = {a.name for a in spec.args} | _steps(body) | set(outputs) | {rowwise.N_SYMBOL}
    new = ([grad_name(o) for o in outputs] + [grad_name(t) for t in tensors]
           + [f"count_{s.name}" for s in body.steps])
    if taken & set(new) or len(set(new)) != len(new):
        return None
    try:
        reduce, compute = _derive(body, tensors, taken | set(new))
    except NotDifferentiable:
        return None
    columns = {grad_name(t): compute.pop(grad_name(t)) for t in body.along}
    args = tuple(TensorArg(a.name, low=a.low, high=a.high) for a in spec.tensors) + tuple(
        TensorArg(grad_name(o)) for o in outputs) + tuple(
        a for a in spec.args if not isinstance(a, TensorArg) and a.name != body.dtype)
    # gradients laid out as the forward lays out its results, as torch's backward kernels do
    # (softmax's and log_softmax's are contiguous whatever the layouts of x and the gradient)
    rows = {"tensor": body.tensor, "layout": body.layout}
    if body.along:
        rows["along"] = list(body.along)
    if body.normalized_shape is not None:
        rows["normalized_shape"] = body.normalized_shape
    else:
        rows["dim"] = body.dim
    if body.finfo_eps:
        rows["finfo_eps"] = list(body.finfo_eps)
    table = {"rows": rows, "reduce": reduce, "compute": compute,
             "tuning": {"CHUNK": list(body.chunks), "num_warps": list(body.num_warps)}}
    if columns:
        table["columns"] = columns
    name = spec.name + SUFFIX
    where = Where(spec.source.path).child(f"(derived {name})")
    # a gradient has its tensor's dtype (a float32 weight's, under bfloat16 rows), as torch's
    derived_body = dataclasses.replace(rowwise.parse_body(Table(table, where), args, name),
                                       derived_from=spec.name,
                                       output_dtypes=tuple((grad_name(t), t) for t in tensors))
    return OpSpec(
        name=name, family=spec.family,
        doc=f"the gradient of {spec.name} with respect to {', '.join(tensors)}, given the "
            f"gradient of {', '.join(outputs)} (derived from its spec)",
        reference=_reference(spec, tensors, outputs), args=args, dtypes=spec.dtypes,
        indexing=spec.indexing, source=spec.source, body=derived_body)


def _steps(body) -> set[str]:
    return {s.name for s in body.steps}


def _derive(body, tensors: list[str], taken: set[str]) -> tuple[dict, dict]:
    """The derived op's [reduce] and [compute] tables.

    The adjoints and gradients are sums of products (specgen/polynomial.py): an adjoint is a
    per-row polynomial in sums over the row of element factors (a forward sum step where one
    sums that factor already, else a new sum step), and each gradient is written out grouped by
    its per-row factors."""
    # earlier outputs are intermediate values of later ones: inline them
    inlined: dict[str, ast.expr] = {}
    for output in body.outputs:
        inlined[output.name] = derive.substitute(output.expr.tree, inlined)
    cotangents = [(ast.Name(grad_name(o), ast.Load()), tree) for o, tree in inlined.items()]
    element = set(tensors) | {grad_name(o) for o in inlined}
    counts = {s.name: f"count_{s.name}" for s in body.steps if s.op != "sum"}
    atoms = polynomial.Atoms(
        element, polynomial.spec_sums([*inlined.values(), *(s.of.tree for s in body.steps)],
                                      element),
        {s.name for s in body.steps} | set(counts.values()) | {rowwise.N_SYMBOL})

    def through_outputs(name: str) -> Poly:
        """sum_o g_o dh_o/d name, at one element."""
        return polynomial.total(*(atoms.expand(derive.mul(g, derive.partial(tree, name)))
                                  for g, tree in cotangents))

    reduce = {s.name: _step_table(s) for s in body.steps}
    added: dict[str, dict] = {}          # new sum steps, by name
    sums = _forward_sums(body, atoms)    # an element factor's sum over the row, per row

    def row_sum(poly: Poly) -> Poly:
        """The sum over the row of ``poly``: its per-row factors taken out, one sum per element
        factor."""
        out: Poly = {}
        for monomial, coefficient in poly.items():
            row, factor = atoms.split(monomial)
            if _sums_to_zero(factor, atoms, sums):
                continue
            if factor not in sums:
                if not factor:
                    sums[factor] = atoms.name(rowwise.N_SYMBOL)
                else:
                    name = _fresh(f"sum_{len(added)}", taken)
                    added[name] = {"op": "sum", "of": derive.source(atoms.monomial_tree(factor))}
                    atoms.reductions.add(name)
                    sums[factor] = atoms.name(name)
            out = polynomial.total(out, polynomial.product({row: coefficient}, sums[factor]))
        return out

    # a_k D_k, for the steps whose adjoint is not zero
    weighted: dict[str, Poly] = {}
    for k in reversed(range(len(body.steps))):
        step = body.steps[k]
        term = through_outputs(step.name)
        for later in body.steps[k + 1:]:
            if later.name in weighted:
                term = polynomial.total(term, polynomial.product(
                    weighted[later.name], atoms.expand(derive.partial(later.of.tree, step.name))))
        adjoint = row_sum(term)
        if adjoint:
            weighted[step.name] = polynomial.product(adjoint, atoms.expand(_local_slope(step)))

    compute = {}
    for t in tensors:
        gradient = through_outputs(t)
        for step in body.steps:
            if step.name in weighted:
                gradient = polynomial.total(gradient, polynomial.product(
                    weighted[step.name], atoms.expand(derive.partial(step.of.tree, t))))
        if not gradient:
            raise NotDifferentiable(f"the gradient of {t} is zero")
        compute[grad_name(t)] = derive.source(atoms.tree(gradient))
    # the tie counts and sums the gradients read, after the forward's steps
    read = {n.id for source in compute.values() for n in ast.walk(derive.parse(source))
            if isinstance(n, ast.Name)}
    for step in body.steps:
        if counts.get(step.name) in read:
            hit = _hit(step)
            reduce[counts[step.name]] = {"op": "sum", "of": derive.source(hit)}
    reduce.update({name: table for name, table in added.items() if name in read})
    return reduce, compute


def _forward_sums(body, atoms: polynomial.Atoms) -> dict:
    """The element factors the forward's sum steps sum already, each with its sum as a per-row
    polynomial: softmax's sum of exps, layer_norm's N * mean of x."""
    sums = {}
    for step in body.steps:
        if step.op != "sum":
            continue
        of = atoms.expand(step.of.tree)
        scale = atoms.expand(step.scale.tree) if step.scale is not None else polynomial.constant(1.0)
        if len(of) != 1 or len(scale) != 1:
            continue
        (monomial, coefficient), = of.items()
        row, factor = atoms.split(monomial)
        if row or not factor:
            continue
        # step = coefficient * scale * sum(factor)
        inverse = atoms.power(polynomial.scaled(scale, coefficient), -1)
        sums.setdefault(factor, polynomial.product(atoms.name(step.name), inverse))
    return sums


def _sums_to_zero(factor: polynomial.Monomial, atoms: polynomial.Atoms, sums: dict) -> bool:
    """Whether ``factor`` is a spec-written element sum whose sum over the row is 0 by the sums
    already known: layer_norm's ``x - mean``, as ``sum(x) - N * mean`` with ``sum(x) = N *
    mean``. Its float32 sum is a rounding error, which torch's formula leaves out as well."""
    if len(factor) != 1 or factor[0][1] != 1:
        return False
    terms = atoms.opened(factor[0][0])
    if terms is None:
        return False
    out: Poly = {}
    for monomial, coefficient in terms.items():
        row, element = atoms.split(monomial)
        if element and element not in sums:
            return False
        summed = sums[element] if element else atoms.name(rowwise.N_SYMBOL)
        out = polynomial.total(out, polynomial.product({row: coefficient}, summed))
    return not out


def _fresh(name: str, taken: set[str]) -> str:
    while name in taken:
        name += "_"
    return name


def _step_table(step) -> dict:
    table = {"op": step.op, "of": step.of.source}
    if step.scale is not None:
        table["scale"] = step.scale.source
    return table


def _local_slope(step) -> ast.expr:
    """D_k, how r_k moves with one element's f_k: a sum's scale; for a max or min, 1 / (the count
    of the elements equal to it) where f_k equals it (``count_<step>``, a step of the derived op)."""
    if step.op == "sum":
        return derive.parse(step.scale.source) if step.scale is not None else derive.const(1.0)
    return derive.div(_hit(step), ast.Name(f"count_{step.name}", ast.Load()))


def _hit(step) -> ast.expr:
    """1 where the element's f_k equals the max (min) r_k, else 0."""
    return derive.indicator(derive.compare(derive.parse(step.of.source), ast.Eq(),
                                           ast.Name(step.name, ast.Load())))


def _reference(spec: OpSpec, tensors: list[str], outputs: list[str]) -> str:
    """torch's vector-Jacobian product of the forward's reference, with respect to its tensors; a
    forward argument the derived op lacks (its dtype) takes its default, None."""
    dtype = spec.body.dtype
    return derive.vjp_reference(spec.reference, tensors + ([f"{dtype}=None"] if dtype else []),
                                tensors, [grad_name(o) for o in outputs])

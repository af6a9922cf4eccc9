"""The backward of a row-wise op, derived from its spec: a row-wise op, built and tested as any.

A row-wise op computes reductions r_1..r_K over a row (each a sum, max or min of an element
expression f_k of the row's tensors and the earlier r), then element outputs h_o. Given the
gradient g_o of each output, the gradient of a full-shape input t at element j is

    dt_j = sum_o g_o,j dh_o,j/dt_j + sum_k a_k D_k,j df_k,j/dt_j

where a_k, the adjoint of r_k, is itself a sum over the row, taken last reduction first:

    a_k = sum_i (sum_o g_o,i dh_o,i/dr_k + sum_(m > k) a_m D_m,i df_m,i/dr_k)

and D_k,j is how r_k moves with f_k,j: its scale for a sum; for a max or min, 1 / (the count of
elements equal to it) where f_k,j equals it, as torch's amax splits its gradient among ties. So
the backward is a row-wise op: the forward's steps again, a count per max or min, the adjoints,
then the gradients as element outputs. It gets every strategy, layout and index width of the
family, and the property suite checks it against torch's vector-Jacobian product of the
forward's reference. The forward's eager autograd calls it (docs/design.md, "Backward").

A tensor read along the rows (a weight, a bias) has the same element-wise gradient, summed over
the rows: the derived op's column outputs ([columns]), which its kernels sum as they go.

Derived for the ops whose outputs are all element-wise and whose step scales read no step; others
keep the backward by reference. The derived op takes every tensor (an omitted optional one makes
the forward fall back to the reference's gradient), and leaves out a forward's dtype argument:
it serves calls without a dtype cast.
"""

from __future__ import annotations

import ast
import dataclasses

from specgen import derive
from specgen.derive import NotDifferentiable
from specgen.errors import Where
from specgen.families import rowwise
from specgen.model import OpSpec, TensorArg
from specgen.table import Table

SUFFIX = "_backward"


def grad_name(name: str) -> str:
    return f"grad_{name}"


def backward_spec(spec: OpSpec) -> OpSpec | None:
    """The derived backward op of a row-wise ``spec``, or None where none is derived."""
    body: rowwise.RowwiseBody = spec.body
    scales_read_steps = any(s.scale is not None and s.scale.names & _steps(body)
                            for s in body.steps)
    if body.derived_from is not None or body.row_outputs or scales_read_steps:
        return None
    tensors = [t.name for t in spec.tensors]
    outputs = [o.name for o in body.outputs]
    taken = {a.name for a in spec.args} | _steps(body) | set(outputs) | {rowwise.N_SYMBOL}
    new = ([grad_name(o) for o in outputs] + [grad_name(t) for t in tensors]
           + [f"count_{s.name}" for s in body.steps] + [f"adj_{s.name}" for s in body.steps])
    if taken & set(new) or len(set(new)) != len(new):
        return None
    try:
        reduce, compute = _derive(body, tensors)
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
    derived_body = dataclasses.replace(rowwise.parse_body(Table(table, where), args, name),
                                       derived_from=spec.name)
    return OpSpec(
        name=name, family=spec.family,
        doc=f"the gradient of {spec.name} with respect to {', '.join(tensors)}, given the "
            f"gradient of {', '.join(outputs)} (derived from its spec)",
        reference=_reference(spec, tensors, outputs), args=args, dtypes=spec.dtypes,
        indexing=spec.indexing, source=spec.source, body=derived_body)


def _steps(body) -> set[str]:
    return {s.name for s in body.steps}


def _derive(body, tensors: list[str]) -> tuple[dict, dict]:
    """The derived op's [reduce] and [compute] tables."""
    # earlier outputs are intermediate values of later ones: inline them
    inlined: dict[str, ast.expr] = {}
    for output in body.outputs:
        inlined[output.name] = derive.substitute(output.expr.tree, inlined)
    cotangents = [(ast.Name(grad_name(o), ast.Load()), tree) for o, tree in inlined.items()]

    def through_outputs(name: str) -> ast.expr:
        """sum_o g_o dh_o/d name, at one element."""
        total = derive.const(0.0)
        for g, tree in cotangents:
            total = derive.add(total, derive.mul(g, derive.partial(tree, name)))
        return total

    reduce = {s.name: _step_table(s) for s in body.steps}
    slopes: dict[str, ast.expr] = {}   # D_k, for the steps whose adjoint is not zero
    adjoint_terms = []
    for k in reversed(range(len(body.steps))):
        step = body.steps[k]
        term = through_outputs(step.name)
        for later in body.steps[k + 1:]:
            if later.name in slopes:
                term = derive.add(term, derive.mul(slopes[later.name],
                                                   derive.partial(later.of.tree, step.name)))
        if derive.is_zero(term):
            continue
        if not _reads(term, tensors + [grad_name(o) for o in inlined]):
            raise NotDifferentiable(f"the adjoint of {step.name} reads no tensor")
        slope, count = _local_slope(step)
        if count is not None:
            reduce[count[0]] = count[1]   # after the forward's steps, before the adjoints
        slopes[step.name] = derive.mul(ast.Name(f"adj_{step.name}", ast.Load()), slope)
        adjoint_terms.append((f"adj_{step.name}", term))
    for name, term in adjoint_terms:
        reduce[name] = {"op": "sum", "of": derive.source(term)}

    compute = {}
    for t in tensors:
        total = through_outputs(t)
        for step in body.steps:
            if step.name in slopes:
                total = derive.add(total, derive.mul(slopes[step.name],
                                                     derive.partial(step.of.tree, t)))
        compute[grad_name(t)] = derive.source(total)
    return reduce, compute


def _reads(tree: ast.expr, names: list[str]) -> bool:
    return any(isinstance(n, ast.Name) and n.id in names for n in ast.walk(tree))


def _step_table(step) -> dict:
    table = {"op": step.op, "of": step.of.source}
    if step.scale is not None:
        table["scale"] = step.scale.source
    return table


def _local_slope(step) -> tuple[ast.expr, tuple[str, dict] | None]:
    """D_k, how r_k moves with one element's f_k, and for a max or min the step that counts the
    elements equal to it (name, table)."""
    if step.op == "sum":
        slope = derive.parse(step.scale.source) if step.scale is not None else derive.const(1.0)
        return slope, None
    count = f"count_{step.name}"
    hit = derive.indicator(derive.compare(derive.parse(step.of.source), ast.Eq(),
                                          ast.Name(step.name, ast.Load())))
    return (derive.div(hit, ast.Name(count, ast.Load())),
            (count, {"op": "sum", "of": derive.source(hit)}))


def _reference(spec: OpSpec, tensors: list[str], outputs: list[str]) -> str:
    """torch's vector-Jacobian product of the forward's reference, with respect to its tensors; a
    forward argument the derived op lacks (its dtype) takes its default, None."""
    dtype = spec.body.dtype
    params = ", ".join(tensors + ([f"{dtype}=None"] if dtype else []))
    primals = "".join(f"{t}, " for t in tensors)
    cotangents = "".join(f"{grad_name(o)}, " for o in outputs)
    return (f"rt.reference_vjp(lambda {params}: {spec.reference}, ({primals}), "
            f"({cotangents}))")


def eager_call(spec: OpSpec) -> rowwise.DerivedBackward | None:
    """How ``spec``'s eager autograd calls its derived backward op, where it has one."""
    derived = backward_spec(spec)
    if derived is None:
        return None
    cotangents = {grad_name(o.name): f"grads[{i}]" for i, o in enumerate(spec.body.outputs)}
    results = tuple(o.name for o in derived.body.outputs + derived.body.column_outputs)
    return rowwise.DerivedBackward(
        derived.name, ", ".join(cotangents.get(a.name, a.name) for a in derived.args), results,
        tuple(grad_name(a.name) if grad_name(a.name) in results else "None" for a in spec.args),
        spec.body.dtype, tuple(t.name for t in spec.tensors if t.optional))

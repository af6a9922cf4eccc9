"""The backward of a pointwise op, derived from its spec: a pointwise op, built and tested as any.

The gradient of an input t is sum_o g_o * d out_o / d t, element by element (earlier outputs
inlined into later ones), each partial derived symbolically (specgen/derive.py): one kernel reads
the forward's inputs and the outputs' gradients and writes every input's gradient, where torch's
eager autograd runs the forward's ops again and a backward kernel for each. The forward's eager
autograd calls it where every tensor has the output's shape and dtype (a broadcast input's
gradient is a sum, a mixed-dtype call's gradients have dtypes of their own: those take the
reference's gradient, as do ops with no derivative rule here or no floating dtype).
"""

from __future__ import annotations

import ast
import dataclasses

from specgen import derive
from specgen.derive import NotDifferentiable, grad_name
from specgen.errors import Where
from specgen.families import pointwise
from specgen.model import OpSpec, TensorArg
from specgen.table import Table

SUFFIX = "_backward"
FLOATS = ("float16", "bfloat16", "float32", "float64")


def derived_specs(spec: OpSpec) -> tuple[OpSpec, ...]:
    """The ops derived from a pointwise spec at the spec stage: its backward, where it has one."""
    derived = backward_spec(spec)
    return () if derived is None else (derived,)


def backward_spec(spec: OpSpec) -> OpSpec | None:
    body: pointwise.PointwiseBody = spec.body
    dtypes = tuple(d for d in spec.dtypes if d in FLOATS)
    if body.derived_from is not None or not dtypes:
        return None
    tensors = [t.name for t in spec.tensors]
    outputs = [o.name for o in body.outputs]
    taken = {a.name for a in spec.args} | set(outputs)
    new = [grad_name(o) for o in outputs] + [grad_name(t) for t in tensors]
    if taken & set(new) or len(set(new)) != len(new):
        return None
    inlined: dict[str, ast.expr] = {}
    for output in body.outputs:
        inlined[output.name] = derive.substitute(output.expr.tree, inlined)
    compute = {}
    try:
        for t in tensors:
            gradient = derive.const(0.0)
            for o, tree in inlined.items():
                gradient = derive.add(gradient, derive.mul(ast.Name(grad_name(o), ast.Load()),
                                                           derive.partial(tree, t)))
            if derive.is_zero(gradient):   # an output must read a tensor: a zero of its shape
                gradient = derive.mul(ast.Name(grad_name(outputs[0]), ast.Load()),
                                      ast.Constant(0.0))
            compute[grad_name(t)] = ast.unparse(gradient)
    except NotDifferentiable:
        return None
    args = tuple(TensorArg(a.name, low=a.low, high=a.high) for a in spec.tensors) + tuple(
        TensorArg(grad_name(o)) for o in outputs) + tuple(
        a for a in spec.args if not isinstance(a, TensorArg))
    name = spec.name + SUFFIX
    where = Where(spec.source.path).child(f"(derived {name})")
    table = {"compute": compute, "tuning": {"BLOCK": list(body.blocks),
                                            "TILE": [list(t) for t in body.tiles],
                                            "num_warps": list(body.num_warps)}}
    derived_body = dataclasses.replace(pointwise.parse_body(Table(table, where), args, name),
                                       derived_from=spec.name)
    return OpSpec(
        name=name, family=spec.family,
        doc=f"the gradient of {spec.name} with respect to {', '.join(tensors)}, given the "
            f"gradient of {', '.join(outputs)} (derived from its spec)",
        reference=derive.vjp_reference(spec.reference, tensors, tensors,
                                       [grad_name(o) for o in outputs]),
        args=args, dtypes=dtypes,
        indexing=spec.indexing, source=spec.source, body=derived_body)


"""The pointwise family's runtime: torch's type promotion and output layout, cached launch plans,
and the implementation of its ops (``RUNTIME``)."""

from __future__ import annotations

import ast
import functools
import math
import numbers
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from specgen import promotion
from specgen.runtime.autograd import sibling
from specgen.runtime.checks import (broadcast_shape, check_out, check_outs_disjoint,
                                    check_tensors)
from specgen.runtime.context import note_launch, overrides
from specgen.runtime.dtypes import all_floating, compute_dtype, torch_result
from specgen.runtime.launch import choose_int64, grid_size, launch, max_programs, plan_cache
from specgen.runtime.layout import (Shape, cdiv, collapse, dense_strides, fast_setup_strides,
                                    memory_order, span, strides_at)
from specgen.runtime.op import FamilyRuntime, Op
from specgen.runtime.replay import empty


# the Python numbers a tensor argument takes, as torch's element-wise ops do (x + 2.0)
NUMBERS = (bool, int, float)
# the largest float32, and the least float64 that rounds past it to inf (halfway to 2**128)
FLOAT32_MAX = 3.4028234663852886e38
FLOAT32_OVERFLOW = 3.4028235677973366e38
# the 16-bit floats: (significand bits, the largest frexp exponent, the least subnormal)
HALF_FLOATS = {torch.float16: (11, 16, 2.0 ** -24), torch.bfloat16: (8, 128, 2.0 ** -133)}


def wrapped_numbers(op: Op, args: tuple) -> tuple:
    """``args`` with each Python number given for a tensor argument (``add(x, 2.5)``) made a
    0-dim tensor that the kernels read as any other operand, of a dtype that gives torch's
    result: torch promotes a number ("wrapped") below a 0-dim tensor of its kind, and a 0-dim
    tensor below a dimensioned one (``_result_type``), and computes with it in the math's type
    (float32 beside 16- and 32-bit floats), where a tensor operand is rounded to the operation's
    dtype first. So the number's tensor takes the result's dtype where that is floating (a
    16-bit one only where it holds the number exactly, and every 16-bit float it meets does:
    then rounding it changes nothing; else the call is refused, a TypeError: pass a tensor); an
    int beside integers is int64 (their math is int64, wrap-around included, and a true division
    takes the number whole; beside 0-dim tensors only the result's own dtype, which must hold
    it); a bool stays bool where the op takes bool tensors (torch's sub refuses it as one).
    A call of numbers alone, or a derived backward op's, is left to the checks (a TypeError
    names the argument)."""
    d = op.description
    if all(isinstance(args[i], torch.Tensor) for i in d.tensor_positions):
        # the common call (every first call and every unreplayed one comes here): nothing to do
        return args
    given = args
    if any(_numpy_number(args[i]) for i in d.tensor_positions):
        # numpy's scalars as the Python numbers they stand for, as torch takes them
        args = tuple(a.item() if i in d.tensor_positions and _numpy_number(a) else a
                     for i, a in enumerate(args))
    numbers_at = [i for i in d.tensor_positions if type(args[i]) in NUMBERS]
    tensors = [args[i] for i in d.tensor_positions if isinstance(args[i], torch.Tensor)]
    # (a derived backward op takes its forward's tensors and gradients: tensors only)
    if not numbers_at or not tensors or d.launch.derived_from:
        return given
    dimensioned = any(t.dim() > 0 for t in tensors)
    result = _result_type(tensors, [args[i] for i in numbers_at])
    met = {t.dtype for t in tensors if t.dtype in HALF_FLOATS} | (
        {result} if result in HALF_FLOATS else set())
    args = list(args)
    for i in numbers_at:
        value = args[i]
        if type(value) is int and not -2 ** 63 <= value < 2 ** 63:
            # as torch's own conversion of the number refuses it
            raise OverflowError(f"{op.name}: argument '{d.args[i].name}' is {value}, an int "
                                f"too big to convert (past int64)")
        if type(value) is float and abs(value) > FLOAT32_MAX and result != torch.float64:
            # rounded to float32 as torch rounds it (1e40 is inf), where torch.full refuses an
            # overflow
            value = math.copysign(math.inf if abs(value) >= FLOAT32_OVERFLOW else FLOAT32_MAX,
                                  value)
        if type(value) is bool and torch.bool in d.dtypes:
            dtype = torch.bool
        elif result.is_floating_point:
            dtype = result
            for half in met:
                if type(value) is not bool and not _holds(half, value):
                    raise TypeError(
                        f"{op.name}: argument '{d.args[i].name}' is {value!r}, which {half} "
                        f"does not hold exactly: torch computes with a number in float32, where "
                        f"a tensor operand is rounded to {half}; pass a tensor")
        elif dimensioned and torch.int64 in d.dtypes and type(value) is not bool:
            dtype = torch.int64
        else:
            dtype = result
            info = torch.iinfo(result) if result != torch.bool else None
            if info is not None and not info.min <= value <= info.max:
                raise TypeError(f"{op.name}: argument '{d.args[i].name}' is {value!r}, outside "
                                f"{result}, the result's dtype beside 0-dim tensors only; pass "
                                f"a tensor")
        args[i] = torch.full((), value, dtype=dtype, device=tensors[0].device)
    return tuple(args)


def _numpy_number(value: object) -> bool:
    """Whether ``value`` is a real number of another type than Python's own (numpy's float32,
    int64), whose ``item()`` is one."""
    return (isinstance(value, numbers.Real) and type(value) not in NUMBERS
            and hasattr(value, "item"))


def _result_type(tensors: Sequence[torch.Tensor], values: Sequence[object]) -> torch.dtype:
    """torch's result dtype of ``tensors`` and the wrapped numbers ``values`` (c10's result_type: each
    priority promoted in itself, then a lower one counts where its kind is higher). Worked out
    here: dynamo does not trace torch.result_type, which returns no tensor."""
    def promoted(dtypes):
        return functools.reduce(torch.promote_types, dtypes) if dtypes else None

    def combine(higher, lower):
        if higher is None:
            return lower
        if higher.is_floating_point or lower is None:
            return higher
        if higher == torch.bool or lower.is_floating_point:
            return torch.promote_types(higher, lower)
        return higher

    wrapped = promoted([torch.bool if type(v) is bool else torch.int64 if type(v) is int
                        else torch.get_default_dtype() for v in values])
    return combine(promoted([t.dtype for t in tensors if t.dim() > 0]),
                   combine(promoted([t.dtype for t in tensors if t.dim() == 0]), wrapped))


def _holds(dtype: torch.dtype, value: float | int) -> bool:
    """Whether the 16-bit float ``dtype`` holds ``value`` exactly (inf and nan included)."""
    value = float(value)
    if value == 0 or not math.isfinite(value):
        return True
    bits, largest, least = HALF_FLOATS[dtype]
    significand, exponent = math.frexp(abs(value))
    return (exponent <= largest and (significand * 2 ** bits).is_integer()
            and (abs(value) / least).is_integer())


def result_dtype(tensors: Sequence[torch.Tensor]) -> torch.dtype:
    """torch's promotion for floating tensors: 0-dim tensors only count when all are 0-dim (a
    call with an integer or bool tensor asks torch: ``call_dtype``)."""
    ranked = [t for t in tensors if t.dim() > 0] or list(tensors)
    dtype = ranked[0].dtype
    for tensor in ranked[1:]:
        dtype = torch.promote_types(dtype, tensor.dtype)
    return dtype


def empty_output(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device,
                 inputs: Sequence[torch.Tensor]) -> torch.Tensor:
    """An output laid out as torch lays out the result of an element-wise op on ``inputs``."""
    return empty(shape, dtype, device, output_strides(shape, inputs))


def output_strides(shape: tuple[int, ...], inputs: Sequence[torch.Tensor]) -> Shape:
    """The strides torch gives the result of an element-wise op on ``inputs``."""
    metas = tuple((tuple(t.shape), tuple(t.stride())) for t in inputs)
    try:
        return _output_strides(shape, metas)
    except TypeError:  # symbolic sizes do not hash
        return _output_strides.__wrapped__(shape, metas)


@functools.lru_cache(maxsize=4096)
def _output_strides(shape: Shape, metas: tuple) -> Shape:
    # TensorIterator's fast setup where it applies (it sets the strides of size-1 dims): torch's
    # tensor-tensor ops and its unary functions (exp, gelu) take it; an op of a tensor and a
    # Python scalar (x * 2) does not, and gets memory_order's strides on size-1 dims
    fast = fast_setup_strides(shape, metas)
    if fast is not None:
        return fast
    order = memory_order(shape, [strides_at(size, stride, shape) for size, stride in metas])
    return dense_strides(shape, order)


@dataclass(frozen=True)
class LaunchPlan:
    """What one element-wise launch needs beyond the tensors themselves."""

    dense: bool                  # one flat offset serves every tensor
    index_64: bool
    args: tuple[int, ...]        # dense: (numel,); tiled: collapsed sizes, then each tensor's strides
    grid: Callable[[dict], tuple[int]]


def plan_launch(op: str, indexing: str, names: tuple[str, ...], tensors: Sequence[torch.Tensor],
                *, max_tile: int, launch: str, rank: int) -> LaunchPlan | None:
    """The launch for ``tensors`` (outputs first, then inputs), or None when there is nothing to do.

    Plans depend on sizes and strides only, so they are cached on them: repeated calls on tensors
    of one layout skip the collapsing, the span arithmetic and the grid set-up.
    """
    metas = tuple((tuple(t.shape), tuple(t.stride())) for t in tensors)
    return _plan(op, indexing, names, metas, max_tile, launch, rank, overrides(), tensors[0].device)


@plan_cache
def _plan(op, indexing, names, metas, max_tile, launch, rank, _overrides, device) -> LaunchPlan | None:
    shape = metas[0][0]
    space = collapse(shape, [strides_at(size, stride, shape) for size, stride in metas])
    if space.numel == 0:
        return None
    index_64 = choose_int64(op, indexing, {n: span(*meta) for n, meta in zip(names, metas)},
                            max_tile)
    cap = max_programs(device, launch)
    if space.dense:
        numel = space.numel
        return LaunchPlan(True, index_64, (numel,),
                          lambda meta: (grid_size(cdiv(numel, meta["BLOCK"]), cap),))
    space = space.padded(rank, op)
    size_m, size_n = space.sizes[-2:]
    outer = 1
    for size in space.sizes[:-2]:
        outer *= size

    def grid(meta: dict) -> tuple[int]:
        tiles = cdiv(size_m, meta["TILE_M"]) * cdiv(size_n, meta["TILE_N"])
        return (grid_size(outer * tiles, cap),)

    strides = tuple(stride for operand in space.strides for stride in operand)
    return LaunchPlan(False, index_64, space.sizes + strides, grid)


@dataclass(frozen=True)
class Launch:
    """A pointwise op's launch data (its description's ``launch``)."""

    max_tile: int    # the widest tile a program may cover: masked lanes past the end form offsets
    schedule: str    # "flat" (a program a tile) or "persistent" (a grid-stride loop)
    rank: int        # collapsed dimensions the tiled kernel walks
    # each output with its expression, where ``conversions`` finds the types the kernels' operands
    # are rounded to (CONVERT_0, ...); none where the kernels round none (a derived backward's)
    expressions: tuple[tuple[str, str], ...] = ()
    # the op derived from this one for its eager gradients (specgen/families/pointwise_backward.py:
    # it takes the forward's tensors, the outputs' gradients, then the other arguments)
    backward: str = ""
    derived_from: str = ""   # the forward op, where this one is its derived backward


class Pointwise(FamilyRuntime):
    """Element-wise ops: kernels ``dense`` (one flat offset serves every tensor) and ``tiled``
    (any strides), each taking the inputs' pointers, then the outputs', the plan's sizes and
    strides, the scalar arguments, then the choices as constexprs."""

    takes_out = True

    def call(self, op: Op, key: tuple | None, args: tuple, out: object = None) -> object:
        wrapped = wrapped_numbers(op, args)
        # (is_compiling first: dynamo cannot trace `is not` between tuples, and a traced call
        # neither records nor replays)
        if not torch.compiler.is_compiling() and wrapped is not args and out is None:
            # a call with a number (which the public function does not key) keyed as a call
            # with the number's tensor: wrapped_numbers takes a number only where it computes
            # as that tensor would, so one recording serves both
            d = op.description
            tensors = tuple(wrapped[i] for i in d.tensor_positions)
            others = tuple(a for arg, a in zip(d.args, wrapped) if arg.kind != "tensor")
            key, replay = op.replays.lookup(tensors, others)
            if replay is not None:
                return replay(tensors)
        return op.call(key, wrapped, out)

    def run(self, op: Op, args: tuple) -> torch.Tensor | tuple[torch.Tensor, ...]:
        inputs, shape, device = _checked(op, args)
        dtype = call_dtype(op, args, inputs)
        outs = tuple(empty_output(shape, dtype, device, inputs) for _ in op.description.outputs)
        _launch(op, args, inputs, outs, dtype)
        return outs[0] if len(outs) == 1 else outs

    def run_out(self, op: Op, outs: tuple, args: tuple) -> None:
        inputs, shape, device = _checked(op, args)
        dtype = call_dtype(op, args, inputs)
        named = dict(zip(op.description.tensor_names, inputs))
        for name, out in zip(op.description.outputs, outs):
            check_out(op.name, name, out, shape, device, op.description.dtypes, named)
            _check_out_dtype(op.name, name, out.dtype, dtype, outs[0].dtype)
        if len(outs) > 1:
            check_outs_disjoint(op.name, dict(zip(op.description.outputs, outs)))
        _launch(op, args, inputs, outs, dtype)

    def backward(self, op: Op) -> Callable | None:
        if not op.description.launch.backward:
            return None
        return lambda args, grads: _derived_backward(op, args, grads)


RUNTIME = Pointwise()


def _derived_backward(op: Op, args: tuple, grads: tuple) -> tuple | None:
    """Every tensor's gradient by the backward op derived from the op's spec, or None where it
    does not apply (the reference's gradient then serves): a tensor broadcast or of another dtype
    than the others (its gradient a sum, or of a dtype of its own), an output's gradient absent,
    or a float64 call beside other float dtypes."""
    d = op.description
    tensors = [args[i] for i in d.tensor_positions]
    first = tensors[0]
    if not first.dtype.is_floating_point or any(
            g is None or g.shape != first.shape or g.dtype != first.dtype for g in grads) or any(
            t.shape != first.shape or t.dtype != first.dtype for t in tensors):
        return None
    others = [a for i, a in enumerate(args) if i not in d.tensor_positions]
    found = sibling(op.module, d.launch.backward)(*tensors, *grads, *others)
    found = iter(found if isinstance(found, tuple) else (found,))
    positions = set(d.tensor_positions)
    return tuple(next(found) if i in positions else None for i in range(len(args)))


def call_dtype(op: Op, args: tuple, inputs: Sequence[torch.Tensor]) -> torch.dtype:
    """The result's dtype: torch's promotion of floating inputs, or, where a tensor is an integer
    or bool one, what torch's reference gives for these dtypes (``div`` of int32 tensors is
    float32), or torch's refusal (``sub`` of bools), raised before any launch."""
    if all_floating(inputs):
        return result_dtype(inputs)
    d = op.description
    return torch_result(op.name, op.reference, args, d.tensor_positions,
                        tuple(a.name for a in d.args))


def _check_out_dtype(op: str, name: str, dtype: torch.dtype, result: torch.dtype,
                     first: torch.dtype) -> None:
    """An out= of another dtype than the result's: written cast where both are floating, as torch
    writes it. torch refuses a cast to a lower kind (a float result into an integer out=); an
    integer or bool result, or out=, of another dtype than the result's is refused here too: the
    kernel computes in its out='s type (``compute_dtype``), and an integer sum in another integer
    type wraps elsewhere; so is a floating out= that computes in another type than the result
    (float64 against the others). Outputs of one call compute in one type: the first out='s."""
    if dtype != result and not torch.can_cast(result, dtype):
        raise RuntimeError(f"{op}: result type {result} can't be cast to the desired output type "
                           f"{dtype} of '{name}'")
    if dtype != result and not (dtype.is_floating_point and result.is_floating_point):
        raise TypeError(f"{op}: '{name}' has dtype {dtype}; an integer or bool result ({result}) "
                        f"is written to an out= of its own dtype only")
    if compute_dtype(dtype) != compute_dtype(result):
        # the kernel would compute in the out='s type: float64 math cast into a float32 out=
        # would lose what torch keeps (1e8 + 0.5 - 1e8), float32 math into a float64 out= would
        # keep what torch rounds
        raise TypeError(f"{op}: '{name}' has dtype {dtype}, which computes in "
                        f"{compute_dtype(dtype)}, and the result ({result}) in "
                        f"{compute_dtype(result)}: an out= of another dtype is written only where "
                        f"both compute in one type")
    if compute_dtype(dtype) != compute_dtype(first):
        raise TypeError(f"{op}: '{name}' has dtype {dtype}, which computes in "
                        f"{compute_dtype(dtype)}, and the first out= {first}: the outputs of one "
                        f"call must compute in one type")


def _checked(op: Op, args: tuple) -> tuple[list[torch.Tensor], tuple[int, ...], torch.device]:
    d = op.description
    tensors = {d.args[i].name: args[i] for i in d.tensor_positions}
    device = check_tensors(op.name, tensors, d.dtypes)
    return list(tensors.values()), broadcast_shape(op.name, tensors), device


def conversions(op: Op, args: tuple, inputs: Sequence[torch.Tensor], result: torch.dtype,
                compute: torch.dtype) -> dict[str, str]:
    """The kernels' CONVERT_0, ...: the type torch's promotion rounds each of the op's sites to
    for tensors of these dtypes and ranks, scalars of these Python types (a float argument given
    as an int promotes as an int) and these choices (specgen.promotion), cached on them."""
    walk = _walks.get(op.name)
    if walk is None or walk[0] is not op:
        walk = _walks[op.name] = (op, *_walk(op))
    _, trees, scalars, choices, casts, none = walk
    if trees is None:
        return {}
    if not casts and all(t.dtype == result for t in inputs):
        return none   # every node has the result's dtype: nothing is converted
    ranks = tuple((t.dtype, t.dim() > 0) for t in inputs)
    values = tuple((name, type(args[i])) for name, i in scalars) + tuple(
        (name, args[i]) for name, i in choices)
    return _conversions(trees, op.description.tensor_names, values, ranks, result, compute)


# op name -> (op, its parsed expressions or None where it converts nothing, its scalars' and
# choices' names and positions, whether it casts, the constexprs that convert none)
_walks: dict[str, tuple] = {}


def _walk(op: Op) -> tuple:
    d = op.description
    trees = tuple((name, ast.parse(source, mode="eval").body)
                  for name, source in d.launch.expressions)
    tensors = set(d.tensor_names)
    count = 0
    for name, tree in trees:
        count += sum(1 for _ in promotion.sites(tree, tensors))
        tensors.add(name)
    scalars = tuple((a.name, i) for i, a in enumerate(d.args) if a.kind in ("float", "int", "bool"))
    choices = tuple((a.name, i) for i, a in enumerate(d.args) if a.kind == "choice")
    # a rounding cast (float16(x) of a float32 x) makes a node of another dtype than the inputs'
    casts = any(isinstance(node, ast.Call) and node.func.id in promotion.CASTS
                for _, tree in trees for node in ast.walk(tree))
    none = {f"{promotion.CONVERT_PREFIX}{k}": "" for k in range(count)}
    return (trees if count else None), scalars, choices, casts, none


@functools.lru_cache(maxsize=4096)
def _conversions(trees, tensor_names, values, ranks, result, compute) -> dict[str, str]:
    leaves = {name: promotion.leaf(dtype, dims) for name, (dtype, dims) in zip(tensor_names, ranks)}
    leaves.update((name, promotion.scalar(value)) for name, value in values)
    found = promotion.conversions(trees, leaves, result, compute)
    return {f"{promotion.CONVERT_PREFIX}{k}": to for k, to in enumerate(found)}


def _launch(op: Op, args: tuple, inputs: list[torch.Tensor], outs: tuple,
            result: torch.dtype) -> None:
    """Launches the kernel over ``outs`` (outputs first, then inputs); ``result``: the result's
    dtype, which an out= may differ from, passed by name (RESULT): the kernels round outputs to it
    before their store, as torch does, and operands where torch's promotion converts them
    (``conversions``)."""
    d = op.description
    spec: Launch = d.launch
    plan = plan_launch(op.name, d.indexing, (*d.outputs, *d.tensor_names), [*outs, *inputs],
                       max_tile=spec.max_tile, launch=spec.schedule, rank=spec.rank)
    if plan is None:
        return  # some dimension is 0: nothing to compute
    note_launch(op.name, "dense" if plan.dense else "tiled", plan.index_64)
    scalars = [args[i] for i in d.scalar_positions]
    dtypes = tuple(t.dtype for t in (*inputs, *outs))
    launch(op.kernels["dense" if plan.dense else "tiled"], plan.grid, *inputs, *outs, *plan.args,
           *scalars, **d.choices_of(args), RESULT=str(result).removeprefix("torch."),
           **conversions(op, args, inputs, result, compute_dtype(outs[0].dtype)),
           INDEX_64=plan.index_64, tune_key=(plan, dtypes))


__all__ = ["RUNTIME", "Launch", "LaunchPlan", "Shape", "call_dtype", "conversions", "empty_output",
           "output_strides", "plan_launch", "result_dtype"]

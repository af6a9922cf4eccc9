"""torch's dtype rules for the calls that are not all floating (integer and bool tensors, which
the pointwise and reduce families take where a spec lists them).

The result dtype of such a call, or torch's refusal of it, is not a rule of the family alone:
``add`` of int32 tensors is int32, ``div`` of them float32 (true division), ``sigmoid`` of one
float32, ``sum`` of a bool mask int64, ``mean`` of an int32 tensor a RuntimeError, ``gelu`` of
one a NotImplementedError. So it is asked of torch itself: the op's reference runs once on
one-element CPU tensors of the call's dtypes and ranks (the values are not read), and its result
dtype, or its exception, is kept per signature. Meta tensors would not serve: their kernels skip
the dtype dispatch that refuses (``F.gelu`` of an int32 meta tensor returns one).
"""

from __future__ import annotations

import functools
from typing import Callable, Sequence

import torch
from torch.utils._python_dispatch import _disable_current_modes

INTEGRAL = frozenset({torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64})


def all_floating(tensors: Sequence[torch.Tensor]) -> bool:
    return all(t.dtype.is_floating_point for t in tensors)


def torch_result(op: str, reference: Callable, args: tuple, tensor_positions: Sequence[int],
                 names: Sequence[str]) -> torch.dtype:
    """The dtype of torch's result for ``args`` (the op's arguments in call order, the tensors at
    ``tensor_positions``; None for an omitted optional one), or torch's exception, of its type,
    naming ``op`` and the first argument that is not floating. Cached per dtypes, ranks and
    other arguments (a dim list, a dtype=, a choice: they may change the answer)."""
    # the default dtype too: torch's true division of integers gives it
    key = (("default", torch.get_default_dtype()),
           *(_key_of(i, a, tensor_positions) for i, a in enumerate(args)))
    try:
        if torch.compiler.is_compiling():
            verdict = _traced_verdict(reference, key)
            if not isinstance(verdict, torch.dtype):
                verdict = _REFUSALS[verdict[0]], verdict[1]
        else:
            verdict = _verdict(reference, key)
    except TypeError:  # an argument that does not hash (a symbolic int): no cache
        verdict = _verdict.__wrapped__(reference, key)
    if isinstance(verdict, torch.dtype):
        return verdict
    kind, message = verdict
    culprit = next((i for i in tensor_positions if isinstance(args[i], torch.Tensor)
                    and not args[i].dtype.is_floating_point), tensor_positions[0])
    others = ", ".join(f"'{names[i]}' {args[i].dtype}" for i in tensor_positions
                       if i != culprit and isinstance(args[i], torch.Tensor))
    raise kind(f"{op}: argument '{names[culprit]}' has dtype {args[culprit].dtype}"
               f"{f' (with {others})' if others else ''}, which torch refuses here: {message}")


def _key_of(i: int, arg: object, tensor_positions: Sequence[int]) -> tuple:
    if i in tensor_positions and isinstance(arg, torch.Tensor):
        return ("tensor", arg.dtype, arg.dim())
    if isinstance(arg, list):
        return ("list", tuple(arg))
    # with its type: 1 and 1.0 hash alike, and torch promotes them apart (int32 * 1 is int32,
    # int32 * 1.0 float32)
    return ("value", arg, type(arg))


@functools.lru_cache(maxsize=1024)
def _verdict(reference: Callable, key: tuple) -> torch.dtype | tuple[type, str]:
    args = []
    for kind, *rest in key[1:]:   # key[0]: the default dtype, under which this runs
        if kind == "tensor":
            dtype, rank = rest
            args.append(torch.ones((1,) * rank, dtype=dtype))
        elif kind == "list":
            args.append(list(rest[0]))
        else:
            args.append(rest[0])   # (rest[1], its type, only keeps 1 and 1.0 apart in the cache)
    # plain CPU tensors, whatever mode (a fake tensor mode under torch.compile) is active
    with _disable_current_modes(), torch.no_grad(), torch.autocast("cpu", enabled=False):
        try:
            result = reference(*args)
        except Exception as err:  # torch's refusal, whatever its type
            lines = str(err).strip().splitlines()
            _REFUSALS[type(err).__qualname__] = type(err)
            return type(err), lines[0] if lines else type(err).__name__
    return (result[0] if isinstance(result, tuple) else result).dtype


# the exception types of torch's refusals, by name: a traced verdict names its type (dynamo
# cannot hold a class as a constant of the graph)
_REFUSALS: dict[str, type] = {}


@torch.compiler.assume_constant_result
def _traced_verdict(reference: Callable, key: tuple) -> torch.dtype | tuple[str, str]:
    """``_verdict`` for a call dynamo traces: run as it traces, its answer a constant of the
    graph (it depends on dtypes, ranks and the default dtype, which the graph's guards fix);
    traced, its escape from the active modes would break the graph. A refusal's type by name."""
    verdict = _verdict(reference, key)
    return verdict if isinstance(verdict, torch.dtype) else (verdict[0].__qualname__, verdict[1])


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The type the kernels compute a result of ``dtype`` in (what the templates' COMPUTE
    constexpr works out from the output pointer): float32 for 16- and 32-bit floats, float64 for
    float64, an integer result's own type, uint8 for bool (0 or 1)."""
    if dtype in (torch.float16, torch.bfloat16, torch.float32):
        return torch.float32
    return torch.uint8 if dtype == torch.bool else dtype

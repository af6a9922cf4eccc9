"""What every generated kernel's source must do that no interpreted run shows.

torch.compile (Inductor) launches our kernels itself and passes a Python float as float64, where
Triton's own launcher passes float32: a kernel that did not take its float arguments to float32
first would compute around them in float64, slower and off the eager result (H200, layer_norm
32768x1024 bf16: 43.1 us of device time against 33.7, 904 elements an ulp off). The row-wise
kernels are also compiled that way (tests/test_rowwise_compile.py); this reads every family's.
An op that lists float64 takes them to its math's type instead, float64 for float64 data, and
declares them float64, so that Triton's launcher passes them whole too (the interpreter, which
passes a Python float as it is, cannot show a float32 parameter's rounding).
"""

import ast
import inspect
import sys

import pytest
import torch

import generated


def _float_args(info) -> set[str]:
    return {arg.name for arg in info.args if arg.kind == "float"}


def _entry_kernels(module) -> list[ast.FunctionDef]:
    """The jit functions launched from the host (``*_kernel``; helpers such as attention's
    ``*_rows`` are called by them, with the values they cast)."""
    tree = ast.parse(inspect.getsource(module))
    return [node for node in tree.body
            if isinstance(node, ast.FunctionDef) and node.name.endswith("_kernel")]


def _is_cast(statement: ast.stmt, name: str, float64: bool) -> bool:
    """``name = tl.cast(name, tl.float32)`` (a Python float in the interpreter has no ``.to``),
    or with ``float64``, ``name = tl.full([], name, tl.float64 if <tensor>_ptr.dtype.element_ty
    == tl.float64 else tl.float32)``, or ``tl.full([], name, MATH)`` or ``COMPUTE`` where the
    kernel has set that type so, from a tensor's (the matmul and convolution kernels: their
    epilogue's, from the output; the row-wise kernels: the math's, before their scalars)"""
    if not (isinstance(statement, ast.Assign) and len(statement.targets) == 1
            and isinstance(statement.targets[0], ast.Name) and statement.targets[0].id == name):
        return False
    value = ast.unparse(statement.value)
    if not float64:
        return value == f"tl.cast({name}, tl.float32)"
    if value in (f"tl.full([], {name}, MATH)", f"tl.full([], {name}, COMPUTE)"):
        return True
    head, _, rest = value.partition(" if ")
    return (head == f"tl.full([], {name}, tl.float64" and rest.endswith(
        "_ptr.dtype.element_ty == tl.float64 else tl.float32)"))


def _sets_compute(statement: ast.stmt) -> bool:
    """``COMPUTE: tl.constexpr = tl.float64 if <tensor>_ptr.dtype.element_ty == tl.float64 else
    tl.float32``"""
    return (isinstance(statement, ast.AnnAssign) and ast.unparse(statement.target) == "COMPUTE"
            and ast.unparse(statement.value).startswith("tl.float64 if ")
            and ast.unparse(statement.value).endswith(
                "_ptr.dtype.element_ty == tl.float64 else tl.float32"))


@pytest.mark.parametrize("name", sorted(generated.REGISTRY))
def test_float_arguments_are_of_the_math_type_before_any_use(name):
    info = generated.REGISTRY[name]
    module = sys.modules[info.function.__module__]
    floats = _float_args(info)
    float64 = torch.float64 in info.dtypes
    kernels = _entry_kernels(module)
    assert kernels, f"{name}: no *_kernel function found"
    for kernel in kernels:
        params = {arg.arg: arg for arg in kernel.args.args}
        for float_arg in sorted(floats & set(params)):
            annotation = params[float_arg].annotation
            declared = ast.unparse(annotation) if annotation else "untyped"
            assert (declared == "tl.float64") == float64, (
                f"{name}: {kernel.name} declares {float_arg!r} {declared}")
            for statement in kernel.body:
                reads = [n for n in ast.walk(statement)
                         if isinstance(n, ast.Name) and n.id == float_arg]
                if reads:
                    # the first statement that names it must be its cast, and a type it casts
                    # to by name was set by the float64 rule before it
                    before = kernel.body[:kernel.body.index(statement)]
                    if ast.unparse(statement.value).endswith(", COMPUTE)"):
                        assert any(_sets_compute(s) for s in before), (
                            f"{name}: {kernel.name} casts {float_arg!r} to an unset COMPUTE")
                    assert _is_cast(statement, float_arg, float64), (
                        f"{name}: {kernel.name} uses {float_arg!r} before casting it to its "
                        f"math's type: {ast.unparse(statement)[:120]}")
                    break

"""Building blocks for property tests: shapes, layouts, tensors, knobs, tolerances, comparison.

A case draws shapes (including 1, primes, tile boundaries and 0), layouts (permuted memory order,
stepped slices, storage offsets, stride-0 broadcast views), dtypes and argument values, fresh
random data for every example, and the launch knobs (int64 indexing, persistent grid) that reach
every specialization on small inputs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy
import torch
from hypothesis import note
from hypothesis import strategies as st

from specgen.runtime import OpInfo, interpreting

# sizes that catch off-by-one masks: 1, small primes, and both sides of power-of-two tiles
SPECIAL_SIZES = (1, 2, 3, 5, 7, 13, 31, 32, 33, 63, 64, 65, 127, 128, 129, 257)

# |actual - expected| <= atol + rtol * |expected|, against a float64 reference. Math is float32,
# so the bound is one rounding to the output dtype plus a few float32 ulps; float64 math is
# float64, float scalars included (the row-wise cases draw them whole; scalar_value draws float32
# values, which float32 math takes exactly too).
# Integer and bool results are compared exactly (assert_matches), whatever their tolerance.
TOLERANCES = {
    torch.float32: (2e-5, 1e-5),
    torch.float16: (1e-3, 1e-5),
    torch.bfloat16: (8e-3, 1e-5),
    torch.float64: (1e-10, 1e-12),
}
INTEGRAL = (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)


def device() -> str:
    """The device tests run on: CPU under the interpreter (CPU tier), else CUDA (GPU tier)."""
    return "cpu" if interpreting() or not torch.cuda.is_available() else "cuda"


def max_numel() -> int:
    """Keeps CPU-tier examples small: the interpreter runs each program in numpy."""
    return 4096 if interpreting() else 1 << 20


def sizes(max_size: int, allow_zero: bool = True) -> st.SearchStrategy[int]:
    special = [s for s in SPECIAL_SIZES if s <= max_size]
    options = [st.sampled_from(special), st.integers(1, max_size)]
    if allow_zero:
        options.append(st.just(0))
    return st.one_of(*options)


@st.composite
def shapes(draw, min_rank: int = 0, max_rank: int = 5, max_elements: int | None = None,
           allow_zero: bool = True) -> tuple[int, ...]:
    budget = max_elements or max_numel()
    rank = draw(st.integers(min_rank, max_rank))
    shape = []
    for _ in range(rank):
        size = draw(sizes(min(257, budget), allow_zero=allow_zero and draw(st.booleans())))
        shape.append(size)
        budget = max(1, budget // max(size, 1))
    return tuple(shape)


@dataclass(frozen=True)
class Layout:
    """How a tensor sits in its storage: a memory order, a step per dim, an offset, stride-0 dims."""

    order: tuple[int, ...]                 # dims from slowest to fastest in memory
    steps: tuple[int, ...]                 # 1: dense along the dim; 2, 3: a stepped slice
    offset: int = 0                        # elements before the first one in the storage
    broadcast: frozenset[int] = field(default_factory=frozenset)  # dims viewed with stride 0

    @staticmethod
    def contiguous(rank: int) -> "Layout":
        return Layout(tuple(range(rank)), (1,) * rank)


@st.composite
def layouts(draw, rank: int, allow_broadcast: bool = True) -> Layout:
    kind = draw(st.sampled_from(["contiguous", "permuted", "stepped", "offset", "broadcast",
                                 "mixed"]))
    layout = Layout.contiguous(rank)
    if kind in ("permuted", "mixed") and rank > 1:
        layout = Layout(tuple(draw(st.permutations(range(rank)))), layout.steps)
    if kind in ("stepped", "mixed"):
        layout = Layout(layout.order, tuple(draw(st.lists(st.integers(1, 3), min_size=rank,
                                                          max_size=rank))))
    if kind in ("offset", "mixed"):
        layout = Layout(layout.order, layout.steps, draw(st.integers(1, 17)))
    if kind == "broadcast" and allow_broadcast and rank > 0:
        dims = draw(st.sets(st.integers(0, rank - 1), min_size=1, max_size=rank))
        layout = Layout(layout.order, layout.steps, layout.offset, frozenset(dims))
    return layout


def dtypes_of(dtypes: Sequence[torch.dtype]) -> st.SearchStrategy[torch.dtype]:
    """A dtype of an op's: a floating one three times in four where it takes integer or bool
    tensors too (the floating paths keep most of the examples)."""
    floating = [d for d in dtypes if d.is_floating_point]
    integral = [d for d in dtypes if not d.is_floating_point]
    if not floating or not integral:
        return st.sampled_from(tuple(dtypes))
    return st.integers(0, 3).flatmap(
        lambda n: st.sampled_from(floating if n else integral))


def accepted(info: OpInfo, args: dict[str, Any]) -> dict[str, Any]:
    """``args``, with its integer and bool tensors as float32 where torch's reference refuses
    them (``sub`` of bools, ``mean`` of an int32 tensor): a case is a call torch computes. The
    refusals, which the op must raise as torch does, are tests/test_dtypes.py's."""
    if all(v.is_floating_point for v in args.values() if isinstance(v, torch.dtype)) and all(
            v.is_floating_point() for v in args.values() if isinstance(v, torch.Tensor)):
        return args
    for step in range(2):
        try:
            info.reference(**args)
            return args
        except Exception:
            # the tensors first, then (mean's dtype=torch.int32) an integer dtype= argument
            args = {k: v.float() if isinstance(v, torch.Tensor) and not v.is_floating_point()
                    else None if step and isinstance(v, torch.dtype) and not v.is_floating_point
                    else v for k, v in args.items()}
    return args


def make_tensor(shape: tuple[int, ...], dtype: torch.dtype, layout: Layout, *,
                low: float = -3.0, high: float = 3.0, seed: int = 0,
                device: str | None = None, fill: float | None = None) -> torch.Tensor:
    """A tensor of ``shape`` in ``layout`` over a fresh storage of random values (or ``fill``)."""
    rank = len(shape)
    padded = [max(size, 1) * step for size, step in zip(shape, layout.steps)]
    strides = [0] * rank
    running = 1
    for dim in reversed(layout.order):  # fastest first
        strides[dim] = running * layout.steps[dim]
        running *= padded[dim]
    for dim in layout.broadcast:
        strides[dim] = 0
    span = layout.offset + running
    # drawn on the CPU from a seeded generator whatever the default device, then moved
    generator = torch.Generator(device="cpu").manual_seed(seed)
    if fill is None and dtype in INTEGRAL:
        storage = _integers(span, dtype, low, high, generator)
    elif fill is None:
        storage = torch.rand(span, generator=generator, dtype=torch.float64, device="cpu")
        storage = storage * (high - low) + low
    else:
        storage = torch.full((span,), fill, dtype=torch.float64, device="cpu")
    storage = storage.to(dtype).to(device or globals()["device"]())
    return torch.as_strided(storage, shape, strides, layout.offset)


def _integers(count: int, dtype: torch.dtype, low: float, high: float,
              generator: torch.Generator) -> torch.Tensor:
    """Integers in [low, high] (a tensor argument's range, clipped to the dtype's; a bool's: 0 or
    1), as int64 values to cast."""
    if dtype == torch.bool:
        return torch.randint(0, 2, (count,), generator=generator)
    info = torch.iinfo(dtype)
    low, high = max(math.ceil(low), info.min), min(math.floor(high), info.max)
    if low > high:
        low, high = info.min, info.max
    # randint's high is exclusive and an int64: the widest range draws halves
    if high - low >= 2**62:
        halves = torch.randint(-2**62, 2**62, (2, count), generator=generator, dtype=torch.int64)
        return halves[0] + halves[1]
    return torch.randint(low, high + 1, (count,), generator=generator, dtype=torch.int64)


def integer_range(dtype: torch.dtype, low: float, high: float, wide: bool) -> tuple[float, float]:
    """Where an integer tensor is drawn: the argument's range, or (``wide``) the dtype's whole
    range, where sums and products wrap as torch's do."""
    if not wide or dtype == torch.bool:
        return low, high
    info = torch.iinfo(dtype)
    return float(info.min), float(info.max)


@st.composite
def broadcast_operand(draw, shape: tuple[int, ...]) -> tuple[int, ...]:
    """A shape that broadcasts to ``shape``: leading dims dropped, some dims set to 1."""
    drop = draw(st.integers(0, len(shape)))
    kept = list(shape[drop:])
    for i in range(len(kept)):
        if draw(st.integers(0, 3)) == 0:
            kept[i] = 1
    return tuple(kept)


@dataclass
class Case:
    """One call of an op: arguments, the out= tensors to poison, and launch knobs to force."""

    args: dict[str, Any]
    outs: tuple[torch.Tensor, ...]          # NaN-poisoned out= tensors; () for ops without out=
    overrides: dict[str, Any]
    describe: str = ""
    # per-dtype (rtol, atol) replacing TOLERANCES, for ops whose error grows with a size
    # (a reduction's length, a matmul's K); None keeps the element-wise bounds
    tolerances: dict[torch.dtype, tuple[float, float]] | None = None
    # the gradients' own (rtol, atol), atol relative to each gradient's largest element (at
    # least 1), every gradient held to the least precise input's, for a backward that sums terms
    # larger than its results (attention's dQ and dK sum
    # a row's or a key's scores' gradients, rounded to the inputs' dtype before the matmuls, as
    # every flash kernel does: an element that cancels keeps its terms' rounding); None:
    # ``tolerances``
    grad_tolerances: dict[torch.dtype, tuple[float, float]] | None = None
    # with ``grad_tolerances``: per input, how many of the backward's rounded terms each element
    # of its gradient sums (a float attention mask of shape (1, 1), or ALiBi's slope of a head,
    # sums the gradients of every score it meets); its atol grows with the square root of that
    # count (rounding errors of independent terms add as a random walk)
    grad_sums: dict[str, int] = field(default_factory=dict)
    # arguments for the float64 reference when they must differ from ``args``: a None that torch
    # resolves from the input dtype (rms_norm's eps) is spelled out, as upcasting would change it
    reference_args: dict[str, Any] | None = None
    # what the output layout must match: "eager" (the eager reference's result), a tensor whose
    # layout torch defines for this call (when the reference composes several ops, each with its
    # own layout rule), or None where torch has no single answer
    layout_reference: Any = "eager"
    # for ops whose math cancels by design (gradients: layer_norm's over two elements with a tiny
    # eps is a difference of nearly equal terms, computed in float32 to about 1e-5 by torch and
    # by us alike): torch's own error is also taken at this many nearby inputs (each floating
    # input moved by a few ulps of its dtype), and the worst bounds the element. Torch's error at
    # the drawn input alone is the luck of its rounding there
    nearby: int = 0
    # arguments for the registered operator (``torch.ops.specgen``) where they must differ from
    # ``args``: a convolution's padding="same", which the operator takes as four ints
    op_args: dict[str, Any] | None = None

    def call(self, info: OpInfo, **extra) -> Any:
        return info.function(**self.args, **extra)


def matmul_tolerances(k: int, tf32: bool = False) -> dict[torch.dtype, tuple[float, float]]:
    """(rtol, atol) per output dtype for a K-term float32 (float64) accumulation of products up
    to 9.

    The reference sees the same rounded inputs in float64, so the error is the float32 sums
    (worst case growing with K) plus one rounding to the output dtype. TF32 rounds each input to
    10 mantissa bits first: about 1e-3 of every product.
    """
    k = max(k, 1)
    accumulate = 2e-6 * k + (5e-3 * k ** 0.5 if tf32 else 0.0)
    return {
        torch.float32: (1e-5 if not tf32 else 2e-3, accumulate + 1e-5),
        torch.float16: (1e-3, accumulate + 1e-4),
        torch.bfloat16: (8e-3, accumulate + 1e-3),
        # float64 operands accumulate in float64 (no TF32)
        torch.float64: (1e-12, 4e-15 * k + 1e-13),
    }


def outputs(result: Any) -> tuple:
    """An op's result as a tuple of its outputs."""
    return result if isinstance(result, tuple) else (result,)


class Observe(torch.overrides.TorchFunctionMode):
    """A function mode that lets every call through: under it our ops take the traced path (the
    dispatcher and the registered op), as under torch.compile, on real tensors."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def draw_case(data, info: OpInfo) -> "Case":
    """One drawn case of ``info``'s family (``CASES``), noted for hypothesis's failure report."""
    from specgen.testing import CASES  # specgen.testing imports this module

    case = data.draw(CASES[info.family](info))
    note(case.describe)
    note(f"overrides: {case.overrides}")
    return case


def nearby_errors(count: int, size: int, args: dict[str, Any], reference_args: dict[str, Any],
                  results: Callable[[dict, dict], tuple[Sequence, Sequence]]) -> list:
    """Torch's error at ``count`` nearby inputs (``Case.nearby``), element by element the worst,
    for each of ``size`` results (None each where ``count`` is 0). Each nearby input is ``args``
    with every floating tensor moved by 4 ulps of its dtype, relative to each element, with
    random signs (``reference_args`` likewise); ``results(args, reference_args)`` gives torch's
    results there and the float64 ones."""
    errors: list = [None] * size
    for seed in range(count):
        theirs, wants = results(_nudged(args, seed), _nudged(reference_args, seed))
        for i, (t, w) in enumerate(zip(theirs, wants)):
            error = (t.double().cpu() - w.double().cpu()).abs()
            errors[i] = error if errors[i] is None else torch.maximum(errors[i], error)
    return errors


def _nudged(args: dict[str, Any], seed: int) -> dict[str, Any]:
    generator = torch.Generator().manual_seed(seed)
    out = {}
    for k, v in args.items():
        if isinstance(v, torch.Tensor) and v.is_floating_point():
            signs = torch.randint(0, 2, v.shape, generator=generator).to(v.device) * 2 - 1
            v = (v.double() * (1 + 4 * torch.finfo(v.dtype).eps * signs)).to(v.dtype)
        out[k] = v
    return out


def reference64(info: OpInfo, args: dict[str, Any]) -> Any:
    """The op's torch reference evaluated on the same values upcast to float64."""
    # floating tensors only: index tensors (class targets) keep their dtype
    upcast = {k: v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v
              for k, v in args.items()}
    return info.reference(**upcast)


# where a float or int scalar is drawn when its spec gives no ``range`` (the row-wise family
# draws its floats eps-like instead: families/rowwise.py, EPS_RANGE)
FLOAT_RANGE = (-2.0, 2.0)
INT_RANGE = (-4, 4)


def scalar_value(draw, arg) -> Any:
    """A drawn value of a scalar argument: in its spec's ``range`` where it gives one, else in
    ``FLOAT_RANGE`` or ``INT_RANGE``; a float argument's default now and then."""
    if arg.kind == "choice":
        return draw(st.sampled_from(arg.choices))
    if arg.kind == "float":
        low, high = _inward_float32(*(arg.range or FLOAT_RANGE))
        return draw(st.one_of(st.just(arg.default) if arg.default is not None else st.nothing(),
                              st.floats(low, high, allow_nan=False, width=32)))
    if arg.kind == "int":
        low, high = arg.range or INT_RANGE
        return draw(st.integers(math.ceil(low), math.floor(high)))
    return draw(st.booleans())


def _inward_float32(low: float, high: float) -> tuple[float, float]:
    """[low, high] narrowed to float32 values (what the kernels take a float as; hypothesis
    draws float32 only between bounds it can hold)."""
    low32, high32 = numpy.float32(low), numpy.float32(high)
    if low32 < low:
        low32 = numpy.nextafter(low32, numpy.float32(numpy.inf))
    if high32 > high:
        high32 = numpy.nextafter(high32, numpy.float32(-numpy.inf))
    return float(low32), float(high32)


def dtype_arg(draw, dtypes: tuple[torch.dtype, ...], x_dtype: torch.dtype) -> torch.dtype | None:
    """A value for torch's ``dtype=``: None keeps the input's; any supported dtype, narrower or
    wider. The interpreter rounds float32 to bfloat16 toward zero (torch and the GPU to nearest),
    so a cast to bfloat16 is drawn in the GPU tier only."""
    casts = [d for d in dtypes if not (interpreting() and d == torch.bfloat16 and x_dtype != d)]
    return draw(st.sampled_from((None, *casts)))


def cast_first(args: dict[str, Any], x_name: str, dtype_name: str) -> dict[str, Any]:
    """Reference arguments for a call with ``dtype=``: torch casts x to it before the op, so the
    float64 reference starts from the cast values (and takes no dtype, which would round it)."""
    return {**args, x_name: args[x_name].to(args[dtype_name]), dtype_name: None}


@st.composite
def knobs(draw) -> dict[str, Any]:
    """Forced launch choices: int64 indexing, small persistent grids, any config of the space."""
    forced: dict[str, Any] = {"config": draw(st.integers(0, 63))}
    if draw(st.booleans()):
        forced["indexing"] = "int64"
    if draw(st.booleans()):
        forced["launch"] = "persistent"
        forced["max_programs"] = draw(st.integers(1, 3))
    return forced


def assert_matches(actual: torch.Tensor, expected: torch.Tensor, what: str,
                   tolerances: dict[torch.dtype, tuple[float, float]] | None = None,
                   torch_result: torch.Tensor | None = None,
                   nearby_error: torch.Tensor | None = None) -> None:
    """``actual`` (any dtype) against a float64 ``expected``, with the tolerance of actual's dtype.

    With ``torch_result`` (torch's own result for the same call) each element may also be off by
    up to 4x torch's own error there: an ill-conditioned element (layer_norm of a row whose values
    nearly agree, where float32 ``x - mean`` cancels) is held to torch's accuracy, not to one that
    no float32 computation reaches. Where torch is exact the bound is the dtype's alone.
    ``nearby_error``: torch's own error at nearby inputs (``Case.nearby``), which bounds the
    element as well.
    """
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    if actual.dtype in INTEGRAL:
        # an integer or bool result (an index, a sum of integers) is exact: torch's own values
        assert expected.dtype == actual.dtype, f"{what}: dtype {actual.dtype} != {expected.dtype}"
        got, want = actual.cpu(), expected.cpu()
        if not torch.equal(got, want):
            bad = got != want
            index = tuple(int(i) for i in bad.nonzero()[0])
            raise AssertionError(f"{what}: {int(bad.sum())} of {got.numel()} elements differ; "
                                 f"first at {index}: got {got[index].item()!r}, expected "
                                 f"{want[index].item()!r}")
        return
    rtol, atol = (tolerances or TOLERANCES)[actual.dtype]
    if torch_result is None:
        torch.testing.assert_close(actual.double(), expected.double(), rtol=rtol, atol=atol,
                                   equal_nan=True, msg=lambda m: f"{what}: {m}")
        return
    got, want = actual.double().cpu(), expected.double().cpu()
    torch_error = (torch_result.double().cpu() - want).abs()
    # where torch overflows or gives NaN it sets no bound: those elements must match as they are
    slack = 4 * torch.nan_to_num(torch_error, nan=0.0, posinf=0.0, neginf=0.0)
    if nearby_error is not None:
        slack = torch.maximum(slack, 4 * torch.nan_to_num(nearby_error.double().cpu(), nan=0.0,
                                                          posinf=0.0, neginf=0.0))
    bound = atol + rtol * want.abs() + slack
    same = (got == want) | (got.isnan() & want.isnan())
    # a value past the dtype's range overflows to the infinity torch gives too (a float16 column
    # sum over many rows)
    if actual.is_floating_point():
        same |= got.isinf() & (got == torch_result.double().cpu()) & (
            want.abs() > torch.finfo(actual.dtype).max)
        # and an intermediate that overflows gives the NaN torch gives too (a float16 prod of
        # uint8 values: inf times a later 0, where float64 keeps 0)
        same |= got.isnan() & torch_result.double().cpu().isnan()
    bad = ~same & ~((got - want).abs() <= bound)
    if bad.any():
        index = tuple(int(i) for i in bad.nonzero()[0])
        raise AssertionError(
            f"{what}: {int(bad.sum())} of {got.numel()} elements off; first at {index}: "
            f"got {got[index].item()!r}, expected {want[index].item()!r}, allowed "
            f"{bound[index].item():.3g} (rtol {rtol}, atol {atol}, torch's own error "
            f"{torch_error[index].item():.3g})")


def nvidia_backend_missing() -> str | None:
    """Why kernels cannot be compiled for an NVIDIA GPU on this machine (the Triton wheel was
    built without the NVIDIA backend, which ships ptxas), or None."""
    try:
        from triton.backends.nvidia import compiler  # noqa: F401
    except Exception as err:
        return f"Triton's NVIDIA backend is not installed ({err})"
    return None


def compile_for_nvidia(kernel, constexprs: dict[str, Any], arg_type: Callable[[str], str],
                       arch: int = 90, **options):
    """``kernel`` (a jit function, or an autotuner of one) compiled to a CUDA binary for NVIDIA's
    ``arch``, without a GPU (Triton's NVIDIA backend ships ptxas): a constexpr parameter takes
    its value in ``constexprs`` (False where that does not name it), every other the type
    ``arg_type(name)`` gives ("*bf16", "i32", ...); ``options`` are Triton's
    (num_warps, num_stages). The families' ``compile_kernels`` check on the CPU tier what the
    interpreter lets through; under TRITON_INTERPRET the compiler does not take jit functions."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = kernel
    while not isinstance(fn, triton.runtime.JITFunction):
        fn = fn.fn
    signature, constants = {}, {}
    for index, param in enumerate(fn.params):
        if param.is_constexpr:
            signature[param.name] = "constexpr"
            constants[(index,)] = constexprs.get(param.name, False)
        else:
            signature[param.name] = arg_type(param.name)
    return triton.compile(ASTSource(fn, signature, constants), target=GPUTarget("cuda", arch, 32),
                          options=options)


_COMPILE_SCRIPT = """
import importlib, sys
compile_kernels = importlib.import_module(sys.argv[1]).compile_kernels
for name in sys.argv[2:]:
    print(name, len(compile_kernels(importlib.import_module(f"generated.{name}"))))
"""


def compiled_kernel_counts(compiler_module: str, names: Sequence[str]) -> dict[str, int]:
    """How many kernels ``compiler_module``'s ``compile_kernels`` compiles (for sm_90, no GPU
    needed) in each generated module of ``names``: in a subprocess without TRITON_INTERPRET,
    under which jit functions are interpreted objects the compiler does not take. A failure
    raises AssertionError with the end of its stderr."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(root) + os.pathsep + env.get("PYTHONPATH", "")
    result = subprocess.run([sys.executable, "-c", _COMPILE_SCRIPT, compiler_module, *names],
                            cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    return {name: int(count) for name, count in
            (line.split() for line in result.stdout.splitlines())}

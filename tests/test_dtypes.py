"""Integer, bool and float64 tensors as torch takes them (integer and bool in the pointwise and
reduce families; float64 in every family).

Every op that lists an integer dtype, on every integer and bool dtype: the result torch gives
(dtype and values, exactly), or torch's refusal, of its type, naming the op, before any launch.
The property suite draws these dtypes too (tests/test_ops.py); here each is met once.
"""

import itertools
import math

import numpy as np
import pytest
import torch

import generated
from specgen import parse, runtime, testing
from specgen.errors import SpecError

INTEGRAL = (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)
OPS = sorted(name for name, info in generated.REGISTRY.items()
             if any(d in info.dtypes for d in INTEGRAL))


def _tensor(dtype: torch.dtype, shape=(4, 37), seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        values = torch.randint(0, 2, shape, generator=generator)
    elif dtype.is_floating_point:
        values = torch.randn(shape, generator=generator, dtype=torch.float64)
    else:
        info = torch.iinfo(dtype)   # the whole range: sums and products wrap as torch's do
        values = torch.randint(max(info.min, -2**62), min(info.max, 2**62), shape,
                               generator=generator)
    return values.to(dtype).to(testing.device())


def _calls(info, dtype):
    """The op's calls at ``dtype``: both operands of a binary op, and the reduce ops over one
    dim and over all (with dtype= None, where they take one)."""
    tensors = [a for a in info.args if a.kind == "tensor"]
    if info.family == "pointwise":
        yield {a.name: _tensor(dtype, seed=i) for i, a in enumerate(tensors)}
        return
    for dim in ([1], None) if info.args[1].kind != "dim" else (1, None):
        yield {"x": _tensor(dtype), "dim": dim, "keepdim": False}


@pytest.mark.parametrize("dtype", INTEGRAL, ids=str)
@pytest.mark.parametrize("name", OPS)
def test_integer_tensors_as_torch_takes_them(name, dtype):
    info = generated.REGISTRY[name]
    for args in _calls(info, dtype):
        try:
            want = info.reference(**args)
        except Exception as err:
            with runtime.record_launches() as launches, pytest.raises(type(err)) as raised:
                info.function(**args)
            assert name in str(raised.value) and str(dtype) in str(raised.value), raised.value
            assert not launches, f"{name}: launched before refusing {dtype}"
            continue
        got = info.function(**args)
        assert got.dtype == want.dtype, f"{name} {dtype}: {got.dtype}, torch's {want.dtype}"
        if want.is_floating_point():   # a true division or a sigmoid of integers
            testing.assert_matches(got, info.reference(**{k: v.double() if isinstance(
                v, torch.Tensor) else v for k, v in args.items()}), name)
        else:
            assert torch.equal(got.cpu(), want.cpu()), f"{name} {dtype}: values differ"


@pytest.mark.parametrize("dtype", (torch.float16, torch.bfloat16, torch.float32, torch.float64,
                                   *INTEGRAL), ids=str)
@pytest.mark.parametrize("name", ["add", "sub", "mul", "div"])
def test_python_numbers_for_tensor_arguments_as_torch_takes_them(name, dtype):
    """``add(x, 2.5)``: a Python number for a tensor argument gives torch's result (its dtype, a
    wrapped number's: int8 + 300 stays int8 and wraps, int32 + 2.5 is float32; its values, the
    number taken in float32 beside 16- and 32-bit floats: 1e40 is inf), or torch's refusal (a
    bool subtracted); beside a 16-bit float a number it does not hold (0.1, 70000) is refused,
    where torch computes with it in float32."""
    x = _tensor(dtype)
    function, reference = getattr(generated, name), getattr(torch, name)
    for value in (2.5, -3, 300, True, 0.1, 1e40, 70000.0):
        try:
            want = reference(x, value)
        except Exception as err:
            with runtime.record_launches() as launches, pytest.raises(type(err)):
                function(x, value)
            assert not launches, f"{name}: launched before refusing {value!r}"
            continue
        number = torch.tensor(value, dtype=torch.float64 if want.dtype == torch.float64
                              else torch.float32)
        if dtype in (torch.float16, torch.bfloat16) and not torch.equal(
                number.to(dtype).to(number.dtype), number):
            with runtime.record_launches() as launches, pytest.raises(
                    TypeError, match=f"{name}: argument 'y' is {value!r}, which {dtype} does "
                                     f"not hold exactly"):
                function(x, value)
            assert not launches
            continue
        got = function(x, value)
        assert got.dtype == want.dtype, f"{name} {dtype} {value!r}: {got.dtype}, torch's {want.dtype}"
        if want.is_floating_point():
            # in float64, each element held to torch's own accuracy as well
            testing.assert_matches(got, reference(x.double(), number.item()), name,
                                   torch_result=want)
        else:
            assert torch.equal(got.cpu(), want.cpu()), f"{name} {dtype} {value!r}: values differ"


@pytest.mark.parametrize("default", (torch.float32, torch.float16, torch.float64), ids=str)
def test_a_numbers_result_dtype_is_torchs(default):
    """pointwise._result_type (dynamo does not trace torch.result_type) against torch's, for a
    dimensioned or 0-dim tensor of each dtype and each kind of number, under default dtypes."""
    from specgen.runtime.pointwise import _result_type
    saved = torch.get_default_dtype()
    torch.set_default_dtype(default)
    try:
        for dtype, shape, value in itertools.product(
                (torch.bool, torch.uint8, torch.int8, torch.int32, torch.int64, torch.float16,
                 torch.bfloat16, torch.float32, torch.float64), ((), (2,)), (True, 3, 2.5)):
            tensor = torch.zeros(shape, dtype=dtype)
            assert _result_type([tensor], [value]) == torch.result_type(tensor, value), \
                (dtype, shape, value)
            # a 0-dim tensor of this dtype beside a dimensioned one: the number meets the 0-dim
            # tensor first (c10 promotes each priority in itself, then the lower into the higher)
            zero = torch.zeros((), dtype=dtype)
            for other in (torch.int16, torch.bool, torch.float16):
                wide = torch.zeros(3, dtype=other)
                want = torch.result_type(wide, torch.zeros((), dtype=torch.result_type(zero, value)))
                assert _result_type([wide, zero], [value]) == want, (other, dtype, value)
    finally:
        torch.set_default_dtype(saved)


def test_python_numbers_take_out_and_gradients():
    x = _tensor(torch.float32)
    out = torch.empty_like(x)
    assert generated.mul(x, 2, out=out) is out and torch.equal(out, x * 2)
    leaf = x.clone().requires_grad_()
    (grad,) = torch.autograd.grad(generated.mul(leaf, 3.0).sum(), leaf)
    assert torch.equal(grad, torch.full_like(x, 3.0))
    # numpy's scalars as the numbers they stand for, as torch takes them
    for value in (np.float32(2.5), np.float64(0.1), np.int64(3)):
        assert torch.equal(generated.add(x, value), torch.add(x, value)), type(value)
    # beside 0-dim tensors only: the result's dtype, which holds the number
    scalar = x[0, 0].half()
    assert generated.add(scalar, 2.5).dtype == torch.float16
    torch.testing.assert_close(generated.add(scalar, 2.5), torch.add(scalar, 2.5))
    with runtime.record_launches() as launches:
        with pytest.raises(TypeError, match="add: argument 'x' must be a torch.Tensor, got float"):
            generated.add(2.0, 3.0)
        with pytest.raises(TypeError, match="add: argument 'y' is 300, outside torch.int8"):
            generated.add(torch.tensor(1, dtype=torch.int8), 300)
        # torch's own refusal: OverflowError
        with pytest.raises(OverflowError, match="add: argument 'y' is 18446744073709551616"):
            generated.add(x, 2 ** 64)
        # a derived backward op takes its forward's tensors and gradients as tensors only
        with pytest.raises(TypeError, match="add_backward: argument 'y' must be a torch.Tensor"):
            generated.add_backward(x, 2.0, x)
    assert not launches


def test_a_call_with_a_number_replays_as_one_with_its_tensor():
    """A number's call is keyed by its 0-dim tensor (the public function keys tensors only): it
    records and replays as other calls do, each call reading its own number, and its recording
    serves a call with such a tensor, which computes alike."""
    replays = generated.REGISTRY["add"].replays
    x = _tensor(torch.float32, shape=(3, 5), seed=3)
    before = replays.replayed
    for value in (2.5, -1.0, 0.25, 7):
        assert torch.equal(generated.add(x, value), x + value), value
    assert replays.replayed - before == 2   # the first call runs, the second records
    zero_dim = torch.tensor(3.5, device=testing.device())
    assert torch.equal(generated.add(x, zero_dim), x + zero_dim)
    assert replays.replayed - before == 3


def test_mixed_and_zero_dim_promotion():
    """torch.result_type's rules: a 0-dim tensor counts when its kind is higher (int32 + 0-dim
    float64 is float64), else not (int32 + 0-dim int64 is int32); uint8 with int8 is int16."""
    x = _tensor(torch.int32)
    for other in (torch.tensor(2.5, dtype=torch.float64), torch.tensor(3), _tensor(torch.float16),
                  torch.tensor(True)):
        other = other.to(testing.device())
        got, want = generated.add(x, other), torch.add(x, other)
        assert got.dtype == want.dtype, (other.dtype, got.dtype, want.dtype)
        testing.assert_matches(got, want.double() if want.is_floating_point() else want, "add")
    u, i = _tensor(torch.uint8), _tensor(torch.int8, seed=1)
    assert torch.equal(generated.mul(u, i), u * i) and generated.mul(u, i).dtype == torch.int16


@pytest.mark.parametrize("dtype", [
    torch.float16,
    pytest.param(torch.bfloat16, marks=pytest.mark.skipif(
        runtime.interpreting(), reason="the interpreter rounds float32 to bfloat16 toward zero "
        "(torch and the GPU round to nearest): the GPU tier runs this case")),
])
@pytest.mark.parametrize("name", ["add", "sub", "mul"])
def test_inputs_are_converted_to_a_16_bit_result_first(name, dtype):
    """Type promotion converts each input to the result's dtype before the math, and the result
    is rounded to it before an out= of another dtype: an integer tensor, or a 0-dim integer,
    float32 or float64 one, beside a float16 tensor rounds to float16 first (int32 2049 is
    2048.0), where the kernels took it to float32 as it was. The reference: the inputs so
    converted, the math in float64, one rounding to the result's dtype (what torch's float32 math
    rounded gives, for these ops; torch's CPU mul alone reads a 0-dim second operand unrounded)."""
    generator = torch.Generator().manual_seed(0)
    device = testing.device()
    info = generated.REGISTRY[name]
    half = (torch.rand(4, 37, generator=generator) * 2.5 + 0.5).to(dtype).to(device)
    ints = torch.randint(2049, 20000, (4, 37), generator=generator).to(device)
    calls = [(ints.int(), half), (half, ints.short()), (ints[0, 0], half),
             (half, torch.rand((), generator=generator).to(device) + 0.5),
             (torch.rand((), generator=generator, dtype=torch.float64).to(device) + 0.5, half)]
    for x, y in calls:
        result = torch.result_type(x, y)
        want = info.reference(x.to(result).double(), y.to(result).double()).to(result)
        got = info.function(x, y)
        assert got.dtype == dtype and torch.equal(got, want), (name, x.dtype, x.dim(), y.dtype)
    other = (torch.rand(4, 37, generator=generator) * 2.5 + 0.5).to(dtype).to(device)
    out = torch.full(half.shape, math.nan, device=device)
    info.function(half, other, out=out)
    assert torch.equal(out, info.reference(half.double(), other.double()).to(dtype).float())


def test_an_input_under_a_function_keeps_its_dtype():
    """torch computes gelu of a 0-dim float32 ``a`` in float32 and converts its value where it
    meets the float16 ``b``: converting ``a`` to float16 first moved geglu's result by up to 2%
    where gelu is steep relative to its value (a near -2.7)."""
    generator = torch.Generator().manual_seed(0)
    device = testing.device()
    b = (torch.rand(64, generator=generator) + 0.5).half().to(device)
    for value in (-2.71, -1.3, 0.7):
        a = torch.tensor(value, device=device)
        got = generated.geglu(a, b)
        gelu = torch.nn.functional.gelu(a.double(), approximate="tanh").half().double()
        want = gelu * b.double()
        assert got.dtype == torch.float16
        # gelu(a) as torch converts it, then one rounding to float16 (half an ulp: 2**-11
        # relative), not a rounded input's error
        assert ((got.double() - want) / want).abs().max() <= 2.0**-11 * 1.001, value


MIXED = """
[op]
name = "test_mixed_fma"
family = "pointwise"
dtypes = ["float16", "float32", "int32"]
reference = "x + s * t"

[args]
x = "tensor"
s = "tensor"
t = "tensor"

[compute]
out = "x + s * t"
"""

CHAINED = """
[op]
name = "test_sum_and_root"
family = "pointwise"
dtypes = ["float16", "float32", "int32"]
reference = "(a + b, torch.sqrt(a + b))"

[args]
a = "tensor"
b = "tensor"

[compute]
y = "a + b"
z = "sqrt(y)"
"""


def test_operands_that_meet_first_are_converted_where_they_meet_the_result(authored):
    """torch computes ``s * t`` in the operands' own dtype (int32; a 0-dim float32's) and
    converts the product where it meets the float16 ``x``: int32 40 * 200 is 8000 there, 8000.0
    in float16, where rounding s and t to float16 first gave their product rounded twice (6144
    for 2049 * 3, torch's 6148). The reference: the product converted, the sum in float64, one
    rounding."""
    module = authored(MIXED)
    generator = torch.Generator().manual_seed(0)
    device = testing.device()
    x = (torch.rand(4, 37, generator=generator) * 2.5 + 0.5).half().to(device)
    s, t = (torch.randint(40, 200, (4, 37), generator=generator, dtype=torch.int32).to(device)
            for _ in range(2))
    got = module.test_mixed_fma(x, s, t)
    want = (x.double() + (s * t).half().double()).half()
    assert got.dtype == torch.float16 and torch.equal(got, want)
    # 0-dim float32s: their product in float32 (1.0006) is converted once (to 1.0009765625),
    # where each converted first gives 1.0 * 1.0
    for _ in range(4):
        s, t = (1 + torch.rand((), generator=generator) * 1e-3 for _ in range(2))
        got = module.test_mixed_fma(x, s.to(device), t.to(device))
        want = (x.double() + (s * t).half().double()).half()
        assert got.dtype == torch.float16 and torch.equal(got, want), (s, t)


CAST = """
[op]
name = "test_cast_meets_scalar"
family = "pointwise"
reference = "x.half() * s + x"

[args]
x = "tensor"
s = "tensor"

[compute]
out = "float16(x) * s + x"
"""

SCALED = """
[op]
name = "test_scaled_int"
family = "pointwise"
dtypes = ["float16", "float32", "int32"]
reference = "i * alpha + h"

[args]
i = "tensor"
h = "tensor"
alpha = "float"

[compute]
out = "i * alpha + h"
"""


def test_a_cast_and_a_scalar_given_as_an_int_promote_as_torch(authored):
    """float16(x) of a float32 x meets the 0-dim float32 s as float16 (s rounded: 1 + 2**-12 is
    1.0 there), though every tensor is float32; a float argument given as the int 1 keeps
    i * alpha in int32, which h's float16 rounds (6146 to 6144), where 1.0 makes it float32."""
    device = testing.device()
    x = torch.ones(4, 37, device=device)
    s = torch.tensor(1 + 2.0**-12, device=device)
    got = authored(CAST).test_cast_meets_scalar(x, s)
    assert torch.equal(got, torch.full_like(x, 2.0)), got
    scaled = authored(SCALED).test_scaled_int
    h = torch.full((4, 37), 2.0, dtype=torch.float16, device=device)
    i = torch.full((4, 37), 6146, dtype=torch.int32, device=device)
    for alpha in (1, 1.0, 1):   # each after the other: neither answer is cached for the other
        got = scaled(i, h, alpha)
        want = i.double() * alpha + 2 if isinstance(alpha, float) else \
            (i * alpha).half().double() + 2
        assert got.dtype == torch.result_type(i * alpha, h), (alpha, got.dtype)
        assert torch.equal(got, want.to(got.dtype)), (alpha, got)


INTEGER_LITERALS = """
[op]
name = "test_times_four_plus_k"
family = "pointwise"
reference = "x * 4 + y * k + x ** 0"
dtypes = ["float32", "int32", "int64"]

[args]
x = "tensor"
y = "tensor"
k = { kind = "int", default = 3 }

[compute]
out = "x * 4 + y * k + x ** 0"
"""

BOOL_COMPARISONS = """
[op]
name = "test_where_above"
family = "pointwise"
reference = "torch.where(x > -1, torch.where(x > k, x, y), y)"
dtypes = ["bool", "int8", "float32"]

[args]
x = "tensor"
y = "tensor"
k = { kind = "int", default = 0 }

[compute]
out = "where(x > -1, where(x > k, x, y), y)"
"""

SCALED_MAXIMUM = """
[op]
name = "test_scaled_maximum"
family = "reduce"
reference = "torch.amax(x * k, dim=dim, keepdim=keepdim)"
dtypes = ["float32", "int8", "int32"]

[args]
x = "tensor"
k = { kind = "int", default = 2 }

[reduce]
combine = "max"
map = "x * k"
"""

INTEGER_MAP = """
[op]
name = "test_sum_of_doubles"
family = "reduce"
reference = "torch.sum(x * 2, dim=dim, keepdim=keepdim)"
dtypes = ["float32", "int32", "int64"]

[args]
x = "tensor"

[reduce]
combine = "sum"
map = "x * 2"
"""


def test_integer_literals_and_int_arguments_take_an_integer_maths_type(authored):
    """In an op that lists integer dtypes, ``4`` and an int argument ``k`` compute in the data's
    integer type, as torch's: exact past 2**24 in int64, wrapping in int32 (they were floats,
    which lost int64's low bits and saturated int32's overflow); float data stays in floats."""
    device = testing.device()
    op = authored(INTEGER_LITERALS).test_times_four_plus_k
    big = torch.tensor([2**40 + 1, -(2**41) - 3, 7], device=device)
    wide = torch.tensor([2**30, 5, -2**30], dtype=torch.int32, device=device)
    fractions = torch.tensor([1.5, -0.25, 3.0], device=device)
    for x, y, k in ((big, big, 3), (wide, wide, 2), (fractions, fractions, 3), (big, big, 2**33)):
        got, want = op(x, y, k), x * 4 + y * k + x ** 0
        assert got.dtype == want.dtype and torch.equal(got, want), (x, k, got, want)
    # bools compare with -1 and 256 as torch's (in int64: as uint8 they read 255 and 0)
    above = authored(BOOL_COMPARISONS).test_where_above
    flags = torch.tensor([True, False, True], device=device)
    for x, y, k in ((flags, ~flags, -1), (flags, ~flags, 256), (flags, flags, 0),
                    (torch.tensor([100, -7, 3], dtype=torch.int8, device=device), flags, 2)):
        got = above(x, y, k)
        want = torch.where(x > -1, torch.where(x > k, x, y), y)
        assert got.dtype == want.dtype and torch.equal(got, want), (x, k, got, want)
    # an int8 map wraps as torch's (100 * 2 is -56) and the int8 maximum is carried as int8
    scaled = authored(SCALED_MAXIMUM).test_scaled_maximum
    for x, k in ((torch.tensor([100, 10], dtype=torch.int8, device=device), 2),
                 (wide, 3), (fractions, 2)):
        got, want = scaled(x, 0, False, k), torch.amax(x * k, dim=0)
        assert got.dtype == want.dtype and torch.equal(got, want), (x, k, got, want)
    total = authored(INTEGER_MAP).test_sum_of_doubles
    # (an int32 x's map runs in the int64 sum's type: doubles that stay in int32's range)
    for x in (big, wide // 2, fractions):
        got, want = total(x, 0), torch.sum(x * 2, dim=0)
        assert got.dtype == want.dtype and torch.equal(got, want), (x, got, want)


def test_an_output_a_later_one_reads_is_read_in_the_result_dtype(authored):
    """``z = sqrt(y)`` reads ``y`` as torch reads the float16 tensor ``a + b``, whose int32 ``b``
    is converted where it meets ``a`` although ``y`` is read under a function."""
    module = authored(CHAINED)
    generator = torch.Generator().manual_seed(0)
    device = testing.device()
    a = (torch.rand(4, 37, generator=generator) * 2.5 + 0.5).half().to(device)
    b = torch.randint(2049, 8000, (4, 37), generator=generator, dtype=torch.int32).to(device)
    y, z = module.test_sum_and_root(a, b)
    want_y = (a.double() + b.half().double()).half()
    assert torch.equal(y, want_y) and torch.equal(z, torch.sqrt(want_y))


def test_float64_into_float16_rounds_through_float32_as_torch():
    """torch converts a float64 (or an integer) to a 16-bit float through float32, two roundings:
    a sum's dtype=float16 cast x in one, which parts from torch's where float32 lands x on a
    float16 midpoint (the reduce kernels' cast; the pointwise loads take the same helper).
    Drawn values just past a midpoint, closer to it than float32 can tell."""
    generator = torch.Generator().manual_seed(0)
    base = (1 + torch.rand(4, 8, generator=generator, dtype=torch.float64)).half().double()
    ulp = 2.0**-10   # float16's spacing in [1, 2); float32's is 2**-13 of it
    past = torch.rand(4, 8, generator=generator, dtype=torch.float64) * 0.9 + 0.05
    x = (base + ulp / 2 + ulp * 2.0**-14 * past).to(testing.device())
    got = generated.sum(x, 1, dtype=torch.float16)
    assert torch.equal(got, x.half().double().sum(1).half()), (got, x.half().double().sum(1))


def test_out_of_another_dtype():
    """An integer result into an out= of another dtype: torch's refusal where it refuses the
    cast (a float result into an int32 out=), else a TypeError (the kernel computes in its
    out='s type); float results keep torch's casting out=."""
    x, y = _tensor(torch.int32), _tensor(torch.int32, seed=1)
    with pytest.raises(TypeError, match="'out' has dtype torch.int64; an integer or bool result"):
        generated.add(x, y, out=torch.empty(x.shape, dtype=torch.int64, device=x.device))
    with pytest.raises(RuntimeError, match="result type torch.float32 can't be cast"):
        generated.div(x, y, out=torch.empty(x.shape, dtype=torch.int32, device=x.device))
    out = torch.empty(x.shape, dtype=torch.int32, device=x.device)
    assert generated.add(x, y, out=out) is out and torch.equal(out, x + y)


def test_refusals_name_the_op_and_argument():
    x = _tensor(torch.int32)
    with pytest.raises(RuntimeError, match=r"mean: argument 'x' has dtype torch.int32, which "
                                           r"torch refuses here: mean\(\): could not infer"):
        generated.mean(x)
    assert generated.mean(x, 1, dtype=torch.float64).dtype == torch.float64
    with pytest.raises(TypeError, match="mean: argument 'dtype' is torch.int64; supported: "
                                        "float16, bfloat16, float32, float64"):
        generated.mean(x.float(), 1, dtype=torch.int64)
    with pytest.raises(TypeError, match="gelu: argument 'x' has dtype torch.int32; supported"):
        generated.gelu(x)
    with pytest.raises(TypeError, match="sum: a sum into bool"):
        generated.sum(x, dtype=torch.bool)
    # an integer result has no gradient, as torch's "Autograd not support dtype"
    with pytest.raises(RuntimeError, match="sum: argument 'x' requires grad, but the result's"):
        generated.sum(torch.randn(3, 4, requires_grad=True), dtype=torch.int32)


@pytest.mark.parametrize("name", ["sum", "prod"])
def test_dynamo_traces_an_integer_dtype_check_whole(name):
    """torch's verdict on an integer dtype= (asked of torch on CPU tensors, outside any mode) is a
    constant of the traced graph: dynamo does not trace into it, which would break a fullgraph
    compile. Where torch.compile runs (the GPU tier, tests/gpu/test_autocast_gpu.py) the call
    then completes; on the CPU the trace reaches the operator, which says it needs a GPU."""
    x = torch.tensor([True, False, True], device=testing.device())
    compiled = torch.compile(lambda x: getattr(generated, name)(x, [0], dtype=torch.uint8),
                             fullgraph=True, backend="eager")
    if runtime.interpreting():
        with pytest.raises(Exception, match="torch.compile of specgen ops needs a GPU"):
            compiled(x)
    else:
        assert torch.equal(compiled(x), getattr(torch, name)(x, 0, dtype=torch.uint8))


@pytest.mark.parametrize("fullgraph", [False, True])
def test_a_refusal_traced_by_dynamo_is_the_eager_error(fullgraph):
    """torch's refusal (mean of an integer dtype=), a constant of the traced graph by its type's
    name, raises the eager error under torch.compile too; with fullgraph=True dynamo reports it
    inside its own error (an exception the compiled region does not handle is a graph break)."""
    # the two parametrizations compile the same lambda: neither may find the other's graph
    torch._dynamo.reset()
    x = torch.tensor([1.0, 2.0, 3.0], device=testing.device())
    with pytest.raises(TypeError) as eager:
        generated.mean(x, [0], dtype=torch.int32)
    compiled = torch.compile(lambda x: generated.mean(x, [0], dtype=torch.int32),
                             fullgraph=fullgraph, backend="eager")
    with pytest.raises(Exception) as traced:
        compiled(x)
    if fullgraph:
        assert isinstance(traced.value, torch._dynamo.exc.Unsupported)
        assert str(eager.value) in str(traced.value)
    else:
        assert type(traced.value) is TypeError and str(traced.value) == str(eager.value)


def test_the_default_dtype_is_part_of_torchs_verdict():
    """torch's true division of integers gives the default dtype: the cached verdict keys on it."""
    a = torch.tensor([3, 4], dtype=torch.int32, device=testing.device())
    assert generated.div(a, a).dtype == torch.float32
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        assert generated.div(a, a).dtype == torch.div(a, a).dtype == torch.float64
    finally:
        torch.set_default_dtype(default)


@pytest.mark.parametrize("name", ["sum", "prod", "amax", "argmin"])
@pytest.mark.parametrize("strategy", ["inner", "outer", "split", "last", "atomic"])
def test_integer_reductions_in_every_strategy(name, strategy):
    # the split strategies' partials are in the accumulator's type (int64 for a sum): exact
    if strategy == "atomic" and name != "sum" or strategy == "last" and name == "argmin":
        pytest.skip("not a strategy of this reduction")
    x = _tensor(torch.int16, shape=(5, 300))
    for dim in (0, 1):
        with runtime.override(strategy=strategy):
            got = getattr(generated, name)(x, dim)
        want = getattr(torch, name)(x, dim)
        assert got.dtype == want.dtype and torch.equal(got, want), (name, strategy, dim)


def test_float64_is_computed_in_float64():
    """float64 math, not float32 rounded: a sum whose float32 partials would lose the 1e-12."""
    x = torch.full((4, 1000), 1.0, dtype=torch.float64, device=testing.device())
    x[:, ::2] += 1e-12
    assert torch.equal(generated.sum(x, 1), x.sum(1))
    y = torch.randn(3, 50, dtype=torch.float64, device=testing.device())
    assert (generated.add(y, 1e-13 * y) - (y + 1e-13 * y)).abs().max() == 0


@pytest.mark.parametrize("strategy", ["single", "looped", "split"])
def test_rowwise_float64_is_computed_in_float64(strategy):
    """Row-wise float64 math, its split and column partials too: rows of 1 + 1e-4 noise, whose
    variance float32 would keep to 3 digits at best (and a softmax of 1e4 times them, whose
    differences from the max float32 would lose)."""
    generator = torch.Generator().manual_seed(0)
    device = testing.device()
    x = (1 + 1e-4 * torch.randn(3, 40, generator=generator, dtype=torch.float64)).to(device)
    weight = (1 + 1e-4 * torch.randn(40, generator=generator, dtype=torch.float64)).to(device)
    x.requires_grad_()
    weight.requires_grad_()
    grad = torch.randn(3, 40, generator=generator, dtype=torch.float64).to(device)

    def close(got, want):
        assert got.dtype == torch.float64
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12)

    # the interpreter's 16-wide chunks and splits: several chunks and partials a row
    with runtime.override(strategy=strategy, config=0, split_chunk=16):
        close(generated.softmax(1e4 * x, -1), torch.softmax(1e4 * x, -1))
        close(generated.logsumexp(x, -1), torch.logsumexp(x, -1))
        # eps=None: float64's machine epsilon, as torch's (float32's would be 10x the mean square)
        close(generated.rms_norm(x - 1, [40], weight, None),
              torch.nn.functional.rms_norm(x - 1, [40], weight, None))
        out = generated.layer_norm(x, [40], weight, eps=1e-30)
        got = torch.autograd.grad(out, (x, weight), grad)
    want_out = torch.nn.functional.layer_norm(x, [40], weight, eps=1e-30)
    close(out, want_out)
    # the weight's gradient sums its column over the rows: the column partials in float64
    for g, w in zip(got, torch.autograd.grad(want_out, (x, weight), grad)):
        close(g, w)


@pytest.mark.parametrize("strategy", [None, "direct", "two_stage:3", "atomic:2"])
def test_matmul_float64_is_computed_in_float64(strategy):
    """float64 operands multiply and accumulate in float64 in every matmul strategy: values of
    1 + 1e-9 noise, whose products float32 would keep to 7 digits; alpha, beta and a float64
    residual enter float64 math whole, and a float64 residual beside float32 operands promotes
    the epilogue to float64 (as torch's F.linear(x, w) + residual)."""
    generator = torch.Generator().manual_seed(0)
    device = testing.device()

    def near_one(*shape, dtype=torch.float64):
        values = 1 + 1e-9 * torch.randn(*shape, generator=generator, dtype=torch.float64)
        return values.to(dtype).to(device)

    def close(got, want, rtol=1e-13):
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want, rtol=rtol, atol=0)

    a, b, c = near_one(33, 70), near_one(70, 45), near_one(33, 45)
    with runtime.override(strategy=strategy):
        close(generated.mm(a, b), a @ b)
        close(generated.addmm(c, a, b, beta=1 / 3, alpha=1 + 1e-10),
              torch.addmm(c, a, b, beta=1 / 3, alpha=1 + 1e-10))
        x, y = near_one(3, 20, 70), near_one(3, 70, 9)
        close(generated.bmm(x, y), torch.bmm(x, y))
        w, bias = near_one(45, 70), near_one(45)
        close(generated.linear_gelu(a, w, bias),
              torch.nn.functional.gelu(torch.nn.functional.linear(a, w, bias), approximate="tanh"))
        # float32 operands of small integers (their product exact in float32, torch's and ours)
        # and a float64 residual of 1e-9s, which the sum in float32 would lose: added in float64
        a32, w32, bias32 = (torch.randint(-4, 5, shape, generator=generator).float().to(device)
                            for shape in ((33, 70), (45, 70), (45,)))
        residual = 1e-9 * near_one(33, 45)
        product = torch.nn.functional.linear(a32, w32, bias32)
        close(generated.linear_residual(a32, w32, bias32, residual), product + residual)


def test_conv_and_cross_entropy_float64_are_computed_in_float64():
    """conv2d (its pointer, channels-last-copy and depthwise kernels) and cross_entropy with
    float64 tensors compute in float64: values whose float32 math would be 1e-7 off."""
    generator = torch.Generator().manual_seed(0)
    device = testing.device()

    def noise(*shape, scale=1.0):
        return (scale * torch.randn(*shape, generator=generator, dtype=torch.float64)).to(device)

    def close(got, want):
        assert got.dtype == torch.float64
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-15)

    x, w, bias = 1 + noise(2, 6, 9, 11, scale=1e-9), noise(8, 3, 3, 3), noise(8)
    for strategy in ("gemm", "gemm_repack", "tma"):
        with runtime.override(strategy=strategy):
            close(generated.conv2d(x, w, bias, padding=1, groups=2),
                  torch.nn.functional.conv2d(x, w, bias, padding=1, groups=2))
    depthwise = noise(6, 1, 3, 3)
    close(generated.conv2d(x, depthwise, None, padding=1, groups=6),
          torch.nn.functional.conv2d(x, depthwise, None, padding=1, groups=6))
    w6 = noise(8, 6, 3, 3)
    close(generated.conv2d_bias_silu(x, w6, bias, padding=1),
          torch.nn.functional.silu(torch.nn.functional.conv2d(x, w6, bias, padding=1)))
    logits = (30 + noise(7, 300, scale=1e-6)).requires_grad_()
    target = torch.randint(0, 300, (7,), generator=generator).to(device)
    weight = 1 + noise(300, scale=0.1)
    for kwargs in ({}, {"weight": weight, "label_smoothing": 0.1}, {"reduction": "none"}):
        loss = generated.cross_entropy(logits, target, **kwargs)
        want = torch.nn.functional.cross_entropy(logits, target, **kwargs)
        close(loss, want)
        grad_out = torch.ones_like(want)
        close(*(torch.autograd.grad(l, logits, grad_out)[0] for l in (loss, want)))


def test_float64_mean_divides_by_a_float64_count():
    """A float64 mean divides by its element count in float64: in float32 a count past 2**24
    rounded (a mean of 2**24 + 1 equal values was 6e-8 off). A stride-0 view of a drawn value.
    The interpreter reads it in tiles of 2**20 elements (about a second); compiled, the planner's
    tile (ptxas takes minutes over a 2**20-element float64 tile: on sm_90 one of 65536 took 17 s
    to compile, one of 2**20 more than 400 s)."""
    generator = torch.Generator().manual_seed(0)
    value = torch.randn((), generator=generator, dtype=torch.float64).to(testing.device())
    x = value.expand(2**24 + 1)
    config = {"BLOCK_K": 1, "BLOCK_R": 2**20} if runtime.interpreting() else None
    with runtime.override(strategy="inner", config=config):
        got = generated.mean(x)
    torch.testing.assert_close(got, torch.mean(x), rtol=1e-13, atol=0)


@pytest.mark.parametrize("strategy", ["single", "looped", "split"])
def test_rowwise_float64_takes_float_arguments_whole(strategy):
    """eps in float64 math is the float64 the caller gave, as in torch: taken as float32 it
    moved results 1.6e-8 where a row's variance is near eps (forward and the derived backward).
    A drawn eps, and rows of variance around it."""
    generator = torch.Generator().manual_seed(0)
    device = testing.device()
    eps = float(torch.empty((), dtype=torch.float64).uniform_(5e-7, 2e-6, generator=generator))
    x, residual = (1e-3 * torch.randn(3, 40, generator=generator, dtype=torch.float64)
                   for _ in range(2))
    weight = torch.randn(40, generator=generator, dtype=torch.float64)
    grad = torch.randn(3, 40, generator=generator, dtype=torch.float64)
    x, residual, weight, grad = (t.to(device) for t in (x, residual, weight, grad))
    x.requires_grad_()
    F = torch.nn.functional

    def close(got, want):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-15)

    with runtime.override(strategy=strategy, config=0, split_chunk=16):
        out = generated.layer_norm(x, [40], weight, eps=eps)
        (got_grad,) = torch.autograd.grad(out, x, grad)
        close(generated.rms_norm(x, [40], weight, eps), F.rms_norm(x, [40], weight, eps))
        for got, want in zip(generated.add_rms_norm(x, residual, weight, eps),
                             (x + residual, F.rms_norm(x + residual, [40], weight, eps))):
            close(got, want)
    want_out = F.layer_norm(x, [40], weight, eps=eps)
    close(out, want_out)
    close(got_grad, torch.autograd.grad(want_out, x, grad)[0])


def test_integer_dtypes_only_in_the_pointwise_and_reduce_families(tmp_path):
    spec = tmp_path / "soft.toml"
    spec.write_text('[op]\nname = "soft"\nfamily = "rowwise"\ndoc = "d"\n'
                    'dtypes = ["float32", "int32"]\nreference = "torch.softmax(x, -1)"\n'
                    '[args]\nx = "tensor"\n')
    with pytest.raises(SpecError, match=r"\[op.dtypes\]: dtype 'int32': only the pointwise and "
                                        r"reduce families take integer and bool tensors"):
        parse.load_spec(spec, tmp_path)


def test_an_out_that_computes_in_another_type_than_the_result_is_refused():
    # float64 math into a float32 out= would lose what torch keeps (it computes in float64,
    # then casts: 0.5), float32 math into a float64 out= keep what torch rounds
    x = torch.tensor([1e8 + 0.5], dtype=torch.float64, device=testing.device())
    y = torch.tensor([-1e8], dtype=torch.float64, device=testing.device())
    out = torch.full((1,), float("nan"), dtype=torch.float32, device=testing.device())
    with pytest.raises(TypeError, match="'out' has dtype torch.float32, which computes in "
                                        "torch.float32, and the result \\(torch.float64\\)"):
        generated.add(x, y, out=out)
    assert torch.isnan(out).all()     # nothing launched
    third = torch.tensor([1.0 / 3], dtype=torch.float32, device=testing.device())
    with pytest.raises(TypeError, match="computes in torch.float64"):
        generated.div(third, third, out=torch.empty(1, dtype=torch.float64,
                                                     device=testing.device()))
    # an out= of the same math type is written cast, as torch writes it
    half = torch.empty(1, dtype=torch.float16, device=testing.device())
    generated.add(third, third, out=half)
    assert half.item() == torch.add(third, third).half().item()


def test_float64_tanh_is_accurate_to_float64():
    """tanh in float64 math (kernel_lib's tanh_f32, which the tanh op and any expression's tanh
    call) is float64-accurate at every magnitude: the float32 formula's series was 4e-12 off
    near |x| = 1/16."""
    generator = torch.Generator().manual_seed(0)
    magnitude = torch.empty(4000, dtype=torch.float64).uniform_(-20, 3.5, generator=generator).exp()
    sign = torch.where(torch.rand(4000, generator=generator) < 0.5, -1.0, 1.0)
    x = (sign * magnitude).to(testing.device())
    torch.testing.assert_close(generated.tanh(x), torch.tanh(x), rtol=2e-15, atol=0)

"""specgen.promotion: which operands of a pointwise expression torch's type promotion converts,
and to what, for a call's dtypes and ranks (the host's CONVERT_0, ... constexprs).

The expected types follow torch.result_type's rules op by op (checked against torch itself in
``test_the_common_types_are_torch_result_types``); the kernels' values are tested against torch
in tests/test_dtypes.py."""

import ast
import itertools

import pytest
import torch

from specgen import promotion

F16, BF16, F32, F64, I8, I32, I64 = (torch.float16, torch.bfloat16, torch.float32, torch.float64,
                                     torch.int8, torch.int32, torch.int64)


def tensor(dtype, dims=True):
    return promotion.leaf(dtype, dims)


def found(outputs, leaves, result, compute=F32):
    trees = [(name, ast.parse(source, mode="eval").body) for name, source in outputs]
    return promotion.conversions(trees, leaves, result, compute)


def test_sites_are_numbered_outside_in_and_left_to_right():
    tree = ast.parse("x + s * t", mode="eval").body
    wrapped, count = promotion.wrap_sites(tree, {"x", "s", "t"})
    assert count == 4 and ast.unparse(tree) == "x + s * t", "the tree itself is left as it was"
    assert ast.unparse(wrapped) == ("round_to_promoted(x, CONVERT_0) + round_to_promoted("
                                    "round_to_promoted(s, CONVERT_2) * round_to_promoted(t, "
                                    "CONVERT_3), CONVERT_1)")
    # operands that read no tensor (scalars, constants) are never converted: torch computes
    # x * 0.5 with 0.5 in the math's type; a function's own operand is not promoted
    tree = ast.parse("gelu(x) * eps + 2.0 * eps", mode="eval").body
    assert [ast.unparse(s) for s in promotion.sites(tree, {"x"})] == ["gelu(x) * eps", "gelu(x)"]


@pytest.mark.parametrize("source, leaves, result, want", [
    # s * t meets the float16 x as one operand: the product is rounded once, its factors not
    ("x + s * t", dict(x=tensor(F16), s=tensor(I32), t=tensor(I32)), F16, ("", "float16", "", "")),
    ("x + s * t", dict(x=tensor(F16), s=tensor(F32, False), t=tensor(F32, False)), F16,
     ("", "float16", "", "")),
    # a 0-dim bfloat16 beside a float16 tensor takes float16 (0-dim tensors do not promote)
    ("x * y", dict(x=tensor(F16), y=tensor(BF16, False)), F16, ("", "float16")),
    # float16 with bfloat16 is float32: both exact there, nothing rounded
    ("x * y", dict(x=tensor(F16), y=tensor(BF16)), F32, ("", "")),
    # int8 fits float16 and bfloat16 whole; an int16 does not
    ("x + y", dict(x=tensor(BF16), y=tensor(I8)), BF16, ("", "")),
    ("x + y", dict(x=tensor(F16), y=tensor(torch.int16)), F16, ("", "float16")),
    # gelu of a 0-dim float32 is computed in float32, its value converted where it meets b
    ("gelu_tanh(a) * b", dict(a=tensor(F32, False), b=tensor(BF16)), BF16, ("bfloat16", "")),
    ("gelu_tanh(a) * b", dict(a=tensor(F32), b=tensor(BF16)), F32, ("", "")),
    # a scalar argument is a wrapped number: x stays float16
    ("x * eps", dict(x=tensor(F16), eps=promotion.scalar(float)), F16, ("",)),
    # comparisons and where promote their operands too
    ("where(x > y, x, y)", dict(x=tensor(F16), y=tensor(I32)), F16,
     ("", "float16", "", "float16")),
    # integer results: nothing narrower than the math's own type
    ("x + y", dict(x=tensor(I32), y=tensor(I64)), I64, ("", "")),
    ("x / y", dict(x=tensor(I32), y=tensor(I32)), F32, ("", "")),
])
def test_the_conversions_for_one_call(source, leaves, result, want):
    assert found([("out", source)], leaves, result) == want


def test_float32_is_narrower_than_float64_math():
    # a + s of a float32 tensor and a 0-dim float64 is float32 (s rounded to it); then float64
    leaves = dict(a=tensor(F32), s=tensor(F64, False), c=tensor(F64))
    assert found([("out", "(a + s) * c")], leaves, F64, F64) == ("", "", "float32", "")


def test_an_earlier_output_is_a_tensor_of_the_result_dtype():
    # y = a + b converts b (read under sqrt later or not); z reads y as the float16 tensor
    leaves = dict(a=tensor(F16), b=tensor(I32))
    got = found([("y", "a + b"), ("z", "sqrt(y) * b")], leaves, F16)
    assert got == ("", "float16", "", "float16")


DTYPES = (torch.bool, torch.uint8, I8, I32, I64, F16, BF16, F32, F64)


def test_the_common_types_are_torch_result_types():
    """For every pair of dtypes and ranks, the site conversions of ``x * y`` name the dtype
    torch.mul gives where it rounds an operand, on real tensors."""
    for (dx, rx), (dy, ry) in itertools.product(itertools.product(DTYPES, (True, False)),
                                                repeat=2):
        x = torch.ones((2,) if rx else (), dtype=dx)
        y = torch.ones((2,) if ry else (), dtype=dy)
        common = torch.result_type(x, y)
        if common == torch.bool:
            continue
        compute = F64 if common == F64 else F32 if common.is_floating_point else common
        got = found([("out", "x * y")], dict(x=tensor(dx, rx), y=tensor(dy, ry)), common, compute)
        for name, dtype, site in zip("xy", (dx, dy), got):
            assert site in ("", str(common).removeprefix("torch.")), (dx, rx, dy, ry, got)
            # rounded exactly where the common type is narrower than the math's and loses values
            loses = torch.tensor(2049 if not dtype.is_floating_point else 1 + 2**-20,
                                 dtype=torch.float64)
            if dtype == torch.bool or dtype in (torch.uint8, I8) or dtype == common:
                assert site == "", (name, dtype, common)
            elif common in (F16, BF16) and loses.to(dtype).to(common).double() != loses.to(
                    dtype).double():
                assert site == str(common).removeprefix("torch."), (name, dtype, common)


def test_a_choice_types_the_branch_it_takes():
    leaves = dict(i=tensor(I32), h=tensor(F16), h2=tensor(F16))
    source = '(i if mode == "a" else h) + h2'
    assert found([("out", source)], {**leaves, "mode": "a"}, F16) == ("float16", "")
    assert found([("out", source)], {**leaves, "mode": "b"}, F16) == ("", "")


def test_where_ranks_with_its_condition():
    # where(c, s, t) of 0-dim float32s under a dimensioned condition is a dimensioned float32
    # (nothing rounds it to h's float16); where(c, 1.0, 0.0) is a float32 tensor, so i meets
    # float32, not float16
    leaves = dict(x=tensor(F32), s=tensor(F32, False), t=tensor(F32, False), h=tensor(F16),
                  y=tensor(F32))
    got = found([("out", "(where(x > 0.0, s, t) + h) * y")], leaves, F32)
    assert set(got) == {""}, got
    leaves = dict(h=tensor(F16), i=tensor(I32))
    assert set(found([("out", "where(h > 0.0, 1.0, 0.0) * h + i")], leaves, F32)) == {""}


def test_a_scalar_promotes_as_the_python_type_it_is_given():
    # alpha = 1 (an int) times an int32 tensor stays int32, which then rounds to float16 at h;
    # alpha = 1.0 makes it float32, which h's float16 does not narrow
    leaves = dict(i=tensor(I32), h=tensor(F16))
    assert found([("out", "i * alpha + h")], {**leaves, "alpha": promotion.scalar(int)},
                 F16) == ("float16", "", "")
    assert found([("out", "i * alpha + h")], {**leaves, "alpha": promotion.scalar(float)},
                 F32) == ("", "", "")

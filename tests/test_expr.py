"""The expression language's emission to Triton, and the pointwise planner's decisions."""

from pathlib import Path

import pytest

from specgen.errors import SpecError, Where
from specgen.expr import Symbol, emit, helpers, parse_expr
from specgen.families import pointwise
from specgen.parse import load_spec

REPO = Path(__file__).resolve().parent.parent
SYMBOLS = {"x": Symbol("x", "tensor"), "y": Symbol("y", "tensor"), "eps": Symbol("eps", "scalar"),
           "flag": Symbol("flag", "bool"), "mode": Symbol("mode", "choice", ("fast", "exact"))}


def emitted(source: str) -> str:
    expr = parse_expr(source, Where("t.toml", ("compute", "out")), SYMBOLS)
    return emit(expr, {"mode": "MODE"})


def test_powers_unroll_and_invert():
    assert emitted("x ** 3") == "x * x * x"
    assert emitted("(x + y) ** 2") == "(x + y) * (x + y)"
    assert emitted("x ** -2") == "1.0 / (x * x)"
    assert emitted("x ** 0") == "1.0"


def test_logic_becomes_bitwise_with_precedence_kept():
    assert emitted("where(x > 0 and not y < eps, x, y)") == \
        "tl.where((x > 0.0) & ~(y < eps), x, y)"
    assert emitted("where(flag or x > 0, x, y)") == "tl.where(flag | (x > 0.0), x, y)"


def test_integer_literals_are_float32_and_unary_plus_goes():
    """All math is float32: an integer literal left as it is makes Triton compute in int32 (a
    where(x > 0, 1, 0) stored as int32 bits into a bfloat16 output; 100000 * 100000 wraps).
    Triton's tensors have no unary +."""
    assert emitted("where(x > 0, 1, 0) * 100000") == "tl.where(x > 0.0, 1.0, 0.0) * 100000.0"
    assert emitted("+x - -2") == "x - -2.0"
    assert emitted("x ** 2") == "x * x"   # an exponent stays a count of products


@pytest.mark.parametrize("source, words", [
    ("where(x and y, x, y)", "'x': 'and' and 'or' take a condition"),
    ("where(x > 0 or y, x, y)", "'y': 'and' and 'or' take a condition"),
    ("where(not x, x, y)", "'x': 'not' takes a condition"),
    ("where(x, x, y)", "'x': where's first argument must be a condition"),
    ("x > y", "'x > y' is a condition (a bool), and every expression gives a float value: "
              "write where(x > y, 1.0, 0.0)"),
])
def test_conditions_and_values_do_not_mix(source, words):
    """Triton's logic operators are bitwise (a float operand fails at launch) and torch.where
    refuses a float condition: both are spec errors, as is a bool where a value is expected."""
    with pytest.raises(SpecError) as err:
        emitted(source)
    assert words in err.value.message, err.value.message


def test_choice_conditional_uses_the_constexpr():
    assert emitted("silu(x) if mode == 'fast' else gelu(x)") == \
        "silu_f32(x) if MODE == 'fast' else gelu_f32(x)"


def test_helpers_lists_only_kernel_lib_functions():
    expr = parse_expr("exp(x) + gelu_tanh(y) * float16(x)", Where("t.toml"), SYMBOLS)
    assert helpers(expr) == {"gelu_tanh_f32", "round_to_float16"}


def test_pointwise_plan_decisions():
    plan = pointwise.plan(load_spec(REPO / "specs" / "gelu.toml", REPO))
    assert plan.choices[0].constexpr == "APPROXIMATE"
    assert plan.outputs[0].code == "gelu_tanh_f32(x) if APPROXIMATE == 'tanh' else gelu_f32(x)"
    assert plan.helpers == ("gelu_f32", "gelu_tanh_f32")
    # the widest tile bounds the masked offsets a program forms, so it enters the int32 decision
    assert plan.max_tile == max([c["BLOCK"] for c in plan.dense_configs] +
                                [c["TILE_M"] * c["TILE_N"] for c in plan.tiled_configs])
    assert [t.name for t in plan.tensors] == ["out", "x"], "outputs first: they set memory order"


def test_pointwise_plan_wraps_the_operands_torch_converts():
    """geglu's product converts both sides (gelu(a) after gelu, never a before it); a unary op
    converts nothing."""
    plan = pointwise.plan(load_spec(REPO / "specs" / "geglu.toml", REPO))
    assert plan.outputs[0].code == ("round_to_promoted(gelu_tanh_f32(a), CONVERT_0) * "
                                    "round_to_promoted(b, CONVERT_1)")
    assert plan.conversions == 2 and "round_to_promoted" in plan.helpers
    assert plan.expressions == (("out", "gelu_tanh(a) * b"),)
    plan = pointwise.plan(load_spec(REPO / "specs" / "relu.toml", REPO))
    assert plan.conversions == 0 and plan.outputs[0].code == "relu_f32(x)"

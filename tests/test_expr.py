"""The expression language's emission to Triton, and the pointwise planner's decisions."""

from pathlib import Path

from specgen.errors import Where
from specgen.expr import Symbol, emit, helpers, parse_expr
from specgen.families import pointwise
from specgen.parse import load_spec

REPO = Path(__file__).resolve().parent.parent
SYMBOLS = {"x": Symbol("x", "tensor"), "y": Symbol("y", "tensor"), "eps": Symbol("eps", "scalar"),
           "mode": Symbol("mode", "choice", ("fast", "exact"))}


def emitted(source: str) -> str:
    expr = parse_expr(source, Where("t.toml", ("compute", "out")), SYMBOLS)
    return emit(expr, {"mode": "MODE"})


def test_powers_unroll_and_invert():
    assert emitted("x ** 3") == "x * x * x"
    assert emitted("(x + y) ** 2") == "(x + y) * (x + y)"
    assert emitted("x ** -2") == "1.0 / (x * x)"
    assert emitted("x ** 0") == "1.0"


def test_logic_becomes_bitwise_with_precedence_kept():
    assert emitted("where(x > 0 and not y < eps, x, y)") == "tl.where((x > 0) & ~(y < eps), x, y)"


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

"""Row-wise specs: located errors for [rows], [reduce], [compute], [schedule]; planner decisions."""

import ast
import importlib
import math
from pathlib import Path

import pytest
import triton
import triton.language as tl

import generated
from specgen.errors import SpecError
from specgen.families import rowwise as family
from specgen.model import Source
from specgen.parse import parse_spec
from specgen.runtime import rowwise

GOOD = """
[op]
name = "norm"
family = "rowwise"
reference = "F.layer_norm(x, normalized_shape, weight, None, eps)"

[args]
x = "tensor"
normalized_shape = "shape"
weight = { kind = "tensor", optional = true }
eps = { kind = "float", default = 1e-5 }

[rows]
tensor = "x"
normalized_shape = "normalized_shape"
along = ["weight"]
absent = { weight = 1.0 }

[reduce]
mean = { op = "sum", of = "x", scale = "1 / N" }
var = { op = "sum", of = "(x - mean) * (x - mean)", scale = "1 / N" }

[compute]
out = "(x - mean) * rsqrt(var + eps) * weight"
"""

SOFTMAX = """
[op]
name = "sm"
family = "rowwise"
reference = "torch.softmax(x, dim)"

[args]
x = "tensor"
dim = { kind = "int", default = -1 }

[rows]
tensor = "x"
dim = "dim"

[reduce]
max = { op = "max", of = "x * 2" }
sum = { op = "sum", of = "exp(x * 2 - max)" }

[compute]
out = "exp(x * 2 - max) / sum"
lse = "max + log(sum)"
"""


def parse(text: str):
    return parse_spec(text, Source("specs/bad.toml", "0" * 64, text))


# (what is wrong, text replaced -> replacement, key path, words of the message)
CASES = [
    ("rows missing", 'tensor = "x"\nnormalized_shape = "normalized_shape"\nalong = ["weight"]\n'
     'absent = { weight = 1.0 }\n', "", "rows", "missing required key 'tensor'"),
    ("row tensor unknown", 'tensor = "x"', 'tensor = "y"', "rows.tensor",
     "'y' is not a required tensor argument"),
    ("both axes", 'normalized_shape = "normalized_shape"\nalong',
     'normalized_shape = "normalized_shape"\ndim = -1\nalong', "rows",
     "give exactly one of 'dim'"),
    ("axis misspelled", 'normalized_shape = "normalized_shape"\nalong',
     'normalized_shap = "normalized_shape"\nalong', "rows",
     "found 'normalized_shap' (a misspelling of 'normalized_shape'?)"),
    ("dim not an int arg", 'normalized_shape = "normalized_shape"\nalong', 'dim = "eps"\nalong',
     "rows.dim", "'eps' is not an argument of kind \"int\""),
    ("shape arg wrong kind", 'normalized_shape = "normalized_shape"\nalong',
     'normalized_shape = "eps"\nalong', "rows.normalized_shape",
     "'eps' is not an argument of kind \"shape\""),
    ("along unknown", 'along = ["weight"]', 'along = ["bias"]', "rows.along",
     "'bias' is not a tensor argument"),
    ("absent missing", "absent = { weight = 1.0 }", "", "rows.absent",
     "say what the omitted optional tensor 'weight' stands for"),
    ("absent not optional", "absent = { weight = 1.0 }", "absent = { weight = 1.0, x = 0.0 }",
     "rows.absent.x", "'x' is not an optional tensor listed in 'along'"),
    ("along misspelled", 'along = ["weight"]', 'alng = ["weight"]', "rows.absent.weight",
     "'weight' is not an optional tensor listed in 'along'; found 'alng' (a misspelling of "
     "'along'?)"),
    ("optional scalar without meaning", 'eps = { kind = "float", default = 1e-5 }',
     'eps = { kind = "float", optional = true }', "args.eps",
     "an optional scalar must say what None means"),
    ("optional with default", 'eps = { kind = "float", default = 1e-5 }',
     'eps = { kind = "float", default = 1e-5, optional = true }', "args.eps.optional",
     "an optional argument defaults to None"),
    ("unknown reduction op", 'mean = { op = "sum"', 'mean = { op = "prod"', "reduce.mean.op",
     "expected one of sum, max, min, got 'prod'"),
    ("reduction of no tensor", 'of = "x", scale', 'of = "eps", scale', "reduce.mean.of",
     "reduces no tensor"),
    ("scale reads a tensor", 'scale = "1 / N" }\nvar', 'scale = "1 / x" }\nvar',
     "reduce.mean.scale", "name 'x' cannot be used here: a scale multiplies the row's reduced "
     "value and reads no tensor"),
    ("later step used early", 'of = "x", scale', 'of = "x - var", scale', "reduce.mean.of",
     "name 'var' cannot be used here: a later step; a step reads only the steps before it"),
    ("step shadows an argument", "mean = {", "eps = {", "reduce.eps",
     "has the name of an argument"),
    ("reduction entry not a table", 'mean = { op = "sum", of = "x", scale = "1 / N" }',
     'mean = "x"', "reduce.mean", "expected a table"),
    ("unknown key in a step", 'scale = "1 / N" }\nvar', 'scale = "1 / N", axis = 1 }\nvar',
     "reduce.mean.axis", "unknown key 'axis'"),
    ("no steps", '[reduce]\nmean = { op = "sum", of = "x", scale = "1 / N" }\n'
     'var = { op = "sum", of = "(x - mean) * (x - mean)", scale = "1 / N" }\n', "[reduce]\n",
     "reduce", "expected at least one step"),
    ("bad strategy", "[compute]", '[schedule]\nstrategy = "fast"\n[compute]', "schedule.strategy",
     "expected one of auto, single, looped, online, split, got 'fast'"),
    ("online without the pattern", "[compute]", '[schedule]\nstrategy = "online"\n[compute]',
     "schedule.strategy", "'online' needs a max step directly followed by a sum of exp"),
    ("chunk not a power of two", "[compute]", "[tuning]\nCHUNK = [1000]\n[compute]",
     "tuning.CHUNK", "expected powers of two up to 1048576, got 1000"),
    ("no chunk fits the warps", "[compute]", "[tuning]\nCHUNK = [64]\nnum_warps = [8]\n[compute]",
     "tuning.CHUNK", "no CHUNK x num_warps pair spreads 2 to 32 elements over each thread"),
    ("output undeclared name", 'out = "(x - mean)', 'out = "(x - mu)', "compute.out",
     "name 'mu' is used but not declared (declared: N, eps, mean, var, weight, x)"),
    # the kernels name a step's per-row value row_<step> and its accumulator acc_<step>: an
    # output row_tot was written over step tot's value, which the next line then read
    ("output named as a step's per-row value", '[compute]\nout',
     'tot = { op = "sum", of = "x" }\n[compute]\nrow_tot = "x"\nout', "compute.row_tot",
     "'row_tot' is a name the rowwise family's generated code uses"),
    ("step named as an accumulator", 'var = { op', 'acc_mean = { op = "sum", of = "x" }\nvar = { op',
     "reduce.acc_mean",
     "'acc_mean' is a name the rowwise family's generated code uses"),
    ("shape argument read", 'of = "x", scale', 'of = "x * normalized_shape", scale', "reduce.mean.of",
     "name 'normalized_shape' cannot be used here: a host argument"),
    ("dims on a tensor", 'x = "tensor"', 'x = { kind = "tensor", dims = ["m"] }', "args.x",
     "row-wise tensors take no 'dims'"),
    ("dtype argument unused", 'eps = { kind = "float", default = 1e-5 }',
     'eps = { kind = "float", default = 1e-5 }\ndtype = { kind = "dtype", optional = true }',
     "args.dtype", "a dtype argument is only used as [rows] dtype"),
    ("dtype not a dtype argument", 'along = ["weight"]', 'along = ["weight"]\ndtype = "eps"',
     "rows.dtype", "'eps' is not an argument of kind \"dtype\""),
    ("dtype with other tensors", 'eps = { kind = "float", default = 1e-5 }\n\n[rows]\n',
     'eps = { kind = "float", default = 1e-5 }\ndtype = { kind = "dtype", optional = true }\n\n'
     '[rows]\ndtype = "dtype"\n', "rows.dtype",
     "dtype casts the row tensor 'x' before the op, as torch's dtype=; this op also reads weight"),
    ("keepdim not a bool", 'along = ["weight"]', 'along = ["weight"]\nkeepdim = "eps"',
     "rows.keepdim", "'eps' is not an argument of kind \"bool\""),
    ("bad layout", 'along = ["weight"]', 'along = ["weight"]\nlayout = "strided"', "rows.layout",
     "expected one of contiguous, memory_format, elementwise, got 'strided'"),
    ("keepdim without per-row outputs", 'eps = { kind = "float", default = 1e-5 }\n\n[rows]\n',
     'eps = { kind = "float", default = 1e-5 }\nkeep = { kind = "bool", default = false }\n\n'
     '[rows]\nkeepdim = "keep"\n', "rows.keepdim",
     "keepdim shapes the outputs with one value per row"),
    ("column output of no tensor", 'rsqrt(var + eps) * weight"',
     'rsqrt(var + eps) * weight"\n[columns]\nmeans = "mean * 2"', "columns.means",
     "reads no tensor: a column output sums an element-wise expression over the rows"),
    ("column output named as an argument", 'rsqrt(var + eps) * weight"',
     'rsqrt(var + eps) * weight"\n[columns]\nweight = "x"', "columns.weight",
     "has the name of an argument"),
    ("column output read by another", 'rsqrt(var + eps) * weight"',
     'rsqrt(var + eps) * weight"\n[columns]\na = "x"\nb = "a * x"', "columns.b",
     "name 'a' is used but not declared"),
    ("empty columns", 'rsqrt(var + eps) * weight"', 'rsqrt(var + eps) * weight"\n[columns]\n',
     "columns", "expected at least one column output"),
]


@pytest.mark.parametrize("what, old, new, key, words", CASES, ids=[c[0] for c in CASES])
def test_spec_error(what, old, new, key, words):
    assert old in GOOD, what
    with pytest.raises(SpecError) as info:
        parse(GOOD.replace(old, new, 1))
    assert info.value.path == "specs/bad.toml"
    assert info.value.key == key, str(info.value)
    assert words in info.value.message, str(info.value)


def test_a_chunked_programs_column_rows_put_the_sums_before_their_carries():
    plan = family.plan(parse(GOOD.replace(
        'rsqrt(var + eps) * weight"', 'rsqrt(var + eps) * weight"\n[columns]\na = "x"\nb = "x * x"', 1)))
    assert plan.chunked_part_rows == 4
    assert plan.chunked_column_rows == (("a", 0, 2), ("b", 1, 3))


def test_keepdim_shapes_the_per_row_outputs_on_the_host_only():
    text = (SOFTMAX.replace('dim = { kind = "int", default = -1 }',
                            'dim = { kind = "int", default = -1 }\n'
                            'keepdim = { kind = "bool", default = false }')
            .replace('dim = "dim"', 'dim = "dim"\nkeepdim = "keepdim"')
            .replace('reference = "torch.softmax(x, dim)"', 'reference = "(torch.softmax(x * 2, '
                     'dim), torch.logsumexp(x * 2, dim, keepdim))"'))
    plan = family.plan(parse(text))
    assert plan.keepdim == "keepdim"
    # the kernels never read it, and no expression may
    assert "keepdim" not in [a.name for a in plan.kernel_scalars]
    for host in ("keepdim", "dim"):
        with pytest.raises(SpecError, match=f"name '{host}' cannot be used here: a host argument"):
            parse(text.replace('lse = "max + log(sum)"', f'lse = "where({host}, max, sum)"'))


def test_chunk_spaces_keep_threads_busy():
    # looped/online chunks up to 16384 (long rows want many loads in flight); split programs
    # read a share of one row and take chunks up to 4096 on up to 8 warps
    plan = family.plan(parse(GOOD))
    per_thread = {c["BLOCK_N"] // (32 * c["num_warps"]) for c in plan.chunked_configs}
    assert min(per_thread) == 2 and max(per_thread) == 32
    assert {"BLOCK_M": 1, "BLOCK_N": 16384, "num_warps": 32} in plan.chunked_configs
    assert max(c["BLOCK_N"] for c in plan.split_configs) == plan.max_chunk == 4096
    assert max(c["num_warps"] for c in plan.split_configs) == 8
    assert plan.widest_chunk == 16384


def passes(plan):
    return [(p.kind, [s.name for s in p.steps]) for p in plan.looped_passes]


def test_passes_group_independent_steps():
    # a mean and the squared deviations from it: one variance pass (count, mean, M2 partials)
    plan = family.plan(parse(GOOD))
    assert passes(plan) == [("variance", ["mean", "var"])]
    assert plan.variance == 0 and "add_pairs" in plan.helpers   # the single tile's pair
    assert plan.step_tensors == ("x",) and plan.output_only_tensors == ("weight",)
    assert plan.slot_count == 3
    assert plan.online_passes == ()
    assert plan.strategies == ("single", "looped", "split")
    assert plan.output_tensors == ("weight", "x")
    squared = GOOD.replace('"(x - mean) * (x - mean)"', '"(x - mean) ** 2"')
    assert passes(family.plan(parse(squared))) == [("variance", ["mean", "var"])]
    # not the pattern (the mean is not scaled by 1 / N): var reads mean, so two passes
    unscaled = GOOD.replace('of = "x", scale = "1 / N"', 'of = "x", scale = "2 / N"')
    assert passes(family.plan(parse(unscaled))) == [("plain", ["mean"]), ("plain", ["var"])]
    independent = GOOD.replace('of = "(x - mean) * (x - mean)"', 'of = "x * x"')
    assert passes(family.plan(parse(independent))) == [("plain", ["mean", "var"])]


def test_online_pattern_is_recognized():
    plan = family.plan(parse(SOFTMAX))
    assert [p.online for p in plan.online_passes] == [True]
    assert plan.strategies == ("single", "looped", "online", "split")
    assert plan.split_passes == plan.online_passes
    # the sum subtracts the -inf-safe max in every strategy
    assert "row_max_shift" in plan.steps[1].value
    # lse reads no tensor: one value per row; out reads reductions: contiguous like torch.softmax
    assert [(o.name, o.per_row, o.like) for o in plan.outputs] == [("out", False, ()),
                                                                   ("lse", True, ())]
    # a different expression under the exp is not the pattern
    other = SOFTMAX.replace('of = "exp(x * 2 - max)"', 'of = "exp(x - max)"')
    assert family.plan(parse(other)).online_passes == ()


@pytest.mark.parametrize("rows, n, online, expected", [
    (4096, 4096, True, "single"),
    (32768, 1024, False, "single"),
    (1024, 16384, True, "single"),      # still fits in registers, and 1024 rows fill the GPU
    # re-read from L2, a max pass costs less than the online update's exp and selects
    (1024, 32768, True, "looped"),
    (1024, 20000, True, "looped"),
    (1024, 32769, True, "online"),
    (1024, 65536, True, "online"),
    (1024, 65536, False, "looped"),
    (8, 262144, False, "split"),
    (8, 262144, True, "split"),
    (8, 1024, True, "single"),          # few rows but short: splitting would not pay
    (100, 1 << 20, False, "split"),
    (1 << 24, 8, False, "single"),
])
def test_auto_strategy(rows, n, online, expected):
    assert rowwise.choose_strategy(rows, n, online, sms=132) == expected


def test_single_config_scales_with_the_row():
    # a 1024-long row alone on 2 warps (no more warps a row than 16 elements a thread need)
    assert rowwise.single_config(32768, 1024) == {"BLOCK_N": 1024, "BLOCK_M": 1, "num_warps": 2}
    short = rowwise.single_config(32768, 64)
    assert short["BLOCK_N"] == 64 and short["BLOCK_M"] == 16 and short["num_warps"] == 2
    long = rowwise.single_config(1024, 16384)
    assert long["BLOCK_N"] == 16384 and long["BLOCK_M"] == 1 and long["num_warps"] == 32
    assert rowwise.single_config(3, 5)["BLOCK_M"] == 4    # no more rows than exist (rounded up)


@pytest.mark.parametrize("rows, n, online, expected", [
    # softmax(x, 0) of a 4096x8192 x (issue 37): chunks of many rows a program, one pass for the
    # max and the sum where the op has the pattern
    (8192, 4096, True, "online"),
    (8192, 4096, False, "looped"),
    (16384, 256, True, "single"),       # the narrowest kept tile holds whole rows
    (16384, 1024, True, "online"),      # which a one-row-per-program plan would hold (single)
    (8, 262144, True, "split"),         # few long rows still split
])
def test_auto_strategy_over_strided_rows(rows, n, online, expected):
    assert rowwise.choose_strategy(rows, n, online, sms=132, kept=True) == expected


@pytest.mark.parametrize("rows, n", [(8192, 4096), (65536, 1024), (16384, 256), (1024, 32768),
                                     (37, 600), (5, 45), (1, 7)])
@pytest.mark.parametrize("strategy", ["single", "looped", "online"])
def test_kept_tiles_read_many_rows_a_program(rows, n, strategy):
    sms = 132
    tile = rowwise.kept_config(rows, n, strategy, sms)
    block_m, block_n, warps = tile["BLOCK_M"], tile["BLOCK_N"], tile["num_warps"]
    for size in (block_m, block_n, warps):
        assert size & (size - 1) == 0, tile          # powers of two
    assert 1 <= warps <= 32
    # no more rows than exist (rounded up), no wider chunk than the row
    assert block_m <= max(triton.next_power_of_2(rows), 1) and block_n <= triton.next_power_of_2(n)
    if strategy == "single":
        assert block_n >= n and block_m * block_n <= max(rowwise.KEPT_SINGLE_MAX, block_n), tile
    else:
        assert block_m * block_n <= rowwise.KEPT_TILE, tile
    if rows >= min(rowwise.KEPT_BLOCK_M) and (strategy != "single" or n <= 512):
        # at least 16 rows side by side: 32 contiguous bytes of bf16, a whole sector
        assert block_m >= 16, tile
    # as wide as still gives every multiprocessor its programs
    wider = [m for m in rowwise.KEPT_BLOCK_M if m > block_m]
    if strategy != "single" and rows >= min(rowwise.KEPT_BLOCK_M):
        assert all(triton.cdiv(rows, m) < rowwise.KEPT_PROGRAMS_PER_SM * sms for m in wider), tile


def test_split_count_fills_the_gpu():
    import torch
    cpu = torch.device("cpu")
    assert rowwise.split_count(8, 262144, 4096, cpu) == 64   # 8 rows x 64 = 512 programs
    assert rowwise.split_count(1, 100, 4096, cpu) == 1       # never more shares than chunks


def test_columns_launch_gives_every_multiprocessor_a_program():
    import torch
    cpu = torch.device("cpu")  # planned with an H100's 132 multiprocessors
    # the widest column block with a program for each, 2048 partials of each output a step
    assert rowwise.columns_launch(4096, cpu) == ((256,), {"BLOCK_C": 16, "BLOCK_P": 128, "num_warps": 4})
    assert rowwise.columns_launch(32768, cpu)[0] == (256,)
    # narrower than a sector is not worth it: short outputs get fewer programs
    assert rowwise.columns_launch(1024, cpu) == ((128,), {"BLOCK_C": 8, "BLOCK_P": 256, "num_warps": 4})
    assert rowwise.columns_launch(5, cpu)[0] == (1,)


def test_exact_cast_is_true_where_every_value_survives_the_round_trip():
    import torch
    # every finite value of each 16-bit dtype (all bit patterns), and float32 values from its
    # extremes to random ones: the cast is exact where each comes back unchanged
    bits = torch.arange(-2**15, 2**15, dtype=torch.int32).to(torch.int16)
    values = {d: bits.view(d) for d in (torch.float16, torch.bfloat16)}
    info = torch.finfo(torch.float32)
    values[torch.float32] = torch.cat([
        torch.tensor([info.max, info.tiny, info.smallest_normal / 2**23, 1 + info.eps]),
        torch.randn(4096, generator=torch.Generator().manual_seed(0)) * 1e3])
    for source, v in values.items():
        v = v[v.isfinite()]
        for target in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
            survives = bool((v.to(target).to(source) == v).all())
            assert rowwise.exact_cast(source, target) == survives, (source, target)


def test_scaffold_parses_and_plans():
    text = family.scaffold("my_rms")
    plan = family.plan(parse(text))
    assert plan.name == "my_rms" and plan.strategies == ("single", "looped", "split")


def test_layout_picks_how_each_element_output_is_allocated():
    """Outputs that read no reduction follow torch's element-wise rule over the tensors they read;
    the others take [rows] layout (default contiguous) over every full-shape tensor."""
    text = GOOD.replace('[compute]\n', '[compute]\nshifted = "x * eps"\nscaled = "shifted * 2"\n')
    for layout, out in [(None, ("contiguous", ())), ("memory_format", ("memory_format", ("x",))),
                        ("elementwise", ("elementwise", ("x",)))]:
        spec = text if layout is None else text.replace(
            'along = ["weight"]', f'along = ["weight"]\nlayout = "{layout}"')
        layouts = {o.name: (o.layout, o.like) for o in family.plan(parse(spec)).outputs}
        assert layouts == {"shifted": ("elementwise", ("x",)), "scaled": ("elementwise", ("x",)),
                           "out": out}, layout


ROWWISE = sorted(name for name, info in generated.REGISTRY.items() if info.family == "rowwise")


@pytest.mark.parametrize("name", ROWWISE)
def test_kernels_are_what_torch_compile_can_re_emit(name):
    """Inductor re-emits a kernel with the jit functions it calls under their own names and the
    constexpr globals it reads as ``tl.constexpr(<repr>)``: helpers must be module globals of that
    very name (never ``lib.x``), and no global may hold inf or nan (``tl.constexpr(-inf)``)."""
    module = importlib.import_module(f"generated.{name}")
    for value in vars(module).values():
        if isinstance(value, tl.constexpr) and isinstance(value.value, float):
            assert math.isfinite(value.value), f"{name}: constexpr global {value.value}"
    tree = ast.parse(Path(module.__file__).read_text())
    kernels = [node for node in tree.body if isinstance(node, ast.FunctionDef)
               and any("jit" in ast.unparse(d) for d in node.decorator_list)]
    assert kernels
    builtins = {"range", "float"}
    for kernel in kernels:
        for node in (n for statement in kernel.body for n in ast.walk(statement)):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                # methods of locals are fine; a module's attribute is not (Inductor cannot see it)
                assert node.value.id == "tl" or not hasattr(module, node.value.id), \
                    f"{name}: {ast.unparse(node)}"
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and \
                    node.id not in builtins and hasattr(module, node.id):
                value = getattr(module, node.id)
                helper = getattr(value, "fn", value)
                if callable(helper):
                    assert helper.__name__ == node.id, f"{name}: {node.id} is aliased"


@pytest.mark.parametrize("name", ROWWISE)
def test_chunk_loops_reduce_nothing_block_wide(name):
    """A chunk loop only accumulates per lane: a block-wide reduction in it is a barrier round trip
    a chunk that the loads cannot hide (a per-chunk variance merge made looped layer_norm 5x slower
    than looped rms_norm). The rows are reduced once, after the loop. A column output sums a
    chunk over its rows (``axis=0``), which stays inside each lane: every chunked config and every
    split program has one row (BLOCK_M = 1)."""
    module = importlib.import_module(f"generated.{name}")
    tree = ast.parse(Path(module.__file__).read_text())
    loops = [node for node in ast.walk(tree) if isinstance(node, ast.For)
             and isinstance(node.target, ast.Name) and node.target.id == "start"]
    assert loops
    for loop in loops:
        calls = {ast.unparse(n.func) for n in ast.walk(loop) if isinstance(n, ast.Call)
                 and not _over_rows(n)}
        assert not calls & {"tl.sum", "tl.reduce", "tl.max", "tl.min"}, f"{name}: {calls}"


def _over_rows(call: ast.Call) -> bool:
    return ast.unparse(call.func) == "tl.sum" and any(
        k.arg == "axis" and ast.unparse(k.value) == "0" for k in call.keywords)


def test_the_generator_and_the_runtime_agree_on_the_kernels_ranks():
    # the kernels split row ids and column indices into these many dims; the runtime collapses
    # every layout to at most that many
    assert (family.ROW_RANK, family.COL_RANK) == (rowwise.ROW_RANK, rowwise.COL_RANK)


def test_a_derived_backward_is_made_at_the_spec_stage_and_handed_to_the_planner():
    spec = parse(GOOD)
    (derived,) = spec.derived
    assert derived.name == "norm_backward" and derived.body.derived_from == "norm"
    call = family.plan(spec).backward
    assert call.op == "norm_backward"
    # the derived op's arguments in the forward's names, the output's gradient by its index
    assert call.call == tuple(0 if a.name == "grad_out" else a.name for a in derived.args)
    # a gradient for each forward tensor, none for its other arguments
    assert call.grads == ("grad_x", None, "grad_weight", None)
    # an omitted weight is the constant the spec says it stands for
    assert call.absent == (("weight", 1.0),)


def test_launch_data_gives_the_roles_the_runtime_launches_by():
    spec = parse(GOOD)
    data = family.plan(spec).launch_data
    roles = data["roles"]
    assert roles["row_tensor"] == "x" and roles["normalized_shape"] == "normalized_shape"
    # the optional weight gets its kernels' flag; the launch lists put the outputs first
    assert roles["optional"] == (("weight", "HAS_WEIGHT"),)
    elem, along, row_out = roles["launch_tensors"]
    assert elem == ("out", "x") and along == ("weight",) and row_out == ()
    assert roles["inputs"][0] == "x" and roles["kernel_scalars"] == ("eps",)
    assert data["fp_fusion"] and data["results"] == ("out",)
    # a derived op's kernels compile without FMA contraction (terms that cancel)
    derived = family.plan(spec.derived[0]).launch_data
    assert not derived["fp_fusion"]
    assert ("column", "grad_weight", (), "weight") in derived["outputs"]


def test_row_values_the_outputs_share_are_computed_once_a_row():
    """A call over row values alone that the element and column outputs repeat (the derived
    gradients' rsqrt(var + eps)) is named and computed once a row, before the outputs' loop; an
    element output equal to an earlier one is that one."""
    for name, call in (("layer_norm_backward", "tl.rsqrt(row_var + eps)"),
                       ("rms_norm_backward", "tl.rsqrt(row_ms + eps)"),
                       ("add_rms_norm_backward", "tl.rsqrt(row_ms + eps)")):
        source = Path(generated.__file__).with_name(f"{name}.py").read_text()
        for kernel in ast.parse(source).body:
            if not isinstance(kernel, ast.FunctionDef) or "grad_x = " not in ast.unparse(kernel):
                continue
            text = ast.unparse(kernel)
            assert text.count(call) == 1 and f"row_rsqrt = {call}" in text, (name, kernel.name)
    source = Path(generated.__file__).with_name("add_rms_norm_backward.py").read_text()
    assert "grad_residual = grad_x\n" in source

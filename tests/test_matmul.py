"""The matmul family: spec errors, planner decisions and launch decisions (no GPU needed).

Values are checked by tests/test_ops.py (the property suite); this file pins the decisions that
the property suite forces or cannot see: auto split-K, batch folding, precision, config pruning.
"""

import importlib
import math
import sys

import pytest
import torch
import triton

import generated
from specgen import runtime, testing
from specgen.errors import SpecError
from specgen.families import matmul as family
from specgen.model import Source
from specgen.runtime.op import _autocast_lines
from specgen.parse import parse_spec
from specgen.runtime import matmul
from specgen.runtime.launch import forced_config
from specgen.testing.core import compiled_kernel_counts, nvidia_backend_missing
from specgen.runtime.layout import contiguous_strides

GOOD = """
[op]
name = "lin"
family = "matmul"
reference = "F.linear(x, w, bias) * scale + residual"

[args]
x = { kind = "tensor", dims = ["...", "M", "K"] }
w = { kind = "tensor", dims = ["N", "K"] }
bias = { kind = "tensor", dims = ["N"] }
residual = { kind = "tensor", dims = ["...", "M", "N"] }
scale = { kind = "float", default = 1.0 }

[epilogue]
out = "(acc + bias) * scale + residual"

[schedule]
swizzle = "grouped"
split_k = "auto"

[tuning]
BLOCK_M = [64, 128]
num_stages = [3]
"""


def randn(*shape, **kwargs):
    """Tensors live where the tier runs kernels: CPU (interpreter) or CUDA. (Not through a
    ``torch.device`` context: that is a function mode, which turns off the eager paths.)"""
    return torch.randn(*shape, device=testing.device(), **kwargs)


def empty(*shape, **kwargs):
    return torch.empty(*shape, device=testing.device(), **kwargs)


def parse(text: str):
    return parse_spec(text, Source("specs/bad.toml", "0" * 64, text))


def test_good_spec_plans():
    plan = family.plan(parse(GOOD))
    assert (plan.a.name, plan.b.name) == ("x", "w")
    assert plan.b.letters == "kn"                       # N x K weight read through its strides
    assert [o.letters for o in plan.epilogue_inputs] == ["n", "mn"]
    assert plan.batch_rank == family.BROADCAST_BATCH_RANK
    assert {c["BLOCK_M"] for c in plan.configs} == {64, 128}
    assert {c["num_stages"] for c in plan.configs} == {3}
    assert plan.outputs[0].code == "(acc + bias) * scale + residual"
    assert plan.promoted == () and plan.uncast == ()


def test_a_promoted_operand_keeps_its_dtype_under_autocast():
    plan = family.plan(parse(GOOD.replace("[epilogue]", '[epilogue]\npromote = "residual"')
                             .replace('family = "matmul"', 'family = "matmul"\nautocast = "lower"')))
    assert plan.promoted == ("residual",)
    assert any("promotes=True" in info for info in plan.arg_infos if '"residual"' in info)
    # the public function Op compiles casts the other tensors, not residual (as torch's autocast)
    args = tuple(eval(info, {"rt": runtime}) for info in plan.arg_infos)
    description = runtime.OpDescription(
        name=plan.name, family="matmul", doc="", reference=plan.reference, spec_path="",
        spec_sha256="", dtypes=(), indexing="auto", autocast=plan.autocast, args=args,
        outputs=plan.output_names, launch=None)
    assert _autocast_lines(description, False)[-1].strip() == \
        'x, w, bias = _autocast.cast("lower", x, w, bias)'


def test_config_list_and_default_space():
    listed = GOOD.replace("BLOCK_M = [64, 128]\nnum_stages = [3]",
                          "configs = [{ BLOCK_M = 16, BLOCK_N = 64, BLOCK_K = 128, num_warps = 4, "
                          "num_stages = 4 }]")
    assert family.plan(parse(listed)).configs == (
        {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 128, "GROUP_M": 8, "num_warps": 4,
         "num_stages": 4},)
    default = family.plan(parse(GOOD.replace("[tuning]\nBLOCK_M = [64, 128]\nnum_stages = [3]", "")))
    assert default.configs == family.DEFAULT_CONFIGS
    assert default.split_factors == family.DEFAULT_SPLIT_K


# (what is wrong, text replaced -> replacement, key path, words of the message)
CASES = [
    ("no dims", 'w = { kind = "tensor", dims = ["N", "K"] }', 'w = "tensor"', "args.w",
     "matmul tensors need dims"),
    ("bad dims", 'dims = ["N"] }', 'dims = ["K"] }', "args.bias.dims", "expected one of"),
    ("two A operands", 'w = { kind = "tensor", dims = ["N", "K"] }',
     'w = { kind = "tensor", dims = ["M", "K"] }', "args.w", "a second A (M, K) operand"),
    ("optional B", ('dims = ["N", "K"] }\nbias = { kind = "tensor", dims = ["N"] }\n'
                    'residual = { kind = "tensor", dims = ["...", "M", "N"] }'),
     ('dims = ["N", "K"], optional = true }\nbias = { kind = "tensor", dims = ["N"], optional = '
      'true }\nresidual = { kind = "tensor", dims = ["...", "M", "N"], optional = true }'),
     "args.w.optional", "cannot be optional"),
    ("mixed batch", 'residual = { kind = "tensor", dims = ["...", "M", "N"] }',
     'residual = { kind = "tensor", dims = ["B", "M", "N"] }', "args", "all \"...\""),
    ("reserved name", "default = 1.0 }", "default = 1.0 }\nacc = { kind = \"float\", default = 1.0 }",
     "args.acc", "'acc' is a name the matmul family's generated code uses for itself"),
    ("epilogue reads A", 'out = "(acc + bias) * scale + residual"', 'out = "x + acc"',
     "epilogue.out", "name 'x' cannot be used here: the operands enter the epilogue only through "
     "acc, the tile of their product"),
    ("bad out dtype", "[epilogue]", '[epilogue]\ndtype = "int8"', "epilogue.dtype",
     "unknown dtype 'int8'"),
    ("a matmul operand promoted", "[epilogue]", '[epilogue]\npromote = ["w"]', "epilogue.promote",
     "'w' is an operand of the matmul, which takes one dtype for its operands; only epilogue "
     "operands (bias, residual) may promote"),
    ("an unknown name promoted", "[epilogue]", '[epilogue]\npromote = ["scale"]', "epilogue.promote",
     "'scale' is not an epilogue operand; expected some of: bias, residual"),
    ("a name promoted twice", "[epilogue]", '[epilogue]\npromote = ["residual", "residual"]',
     "epilogue.promote", "names an operand twice"),
    ("no outputs", 'out = "(acc + bias) * scale + residual"', "", "epilogue",
     "expected at least one output"),
    ("bad swizzle", 'swizzle = "grouped"', 'swizzle = "hilbert"', "schedule.swizzle",
     "expected one of grouped, swizzle2d, none"),
    ("bad split_k", 'split_k = "auto"', 'split_k = "always"', "schedule.split_k",
     "expected one of auto, atomic, off"),
    ("block not a power of two", "BLOCK_M = [64, 128]", "BLOCK_M = [96]", "tuning.BLOCK_M",
     "expected powers of two, got 96"),
    ("block too small for tl.dot", "BLOCK_M = [64, 128]", "BLOCK_K = [8]", "tuning.BLOCK_K",
     "at least 16"),
    ("zero stages", "num_stages = [3]", "num_stages = [0]", "tuning.num_stages",
     "expected positive integers"),
    ("too many warps", "num_stages = [3]", "num_stages = [3]\nnum_warps = [64]",
     "tuning.num_warps", "expected at most 32 warps, got 64"),
    ("tile past a Triton block", "BLOCK_M = [64, 128]", "BLOCK_M = [2048]\nBLOCK_N = [1024]",
     "tuning", "a BLOCK_M x BLOCK_N tile of 2048 x 1024 elements; a Triton block holds at most"),
    ("unknown tuning key", "num_stages = [3]", "num_stage = [3]", "tuning.num_stage",
     "unknown key 'num_stage'"),
    ("lists and a config list", "num_stages = [3]",
     "num_stages = [3]\nconfigs = [{ BLOCK_M = 64, BLOCK_N = 64, BLOCK_K = 32, num_warps = 4, "
     "num_stages = 3 }]", "tuning.BLOCK_M", "not both"),
    ("config missing a key", "BLOCK_M = [64, 128]\nnum_stages = [3]",
     "configs = [{ BLOCK_M = 64, BLOCK_N = 64, BLOCK_K = 32, num_warps = 4 }]",
     "tuning.configs.0", "missing required key 'num_stages'"),
    ("config block too small", "BLOCK_M = [64, 128]\nnum_stages = [3]",
     "configs = [{ BLOCK_M = 64, BLOCK_N = 64, BLOCK_K = 32, num_warps = 4, num_stages = 3 },\n"
     "  { BLOCK_M = 64, BLOCK_N = 8, BLOCK_K = 32, num_warps = 4, num_stages = 3 }]",
     "tuning.configs.1.BLOCK_N", "at least 16"),
    ("config value a list", "BLOCK_M = [64, 128]\nnum_stages = [3]",
     "configs = [{ BLOCK_M = [64], BLOCK_N = 64, BLOCK_K = 32, num_warps = 4, num_stages = 3 }]",
     "tuning.configs.0.BLOCK_M", "expected an integer"),
    ("config unknown key", "BLOCK_M = [64, 128]\nnum_stages = [3]",
     "configs = [{ BLOCK_M = 64, BLOCK_N = 64, BLOCK_K = 32, num_warps = 4, num_stages = 3, "
     "split = 2 }]", "tuning.configs.0.split", "unknown key 'split'"),
    ("config repeated", "BLOCK_M = [64, 128]\nnum_stages = [3]",
     "configs = [{ BLOCK_M = 64, BLOCK_N = 64, BLOCK_K = 32, num_warps = 4, num_stages = 3 },\n"
     "  { BLOCK_M = 64, BLOCK_N = 64, BLOCK_K = 32, GROUP_M = 8, num_warps = 4, num_stages = 3 }]",
     "tuning.configs.1", "repeats config 0"),
    ("GROUP_M with no swizzle", 'swizzle = "grouped"\nsplit_k = "auto"\n\n[tuning]\n',
     'swizzle = "none"\nsplit_k = "auto"\n\n[tuning]\nGROUP_M = [4, 8]\n', "tuning.GROUP_M",
     'no effect with schedule.swizzle = "none"'),
    ("config GROUP_M with no swizzle",
     'swizzle = "grouped"\nsplit_k = "auto"\n\n[tuning]\nBLOCK_M = [64, 128]\nnum_stages = [3]',
     'swizzle = "none"\nsplit_k = "auto"\n\n[tuning]\nconfigs = [{ BLOCK_M = 64, BLOCK_N = 64, '
     'BLOCK_K = 32, GROUP_M = 4, num_warps = 4, num_stages = 3 }]',
     "tuning.configs.0.GROUP_M", 'no effect with schedule.swizzle = "none"'),
    # the template has no code for these: the module built, then failed to import
    ("shape argument", 'scale = { kind = "float", default = 1.0 }',
     'scale = { kind = "shape", default = [1] }', "args.scale",
     "the matmul family takes no shape argument"),
    ("optional scalar", 'scale = { kind = "float", default = 1.0 }',
     'scale = { kind = "float", optional = true }', "args.scale",
     "the matmul family takes no optional scalar"),
    ("configs not tables", "BLOCK_M = [64, 128]\nnum_stages = [3]", "configs = [64]",
     "tuning.configs", "expected a table"),
    ("missing epilogue", '[epilogue]\nout = "(acc + bias) * scale + residual"', "", "",
     "missing required table [epilogue]"),
]


@pytest.mark.parametrize("what, old, new, key, words", CASES, ids=[c[0] for c in CASES])
def test_spec_error(what, old, new, key, words):
    assert old in GOOD, what
    with pytest.raises(SpecError) as info:
        parse(GOOD.replace(old, new, 1))
    assert info.value.path == "specs/bad.toml"
    assert info.value.key == key, str(info.value)
    assert words in info.value.message, str(info.value)


# --- launch decisions ------------------------------------------------------------------------

FACTORS = (1, 2, 4, 8, 16)


def test_auto_split_k_picks_a_split_for_decode_shapes():
    # 16 x 4096 x 4096 on an H200 (132 SMs): 32 tiles of 16 x 128, far too few programs
    factor = matmul.split_k_factor(16, 4096, 4096, 1, 132, FACTORS)
    assert factor > 1
    assert 4096 // factor >= matmul.MIN_K_PER_SPLIT


@pytest.mark.parametrize("m, n, k, batch", [(4096, 4096, 4096, 1), (8192, 8192, 8192, 1),
                                            (16, 4096, 256, 1), (16, 4096, 4096, 64)])
def test_auto_split_k_stays_off_when_it_cannot_pay(m, n, k, batch):
    # enough tiles to fill the GPU, a short K, or a batch that already fills it
    assert matmul.split_k_factor(m, n, k, batch, 132, FACTORS) == 1


def test_strategy_follows_the_spec_mode():
    cuda_like = torch.device("cpu")  # an H100's 132 multiprocessors off the GPU
    assert matmul.strategy("off", 16, 64, 8192, 1, cuda_like, FACTORS).kind == "direct"
    auto = matmul.strategy("auto", 16, 64, 8192, 1, cuda_like, FACTORS)
    assert auto.kind == "two_stage" and auto.factor > 1
    assert matmul.strategy("atomic", 16, 64, 8192, 1, cuda_like, FACTORS).kind == "atomic"
    # 512 output tiles fill the GPU: no split
    assert matmul.strategy("auto", 4096, 4096, 8192, 1, cuda_like, FACTORS).kind == "direct"
    with runtime.override(strategy="atomic:3"):
        assert matmul.strategy("off", 1, 1, 1, 1, cuda_like, FACTORS) == matmul.Strategy("atomic", 3)


def test_input_precision_follows_torch(monkeypatch):
    # 16-bit operands: "tf32", what Triton's default (None) means; a string, never None
    assert matmul.input_precision(torch.float16) == "tf32"
    assert matmul.input_precision(torch.float32) == "ieee"  # the interpreter
    monkeypatch.setattr(matmul, "interpreting", lambda: False)
    saved = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = True
        assert matmul.input_precision(torch.float32) == "tf32"
        assert matmul.input_precision(torch.bfloat16) == "tf32"
        torch.backends.cuda.matmul.allow_tf32 = False
        assert matmul.input_precision(torch.float32) == "ieee"
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved


def test_even_k_needs_every_block_k_to_divide_k():
    assert matmul.even_k(256, (32, 64))
    assert not matmul.even_k(96, (32, 64))   # 96 % 64: a partial block for BLOCK_K = 64
    assert matmul.even_k(0, (64,))


def test_prune_fits_tiles_to_small_problems():
    configs = [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": 64, "GROUP_M": 8},
                             num_warps=8, num_stages=3) for bm in (64, 128) for bn in (128, 256)]
    args = {"a_ptr": empty(1, dtype=torch.float16), "M": 16, "N": 4096, "K": 4096}
    pruned = matmul.prune_configs(configs, args)
    assert {c.kwargs["BLOCK_M"] for c in pruned} == {16}          # clamped and merged
    assert {c.kwargs["BLOCK_N"] for c in pruned} == {128, 256}
    # 256 x 256 tiles with 4 warps would need 512 accumulator registers per thread
    spill = [triton.Config({"BLOCK_M": 256, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8},
                           num_warps=4, num_stages=3), configs[0]]
    big = {**args, "M": 4096}
    assert [c.kwargs["BLOCK_M"] for c in matmul.prune_configs(spill, big)] == [64]
    # small-M configs run on small M only (unless nothing else is left)
    decode = triton.Config({"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 128, "GROUP_M": 8},
                           num_warps=4, num_stages=4)
    assert [c.kwargs["BLOCK_M"] for c in matmul.prune_configs([decode, configs[0]], big)] == [64]
    assert [c.kwargs["BLOCK_M"] for c in matmul.prune_configs([decode, configs[0]], args)] == [16, 16]
    assert [c.kwargs["BLOCK_M"] for c in matmul.prune_configs([decode], big)] == [16]


def test_prune_is_looked_up_by_the_sizes_powers_of_two(monkeypatch):
    # a size's first call in a seen power of two reuses that power's prune; every size gives
    # what a fresh prune gives (under an H100's shared memory, where tiles are dropped)
    monkeypatch.setattr(matmul, "shared_memory", lambda device: 232448)
    configs = list(importlib.import_module("generated.mm")._mm_kernel.configs)
    generator = torch.Generator().manual_seed(0)
    for _ in range(60):
        m, n, k = (int(torch.randint(1, 5000, (1,), generator=generator)) for _ in range(3))
        for dtype in (torch.float16, torch.float32):
            args = {"a_ptr": empty(1, dtype=dtype), "M": m, "N": n, "K": k}
            looked_up = matmul.prune_configs(configs, args)
            monkeypatch.setattr(matmul, "_kept_configs", {})
            fresh = matmul.prune_configs(configs, args)
            assert [c.all_kwargs() for c in looked_up] == [c.all_kwargs() for c in fresh]


def _space(op, *tensors):
    info = generated.REGISTRY[op]
    dims = {a.name: a.dims for a in info.args if a.kind == "tensor"}
    problem = matmul.problem(op, dict(zip(dims, tensors)), dims)
    out = empty(problem.shape)
    rank = 3 if "..." in sum(dims.values(), ()) else 1
    return problem, problem.space("op", {"out": out.stride()}, rank)


def test_outputs_are_planned_with_the_strides_torch_allocates():
    # the plan computes its outputs' strides (and spans) rather than allocating meta tensors
    for shape in [(), (0,), (3,), (0, 5), (5, 0), (1, 1), (2, 1, 3), (4, 0, 1, 2)]:
        assert contiguous_strides(shape) == torch.empty(shape, device="meta").stride()


def test_an_output_past_int32_takes_int64_at_a_new_row_count():
    mm = importlib.import_module("generated.mm").LAYOUT
    b = torch.empty(16, 4096, dtype=torch.float16, device="meta")
    plan = matmul.launch_plan(mm, torch.empty(8, 16, dtype=torch.float16, device="meta"), b)
    assert not plan.index_64
    # A and B stay small; the output, 2**19 + 8 rows of 4096, passes 2**31 elements
    rows = 2**19 + 8
    plan = matmul.launch_plan(mm, torch.empty(rows, 16, dtype=torch.float16, device="meta"), b)
    assert plan.index_64 and plan.shape == (rows, 4096)


def test_batch_dims_fold_into_m_when_strides_allow():
    problem, space = _space("linear", randn(2, 5, 7), randn(3, 7))
    assert problem.shape == (2, 5, 3)
    assert (space.m, space.batch) == (10, (1, 1, 1))            # one 10 x 3 GEMM
    # a transposed batch cannot step over M rows: it stays a batch dim
    _, space = _space("linear", randn(5, 2, 7).transpose(0, 1), randn(3, 7))
    assert (space.m, space.batch) == (5, (1, 1, 2))
    # matmul of a batch by one matrix folds; a batch of B matrices does not
    _, space = _space("matmul", randn(4, 6, 7), randn(7, 3))
    assert (space.m, space.batch_count) == (24, 1)
    _, space = _space("matmul", randn(6, 7), randn(4, 7, 3))
    assert (space.m, space.batch_count) == (6, 4)


def test_broadcast_batch_strides_are_zero():
    _, space = _space("matmul", randn(2, 1, 6, 7), randn(3, 7, 4))
    assert space.batch_count == 6
    assert 0 in space.views["b"].batch and 0 in space.views["a"].batch


def test_matmul_vectors_drop_their_dim():
    assert _space("matmul", randn(7), randn(2, 7, 4))[0].shape == (2, 4)
    assert _space("matmul", randn(3, 7), randn(7))[0].shape == (3,)
    assert _space("matmul", randn(7), randn(7))[0].shape == ()


@pytest.mark.parametrize("call, error, words", [
    (lambda: generated.mm(randn(2, 3, 4), randn(4, 5)), ValueError,
     "argument 'a' must be 2-D"),
    (lambda: generated.mm(randn(3, 4), randn(5, 6)), ValueError, "K is 4 and 5"),
    (lambda: generated.bmm(randn(2, 3, 4), randn(3, 4, 5)), ValueError,
     "same batch size"),
    (lambda: generated.matmul(randn(2, 3, 4), randn(3, 4, 5)), ValueError,
     "do not broadcast"),
    (lambda: generated.mm(randn(3, 4), randn(4, 5, dtype=torch.float16)), TypeError,
     "same dtype"),
    (lambda: generated.linear(randn(3, 4), randn(5, 4), randn(6)), ValueError,
     "argument 'bias' has shape (6,)"),
    # the residual promotes (F.linear(...) + residual), the bias is F.linear's: one dtype
    (lambda: generated.linear_residual(randn(3, 4, dtype=torch.float16),
                                       randn(5, 4, dtype=torch.float16), randn(5), randn(3, 5)),
     TypeError, "argument 'bias' has dtype torch.float32, but 'x' has torch.float16"),
    (lambda: generated.linear_residual(randn(3, 4), randn(5, 4), randn(5),
                                       torch.ones(3, 5, dtype=torch.int32, device=testing.device())),
     TypeError, "argument 'residual' has dtype torch.int32; supported: float16, bfloat16, float32, float64"),
    (lambda: generated.addmm(randn(3, 5), randn(3, 4), randn(4, 5), beta="x"),
     TypeError, "argument 'beta' must be float"),
    (lambda: generated.mm(randn(3, 4), [[1.0]]), TypeError, "must be a torch.Tensor"),
    (lambda: generated.matmul(torch.tensor(1.0, device=testing.device()), randn(3)), ValueError, "at least 1 dim"),
    (lambda: generated.matmul(randn(*(3,) * 5, 4, 5)[(slice(None, None, 2),) * 5], randn(5, 2)),
     ValueError, "matmul: the batch dims (2, 2, 2, 2, 2) cannot be merged into 3 or fewer for the "
     "strides of 'a'"),
])
def test_bad_input_is_refused_before_launch(call, error, words):
    with runtime.record_launches() as log, pytest.raises(error, match=words.replace("(", r"\(")
                                                         .replace(")", r"\)")):
        call()
    assert log == []


@pytest.mark.parametrize("strategy", [None, "two_stage:2"])
def test_addmm_ignores_a_zero_scaled_term_as_torch_does(strategy):
    # beta = 0: NaN and inf in c do not reach the result (torch's docs); alpha = 0: nor do those
    # in a and b (BLAS reads neither). Compared with torch's own addmm on the tier's device.
    c, a, b = randn(16, 32), randn(16, 24), randn(24, 32)
    poisoned = a.clone()
    poisoned[3, 5] = math.inf
    bad_c = c.clone()
    bad_c[2] = math.nan
    with runtime.override(strategy=strategy):
        for args, kwargs in [((c, poisoned, b), {"alpha": 0.0, "beta": 0.5}),
                             ((bad_c, a, b), {"beta": 0.0}),
                             ((bad_c, poisoned, b), {"alpha": 0.0, "beta": 0.0})]:
            got, want = generated.addmm(*args, **kwargs), torch.addmm(*args, **kwargs)
            assert not want.isnan().any(), "torch's rule this test stands on"
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_launch_records_strategy_layout_and_index_width():
    a, b = randn(40, 33), randn(20, 33).t()     # b read K-major through its strides
    with runtime.record_launches() as log, runtime.override(indexing="int64"):
        generated.mm(a, b)
    (launch,) = log
    assert (launch.kernel, launch.index_bits) == ("direct", 64)
    assert launch.details["layout"] == "a:k,b:k,out:n"


def test_scaffold_renders_a_module_that_compiles():
    from specgen.render import render_op
    spec = parse(family.scaffold("my_linear_relu"))
    source = render_op(spec)
    compile(source, "my_linear_relu.py", "exec")
    assert "def _my_linear_relu_kernel(" in source and "relu_f32(acc + bias)" in source
    assert "from specgen.kernel_lib import relu_f32" in source     # by name: torch.compile


@pytest.mark.parametrize("strategy", ["two_stage:3", "atomic:3"])
@pytest.mark.parametrize("rows, kernels", [(10, ["split"]), (40, ["split", "reduce"])])
def test_split_k_sums_in_the_last_program_of_small_tiles_and_in_a_kernel_of_its_own_above(
        strategy, rows, kernels):
    # up to FUSED_SUM_ROWS rows the last of a tile's programs sums the workspace and applies the
    # epilogue (here a bias and a transposed residual), leaving every ticket at zero; above, the
    # reduce kernel does. bmm's batch (not folded into M) gives each batch element its tickets.
    from specgen.runtime import counters

    launch = importlib.import_module("specgen.runtime.launch")
    assert (rows <= matmul.FUSED_SUM_ROWS) == (kernels == ["split"])
    x, w, bias, residual = randn(rows, 96), randn(70, 96), randn(70), randn(70, rows).t()
    a, b = randn(3, rows, 96), randn(3, 96, 70)
    with runtime.record_launches() as log, runtime.override(strategy=strategy), \
            launch.watch_autotuned() as seen:
        out = generated.linear_residual(x, w, bias, residual)
        batched = generated.bmm(a, b)
    assert [launch.kernel for launch in log] == [strategy.split(":")[0]] * 2
    assert [kernel.fn.__name__ for kernel, _, _ in seen] == \
        [f"_{op}_{kernel}_kernel" for op in ("linear_residual", "bmm") for kernel in kernels]
    want = x.double() @ w.double().t() + bias.double() + residual.double()
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-5 * 96)
    torch.testing.assert_close(batched.double(), a.double() @ b.double(), rtol=1e-5, atol=1e-5 * 96)
    assert not counters.tile_counters(x.device, 1).any()


def test_a_call_under_capture_gets_zeroed_tickets_that_are_not_kept(monkeypatch):
    # a set first made during a CUDA graph capture would be zeroed only when that graph replays
    # (tests/gpu/test_matmul_gpu.py captures real graphs): a capture gets its own
    from specgen.runtime import counters

    device = torch.empty(0, device=testing.device()).device   # with its index, as a tensor's
    held = counters.tile_counters(device, 1)
    kept = {key: id(value) for key, value in counters._counters.items()}
    monkeypatch.setattr(counters, "_capturing", lambda device: True)
    own = counters.tile_counters(device, 2 * held.numel())     # would grow the kept set
    assert own.numel() == 2 * held.numel() and not own.any()
    assert {key: id(value) for key, value in counters._counters.items()} == kept


def test_split_kernels_compile_for_sm90():
    # the interpreter lets the fused split kernel's branch change its accumulator's type, which
    # the compiler refuses: each module's split kernel is compiled for sm_90, two-stage and
    # atomic (no GPU needed: Triton's NVIDIA backend ships ptxas)
    missing = nvidia_backend_missing()
    if missing:
        pytest.skip(missing)
    names = sorted(n for n, i in generated.REGISTRY.items() if i.family == "matmul")
    assert compiled_kernel_counts("specgen.families.matmul", names) == {name: 2 for name in names}


def test_a_traced_split_k_call_counts_tickets_in_zeroed_counters_of_its_own(monkeypatch):
    # as reduce's one-launch split: a graph cannot hold the counters eager calls keep, so a call
    # traced on fake tensors (as torch.compile traces) allocates its own and never asks for ours
    from torch._subclasses.fake_tensor import FakeTensorMode, is_fake
    from specgen.runtime import counters

    def kept_counters(*args):
        raise AssertionError("a traced call used the counters kept between calls")

    launches = []
    monkeypatch.setattr(counters, "tile_counters", kept_counters)
    # what the launch is given is the point here (the interpreter cannot run on fake tensors)
    monkeypatch.setattr(matmul, "launch", lambda kernel, grid, *args, **options:
                        launches.append(args))
    with FakeTensorMode() as mode, runtime.override(strategy="two_stage:2"):
        # (5 rows: the split kernel sums its slots and counts tickets)
        x, w = (mode.from_tensor(randn(*shape)) for shape in ((5, 256), (7, 256)))
        generated.linear(x, w)
    (args,) = launches
    (tickets,) = [a for a in args if isinstance(a, torch.Tensor) and a.dtype == torch.int32]
    assert is_fake(tickets)


@pytest.mark.parametrize("op, kind", [("linear_gelu", "two_stage"), ("bmm", "atomic")])
def test_auto_split_k_end_to_end(op, kind):
    # off the GPU the launcher assumes 4 multiprocessors: one 5 x 7 tile with K = 2048 splits
    x, w = randn(5, 2048), randn(7, 2048)
    with runtime.record_launches() as log:
        if op == "linear_gelu":
            out = generated.linear_gelu(x, w)
            want = torch.nn.functional.gelu(x.double() @ w.double().t(), approximate="tanh")
        else:
            out = generated.bmm(x[None], w.t()[None])
            want = (x.double() @ w.double().t())[None]
    chosen = [(launch.kernel, launch.details["split_k"]) for launch in log]
    if runtime.interpreting():
        assert chosen == [(kind, 4)]
    else:   # a GPU times split-K against the direct kernel on the first call
        assert chosen in ([(kind, 4)], [("direct", 1)])
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-5 * 2048)


def _plan(**fields):
    base = dict(shape=(16, 64), dtype=torch.float16, empty=False,
                strategy=matmul.Strategy("two_stage", 8), index_64=False, layout="",
                precision="tf32", even_k=True, m=16, n=64, k=4096, batch=1, batch_shape=(),
                sizes=(), ab_strides=(), epilogue_strides=(), swizzle2d=False, batched=False,
                candidates=(matmul.Strategy("direct"), matmul.Strategy("two_stage", 8)))
    return matmul.LaunchPlan(**{**base, **fields})


def test_settle_keeps_the_faster_candidate(monkeypatch):
    plan = _plan()
    ran = []
    monkeypatch.setattr(matmul.triton.testing, "do_bench", lambda fn, **_: fn() or ran[-1][1])

    def run(strategy):
        ran.append((strategy, 3.0 if strategy.kind == "direct" else 2.0))
    x = empty(1, dtype=torch.float16)
    monkeypatch.delenv("SPECGEN_AUTOTUNE", raising=False)
    # by default nothing is timed: the plan's strategy (the heuristic's split)
    assert matmul.settle(plan, [x], True, run) == plan.strategy and ran == []
    monkeypatch.setenv("SPECGEN_AUTOTUNE", "1")     # timed where autotuning is asked for
    assert matmul.settle(plan, [x], True, run) == matmul.Strategy("two_stage", 8)
    assert len(ran) == 2
    # decided once per plan and dtype
    assert matmul.settle(_plan(), [x], True, run) == matmul.Strategy("two_stage", 8) and len(ran) == 2
    # no candidates: the plan's strategy, nothing timed
    assert matmul.settle(_plan(candidates=(), m=17), [x], True, run).kind == "two_stage" and len(ran) == 2


def test_settle_gives_misaligned_operands_the_direct_kernel(monkeypatch):
    monkeypatch.setattr(matmul.triton.testing, "do_bench", lambda fn, **_: fn() or 1.0)
    monkeypatch.setenv("SPECGEN_AUTOTUNE", "1")
    ran = []
    x = empty(1, dtype=torch.float16)
    tma = _plan(strategy=matmul.TMA, candidates=(), m=18)
    assert matmul.settle(tma, [x], True, ran.append) == matmul.TMA
    assert matmul.settle(tma, [x], False, ran.append) == matmul.DIRECT
    # timed candidates too: the TMA one is timed (and kept) as the direct kernel
    timed = _plan(candidates=(matmul.TMA, matmul.Strategy("two_stage", 8)), m=19)
    matmul.settle(timed, [x], False, ran.append)
    assert ran == [matmul.DIRECT, matmul.Strategy("two_stage", 8)]


def _tma_space(a_strides, b_strides, batch=(1,), a_batch=(0,), b_batch=(0,)):
    views = {"a": matmul.View(a_batch, m=a_strides[0], k=a_strides[1]),
             "b": matmul.View(b_batch, k=b_strides[0], n=b_strides[1])}
    return matmul.Space(64, 64, 64, batch, views)


@pytest.mark.parametrize("a_strides, b_strides, majors", [
    ((64, 1), (64, 1), (True, False)),      # row-major A and B (mm)
    ((64, 1), (1, 64), (True, True)),       # B = w.t(), a linear weight
    ((1, 64), (64, 1), (False, False)),     # A = a.t()
    ((1, 72), (1, 136), (False, True)),     # padded rows, still 16-byte multiples
    ((60, 1), (64, 1), None),               # 120-byte rows: not a multiple of 16 bytes
    ((64, 2), (64, 1), None),               # no unit stride in A
    ((0, 1), (64, 1), None),                # a broadcast A (stride 0)
])
def test_tma_describes_row_and_column_major_operands_with_aligned_rows(a_strides, b_strides,
                                                                        majors):
    layout = matmul.tma_layout(_tma_space(a_strides, b_strides), "a", "b", 2)
    assert (layout and (layout.a_k_major, layout.b_k_major)) == majors
    if layout is not None:
        # one batch element: a batch stride the descriptor accepts, never stepped over
        assert layout.a_batch > 0 and layout.b_batch > 0
        assert layout.a_batch * 2 % 16 == layout.b_batch * 2 % 16 == 0


@pytest.mark.parametrize("batch, a_batch, b_batch, strides", [
    ((2,), (4096,), (4096,), (4096, 4096)),           # bmm on contiguous operands
    ((1, 2, 3), (0, 3 * 5000, 5000), (0, 24576, 8192), (5000, 8192)),   # nested batch dims
    ((1, 2), (0, 4096), (0, 0), None),                # B broadcast over the batch
    ((1, 2, 3), (0, 5000, 3 * 5000), (0, 24576, 8192), None),   # batch dims out of order
    ((2,), (4100,), (4096,), None),                   # 8200-byte steps: not 16-byte multiples
])
def test_tma_steps_over_batch_elements_one_stride_apart(batch, a_batch, b_batch, strides):
    space = _tma_space((64, 1), (64, 1), batch, a_batch, b_batch)
    layout = matmul.tma_layout(space, "a", "b", 2)
    assert (layout and (layout.a_batch, layout.b_batch)) == strides


def test_forced_tma_runs_where_descriptors_fit_and_falls_back_elsewhere():
    small = {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 16, "GROUP_M": 2, "num_warps": 4,
             "num_stages": 2}
    a, b = randn(72, 48, dtype=torch.float16), randn(40, 48, dtype=torch.float16)
    misaligned = randn(72, 49, dtype=torch.float16)[:, 1:]    # starts 2 bytes into its storage
    cases = [
        ((a, b.t()), "tma"), ((a.t().contiguous().t(), b.t()), "tma"),
        ((misaligned, b.t()), "direct"),
        ((a[None].expand(2, 72, 48), b.t()[None].expand(2, 48, 40)), "direct"),   # broadcast
        ((torch.stack([a, 2 * a]), torch.stack([b, -b]).mT), "tma"),     # a batch of 2
        ((torch.stack([a, 2 * a]).mT.contiguous().mT, torch.stack([b, -b]).mT), "tma"),
    ]
    for (x, y), kind in cases:
        # a grid of 3 programs for 9 tiles: each program walks several
        with runtime.record_launches() as log, runtime.override(strategy="tma", config=small,
                                                                max_programs=3):
            out = generated.matmul(x, y)
        assert [launch.kernel for launch in log] == [kind]
        torch.testing.assert_close(out.double(), x.double() @ y.double(), rtol=1e-3, atol=1e-2)


def test_launch_plans_are_cached_on_metadata():
    op = sys.modules["generated.mm"].LAYOUT
    a, b = randn(40, 33), randn(33, 20)
    plan = matmul.launch_plan(op, a, b)
    assert matmul.launch_plan(op, randn(40, 33), randn(33, 20)) is plan
    transposed = matmul.launch_plan(op, a, randn(20, 33).t())
    assert transposed is not plan and transposed.layout == "a:k,b:k,out:n"
    with runtime.override(strategy="atomic:2"):
        assert matmul.launch_plan(op, a, b).strategy == matmul.Strategy("atomic", 2)
    assert (plan.shape, plan.m, plan.n, plan.k) == ((40, 20), 40, 20, 33)


def test_forced_config_number_is_fitted_and_mapping_filtered():
    module = sys.modules["generated.mm"]
    a, b, out = randn(20, 24), randn(24, 10), empty(20, 10)
    args = (a, b, out, 20, 10, 24, 24, 1, 10, 1, 10, 1)
    kwargs = dict(LAYOUT="", EVEN_K=False, INDEX_64=False, INPUT_PRECISION="ieee")
    # a number: a config of the space as autotuning would fit it (blocks clamped to the sizes;
    # unfitted, every config of mm's space has 64 rows or more)
    for number in range(8):
        config = forced_config(module._mm_kernel, args, kwargs, number)
        assert (config.kwargs["BLOCK_M"], config.kwargs["BLOCK_N"], config.kwargs["BLOCK_K"]) \
            == (32, 16, 32)
    # a mapping: the meta-parameters a kernel takes (the GEMV kernel has no BLOCK_M, GROUP_M),
    # the rest from its first config
    tiles = {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 16, "GROUP_M": 2, "num_warps": 2,
             "num_stages": 2}
    gemv = sys.modules["generated.int4_weight_linear"]._int4_weight_linear_gemv_kernel
    config = forced_config(gemv, (), {}, tiles)
    assert config.kwargs == {"BLOCK_N": 32, "BLOCK_K": 16,
                             "STAGES": gemv.configs[0].kwargs["STAGES"]}
    assert config.num_warps == 2


def test_the_generator_and_the_runtime_agree_on_the_smallest_dot_block():
    assert family.MIN_BLOCK == matmul.MIN_DOT_BLOCK


@pytest.mark.skipif(not runtime.interpreting(), reason="the interpreter's bfloat16 dot only")
@pytest.mark.parametrize("call", [
    lambda a, b: generated.mm(a, b),
    lambda a, b: generated.linear(a, b.t()),
    lambda a, b: generated.addmm(a[:, :1].expand(-1, 3).contiguous(), a, b[:, :3]),
], ids=["mm", "linear", "addmm"])
def test_the_interpreter_refuses_a_bfloat16_matmul(call):
    # it would compute one wrongly (errors of 1e9) and say nothing: a clear error instead
    a, b = torch.randn(4, 8, dtype=torch.bfloat16), torch.randn(8, 5, dtype=torch.bfloat16)
    with runtime.record_launches() as log:
        with pytest.raises(NotImplementedError, match="computes a bfloat16 matrix product wrongly"):
            call(a, b)
    assert log == []

"""The matmul family: spec errors, planner decisions and launch decisions (no GPU needed).

Values are checked by tests/test_ops.py (the property suite); this file pins the decisions that
the property suite forces or cannot see: auto split-K, batch folding, precision, config pruning.
"""

import pytest
import torch
import triton

import generated
from specgen import runtime
from specgen.errors import SpecError
from specgen.families import matmul as family
from specgen.model import Source
from specgen.parse import parse_spec
from specgen.runtime import matmul

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
     "args.acc", "used by the matmul kernels"),
    ("epilogue reads A", 'out = "(acc + bias) * scale + residual"', 'out = "x + acc"',
     "epilogue.out", "name 'x' is used but not declared"),
    ("bad out dtype", "[epilogue]", '[epilogue]\ndtype = "int8"', "epilogue.dtype",
     "unknown dtype 'int8'"),
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
    ("unknown tuning key", "num_stages = [3]", "num_stage = [3]", "tuning.num_stage",
     "unknown key 'num_stage'"),
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
    cuda_like = torch.device("cpu")  # 4 "multiprocessors" off the GPU
    assert matmul.strategy("off", 16, 64, 8192, 1, cuda_like, FACTORS).kind == "direct"
    auto = matmul.strategy("auto", 16, 64, 8192, 1, cuda_like, FACTORS)
    assert auto.kind == "two_stage" and auto.factor > 1
    assert matmul.strategy("atomic", 16, 64, 8192, 1, cuda_like, FACTORS).kind == "atomic"
    assert matmul.strategy("auto", 512, 512, 8192, 1, cuda_like, FACTORS).kind == "direct"
    with runtime.override(strategy="atomic:3"):
        assert matmul.strategy("off", 1, 1, 1, 1, cuda_like, FACTORS) == matmul.Strategy("atomic", 3)


def test_input_precision_follows_torch(monkeypatch):
    assert matmul.input_precision(torch.float16) is None    # Triton's default: 16-bit tensor cores
    assert matmul.input_precision(torch.float32) == "ieee"  # the interpreter
    monkeypatch.setattr(matmul, "interpreting", lambda: False)
    saved = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = True
        assert matmul.input_precision(torch.float32) == "tf32"
        assert matmul.input_precision(torch.bfloat16) is None
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
    args = {"a_ptr": torch.empty(1, dtype=torch.float16), "M": 16, "N": 4096, "K": 4096}
    pruned = matmul.prune_configs(configs, args)
    assert {c.kwargs["BLOCK_M"] for c in pruned} == {16}          # clamped and merged
    assert {c.kwargs["BLOCK_N"] for c in pruned} == {128, 256}
    # 256 x 256 tiles with 4 warps would need 512 accumulator registers per thread
    spill = [triton.Config({"BLOCK_M": 256, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8},
                           num_warps=4, num_stages=3), configs[0]]
    big = {**args, "M": 4096}
    assert [c.kwargs["BLOCK_M"] for c in matmul.prune_configs(spill, big)] == [64]


def _space(op, *tensors):
    info = generated.REGISTRY[op]
    dims = {a.name: a.dims for a in info.args if a.kind == "tensor"}
    problem = matmul.problem(op, dict(zip(dims, tensors)), dims)
    out = torch.empty(problem.shape)
    return problem, problem.space({"out": out}, 3 if "..." in sum(dims.values(), ()) else 1)


def test_batch_dims_fold_into_m_when_strides_allow():
    problem, space = _space("linear", torch.randn(2, 5, 7), torch.randn(3, 7))
    assert problem.shape == (2, 5, 3)
    assert (space.m, space.batch) == (10, (1, 1, 1))            # one 10 x 3 GEMM
    # a transposed batch cannot step over M rows: it stays a batch dim
    _, space = _space("linear", torch.randn(5, 2, 7).transpose(0, 1), torch.randn(3, 7))
    assert (space.m, space.batch) == (5, (1, 1, 2))
    # matmul of a batch by one matrix folds; a batch of B matrices does not
    _, space = _space("matmul", torch.randn(4, 6, 7), torch.randn(7, 3))
    assert (space.m, space.batch_count) == (24, 1)
    _, space = _space("matmul", torch.randn(6, 7), torch.randn(4, 7, 3))
    assert (space.m, space.batch_count) == (6, 4)


def test_broadcast_batch_strides_are_zero():
    _, space = _space("matmul", torch.randn(2, 1, 6, 7), torch.randn(3, 7, 4))
    assert space.batch_count == 6
    assert 0 in space.views["b"].batch and 0 in space.views["a"].batch


def test_matmul_vectors_drop_their_dim():
    assert _space("matmul", torch.randn(7), torch.randn(2, 7, 4))[0].shape == (2, 4)
    assert _space("matmul", torch.randn(3, 7), torch.randn(7))[0].shape == (3,)
    assert _space("matmul", torch.randn(7), torch.randn(7))[0].shape == ()


@pytest.mark.parametrize("call, error, words", [
    (lambda: generated.mm(torch.randn(2, 3, 4), torch.randn(4, 5)), ValueError,
     "argument 'a' must be 2-D"),
    (lambda: generated.mm(torch.randn(3, 4), torch.randn(5, 6)), ValueError, "K is 4 and 5"),
    (lambda: generated.bmm(torch.randn(2, 3, 4), torch.randn(3, 4, 5)), ValueError,
     "same batch size"),
    (lambda: generated.matmul(torch.randn(2, 3, 4), torch.randn(3, 4, 5)), ValueError,
     "do not broadcast"),
    (lambda: generated.mm(torch.randn(3, 4), torch.randn(4, 5, dtype=torch.float16)), TypeError,
     "same dtype"),
    (lambda: generated.linear(torch.randn(3, 4), torch.randn(5, 4), torch.randn(6)), ValueError,
     "argument 'bias' has shape (6,)"),
    (lambda: generated.addmm(torch.randn(3, 5), torch.randn(3, 4), torch.randn(4, 5), beta="x"),
     TypeError, "argument 'beta' must be float"),
    (lambda: generated.mm(torch.randn(3, 4), [[1.0]]), TypeError, "must be a torch.Tensor"),
    (lambda: generated.matmul(torch.tensor(1.0), torch.randn(3)), ValueError, "at least 1 dim"),
])
def test_bad_input_is_refused_before_launch(call, error, words):
    with runtime.record_launches() as log, pytest.raises(error, match=words.replace("(", r"\(")
                                                         .replace(")", r"\)")):
        call()
    assert log == []


def test_launch_records_strategy_layout_and_index_width():
    a, b = torch.randn(40, 33), torch.randn(20, 33).t()     # b read K-major through its strides
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
    assert "def _my_linear_relu_kernel(" in source and "lib.relu(acc + bias)" in source


@pytest.mark.parametrize("op, kind", [("linear_gelu", "two_stage"), ("bmm", "atomic")])
def test_auto_split_k_end_to_end(op, kind):
    # off the GPU the launcher assumes 4 multiprocessors: one 5 x 7 tile with K = 2048 splits
    x, w = torch.randn(5, 2048), torch.randn(7, 2048)
    with runtime.record_launches() as log:
        if op == "linear_gelu":
            out = generated.linear_gelu(x, w)
            want = torch.nn.functional.gelu(x.double() @ w.double().t(), approximate="tanh")
        else:
            out = generated.bmm(x[None], w.t()[None])
            want = (x.double() @ w.double().t())[None]
    assert [(launch.kernel, launch.details["split_k"]) for launch in log] == [(kind, 4)]
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-5 * 2048)


def test_settle_keeps_the_faster_candidate(monkeypatch):
    plan = matmul.LaunchPlan(
        shape=(16, 64), dtype=torch.float16, device=torch.device("cpu"), empty=False,
        strategy=matmul.Strategy("two_stage", 8), index_64=False, layout="", precision=None,
        even_k=True, m=16, n=64, batch=1, sizes=(), ab_strides=(), epilogue_strides=(),
        details={}, candidates=(matmul.Strategy("direct"), matmul.Strategy("two_stage", 8)))
    ran = []
    monkeypatch.setattr(matmul.triton.testing, "do_bench", lambda fn, **_: fn() or ran[-1][1])

    def run(strategy):
        ran.append((strategy, 3.0 if strategy.kind == "direct" else 2.0))
    assert matmul.settle(plan, run) == matmul.Strategy("two_stage", 8)
    assert plan.candidates == () and len(ran) == 2
    assert matmul.settle(plan, run) == matmul.Strategy("two_stage", 8) and len(ran) == 2

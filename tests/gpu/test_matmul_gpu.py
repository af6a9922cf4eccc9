"""Matmul family on a real GPU: what the interpreter cannot run or cannot afford.

bfloat16 on every op and strategy (the interpreter computes bfloat16 tl.dot wrongly), the TMA
kernel where the launcher picks it (Hopper, aligned rows), autotuning (keyed on layout), both split-K variants with autotuning (atomic targets reset between trials), batches
over the 65535 grid limit, column blocks over it (swizzle2d), int64 indexing on an operand of
more than 2**31 elements, TF32 following torch's setting, and torch.compile of linear_gelu.
Most tests force one small config (`override(config={...})`) so that the file compiles few kernels
(about 3 minutes).
"""

import gc
import sys
import threading

import pytest
import torch
import torch.nn.functional as F

import generated
from specgen import runtime
from specgen.testing.core import matmul_tolerances

pytestmark = pytest.mark.gpu

CONFIG = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 4, "num_warps": 4,
          "num_stages": 3}
TINY = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 2, "num_warps": 4,
        "num_stages": 2}


@pytest.fixture(autouse=True)
def _free_memory():
    yield
    gc.collect()
    torch.cuda.empty_cache()


def randn(*shape, dtype=torch.bfloat16):
    return torch.randn(*shape, device="cuda", dtype=dtype)


def check(actual, expected, k, tf32=False):
    rtol, atol = matmul_tolerances(k, tf32)[actual.dtype]
    assert actual.dtype == expected.dtype or expected.dtype == torch.float64
    torch.testing.assert_close(actual.double(), expected.double(), rtol=rtol, atol=atol)


def d(t):
    return None if t is None else t.double()


# one row per op: (call, float64 reference) on inputs of M, N, K and a layout
def _cases(m, n, k, layout, dtype):
    def mat(rows, cols):
        # "t": stored transposed; "s": a stepped slice of a wider tensor
        if layout == "t":
            return randn(cols, rows, dtype=dtype).t()
        if layout == "s":
            return randn(rows, 2 * cols, dtype=dtype)[:, ::2]
        return randn(rows, cols, dtype=dtype)

    a, b, w = mat(m, k), mat(k, n), mat(n, k)
    bias, c = randn(n, dtype=dtype), mat(m, n)
    x3 = randn(3, m, k, dtype=dtype) if layout != "t" else randn(3, k, m, dtype=dtype).mT
    b3 = randn(3, k, n, dtype=dtype)
    res = randn(3, m, n, dtype=dtype)
    return {
        "mm": (lambda: generated.mm(a, b), lambda: d(a) @ d(b)),
        "bmm": (lambda: generated.bmm(x3, b3), lambda: torch.bmm(d(x3), d(b3))),
        "matmul": (lambda: generated.matmul(x3, b[None]), lambda: torch.matmul(d(x3), d(b))),
        "linear": (lambda: generated.linear(x3, w, bias), lambda: F.linear(d(x3), d(w), d(bias))),
        "addmm": (lambda: generated.addmm(c, a, b, beta=0.5, alpha=-2.0),
                  lambda: torch.addmm(d(c), d(a), d(b), beta=0.5, alpha=-2.0)),
        "linear_gelu": (lambda: generated.linear_gelu(x3, w, bias),
                        lambda: F.gelu(F.linear(d(x3), d(w), d(bias)), approximate="tanh")),
        "linear_residual": (lambda: generated.linear_residual(x3, w, bias, res),
                            lambda: F.linear(d(x3), d(w), d(bias)) + d(res)),
    }


# bfloat16 on every op, layout and strategy (float16 and float32 also run in the property suite,
# which draws bfloat16 too on the GPU)
X3_OPS = {"bmm", "matmul", "linear", "linear_gelu", "linear_residual"}


# (120, 136, 72): rows of 16-byte multiples, which TMA descriptors can describe
@pytest.mark.parametrize("m, n, k, layout", [(1, 1, 1, "n"), (127, 129, 65, "n"),
                                             (127, 129, 65, "t"), (200, 72, 333, "s"),
                                             (120, 136, 72, "n"), (120, 136, 72, "t")])
def test_every_op_bfloat16(m, n, k, layout):
    dtype = torch.bfloat16
    for op, (call, reference) in _cases(m, n, k, layout, dtype).items():
        for strategy in ("direct", "tma", "two_stage:3", "atomic:2"):
            with runtime.override(config=CONFIG, strategy=strategy), \
                    runtime.record_launches() as log:
                out = call()
            want = reference()
            assert out.dtype == dtype, op
            check(out, want, k)
            if strategy == "tma":
                # TMA needs rows of 16-byte multiples, and batch elements one stride apart in
                # A and B: bmm's are; the transposed x3 does not fold into M, and the 2-D
                # operand it meets is then broadcast over its batch
                describable = op not in X3_OPS or layout == "n" or op == "bmm"
                fits = m % 8 == 0 and layout != "s" and describable
                assert [launch.kernel for launch in log] == ["tma" if fits else "direct"], op


def test_auto_picks_tma_and_autotunes_it():
    x, w, bias = randn(1024, 512), randn(768, 512), randn(768)
    want = F.gelu(F.linear(d(x), d(w), d(bias)), approximate="tanh")
    with runtime.record_launches() as log:
        check(generated.linear_gelu(x, w, bias), want, 512)
        # a slice starting 2 bytes in: TMA cannot start there, the direct kernel runs
        xs = randn(1024, 520)[:, 1:513]
        check(generated.linear_gelu(xs, w, bias),
              F.gelu(F.linear(d(xs), d(w), d(bias)), approximate="tanh"), 512)
    assert [launch.kernel for launch in log] == ["tma", "direct"]


def test_tma_calls_replayed_and_from_a_new_thread():
    # the TMA kernel asks triton's launch-time allocator for its descriptors' memory, which is per
    # thread: a first call, replays, and calls from a thread that never launched all find one
    x, w = randn(256, 256), randn(256, 256)
    want = d(x) @ d(w).t()
    with runtime.record_launches() as log:
        check(generated.linear(x, w), want, 256)
    assert [launch.kernel for launch in log] == ["tma"]
    for _ in range(3):   # recorded, then replayed
        check(generated.linear(x, w), want, 256)
    results = []
    thread = threading.Thread(target=lambda: results.append(generated.linear(x, w)))
    thread.start()
    thread.join()
    check(results[0], want, 256)


@pytest.mark.parametrize("strategy, kernel", [("direct", "_mm_kernel"), ("tma", "_mm_tma_kernel")])
def test_autotuning_is_keyed_on_layout(strategy, kernel, monkeypatch):
    # 64^3: every block clamps to 64, so the pruned space is a handful of configs
    monkeypatch.setenv("SPECGEN_AUTOTUNE", "1")     # (by default nothing autotunes)
    a, b = randn(64, 64), randn(64, 64)
    with runtime.override(strategy=strategy):
        generated.mm(a, b)
        generated.mm(a.t(), b)
        check(generated.mm(a.t(), b), d(a.t()) @ d(b), 64)
    keys = getattr(sys.modules["generated.mm"], kernel).cache
    layouts = {key[3] for key in keys}
    assert {"a:k,b:n,out:n", "a:m,b:n,out:n"} <= layouts, layouts


def test_decode_shape_split_k_autotuned(monkeypatch):
    # M = 16, K = 4096: too few output tiles for the GPU, so split-K is a candidate. bmm's spec
    # asks for atomic split-K: its autotuning trials add into the workspace and must reset it
    monkeypatch.setenv("SPECGEN_AUTOTUNE", "1")     # (by default nothing autotunes or times)
    x, w = randn(16, 4096), randn(4096, 4096)

    def call():
        return generated.bmm(x[None], w.t()[None])
    want = d(x)[None] @ d(w).t()[None]
    with runtime.override(strategy="atomic:8"), runtime.record_launches() as log:
        check(call(), want, 4096)
        check(call(), want, 4096)   # the tuned config again, on a fresh zeroed workspace
    assert [(launch.kernel, launch.details["split_k"]) for launch in log] == [("atomic", 8)] * 2
    # auto: the first call times split-K against the direct kernel and keeps the faster
    with runtime.record_launches() as log:
        check(call(), want, 4096)
        check(call(), want, 4096)
    assert log[0].kernel in ("direct", "atomic") and log[1].kernel == log[0].kernel


def test_decode_shape_two_stage():
    x, w, bias = randn(16, 4096), randn(1024, 4096), randn(1024)
    want = F.gelu(F.linear(d(x), d(w), d(bias)), approximate="tanh")
    for factor in (2, 8, 16):
        with runtime.override(strategy=f"two_stage:{factor}", config=TINY):
            check(generated.linear_gelu(x, w, bias), want, 4096)


def test_captured_split_k_calls_count_in_tickets_of_their_own():
    # a decode-sized linear (split-K in one launch) captured into two CUDA graphs on the shared
    # capture stream: each owns zeroed tickets, refilled each replay, and none is kept for later
    # calls (the second graph replayed first would otherwise count in tickets never zeroed)
    from specgen.runtime import counters

    x, w = randn(16, 4096), randn(1024, 4096)
    want = F.linear(d(x), d(w))
    with runtime.override(strategy="two_stage:8"):
        generated.linear(x, w)  # compiled and tuned outside the capture
        kept = {key: id(value) for key, value in counters._counters.items()}
        graphs, outs = [torch.cuda.CUDAGraph() for _ in range(2)], []
        for graph in graphs:
            with torch.cuda.graph(graph):
                outs.append(generated.linear(x, w))
    assert {key: id(value) for key, value in counters._counters.items()} == kept
    for graph, out in zip(reversed(graphs), reversed(outs)):
        out.fill_(float("nan"))
        graph.replay()
        check(out, want, 4096)
    for graph, out in zip(graphs, outs):
        graph.replay()
        check(out, want, 4096)


def test_batched_tma_walks_batch_elements():
    # batch elements one stride apart: 3-D descriptors, and auto takes them from 64 rows on
    cases = [(randn(6, 256, 192), randn(6, 320, 192).mT),      # attention's q @ k.mT
             (randn(6, 192, 256).mT, randn(6, 192, 320)),      # A stored M-major
             (randn(2, 3, 128, 64), randn(2, 3, 64, 96))]      # two batch dims (matmul)
    for a, b in cases:
        op = generated.bmm if a.dim() == 3 else generated.matmul
        with runtime.record_launches() as log:
            check(op(a, b), torch.matmul(d(a), d(b)), a.shape[-1])
        assert [launch.kernel for launch in log] == ["tma"], (a.shape, a.stride())


@pytest.mark.big_memory
def test_batched_tma_int64_past_two_billion_elements():
    # A spans 520 * 2048 * 2048 > 2**31 elements: the epilogue's batch offsets need int64
    a, b = randn(520, 2048, 2048), randn(520, 2048, 64)
    with runtime.record_launches() as log:
        out = generated.bmm(a, b)
    assert [(launch.kernel, launch.index_bits) for launch in log] == [("tma", 64)]
    for i in (0, 519):
        check(out[i], d(a[i]) @ d(b[i]), 2048)
    del a, out


@pytest.mark.parametrize("strategy", ["direct", "two_stage:2", "atomic:2"])
def test_batch_over_grid_limit(strategy):
    # 70000 batch elements: grid axis 1 (or 2) holds 65535 programs, the rest are looped over
    a, b = randn(70000, 4, 40), randn(70000, 40, 4)
    with runtime.override(config=TINY, strategy=strategy):
        check(generated.bmm(a, b), d(a) @ d(b), 40)
        # broadcast over two batch dims that cannot be folded into M
        a4, b4 = randn(350, 1, 4, 40), randn(200, 40, 4)
        check(generated.matmul(a4, b4), torch.matmul(d(a4), d(b4)), 40)


def test_column_blocks_over_grid_limit():
    # swizzle2d puts column blocks on grid axis 1: 65537 of them are looped over
    n = 16 * 65537
    a, b = randn(1, 16, 16), randn(1, 16, n)
    with runtime.override(config=TINY, strategy="direct"):
        check(generated.bmm(a, b), d(a) @ d(b), 16)


@pytest.mark.big_memory
@pytest.mark.parametrize("strategy", ["direct", "tma"])
def test_int64_indexing_over_two_billion_elements(strategy):
    k, n = 4096, 64
    m = 2**31 // k + 3                              # x spans 2**31 + 3 * 4096 elements (4 GiB)
    x, w = randn(m, k), randn(n, k)
    with runtime.record_launches() as log, runtime.override(config=CONFIG, strategy=strategy):
        out = generated.linear(x, w)
    assert [(launch.kernel, launch.index_bits) for launch in log] == [(strategy, 64)]
    # the rows past element 2**31 are the ones an int32 offset would get wrong
    for rows in (slice(0, 64), slice(m - 64, m)):
        check(out[rows], d(x[rows]) @ d(w).t(), k)
    del x, out


def test_tf32_follows_torch_setting():
    a, b = randn(256, 1024, dtype=torch.float32), randn(1024, 192, dtype=torch.float32)
    want = d(a) @ d(b)
    saved = torch.backends.cuda.matmul.allow_tf32
    try:
        for allow, precision in ((False, "ieee"), (True, "tf32")):
            torch.backends.cuda.matmul.allow_tf32 = allow
            with runtime.record_launches() as log, runtime.override(config=CONFIG):
                out = generated.mm(a, b)
            assert log[-1].details["precision"] == precision
            check(out, want, 1024, tf32=allow)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved


def test_torch_compile_linear_gelu():
    x, w, bias = randn(4, 16, 128), randn(128, 128), randn(128)

    def fn(x, w, bias):
        return generated.linear_gelu(x, w, bias) * 2.0

    compiled = torch.compile(fn, fullgraph=True, dynamic=False)
    want = F.gelu(F.linear(d(x), d(w), d(bias)), approximate="tanh") * 2.0
    # 64 rows after folding, aligned: the TMA kernel, its descriptors built on the device inside
    # the compiled graph (triton's allocator gives them global memory)
    check(compiled(x, w, bias), want, 128)
    torch._dynamo.reset()   # the override is not among dynamo's guards
    with runtime.override(strategy="direct"):
        check(torch.compile(fn, fullgraph=True, dynamic=False)(x, w, bias), want, 128)
    # a decode-like call goes through both split-K stages inside the compiled graph
    x1, w1 = randn(16, 4096), randn(256, 4096)
    with runtime.override(strategy="two_stage:4", config=CONFIG):
        out = torch.compile(fn, fullgraph=True, dynamic=False)(x1, w1, None)
    check(out, F.gelu(F.linear(d(x1), d(w1)), approximate="tanh") * 2.0, 4096)


@pytest.mark.parametrize("op", ["int4_weight_linear", "int8_weight_linear"])
def test_torch_compile_of_a_decode_step_reads_words(op, monkeypatch):
    # M = 1 in bf16 takes the GEMV kernel in its word form (the launcher decides from the fake
    # B's offset while tracing): the compiled graph computes what eager does, bit for bit
    from specgen import quant
    from specgen.runtime import matmul as matmul_rt
    choices = []
    reads = matmul_rt.reads_words
    monkeypatch.setattr(matmul_rt, "reads_words",
                        lambda *args: choices.append(reads(*args)) or choices[-1])
    k, n = 4096, 1024
    w = torch.randn(n, k, device="cuda") * k ** -0.5
    x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
    if op == "int4_weight_linear":
        qweight, scales, zeros = quant.quantize_int4(w, 128)
        args = (qweight, scales.bfloat16(), zeros.bfloat16(), 128)
        expected = x.double() @ quant.dequantize_int4(qweight, scales.bfloat16().float(),
                                                      zeros.bfloat16().float(), 128).double().T
    else:
        qweight, scales = quant.quantize_int8(w)
        args = (qweight, scales.bfloat16())
        expected = x.double() @ quant.dequantize_int8(qweight, scales.bfloat16().float()).double().T
    function = getattr(generated, op)
    with runtime.override(strategy="gemv"):
        eager = function(x, *args)
        torch._dynamo.reset()
        compiled = torch.compile(lambda x: function(x, *args), fullgraph=True, dynamic=False)(x)
    assert torch.equal(compiled, eager)
    assert choices and all(choices), choices  # eager's call and the trace's
    error = ((eager.double() - expected).norm() / expected.norm()).item()
    assert error < 1e-2, error

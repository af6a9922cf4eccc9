"""Row-wise ops on a real GPU: bf16 at realistic sizes under every strategy, few very long rows,
many rows, a tensor past 2**31 elements (int64 indexing), and torch.compile through the ops."""

import gc
import math

import pytest
import torch
import torch.nn.functional as F

import generated
from specgen import runtime
from specgen.runtime import rowwise

pytestmark = pytest.mark.gpu

STRATEGIES = ["single", "looped", "online", "split"]


def close(actual, expected, dtype=torch.bfloat16):
    """Against a float64 result: one bf16 rounding (2**-8 relative) plus float32 sums."""
    tolerance = {torch.bfloat16: (1.6e-2, 1e-3), torch.float16: (2e-3, 1e-4),
                 torch.float32: (1e-4, 1e-5)}[dtype]
    torch.testing.assert_close(actual.double(), expected.double(), rtol=tolerance[0],
                               atol=tolerance[1], equal_nan=True)


def ops(x, weight, bias, residual):
    """(name, specgen call, float64 reference) for every row-wise op, over the last dim."""
    n = x.shape[-1]
    x64, w64, b64, r64 = x.double(), weight.double(), bias.double(), residual.double()
    return [
        ("softmax", lambda: generated.softmax(x, -1), lambda: torch.softmax(x64, -1)),
        ("log_softmax", lambda: generated.log_softmax(x, -1), lambda: torch.log_softmax(x64, -1)),
        ("logsumexp", lambda: generated.logsumexp(x, -1), lambda: torch.logsumexp(x64, -1)),
        ("layer_norm", lambda: generated.layer_norm(x, [n], weight, bias),
         lambda: F.layer_norm(x64, [n], w64, b64)),
        ("rms_norm", lambda: generated.rms_norm(x, [n], weight),
         lambda: F.rms_norm(x64, [n], w64, torch.finfo(torch.bfloat16).eps)),
        ("add_rms_norm", lambda: generated.add_rms_norm(x, residual, weight)[1],
         lambda: F.rms_norm(x64 + r64, [n], w64, 1e-6)),
    ]


# auto at the benchmark shapes and a row of 2**20; every forced strategy at two shapes (forced
# runs autotune their own kernels, about a second each, so the grid is kept small)
CASES = [("auto", shape) for shape in [(4096, 4096), (32768, 1024), (1024, 32768), (8, 262144),
                                        (3, 1 << 20)]]
CASES += [(strategy, shape) for strategy in STRATEGIES for shape in [(64, 20000), (8, 262144)]
          if not (strategy == "single" and shape[1] > 1 << 16)]


@pytest.mark.parametrize("strategy, shape", CASES)
def test_bf16_every_strategy(strategy, shape):
    torch.manual_seed(0)
    x = torch.randn(shape, device="cuda", dtype=torch.bfloat16) * 3
    residual = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    weight = torch.randn(shape[1], device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(shape[1], device="cuda", dtype=torch.bfloat16)
    x[0, : shape[1] // 3] = -math.inf       # a partial -inf row
    for name, call, reference in ops(x, weight, bias, residual):
        if strategy == "online" and name not in ("softmax", "log_softmax", "logsumexp"):
            continue
        with runtime.override(strategy=None if strategy == "auto" else strategy):
            with runtime.record_launches() as launches:
                actual = call()
        if strategy != "auto":
            assert {launch.kernel for launch in launches} == {strategy}
            # and the kernels started are that strategy's (split: its stages and output pass)
            started = {k for launch in launches for k in launch.kernels}
            assert started and all(f"_{strategy}" in k for k in started), started
        if name in ("layer_norm", "rms_norm", "add_rms_norm"):
            # the -inf row is NaN in torch too; compare the others
            actual, expected = actual[1:], reference()[1:]
        else:
            expected = reference()
        close(actual, expected)


def test_auto_picks_split_for_few_long_rows():
    x = torch.randn(8, 262144, device="cuda", dtype=torch.bfloat16)
    with runtime.record_launches() as launches:
        generated.layer_norm(x, [262144])
        generated.softmax(x)
    assert [launch.kernel for launch in launches] == ["split", "split"]


def test_transposed_and_sliced_bf16():
    base = torch.randn(3000, 4096, device="cuda", dtype=torch.bfloat16)
    x = base.t()[::2]                       # (2048, 3000), the reduced dim strided by 4096
    for strategy in STRATEGIES:
        with runtime.override(strategy=strategy):
            close(generated.softmax(x, 1), torch.softmax(x.double(), 1))
            close(generated.log_softmax(x, 0), torch.log_softmax(x.double(), 0))
    w = torch.randn(3000, device="cuda", dtype=torch.bfloat16)
    close(generated.rms_norm(x, 3000, w), F.rms_norm(x.double(), [3000], w.double(), 2**-7))


@pytest.mark.parametrize("shape, dim", [((4096, 8192), 0), ((4096, 8191), 0), ((8, 1000, 1030), 1),
                                        ((300, 4096), 0)])
def test_strided_rows_bf16(shape, dim):
    # the reduced dim strided, the kept one contiguous: tiles of many rows a program (whole,
    # ragged and split over two row dims), under auto and every strategy, and the backward
    from specgen.runtime.launch import multiprocessors
    torch.manual_seed(0)
    x = (torch.randn(shape, device="cuda", dtype=torch.bfloat16) * 3).requires_grad_()
    grad_y = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    x64 = x.detach().double().requires_grad_()
    for ours, theirs in ((generated.softmax, torch.softmax),
                         (generated.log_softmax, torch.log_softmax)):
        want = theirs(x64, dim)
        want_grad, = torch.autograd.grad(want, x64, grad_y.double())
        for strategy in (None, "single", "looped", "online"):
            with runtime.override(strategy=strategy, poison=True), \
                    runtime.record_launches() as launches:
                y = ours(x, dim)
                grad, = torch.autograd.grad(y, x, grad_y)
            for launch in launches:
                assert launch.details["tile"] == rowwise.kept_config(
                    launch.details["rows"], launch.details["n"], launch.kernel,
                    multiprocessors(x.device)), launch
            close(y, want)
            # a gradient rounded to bf16 is off by its ulp, relative to the row's largest
            scale = want_grad.abs().amax(dim, keepdim=True)
            close(grad / scale, want_grad / scale)


def test_many_rows_past_grid_limits():
    rows = (1 << 24) + 3
    x = torch.randn(rows, 4, device="cuda", dtype=torch.bfloat16)
    close(generated.softmax(x, -1), torch.softmax(x.float(), -1))
    with runtime.override(launch="persistent"):
        close(generated.layer_norm(x, [4]), F.layer_norm(x.float(), [4]))
    close(generated.logsumexp(x, 1), torch.logsumexp(x.float(), 1))


@pytest.mark.big_memory
def test_int64_indexing_past_2_31_elements():
    rows, n = (1 << 16) + 1, 1 << 15           # 2**31 + 2**15 elements, 4 GiB in bf16
    x = torch.randn(rows, n, device="cuda", dtype=torch.bfloat16)
    with runtime.record_launches() as launches:
        out = generated.softmax(x, -1)
    # auto reads rows of 32768 looped (rowwise.LOOPED_MAX); online is checked forced
    assert [(launch.kernel, launch.index_bits) for launch in launches] == [("looped", 64)]
    close(out[-3:], torch.softmax(x[-3:].double(), -1))
    close(out[:2], torch.softmax(x[:2].double(), -1))
    del out
    with runtime.override(strategy="online"), runtime.record_launches() as launches:
        out = generated.softmax(x, -1)
    assert [(launch.kernel, launch.index_bits) for launch in launches] == [("online", 64)]
    close(out[-3:], torch.softmax(x[-3:].double(), -1))
    del out
    with runtime.override(strategy="single"):
        out = generated.rms_norm(x, [n])
    close(out[-3:], F.rms_norm(x[-3:].double(), [n], None, 2**-7))
    del x, out
    gc.collect()
    torch.cuda.empty_cache()


def test_int32_is_kept_below_the_limit():
    x = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    with runtime.record_launches() as launches:
        generated.softmax(x)
    assert [launch.index_bits for launch in launches] == [32]


def _tuned_graph(rows, n, few_n, m, k, n_out):
    """A graph of autotuned launches: a looped and a split row kernel, the reduce kernel and the
    matmul; its inputs (sizes picked per test, so that no other test has tuned these launches)."""
    many = torch.randn(rows, n, device="cuda", dtype=torch.bfloat16)    # looped
    few = torch.randn(8, few_n, device="cuda", dtype=torch.bfloat16)    # split
    w_many = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n_out, device="cuda", dtype=torch.bfloat16)

    def graph(many, few, a, b):
        return (generated.rms_norm(many, [n], w_many), generated.layer_norm(few, [few_n]),
                generated.sum(many, -1), generated.mm(a, b))

    return graph, (many, few, a, b)


def _assert_equal(outputs, expected):
    for index, (got, want) in enumerate(zip(outputs, expected)):
        assert torch.equal(got, want), f"output {index}: {int((got != want).sum())} differ"


def test_compiled_graphs_run_the_configs_eager_tuning_chose():
    # autotuned kernels traced after eager calls of the same launches run those calls' configs
    # (the frozen table's or the heuristic's), so the compiled results are the eager ones bit for
    # bit (Inductor's own tuning picks others: other summation orders)
    torch._dynamo.reset()
    graph, inputs = _tuned_graph(256, 20000, 65536, 512, 384, 640)
    eager = graph(*inputs)
    _assert_equal(torch.compile(graph, fullgraph=True)(*inputs), eager)


def test_compile_only_launches_are_tuned_on_stand_ins(monkeypatch):
    # the same kernels compiled before any eager call, autotuning asked for: each autotuned launch
    # is tuned at trace time on real stand-in tensors, by our tuner (not Inductor's), and eager
    # calls after it find that config, so they compute the compiled results bit for bit
    monkeypatch.setenv("SPECGEN_AUTOTUNE", "1")
    from specgen.runtime.launch import _tuned as tuned
    torch._dynamo.reset()
    graph, inputs = _tuned_graph(192, 24000, 98304, 448, 320, 576)
    before = set(tuned)
    compiled = torch.compile(graph, fullgraph=True)(*inputs)
    kernels = {key[0].fn.__name__ for key in set(tuned) - before}
    assert {"_rms_norm_looped_kernel", "_layer_norm_split0_kernel", "_sum_kernel"} <= kernels, kernels
    assert any(name.startswith("_mm") for name in kernels), kernels
    _assert_equal(compiled, graph(*inputs))


def test_torch_compile_sees_through_the_ops():
    x = torch.randn(512, 3000, device="cuda", dtype=torch.bfloat16)
    residual = torch.randn(512, 3000, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(3000, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(3000, device="cuda", dtype=torch.bfloat16)

    def block(x):
        # every op once (Inductor re-emits each kernel with the helpers it calls by name), each
        # on the graph's input or on an exact Inductor result (x * 2)
        doubled = x * 2
        hidden, normed = generated.add_rms_norm(doubled, residual, w)
        return {
            "layer_norm": generated.layer_norm(doubled, [3000], w, b),
            "hidden": hidden, "normed": normed,
            "softmax": generated.softmax(doubled, -1),
            "rms_norm": generated.rms_norm(x, [3000], w),
            "log_softmax dim 0": generated.log_softmax(doubled, 0),
            "logsumexp": generated.logsumexp(x, [1]),
            "logsumexp keepdim": generated.logsumexp(x, [1], keepdim=True),
            "softmax dtype float32": generated.softmax(x, -1, dtype=torch.float32),
            "log_softmax dtype bfloat16": generated.log_softmax(x.float(), -1,
                                                                dtype=torch.bfloat16),
        }

    compiled = torch.compile(block, fullgraph=True)(x)
    for name, expected in block(x).items():
        # the same single-tile kernels (rows of 3000 and 512: no autotuning), and float scalars
        # as float32 in both (Inductor passes eps as float64; the kernels cast it): bit for bit
        assert torch.equal(compiled[name], expected), (
            f"{name}: {int((compiled[name] != expected).sum())} elements differ")
    # the split strategy (several kernels and a workspace) under compile as well
    long = torch.randn(4, 65536, device="cuda", dtype=torch.bfloat16)
    compiled_long = torch.compile(lambda t: generated.layer_norm(t, [65536]), fullgraph=True)
    torch.testing.assert_close(compiled_long(long), generated.layer_norm(long, [65536]))

"""GPU tier of the reduce and cross_entropy families: tensors past 2**31 elements (int64
specialization observed), bfloat16 at vocabulary scale, every strategy compiled, torch.compile.

Memory stays under ~40 GB and each test frees what it allocated.
"""

import gc

import pytest
import torch
import torch.nn.functional as F

import generated
from specgen import runtime

pytestmark = pytest.mark.gpu

BIG_ROWS, BIG_VOCAB = 32768, 131072   # 2**32 logits: row * vocab passes int32


@pytest.fixture(autouse=True)
def _free_memory():
    yield
    gc.collect()
    torch.cuda.empty_cache()


@pytest.mark.big_memory
def test_cross_entropy_past_int32_matches_torch_and_runs_int64():
    torch.manual_seed(0)
    logits = torch.randn(BIG_ROWS, BIG_VOCAB, device="cuda", dtype=torch.bfloat16)  # 8 GiB
    target = torch.randint(0, BIG_VOCAB, (BIG_ROWS,), device="cuda")
    target[::7] = -100
    logits.requires_grad_()
    with runtime.record_launches() as log:
        loss = generated.cross_entropy(logits, target)
        loss.backward()
    assert {(l.kernel, l.index_bits) for l in log} >= {("forward", 64), ("backward", 64)}, log

    # reference in float32, a slice of rows at a time (a float32 copy of all of it is 16 GiB)
    with torch.no_grad():
        total, lse = 0.0, []
        for start in range(0, BIG_ROWS, 4096):
            chunk = logits[start:start + 4096].float()
            total += F.cross_entropy(chunk, target[start:start + 4096], reduction="sum").double()
            lse.append(torch.logsumexp(chunk, dim=1))
        valid = (target != -100).sum()
        expected = total / valid
        torch.testing.assert_close(loss.double(), expected, rtol=1e-2, atol=1e-3)  # bf16 loss

        lse = torch.cat(lse)
        rows = torch.randint(0, BIG_ROWS, (16,), device="cuda").tolist() + [BIG_ROWS - 1]
        for row in rows:
            x = logits[row].double()
            want = torch.exp(x - lse[row].double())
            if target[row] != -100:
                want[target[row]] -= 1.0
            else:
                want.zero_()
            # compared times the row count: the gradients themselves are ~1e-10
            torch.testing.assert_close(logits.grad[row].double() * valid, want, rtol=2e-2,
                                       atol=1e-8)


@pytest.mark.big_memory
def test_sum_past_int32_is_exact_on_integers():
    # integer values: float32 partial sums stay exact, so float64 torch.sum is the exact answer
    n = 2**31 + 4099
    x = torch.randint(-4, 5, (n,), device="cuda", dtype=torch.int8).to(torch.float32)  # 8 GiB
    expected = torch.sum(x, dtype=torch.float64)
    for strategy in (None, "atomic"):
        with runtime.record_launches() as log, runtime.override(strategy=strategy):
            result = generated.sum(x)
        assert result.double() == expected, (strategy, result.item(), expected.item())
        assert all(l.index_bits == 64 for l in log)
    # the same elements as 2**16 + 64 rows: a column sum (split) and row sums (inner)
    rows = x[: (n // 32768) * 32768].view(-1, 32768)
    torch.testing.assert_close(generated.sum(rows, 0).double(), torch.sum(rows, 0, dtype=torch.float64),
                               rtol=0, atol=0)
    torch.testing.assert_close(generated.sum(rows, 1).double(), torch.sum(rows, 1, dtype=torch.float64),
                               rtol=0, atol=0)


def test_one_launch_splits_on_two_streams_at_once():
    # the one-launch split ("last") keeps ticket counters between calls, one set per stream: sums
    # queued on two streams run at the same time and must not take each other's tickets
    torch.manual_seed(0)
    xs = [torch.randn(1 << 16, 256, device="cuda") for _ in range(2)]
    expected = [torch.sum(x.double(), 0) for x in xs]
    streams = [torch.cuda.Stream() for _ in xs]
    outs = [[], []]
    with runtime.override(strategy="last"):
        generated.sum(xs[0], 0)  # tunes before the streams are used
        for stream in streams:
            stream.wait_stream(torch.cuda.current_stream())
        for _ in range(50):
            for i, stream in enumerate(streams):
                with torch.cuda.stream(stream):
                    outs[i].append(generated.sum(xs[i], 0))
    torch.cuda.synchronize()
    for out, want in zip(outs, expected):
        for result in out:
            torch.testing.assert_close(result.double(), want, rtol=1e-5, atol=1e-3)


@pytest.mark.parametrize("strategy", [None, "inner", "outer", "split", "atomic"])
@pytest.mark.parametrize("shape, dim", [((4096, 1000), -1), ((4096, 1000), 0), ((8, 3, 50000), (0, 2))])
def test_strategies_in_bfloat16(strategy, shape, dim):
    x = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    with runtime.override(strategy=strategy):
        torch.testing.assert_close(generated.mean(x, dim).float(),
                                   torch.mean(x.double(), dim).float(), rtol=1.6e-2, atol=1e-2)
        if strategy in (None, "split"):  # each new size autotunes: keep the count down
            torch.testing.assert_close(generated.amax(x, dim), torch.amax(x, () if dim is None else dim))
            if isinstance(dim, int) or dim is None:
                assert torch.equal(generated.argmin(x, dim), torch.argmin(x, dim))


def test_nan_and_ties_compiled():
    x = torch.randn(300, 5000, device="cuda")
    x[7, 123] = float("nan")
    x[9, 10] = x[9, 4000] = 100.0
    assert torch.isnan(generated.amax(x, 1)[7]) and torch.isnan(generated.amin(x, 1)[7])
    assert generated.argmax(x, 1)[7] == 123 and generated.argmax(x, 1)[9] == 10
    assert torch.equal(generated.argmax(x, 1), torch.argmax(x, 1))


def test_under_torch_compile():
    x = torch.randn(64, 1000, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    target = torch.randint(0, 1000, (64,), device="cuda")

    def step(x, target):
        # sum has no backward, so it reads a detached x: the graph still holds both ops
        return generated.cross_entropy(x, target, label_smoothing=0.1) + generated.sum(x.detach()).float() * 0

    loss = torch.compile(step, fullgraph=False)(x, target)
    loss.backward()
    ref_x = x.detach().float().requires_grad_()
    ref = F.cross_entropy(ref_x, target, label_smoothing=0.1)
    ref.backward()
    torch.testing.assert_close(loss.float(), ref, rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(x.grad.float(), ref_x.grad, rtol=2e-2, atol=1e-4)


@pytest.mark.parametrize("name", ["sum", "mean", "prod", "amax", "amin", "argmax", "argmin"])
@pytest.mark.parametrize("strategy", [None, "split", "last"])
def test_reductions_compile_fullgraph(name, strategy):
    # Inductor re-emits each kernel with the reduce_lib helpers it calls by name: a helper
    # reached through a module attribute would fail here (NameError), not in eager
    torch._dynamo.reset()
    x = 1.0 + 0.01 * torch.randn(33, 1000, device="cuda")  # prod stays finite
    function, reference = getattr(generated, name), getattr(torch, name)
    # sum, mean and prod take dtype= too (ScalarType? in the registered op): a cast down and up
    casts = name in ("sum", "mean", "prod")

    def graph(t):
        if not casts:
            return (function(t, 1),)
        return (function(t, 1), function(t, 1, dtype=torch.bfloat16),
                function(t.half(), 1, dtype=torch.float32))

    with runtime.override(strategy=strategy):
        results = torch.compile(graph, fullgraph=True)(x)
    want = reference(x.double(), 1)
    if name.startswith("arg"):
        assert torch.equal(results[0], want)
        return
    torch.testing.assert_close(results[0].double(), want, rtol=1e-4, atol=1e-5)
    if casts:
        narrow, wide = results[1:]
        assert (narrow.dtype, wide.dtype) == (torch.bfloat16, torch.float32)
        torch.testing.assert_close(narrow.double(), reference(x.bfloat16().double(), 1),
                                   rtol=8e-3, atol=1e-5)
        torch.testing.assert_close(wide.double(), reference(x.half().double(), 1), rtol=1e-4,
                                   atol=1e-5)


def test_sum_atomic_compiled_full_reduction():
    torch._dynamo.reset()
    x = torch.randn(1 << 20, device="cuda")
    with runtime.override(strategy="atomic"):
        result = torch.compile(lambda t: generated.sum(t), fullgraph=True)(x)
    torch.testing.assert_close(result.double(), x.double().sum(), rtol=1e-4, atol=1e-3)


def test_cross_entropy_bad_target_raises_when_validating_and_is_nan_otherwise():
    logits = torch.randn(64, 1000, device="cuda", dtype=torch.bfloat16)
    target = torch.randint(0, 1000, (64,), device="cuda")
    target[5] = 1000
    # validating mode: the eager call reads the check kernel's verdict (through pinned memory)
    with runtime.validating(), pytest.raises(ValueError, match=r"target\[5\] is 1000"):
        generated.cross_entropy(logits, target)
    # by default nothing is read back: the loss says it, eager and compiled (a compiled graph
    # never syncs to read the flag, validating or not)
    assert torch.isnan(generated.cross_entropy(logits, target))
    torch._dynamo.reset()
    with runtime.validating():
        loss = torch.compile(lambda l, t: generated.cross_entropy(l, t), fullgraph=True)(logits,
                                                                                        target)
    assert torch.isnan(loss)

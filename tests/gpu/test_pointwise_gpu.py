"""GPU tier, pointwise: the index specializations at real sizes, and torch.compile integration."""

import gc
import importlib

import pytest
import torch

import generated
from specgen import runtime
from specgen.runtime.launch import _tuned as tuned_configs

pytestmark = pytest.mark.gpu

BEYOND_INT32 = 2**31 + 2**20  # elements: more than int32 offsets can reach


@pytest.fixture(autouse=True)
def free_memory():
    yield
    gc.collect()
    torch.cuda.empty_cache()


def test_small_input_runs_int32_specialization():
    x, y = torch.randn(2, 1000, 1000, device="cuda").unbind(0)
    with runtime.record_launches() as log:
        out = generated.add(x, y)
        generated.add(x.t(), y)
    assert [launch.index_bits for launch in log] == [32, 32]
    torch.testing.assert_close(out, x + y)


@pytest.mark.big_memory
def test_dense_beyond_int32_runs_int64_and_is_exact():
    x = torch.randn(BEYOND_INT32, device="cuda", dtype=torch.bfloat16)
    y = torch.randn(BEYOND_INT32, device="cuda", dtype=torch.bfloat16)
    with runtime.record_launches() as log:
        out = generated.add(x, y)
    assert [(launch.kernel, launch.index_bits) for launch in log] == [("dense", 64)]
    # float32 math rounded once to bfloat16 is exactly what torch's bfloat16 add does
    assert torch.equal(out, x + y), "mismatch somewhere past (or before) element 2**31"


@pytest.mark.big_memory
def test_tiled_beyond_int32_runs_int64_and_is_exact():
    rows, cols = 65600, 32768  # 2,149,580,800 elements
    x = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(cols, device="cuda", dtype=torch.bfloat16)
    with runtime.record_launches() as log:
        out = generated.add(x, bias)
    assert [(launch.kernel, launch.index_bits) for launch in log] == [("tiled", 64)]
    assert torch.equal(out, x + bias)
    del out
    x.resize_(0)
    # the last rows again, through a transposed view: offsets cross 2**31 in the other order
    tail = torch.randn(cols, 2048, device="cuda", dtype=torch.bfloat16).t()
    torch.testing.assert_close(generated.add(tail, bias), tail + bias)


@pytest.mark.parametrize("dense", [True, False])
def test_out_that_is_an_input_is_exact_on_a_first_launch(dense, monkeypatch):
    # where autotuning is asked for, a first launch times each config on the launch's tensors;
    # with out=x every trial would add y to x again, so such a launch tunes on stand-ins instead
    monkeypatch.setenv("SPECGEN_AUTOTUNE", "1")
    add = importlib.import_module("generated.add")
    for kernel in (add._add_dense_kernel, add._add_tiled_kernel):  # forget earlier tests' tuning
        kernel.cache.clear()
        for key in [key for key in tuned_configs if key[0] is kernel]:
            del tuned_configs[key]
    x, y = torch.randn(2, 300, 301, device="cuda").unbind(0)
    if not dense:
        x, y = x[:, :300], y[:, :300]
    expected = x + y
    with runtime.record_launches() as log:
        assert generated.add(x, y, out=x) is x
    assert [entry.kernel for entry in log] == ["dense" if dense else "tiled"]
    assert torch.equal(x, expected)


def test_torch_compile_two_ops_no_graph_break():
    def f(a, b):
        return generated.gelu(generated.add(a, b), approximate="tanh") * 2

    a = torch.randn(333, 517, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(517, device="cuda", dtype=torch.bfloat16)
    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True, dynamic=False)  # fullgraph: a graph break raises
    torch.testing.assert_close(compiled(a, b), f(a, b))
    torch.testing.assert_close(compiled(a.t().contiguous().t(), b), f(a, b))


def test_torch_compile_a_python_number_for_a_tensor():
    # the number becomes a 0-dim tensor inside the traced function (pointwise.wrapped_numbers)
    a = torch.randn(333, 517, device="cuda", dtype=torch.bfloat16)
    torch._dynamo.reset()
    compiled = torch.compile(lambda a: generated.mul(generated.add(a, 2.5), 3), fullgraph=True)
    got = compiled(a)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got, (a + 2.5) * 3)


def test_torch_compile_out():
    # the registered out= op in a compiled graph: its autograd kernel (registry._refuse_grad)
    # runs it below autograd, and refuses an input that requires grad as eager does
    a = torch.randn(64, 96, device="cuda")
    b = torch.randn(96, device="cuda")
    expected = a.double() + b.double()
    out = torch.full((96, 64), float("nan"), device="cuda").t()
    torch._dynamo.reset()
    public = torch.compile(lambda a, b, out: generated.add(a, b, out=out), fullgraph=True)
    assert public(a, b, out).data_ptr() == out.data_ptr()
    torch.testing.assert_close(out.double(), expected)
    direct = torch.compile(lambda a, b, out: torch.ops.specgen.add_out(out, a, b), fullgraph=True)
    out.fill_(float("nan"))
    direct(a, b, out)
    torch.testing.assert_close(out.double(), expected)
    with pytest.raises(Exception, match="requires grad, but a call with out= is not differentiable"):
        direct(a.requires_grad_(), b, out)

"""Ops traced with symbolic sizes, as torch.compile traces them with dynamic shapes (which it also
picks by itself when a compiled function meets a second shape).

Planning must not hash a symbol. A launch's integer constexprs (block sizes, warps, alignments)
must be plain numbers: Inductor prints a launch's constexprs and configs into Python source, and
torch 2.11's printer cannot write the bitwise expression a power of two of a symbol is. Its flags
may stay expressions of the sizes, which Inductor must print as Python that computes them.

The interpreter cannot run on fake tensors, so the launches are recorded instead of run. Hand
cases pick the strategies whose planning reads sizes (the GPU tier compiles and runs them:
tests/gpu/test_dynamic_gpu.py); a property test traces every registered op on the property
suite's cases.
"""

import importlib
import inspect
import math
from unittest import mock

import pytest
import torch
import triton
from hypothesis import given, note, settings
from hypothesis import strategies as st
from torch._inductor.codegen.wrapper import pexpr
from torch.fx.experimental.proxy_tensor import make_fx

import generated
from specgen import runtime, testing
from specgen.testing import device

# the module (``specgen.runtime.launch`` is also the name of its function)
launch = importlib.import_module("specgen.runtime.launch")


def _target(logits):
    return torch.arange(logits.shape[0], device=logits.device) % logits.shape[1]


# (op, its input's shape): every family, and the row-wise and reduce strategies whose planning
# reads sizes (masks, loops, splits, the matmul's config pruning)
CASES = {
    "add": (lambda x: generated.add(x, x), (37, 300)),
    "softmax": (lambda x: generated.softmax(x, -1), (37, 300)),
    "layer_norm, looped": (lambda x: generated.layer_norm(x, [x.shape[-1]]), (64, 20000)),
    "rms_norm, split": (lambda x: generated.rms_norm(x, [x.shape[-1]]), (4, 200000)),
    "sum over rows": (lambda x: generated.sum(x, 0), (3000, 64)),
    "argmax": (lambda x: generated.argmax(x, 1), (37, 300)),
    "mm": (lambda a: generated.mm(a, a.t()), (128, 64)),
    "cross_entropy": (lambda x: generated.cross_entropy(x, _target(x)), (37, 300)),
    "cross_entropy, backward": (lambda x: _logits_grad(x), (37, 300)),
}


def _logits_grad(x):
    """The gradient of cross_entropy: its backward launches traced too."""
    logits = x.detach().requires_grad_()
    return torch.autograd.grad(generated.cross_entropy(logits, _target(logits)), logits)[0]


class _Recorder:
    """Stands in for ``wrap_triton``: keeps each launch's kernel and arguments, runs nothing."""

    def __init__(self):
        self.launches = []

    def __call__(self, kernel):
        return _Launcher(self.launches, kernel)


class _Launcher:
    def __init__(self, launches, kernel):
        self.launches, self.kernel = launches, kernel

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.launches.append((self.kernel, args, kwargs))


def _jit(kernel):
    """The jitted function of a kernel, autotuned or not."""
    return kernel.fn if isinstance(kernel, triton.runtime.Autotuner) else kernel


def _constexprs(kernel, args, kwargs):
    """The constexpr arguments of one launch, with each config an autotuned kernel could run."""
    tuned = isinstance(kernel, triton.runtime.Autotuner)
    jit = _jit(kernel)
    named = {**dict(zip(jit.arg_names, args)), **kwargs}
    # the Python function's annotations, as Triton reads them (the interpreter's stand-in for a
    # JITFunction keeps no parsed parameters)
    params = inspect.signature(jit.fn).parameters.values()
    given = {p.name: named[p.name] for p in params
             if "constexpr" in str(p.annotation) and p.name in named}
    if not tuned:
        return [given]
    return [{**given, **c.kwargs, "num_warps": c.num_warps, "num_stages": c.num_stages}
            for c in launch.pruned_configs(kernel, args, kwargs)]


@pytest.mark.parametrize("case", sorted(CASES))
def test_symbolic_sizes_plan_plain_constexprs(case):
    fn, shape = CASES[case]
    graph, launches = _trace_symbolic(fn, torch.randn(*shape, device=device()))
    (x,) = [n.meta["val"] for n in graph.graph.nodes if n.op == "placeholder"]
    assert all(isinstance(size, torch.SymInt) for size in x.shape), "the trace kept sizes plain"
    assert launches, "the traced op launched nothing"
    if case.endswith("backward"):
        assert any("backward" in _jit(kernel).fn.__name__ for kernel, _, _ in launches)
    _check_constexprs(launches)


def _reused_for(fn, *inputs):
    """Whether the graph traced for ``inputs`` (symbolic sizes) is reused for other sizes: a
    function of one size per input dim, in order, true where every guard holds."""
    graph, _ = _trace_symbolic(fn, *inputs)
    sizes = [size for n in graph.graph.nodes if n.op == "placeholder" for size in n.meta["val"].shape]
    guards = sizes[0].node.shape_env.guards
    symbols = [size.node.expr for size in sizes]
    return lambda *values: all(bool(g.expr.subs(dict(zip(symbols, values)))) for g in guards)


def test_a_graph_is_planned_for_its_sizes_power_of_two_bucket():
    # the guards a traced softmax takes hold for any shape whose row length rounds up to the same
    # power of two (its graph is reused) and fail for one that leaves it (a recompile); the row
    # count only has to stay at least a tile's rows (2 rows of 512)
    reused_for = _reused_for(lambda x: generated.softmax(x, -1), torch.randn(37, 300, device=device()))
    assert reused_for(53, 410) and reused_for(33, 257) and reused_for(65, 300)
    assert reused_for(100_000, 300)
    assert not reused_for(20, 1000) and not reused_for(37, 256)


def test_row_counts_and_operand_sizes_do_not_recompile():
    # a layer_norm of 4096-wide rows holds one row a program whatever the row count; a linear's
    # int64 choice stays an expression of the sizes (picking the largest operand first compared
    # M * K with N * K: a recompile when M passed N, here 5 -> 7 rows against N = 6, both in
    # the bucket of 8 that the split-K choice guards)
    norm = _reused_for(lambda x: generated.layer_norm(x, [x.shape[-1]]),
                       torch.randn(300, 4096, device=device()))
    assert all(norm(rows, 4096) for rows in (257, 512, 513, 66_000, 10**6))
    linear = _reused_for(lambda x, w: generated.linear(x, w), torch.randn(5, 8, device=device()),
                         torch.randn(6, 8, device=device()))
    assert linear(7, 8, 6, 8) and linear(8, 8, 6, 8)


# torch.compile makes an int argument symbolic once a compiled function meets a second value
# (automatic dynamic): scalars that are sizes' expressions stand in for those here. A kernel
# argument stays a symbol, a dim is specialized (the kernels need to know their dims).
SYMBOLIC_SCALARS = {
    "cross_entropy, ignore_index": (
        lambda x: generated.cross_entropy(x, _target(x), ignore_index=x.shape[0] - 40), (37, 300)),
    "softmax, dim": (lambda x: generated.softmax(x, x.shape[0] - 38), (37, 300)),
    "logsumexp, dims": (lambda x: generated.logsumexp(x, [x.shape[0] - 38]), (37, 300)),
    "sum, dim": (lambda x: generated.sum(x, x.shape[0] - 38), (37, 300)),
    "layer_norm, eps": (lambda x: generated.layer_norm(x, [x.shape[-1]], eps=x.shape[0] * 1e-7),
                        (37, 300)),
}


@pytest.mark.parametrize("case", sorted(SYMBOLIC_SCALARS))
def test_symbolic_scalars_are_taken(case):
    fn, shape = SYMBOLIC_SCALARS[case]
    graph, launches = _trace_symbolic(fn, torch.randn(*shape, device=device()))
    assert launches, "the traced op launched nothing"
    _check_constexprs(launches)


@pytest.mark.parametrize("name", sorted(generated.REGISTRY))
@settings(max_examples=8)
@given(data=st.data())
def test_every_op_traces_with_symbolic_sizes(name, data):
    # the property suite's cases (layouts, dtypes, scalars, forced strategies and configs), with
    # every tensor argument traced symbolically (sizes 0 and 1 stay plain, as torch.compile's do)
    info = generated.REGISTRY[name]
    case = data.draw(testing.CASES[info.family](info))
    note(case.describe)
    tensors = {k: v for k, v in case.args.items() if isinstance(v, torch.Tensor)}
    if case.outs:  # out= tensors too, where the op takes them
        tensors["out"] = case.outs if len(case.outs) > 1 else case.outs[0]

    def call(*values):
        return info.function(**{**case.args, **dict(zip(tensors, values))})

    with runtime.override(**case.overrides):
        _, launches = _trace_symbolic(call, *tensors.values())
    _check_constexprs(launches)


def _trace_symbolic(fn, *inputs):
    """``fn`` traced with symbolic sizes, and the launches it made, recorded instead of run."""
    recorder = _Recorder()
    with mock.patch.object(launch, "wrap_triton", recorder):
        graph = make_fx(fn, tracing_mode="symbolic")(*inputs)
    return graph, recorder.launches


def _check_constexprs(launches):
    for kernel, args, kwargs in launches:
        kernel_name = _jit(kernel).fn.__name__
        for constexprs in _constexprs(kernel, args, kwargs):
            for name, value in constexprs.items():
                # tile sizes, warps and alignments are planned for the size's bucket (guards);
                # a flag (int64 indexing, even K) may stay an expression of the sizes
                assert not isinstance(value, (torch.SymInt, torch.SymFloat)), (kernel_name, name)
                if isinstance(value, torch.SymBool):
                    assert _printed_value(value) == value.node.hint, (kernel_name, name)


def _printed_value(value):
    """What Inductor's wrapper code computes for a symbolic launch argument: the expression as its
    Python printer writes it, run with each size's value (a size expression Inductor cannot write
    in Python, a bitwise one among them, fails here as it would in the compiled graph)."""
    env = value.node.shape_env
    # newer torch calls the hints backed_var_to_val (var_to_val still answers, with a warning)
    hints = getattr(env, "backed_var_to_val", None) or env.var_to_val
    sizes = {str(symbol): hint for symbol, hint in hints.items()}
    return eval(pexpr(value.node.expr), {"math": math, **sizes})

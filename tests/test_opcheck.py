"""torch.library.opcheck on every registered operator (torch.ops.specgen.*, out= variants and
cross_entropy_backward included): schema mutation annotations, autograd registration, the fake
kernel's metadata against the real op's, and AOTAutograd with dynamic shapes (outputs and
gradients of the traced graph against eager).

CPU tier: Triton's interpreter runs kernels on real data, and torch's ``wrap_triton`` hands it
back the interpreted kernel itself, which then fails on fake tensors. So there a launch whose
tensors are fake launches nothing (the op's fake kernel is still its triton_op function, run to
the end: planning, allocation, checks), and AOTAutograd keeps each op as an opaque custom op
(``decompose_custom_triton_ops = False``, as torch.export does) so that the traced graph calls the
real op. The GPU tier runs opcheck as torch.compile uses the ops: decomposed into Triton HOPs.
"""

import importlib

import pytest
import torch

import generated  # registers torch.ops.specgen.*
from specgen import runtime
from specgen.families import FAMILIES
from specgen.testing import device
from specgen.testing.samples import Make

launch = importlib.import_module("specgen.runtime.launch")

UTILS = ("test_schema", "test_autograd_registration", "test_faketensor",
         "test_aot_dispatch_dynamic")


def _family_samples(dev):
    """Per operator: the samples its op's family draws (``Family.samples``), for every op in
    ``generated.REGISTRY``: what a new op or family gets with no edit here."""
    make = Make(dev)
    found = {}
    for info in generated.REGISTRY.values():
        for name, calls in FAMILIES[info.family].samples(info, make).items():
            found.setdefault(name, []).extend(calls)
    return found


def _samples(dev):
    """Per operator: the family's samples, then the shipped ops' own (small float32 cases, with
    inputs requiring grad and non-contiguous (transposed, sliced) layouts; out= variants with a
    transposed out): layouts and arguments the family's draw leaves out (a channels_last
    rms_norm, a 1-D matmul, a float16 softmax reduced in float32, addmm's scalars)."""
    found = _family_samples(dev)
    for name, calls in _curated_samples(dev).items():
        found.setdefault(name, []).extend(calls)
    return found


def _curated_samples(dev):
    def r(*s, g=False, lo=-2.0, hi=2.0):
        return torch.empty(*s, device=dev).uniform_(lo, hi).requires_grad_(g)

    def t(a, b, g=False, **k):  # a x b, transposed
        return r(b, a, **k).t().detach().requires_grad_(g)

    def sl(a, b, g=False):  # a x b, every other column from offset 1
        return r(a, 2 * b + 1)[:, 1::2].detach().requires_grad_(g)

    S = {}
    for op in ("relu", "sigmoid", "tanh", "silu", "gelu"):
        e = ("tanh",) if op == "gelu" else ()
        S[op] = [(r(3, 5, g=True), *e), (t(3, 5, g=True), *e), (sl(3, 5, g=True), *e)]
        S[op + "_out"] = [(torch.empty(5, 3, device=dev).t(), t(3, 5), *e)]
    for op in ("add", "sub", "mul", "div", "swiglu", "geglu"):
        S[op] = [(r(3, 5, g=True), r(5, g=True, lo=0.5)), (t(3, 5, g=True), r(3, 5, lo=0.5)),
                 (sl(3, 5), torch.tensor(1.5, device=dev))]
        S[op + "_out"] = [(torch.empty(5, 3, device=dev).t(), t(3, 5), r(5, lo=0.5))]
    for op in ("softmax", "log_softmax"):
        S[op] = [(r(3, 5, g=True), -1, None), (t(3, 5, g=True), 0, None),
                 (r(3, 5, g=True), -1, torch.float16)]
        S[op + "_backward"] = [(t(3, 5, g=True), r(3, 5, g=True), -1)]
    S["logsumexp"] = [(t(3, 5, g=True), [1], True), (r(2, 3, 4, g=True), [0, 2], False)]
    S["layer_norm"] = [(t(3, 5, g=True), [5], r(5, g=True), r(5, g=True), 1e-5),
                       (r(2, 3, 5, g=True), [3, 5], None, None, 1e-5)]
    S["layer_norm_backward"] = [(t(3, 5, g=True), r(5, g=True), r(5, g=True), r(3, 5, g=True),
                                 [5], 1e-5)]
    cl = r(2, 3, 2, 2).to(memory_format=torch.channels_last).requires_grad_()
    S["rms_norm"] = [(t(3, 5, g=True), [5], r(5, g=True), None), (cl, [2], None, 1e-6)]
    S["rms_norm_backward"] = [(t(3, 5, g=True), r(5, g=True), r(3, 5, g=True), [5], None)]
    S["add_rms_norm"] = [(t(3, 5, g=True), r(3, 5, g=True), r(5, g=True), 1e-6)]
    S["add_rms_norm_backward"] = [(t(3, 5, g=True), r(3, 5, g=True), r(5, g=True),
                                   r(3, 5, g=True), r(3, 5, g=True), 1e-6)]
    for op in ("sum", "mean", "prod"):
        S[op] = [(t(3, 5, g=True, lo=0.5), [1], False, None),
                 (r(3, 5, g=True, lo=0.5), None, True, None),
                 (r(3, 5, lo=0.5).half().requires_grad_(), [0], False, torch.float32)]
    for op in ("amax", "amin"):
        S[op] = [(t(3, 5, g=True), [0], True), (r(3, 5, g=True), None, False)]
    for op in ("argmax", "argmin"):
        S[op] = [(t(3, 5), 1, False), (r(3, 5, g=True), None, True)]
    target = torch.tensor([0, 4, 2], device=dev)
    S["cross_entropy"] = [(r(3, 5, g=True), target, None, -100, "mean", 0.0),
                          (t(3, 5, g=True), torch.tensor([1, -100, 3], device=dev),
                           r(5, lo=0.5), -100, "none", 0.1)]
    logits = r(3, 5)
    _, lse, denom = torch.ops.specgen.cross_entropy(logits, target, None, -100, "mean", 0.0)
    S["cross_entropy_backward"] = [(torch.ones((), device=dev), logits, target, None, lse, denom,
                                    -100, "mean", 0.0)]
    S["mm"] = [(r(3, 4, g=True), t(4, 5, g=True))]
    S["bmm"] = [(r(2, 3, 4, g=True), r(2, 5, 4).transpose(1, 2).requires_grad_())]
    S["matmul"] = [(r(2, 3, 4, g=True), r(4, 5, g=True)), (r(4, g=True), r(4, g=True))]
    S["linear"] = [(r(2, 3, 4, g=True), r(5, 4, g=True), r(5, g=True)),
                   (t(3, 4), r(5, 4), None)]
    S["linear_gelu"] = [(t(3, 4, g=True), r(5, 4, g=True), r(5, g=True))]
    S["linear_residual"] = [(r(3, 4, g=True), r(5, 4, g=True), r(5, g=True), t(3, 5, g=True))]
    S["addmm"] = [(r(5, g=True), t(3, 4, g=True), r(4, 5, g=True), 0.5, 2.0)]
    return S


# the operators `generated` registers, read at collection, before any test builds and imports a
# package of its own (tests/test_build.py's scaffolds register specgen:: ops too)
OPERATORS = sorted(name.split("::")[1] for name in torch._C._dispatch_get_all_op_names()
                   if name.startswith("specgen::"))


def test_every_operator_has_samples():
    # a new op (or out= variant) must get opcheck samples here
    with torch.no_grad():
        assert set(OPERATORS) <= set(_samples(device()))


def test_every_family_draws_samples_for_every_operator_of_its_ops():
    # from the family alone: an op needs no samples listed in this file
    with torch.no_grad():
        assert set(OPERATORS) <= set(_family_samples(device()))


@pytest.fixture(scope="module")
def samples():
    return _samples(device())


@pytest.fixture
def opcheck_tier(monkeypatch):
    if not runtime.interpreting():
        yield
        return
    from torch._subclasses.fake_tensor import is_fake

    wrap = launch.wrap_triton

    class FakeAware:
        def __init__(self, kernel):
            self.kernel = kernel

        def __getitem__(self, grid):
            def start(*args, **kwargs):
                if not any(isinstance(a, torch.Tensor) and is_fake(a)
                           for a in (*args, *kwargs.values())):
                    return wrap(self.kernel)[grid](*args, **kwargs)
            return start

    monkeypatch.setattr(launch, "wrap_triton", FakeAware)
    with torch._functorch.config.patch(decompose_custom_triton_ops=False):
        yield


@pytest.mark.parametrize("name", OPERATORS)
def test_opcheck(name, samples, opcheck_tier):
    op = getattr(torch.ops.specgen, name).default
    # one config per kernel: nothing to tune (the GPU tier compiles one config, not a space)
    with runtime.override(config=0):
        for i, args in enumerate(samples[name]):
            results = torch.library.opcheck(op, args, test_utils=UTILS, raise_exception=False)
            failed = {k: v for k, v in results.items() if v != "SUCCESS"}
            assert not failed, f"{name} sample {i}: {failed}"

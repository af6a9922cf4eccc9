"""Replays of repeated eager calls (specgen/runtime/replay.py): what keys them, what they skip.

tests/test_ops.py replays every op once per drawn case; these tests cover what must *not* be
replayed and the work that stays outside a replay.
"""

import inspect
from collections.abc import Mapping
from types import SimpleNamespace

import pytest
import torch
import triton
import triton.language as tl
from hypothesis import assume, given, settings, strategies as st

import generated
from specgen import runtime, testing
from specgen.runtime import replay


def _randn(*shape, dtype=torch.float32):
    return torch.randn(*shape, dtype=dtype, device=testing.device())


def _replayed(name: str) -> int:
    return generated.REGISTRY[name].replays.replayed


def test_second_call_records_and_third_replays():
    x = _randn(3, 37)
    before = _replayed("softmax")
    for _ in range(3):
        x = _randn(3, 37)
        torch.testing.assert_close(generated.softmax(x, -1), torch.softmax(x, -1))
    assert _replayed("softmax") == before + 1


def test_alignment_is_part_of_the_signature():
    # Triton specializes pointers on 16-byte alignment: a view starting one element in needs the
    # kernel compiled for it, so it must not replay a recording taken on an aligned tensor
    base = _randn(4 * 33 + 1)
    aligned, shifted = base[:-1].view(4, 33), base[1:].view(4, 33)
    with replay.record_at_once():
        generated.softmax(aligned, -1)
        before = _replayed("softmax")
        torch.testing.assert_close(generated.softmax(shifted, -1), torch.softmax(shifted, -1))
    assert _replayed("softmax") == before


def test_scalar_types_are_part_of_the_signature():
    x = _randn(5, 6)
    with replay.record_at_once():
        generated.sum(x, 1)
        generated.sum(x, 1)
        with pytest.raises(TypeError, match="dim"):
            generated.sum(x, 1.0)  # equal to 1 and hashing alike, but not an int


def test_overrides_are_part_of_the_signature():
    x = _randn(4, 40)
    with replay.record_at_once():
        with runtime.override(strategy="looped"):
            generated.rms_norm(x, [40])
        with runtime.record_launches() as log:
            # watching launches turns replays off, so the log shows what this call decides
            generated.rms_norm(x, [40])
        assert [launch.kernel for launch in log] != ["looped"]


def test_a_tensor_passed_twice_has_its_own_signature():
    # a recording of add(a, a) names one input for both pointers: it must not serve add(b, c)
    with replay.record_at_once():
        a = _randn(4, 5)
        for _ in range(2):  # the first call may autotune, which is not recorded
            generated.add(a, a)
        b, c = _randn(4, 5), _randn(4, 5)
        torch.testing.assert_close(generated.add(b, c), b + c)
        torch.testing.assert_close(generated.add(c, c), c + c)


def test_differentiated_calls_replay_their_forward():
    # an eager call that needs a gradient runs its plain call inside an autograd.Function
    # (runtime/autograd.py), where grad mode is off: that call is replayed like any other
    x = _randn(3, 9)
    with replay.record_at_once():
        generated.softmax(x, 0)
        leaf = x.clone().requires_grad_()
        before = _replayed("softmax")
        out = generated.softmax(leaf, 0)
    assert _replayed("softmax") == before + 1
    assert out.grad_fn is not None
    grad_out = _randn(3, 9)
    grad, = torch.autograd.grad(out, leaf, grad_out)
    wide = x.double().requires_grad_()
    want, = torch.autograd.grad(torch.softmax(wide, 0), wide, grad_out.double())
    testing.assert_matches(grad, want, "softmax grad after a replayed forward")


def test_a_kept_differentiated_call_replays_its_plain_call_on_each_calls_tensors():
    # once a signature's differentiated call is kept and the plain call inside its Function
    # recorded, the Function's forward calls that replay itself (autograd.Call: no second
    # lookup by the public function, so one replayed call counted a call), on each call's own
    # tensors, and the gradients are each call's
    with replay.record_at_once():
        for step in range(4):
            x, w, grad_out = _randn(4, 6).requires_grad_(), _randn(6).requires_grad_(), _randn(4, 6)
            before = _replayed("rms_norm")
            out = generated.rms_norm(x, [6], w)
            if step >= 2:
                assert _replayed("rms_norm") == before + 1
            got = torch.autograd.grad(out, (x, w), grad_out)
            wide = [t.detach().double().requires_grad_() for t in (x, w)]
            want = torch.nn.functional.rms_norm(wide[0], [6], wide[1])
            testing.assert_matches(out, want.detach(), f"rms_norm, call {step}")
            for g, h in zip(got, torch.autograd.grad(want, wide, grad_out.double())):
                testing.assert_matches(g, h, f"rms_norm grad, call {step}")


def test_a_kept_call_serves_its_own_signature_alone():
    # a kept training call (and the plain replay its forward keeps) serves calls of its own
    # signature only: another eps, one tensor passed for two, or launch logs take their own path
    with replay.record_at_once():
        x, w = _randn(4, 6).requires_grad_(), _randn(6).requires_grad_()
        for _ in range(3):
            generated.rms_norm(x, [6], w, eps=1e-5)
        wide = [t.detach().double() for t in (x, w)]
        out = generated.rms_norm(x, [6], w, eps=0.5)
        testing.assert_matches(out, torch.nn.functional.rms_norm(*wide[:1], [6], wide[1], eps=0.5),
                               "rms_norm, another eps")
        a, b = _randn(5, 8).requires_grad_(), _randn(5, 8).requires_grad_()
        for _ in range(3):
            generated.geglu(a, b)
        alias = generated.geglu(a, a)
        (grad,) = torch.autograd.grad(alias, a, torch.ones_like(alias))
        wide_a = a.detach().double().requires_grad_()
        want = torch.nn.functional.gelu(wide_a, approximate="tanh") * wide_a
        testing.assert_matches(alias, want.detach(), "geglu(a, a)")
        testing.assert_matches(grad, torch.autograd.grad(want.sum(), wide_a)[0], "geglu(a, a) grad")
        with runtime.record_launches() as launches:
            generated.rms_norm(x, [6], w, eps=1e-5)
        assert [launch.op for launch in launches] == ["rms_norm"], "logged calls launch anew"


def test_cross_entropy_checks_targets_on_a_replay():
    # in validating mode (this test runs under it) a replayed call checks its targets too
    logits = _randn(6, 11)
    target = torch.randint(0, 11, (6,), device=testing.device())
    with runtime.validating(), replay.record_at_once():
        for _ in range(2):  # the first call may autotune, which is not recorded
            generated.cross_entropy(logits, target)
        before = _replayed("cross_entropy")
        bad = target.clone()
        bad[4] = 11
        with pytest.raises(ValueError, match=r"target\[4\] is 11"):
            generated.cross_entropy(logits, bad)
    assert _replayed("cross_entropy") == before + 1


@triton.jit
def _double_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(out_ptr + offsets, 2 * tl.load(x_ptr + offsets, mask=mask), mask=mask)


def _double(x):
    out = runtime.empty(x.shape, x.dtype, x.device)
    runtime.launch(_double_kernel, (triton.cdiv(x.numel(), 32),), x, out, x.numel(), BLOCK=32)
    return out


def _double_through_a_view(x):
    out = runtime.empty(x.shape, x.dtype, x.device)
    # a view made inside the call: neither an input nor a recorded allocation
    runtime.launch(_double_kernel, (triton.cdiv(x.numel(), 32),), x.view(-1), out, x.numel(),
                   BLOCK=32)
    return out


def _call_three_times(impl) -> runtime.Replays:
    """Three calls with one signature and fresh data, as a generated function makes them."""
    replays = runtime.Replays(impl.__name__)
    with replay.record_at_once():
        for _ in range(3):
            x = _randn(50)
            key, found = replays.lookup((x,), ())
            out = found((x,)) if found is not None else replays.record(key, impl, (x,), x)
            torch.testing.assert_close(out, 2 * x)
    return replays


def test_a_recording_replays_its_launches_and_allocations():
    replays = _call_three_times(_double)
    assert replays.replayed == 2 and not replays.failures


def test_an_unknown_tensor_argument_drops_the_recording():
    replays = _call_three_times(_double_through_a_view)
    assert replays.replayed == 0
    assert ["x_ptr" in why for why in replays.failures.values()] == [True]


def test_a_replayed_last_call_looks_its_tickets_up_again(monkeypatch):
    # reduce's one-launch split keeps ticket counters between calls, one set per stream: a replay
    # must take those of the stream it runs on, not the ones the recorded call used. Emptying the
    # table stands in for another stream here.
    from specgen.runtime import counters

    x = _randn(300, 70)
    with runtime.override(strategy="last"), replay.record_at_once():
        generated.sum(x, 0)  # tunes
        generated.sum(x, 0)  # recorded
        recorded = counters.tile_counters(x.device, 1)
        monkeypatch.setattr(counters, "_counters", {})
        recorded.fill_(5)  # a launch that took these tickets would never see its last program
        try:
            before = _replayed("sum")
            out = generated.sum(x, 0)
            assert (recorded == 5).all()
        finally:
            recorded.zero_()  # the table monkeypatch puts back holds them
    assert _replayed("sum") == before + 1
    torch.testing.assert_close(out, torch.sum(x.double(), 0).float(), rtol=1e-5, atol=1e-4)
    assert not counters.tile_counters(x.device, 1).any()


# (name, call, reference): families whose implementations allocate outputs, workspaces,
# counters and a target verdict
_UNDER_A_DEFAULT_DEVICE = [
    ("softmax", lambda x, t: generated.softmax(x, -1), lambda x, t: torch.softmax(x, -1)),
    ("layer_norm", lambda x, t: generated.layer_norm(x, [x.shape[-1]]),
     lambda x, t: torch.nn.functional.layer_norm(x, [x.shape[-1]])),
    ("sum", lambda x, t: generated.sum(x, 0), lambda x, t: torch.sum(x, 0)),
    ("cross_entropy", lambda x, t: generated.cross_entropy(x, t),
     lambda x, t: torch.nn.functional.cross_entropy(x, t)),
    ("mm", lambda x, t: generated.mm(x, x.T), lambda x, t: torch.mm(x, x.T)),
]


@pytest.mark.parametrize("name, call, reference", _UNDER_A_DEFAULT_DEVICE,
                         ids=[c[0] for c in _UNDER_A_DEFAULT_DEVICE])
def test_a_default_device_keeps_the_direct_path(name, call, reference):
    # torch.set_default_device pushes a function mode that only places factory calls naming no
    # device: calls under it keep the direct path and their replays. "meta" as the default shows
    # an allocation that does not name its device (its tensor would be meta, the result wrong).
    x = _randn(40, 24)
    target = torch.randint(0, 24, (40,), device=testing.device())
    with replay.record_at_once():
        call(x, target)  # may autotune, which is not recorded
        with torch.device("meta"):
            call(x, target)
            before = _replayed(name)
            out = call(x, target)
            assert runtime.runs_eagerly(x)
    assert _replayed(name) == before + 1
    assert out.device == x.device
    torch.testing.assert_close(out, reference(x, target), rtol=1e-4, atol=1e-4)


def test_another_function_mode_takes_the_dispatcher():
    class Watch(torch.overrides.TorchFunctionMode):
        def __init__(self):
            super().__init__()
            self.seen = []

        def __torch_function__(self, func, types, args=(), kwargs=None):
            self.seen.append(func)
            return func(*args, **(kwargs or {}))

    x = _randn(3, 7)
    with Watch() as watch, torch.device(x.device):
        assert not runtime.runs_eagerly(x)
        out = generated.softmax(x, -1)
    torch.testing.assert_close(out, torch.softmax(x, -1))
    assert torch.ops.specgen.softmax in watch.seen


def test_an_out_call_is_never_served_by_a_replay():
    # out= takes the checked path every time (its out tensor is checked against the inputs)
    storage = _randn(36)
    x, y = storage[:35].view(5, 7), _randn(5, 7)
    out = torch.empty(5, 7, device=testing.device())
    with replay.record_at_once():
        for _ in range(3):
            generated.add(x, y)
        before = _replayed("add")
        for _ in range(3):
            generated.add(x, y, out=out)
        with pytest.raises(RuntimeError, match="overlaps input"):
            generated.add(x, y, out=storage[1:].view(5, 7))   # x shifted by one element
    assert _replayed("add") == before
    torch.testing.assert_close(out, x + y)


@settings(max_examples=3)
@given(data=st.data())
@pytest.mark.parametrize("name", sorted(generated.REGISTRY))
def test_the_public_functions_signature_is_the_lookups(name, data):
    # the public function writes its signature out (replay.key_source, with each argument's
    # kind); Replays.lookup computes it for any tensors and scalars. A recording made through the
    # one must be found by the other, or families that look up their own replays would miss
    info = generated.REGISTRY[name]
    case = testing.draw_case(data, info)
    assume(not isinstance(case.overrides.get("config"), Mapping))  # a mapping is not hashable
    bound = inspect.signature(info.function).bind(**case.args)
    bound.apply_defaults()
    tensors = [bound.arguments[a.name] for a in info.args if a.kind == "tensor"]
    scalars = [bound.arguments[a.name] for a in info.args if a.kind != "tensor"]
    with runtime.override(**case.overrides), replay.record_at_once():
        case.call(info)
        case.call(info)
        key, found = info.replays.lookup(tensors, scalars)
    assert key is not None and found is not None, info.replays.failures


def _kernel_double(n_values):
    """A stand-in for a compiled kernel of _double_kernel-like parameters (x_ptr, out_ptr, n,
    alpha, ONE, BLOCK): what static_launch reads of Triton's CompiledKernel."""
    metadata = SimpleNamespace(num_warps=4, num_ctas=1, shared=96, global_scratch_size=0,
                               profile_scratch_size=0, launch_pdl=False,
                               launch_cooperative_grid=False)
    signature = {"x_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32", "alpha": "fp32",
                 "one": "i32", "BLOCK": "constexpr"}
    # Triton makes an int argument equal to 1 a constant, keyed by its position
    src = SimpleNamespace(signature=signature, constants={(4,): 1, (5,): 32})
    return SimpleNamespace(metadata=metadata, src=src, function=0xF00)


_NAMES = ("x_ptr", "out_ptr", "n", "alpha", "one", "BLOCK")


def test_static_launch_passes_the_kernels_non_constant_parameters(monkeypatch):
    monkeypatch.setattr(replay, "_static_launcher", lambda: SimpleNamespace())
    x = torch.zeros(3)
    values = [x, x, 3, 0.5, 1, 32]
    static = replay.static_launch(_NAMES, _kernel_double(values), values)
    # two pointers, an i32 and an fp32; then the global and profile scratch pointers
    assert static == replay.StaticLaunch(0xF00, 4, 96, "OOifOO", (0, 1, 2, 3), 2)


@pytest.mark.parametrize("change, why", [
    (lambda k: setattr(k.metadata, "global_scratch_size", 128), "scratch"),
    (lambda k: setattr(k.metadata, "launch_pdl", True), "programmatic"),
    (lambda k: setattr(k.metadata, "num_ctas", 2), "cluster"),
    (lambda k: k.src.signature.update(alpha="fp16"), "alpha of type fp16"),
    (lambda k: k.src.signature.pop("n"), "n is not in the signature"),
])
def test_static_launch_leaves_to_triton_what_torchs_launcher_cannot_start(monkeypatch, change,
                                                                          why):
    monkeypatch.setattr(replay, "_static_launcher", lambda: SimpleNamespace())
    x = torch.zeros(3)
    values = [x, x, 3, 0.5, 1, 32]
    kernel = _kernel_double(values)
    change(kernel)
    assert why in replay.static_launch(_NAMES, kernel, values)


def test_a_written_replay_launches_through_torchs_launcher(monkeypatch):
    # on a GPU, a replay starts a kernel with torch's launcher of Triton cubins: its written
    # function must pass the function, grid, warps, shared memory, the parameters' codes and
    # values (each tensor as its data pointer: an input's or this call's new allocation's, in
    # parameter order) and the current stream. Run here with a stand-in launcher
    started = []
    monkeypatch.setattr(replay.native, "module", lambda: None)  # the Python-written replay
    monkeypatch.setattr(replay, "_static_launcher", lambda: SimpleNamespace(
        _launch_kernel=lambda *args: started.append(args)))
    monkeypatch.setattr(torch._C, "_cuda_getDevice", lambda: 0, raising=False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)  # the current device is checked
    x = torch.zeros(3)
    values = [x, x, 3, 0.5, 1, 32]
    kernel = _kernel_double(values)
    static = replay.static_launch(_NAMES, kernel, values)
    launch = replay._Launch(fn=None, grid=(2, 1, 1), args=(None, None, 3, 0.5, 1, 32),
                            slots=((0, "in", 1), (1, "buf", 0)), options=(), compiled=kernel,
                            device=0, stream=lambda device: 77 + device, static=static)
    recorded = replay.Replay(
        allocations=((None, ((3,), (1,), torch.float32, torch.device("cpu"), False)),),
        launches=(launch,), result=(("buf", 0),), single=True, arity=2)
    first, second = torch.zeros(2), torch.ones(3)
    out = recorded((first, second))
    assert out.shape == (3,) and out.dtype == torch.float32
    assert started == [(0xF00, 2, 1, 1, 4, 96, "OOifOO",
                        (second.data_ptr(), out.data_ptr(), 3, 0.5, None, None), 77)]


def test_the_core_gets_the_launch_the_written_replay_makes(monkeypatch):
    # on a GPU the C++ core replays instead of the written function: it must get the same
    # launch (function, grid, threads, shared memory; each parameter an input's or allocation's
    # pointer, or a constant's bytes in its slot; the scratch pointers null) and the generic
    # path for the calls it cannot launch. Checked here with a stand-in core
    made = []
    monkeypatch.setattr(replay.native, "module", lambda: SimpleNamespace(
        replay=lambda *args: made.append(args) or (lambda *tensors: None)))
    x = torch.zeros(3)
    values = [x, x, 3, 0.5, 1, 32]
    kernel = _kernel_double(values)
    launch = replay._Launch(fn=None, grid=(2, 1, 1), args=(None, None, 3, 0.5, 1, 32),
                            slots=((0, "in", 1), (1, "buf", 0)), options=(), compiled=kernel,
                            device=0, stream=lambda device: 77 + device,
                            static=replay.static_launch(_NAMES, kernel, values))
    layout = ((3,), (1,), torch.float32, torch.device("cpu"), False)
    recorded = replay.Replay(allocations=((None, layout),), launches=(launch,),
                             result=(("buf", 0),), single=True, arity=2)
    (args,) = made
    allocations, launches, result, single, arity, device, enter, leave, generic, kept = args
    assert allocations == [(None, *layout[:4])]
    assert launches == [(None, 0xF00, (2, 1, 1), 128, 96,
                         [("i", 1), ("b", 0), ("v", replay.packed("i", 3)),
                          ("v", replay.packed("f", 0.5)), ("v", 0), ("v", 0)])]
    assert (result, single, arity, device) == ([(True, 0)], True, 2, 0)
    assert generic is recorded.generic and kept == (launch,)


def test_a_differentiated_call_of_a_seen_signature_skips_its_checks(monkeypatch):
    # a call that needs a gradient goes through the op's autograd.Function; once its signature
    # (which inputs need a gradient among it) has passed the checks, later calls go straight to
    # the Function with the spelled-out scalars, and get the same gradients
    from specgen.runtime import op as op_module
    checked = []
    check = op_module.check_tensor_types
    monkeypatch.setattr(op_module, "check_tensor_types",
                        lambda *a, **k: (checked.append(a[0]), check(*a, **k))[1])

    def grads(x, w, wrt):
        out = generated.layer_norm(x, [7], w, eps=1e-3)
        return torch.autograd.grad(out, wrt, torch.ones_like(out))

    def reference(x, w, wrt):
        wide = [t.detach().double().requires_grad_(t.requires_grad) for t in (x, w)]
        out = torch.nn.functional.layer_norm(wide[0], [7], wide[1], eps=1e-3)
        return torch.autograd.grad(out, [wide[0] if t is x else wide[1] for t in wrt],
                                   torch.ones_like(out))

    x, w = _randn(3, 7).requires_grad_(), _randn(7)
    for calls in range(4):
        if calls == 2:  # the differentiated call kept, its forward's plain call recorded
            checked.clear()
        for got, want in zip(grads(x, w, [x]), reference(x, w, [x])):
            testing.assert_matches(got, want, "layer_norm grad")
    assert checked == []
    # w needing a gradient too is another signature: checked once (its plain forward call is
    # the same and replays), and its gradient computed
    w.requires_grad_()
    for _ in range(2):
        for got, want in zip(grads(x, w, [x, w]), reference(x, w, [x, w])):
            testing.assert_matches(got, want, "layer_norm grads")
    assert checked == ["layer_norm"]


def test_a_modules_parameters_take_the_direct_path_and_replay():
    # nn.Parameter is a plain tensor to torch's C++: a layer's weights must not send every call
    # through the dispatcher, in inference (replayed) or in training (differentiated)
    norm = torch.nn.LayerNorm(12).to(testing.device())
    x = _randn(5, 12)
    with torch.no_grad(), replay.record_at_once():
        generated.layer_norm(x, [12], norm.weight, norm.bias)
        before = _replayed("layer_norm")
        out = generated.layer_norm(x, [12], norm.weight, norm.bias)
        assert runtime.runs_eagerly(x, norm.weight, norm.bias)
    assert _replayed("layer_norm") == before + 1
    testing.assert_matches(out, norm(x.double().float()).double(), "layer_norm with parameters")
    out = generated.layer_norm(x, [12], norm.weight, norm.bias)
    assert type(out.grad_fn).__name__ == "SpecgenLayerNormBackward"
    grads = torch.autograd.grad(out.sum(), (norm.weight, norm.bias))
    wants = torch.autograd.grad(norm(x).sum(), (norm.weight, norm.bias))
    for got, want in zip(grads, wants):
        testing.assert_matches(got, want.double(), "layer_norm parameter grad")

"""Replays on a GPU start the compiled kernels through Triton's launcher directly (the CPU tier
replays through the interpreter): every family's replayed calls match torch on fresh data."""

import threading

import pytest
import torch
import torch.nn.functional as F

import generated
from specgen import runtime
from specgen.runtime import replay
from specgen.runtime.cross_entropy import TargetVerdict

pytestmark = pytest.mark.gpu


def _bf16(*shape):
    return torch.randn(*shape, device="cuda", dtype=torch.bfloat16)


# (op, fresh inputs, the call, torch's result in float64, relative tolerance)
CASES = {
    "add broadcast": (lambda: (_bf16(512, 384), _bf16(384)),
                      lambda x, y: generated.add(x, y), lambda x, y: x.double() + y.double(), 1e-2),
    "softmax split": (lambda: (_bf16(8, 262144),), lambda x: generated.softmax(x, -1),
                      lambda x: torch.softmax(x.double(), -1), 2e-2),
    "layer_norm": (lambda: (_bf16(1024, 4096), _bf16(4096), _bf16(4096)),
                   lambda x, w, b: generated.layer_norm(x, [4096], w, b),
                   lambda x, w, b: F.layer_norm(x.double(), [4096], w.double(), b.double()), 2e-2),
    "sum(x, 0)": (lambda: (_bf16(32768, 1024),), lambda x: generated.sum(x, 0),
                  lambda x: x.double().sum(0), 2e-2),
    "argmax": (lambda: (_bf16(300, 5000),), lambda x: generated.argmax(x, 1),
               lambda x: x.argmax(1), 0),
    "cross_entropy": (lambda: (_bf16(64, 32000), torch.randint(0, 32000, (64,), device="cuda")),
                      lambda x, t: generated.cross_entropy(x, t),
                      lambda x, t: F.cross_entropy(x.double(), t), 2e-2),
    "linear_gelu decode": (lambda: (_bf16(16, 4096), _bf16(4096, 4096), _bf16(4096)),
                           lambda x, w, b: generated.linear_gelu(x, w, b),
                           lambda x, w, b: F.gelu(F.linear(x.double(), w.double(), b.double()),
                                                  approximate="tanh"), 2e-2),
}


def run_case(name, make):
    """Four calls of CASES[name] on fresh inputs from ``make`` (seen, recorded or tuned, then
    replayed), each against torch; the op's registry entry and the outputs."""
    _, call, expected, tolerance = CASES[name]
    op = generated.REGISTRY[name.split("(")[0].split()[0]]
    before = op.replays.replayed
    outs = []
    for _ in range(4):
        inputs = make()
        out, want = call(*inputs), expected(*inputs)
        if tolerance == 0:
            assert torch.equal(out, want)
        else:
            error = (out.double() - want).norm() / want.norm()
            assert error < tolerance, f"{name}: relative error {error:.2e}"
        outs.append(out)
    assert op.replays.replayed > before, f"{name}: never replayed ({op.replays.failures})"
    return op, outs


@pytest.mark.parametrize("name", CASES)
def test_replayed_calls_match_torch(name):
    op, _ = run_case(name, CASES[name][0])
    launches = [launch for entry in op.replays._entries.values()
                if isinstance(entry, replay.Replay) for launch in entry.launches]
    assert launches and all(launch.compiled is not None for launch in launches)


def test_under_a_default_cuda_device_on_a_new_thread():
    # torch.set_default_device("cuda") keeps the direct path and replays: cross_entropy's pinned
    # verdict buffer (validating mode, which the thread turns on: the mode does not pass to a new
    # thread), made on a thread's first call, must still be a host tensor, and the calls replay
    # as without the context
    failures, replayed = [], []

    def work():
        try:
            with runtime.validating(), torch.device("cuda"):
                op = generated.REGISTRY["cross_entropy"]
                before = op.replays.replayed
                for _ in range(4):
                    logits = torch.randn(64, 32000, dtype=torch.bfloat16)
                    target = torch.randint(0, 32000, (64,))
                    got = generated.cross_entropy(logits, target)
                    want = F.cross_entropy(logits.double(), target)
                    assert abs(got.double() - want) / want < 2e-2, (got, want)
                    bad = target.clone()
                    bad[5] = 32000
                    with pytest.raises(ValueError, match=r"target\[5\] is 32000"):
                        generated.cross_entropy(logits, bad)
                replayed.append(op.replays.replayed - before)
                # this thread's verdict buffer, made under the context
                host, _ = TargetVerdict._local.buffers[logits.device]
                assert host.device.type == "cpu" and host.is_pinned(), host
        except BaseException as exc:  # reported by the test's own thread
            failures.append(exc)

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    assert not failures, failures
    assert replayed and replayed[0] > 0

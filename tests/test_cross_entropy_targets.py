"""cross_entropy's out-of-range targets (docs/families.md, "Cross-entropy"): by default a row whose
target is neither a class nor ignore_index has a NaN loss and a NaN gradient row, and no call reads
anything back from the device; in validating mode (``runtime.validating()``, SPECGEN_VALIDATE=1)
an eager call checks the targets and raises. (The error's own tests, run under validating mode,
are in test_reduce.py, test_replay.py and test_rowwise_runtime.py.)"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import generated
from specgen import runtime, testing
from specgen.runtime import cross_entropy as cross_entropy_rt
from specgen.runtime import cross_entropy as ce_runtime
from specgen.runtime import replay

REPO = Path(__file__).resolve().parents[1]
CLASSES = 11
TARGETS_KERNEL = "_cross_entropy_targets_kernel"


@pytest.fixture(autouse=True)
def default_mode(monkeypatch):
    """The tests here set the mode themselves: not validating unless they say so, whatever
    SPECGEN_VALIDATE the suite runs under."""
    monkeypatch.setattr(ce_runtime, "_environment_validates", False)


def _logits(rows=8, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(rows, CLASSES, generator=generator).to(testing.device())


def _targets(values):
    return torch.tensor(values, device=testing.device())


# too large (C, far past C), negative (-1, -7): bad; -100 is ignore_index; the rest are classes
MIXED = [0, CLASSES, 3, -100, -1, 7, 1000, -7]
BAD = [1, 4, 6, 7]
IGNORED = [3]
GOOD = [0, 2, 5]


def _rows(values, ignore_index):
    bad = [i for i, t in enumerate(values) if not 0 <= t < CLASSES and t != ignore_index]
    ignored = [i for i, t in enumerate(values) if t == ignore_index]
    good = [i for i in range(len(values)) if i not in bad and i not in ignored]
    return bad, ignored, good


def test_the_rows_of_the_mixed_targets():
    assert _rows(MIXED, -100) == (BAD, IGNORED, GOOD)


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("extras", ["plain", "weight and smoothing"])
def test_bad_targets_give_nan_loss_and_gradient_rows_by_default(reduction, extras):
    x = _logits()
    target = _targets(MIXED)
    options = {"reduction": reduction}
    if extras != "plain":
        options.update(weight=torch.rand(CLASSES, device=x.device) + 0.5, label_smoothing=0.1)
    # no grad: the direct eager call; then the eager autograd call and its backward kernel
    loss = generated.cross_entropy(x, target, **options)
    leaf = x.clone().requires_grad_()
    loss_grad = generated.cross_entropy(leaf, target, **options)
    grad, = torch.autograd.grad(loss_grad, leaf, torch.ones_like(loss_grad))
    # torch on the rows it accepts: the good rows, summed (the gradient of "none" with ones)
    good_x = x[GOOD].double().requires_grad_()
    weight = options.get("weight")
    want_rows = F.cross_entropy(good_x, target[GOOD],
                                weight.double() if weight is not None else None, reduction="none",
                                label_smoothing=options.get("label_smoothing", 0.0))
    want_grad, = torch.autograd.grad(want_rows.sum(), good_x)
    for got in (loss, loss_grad.detach()):
        if reduction == "none":
            assert got.shape == (len(MIXED),)
            assert torch.isnan(got[BAD]).all(), got
            assert (got[IGNORED] == 0).all(), got           # ignore_index rows unaffected
            testing.assert_matches(got[GOOD], want_rows.detach(), "good rows' losses")
        else:
            assert got.shape == () and torch.isnan(got), got
    # each bad row's gradient is NaN throughout; ignored rows' are 0; the good rows' are finite
    # (and torch's, but for "mean", whose denominator counts the bad rows' weights too)
    assert torch.isnan(grad[BAD]).all(), grad
    assert (grad[IGNORED] == 0).all(), grad
    assert torch.isfinite(grad[GOOD]).all(), grad
    if reduction != "mean":
        testing.assert_matches(grad[GOOD], want_grad, "good rows' gradient")


def test_a_negative_target_other_than_ignore_index_is_bad():
    # with ignore_index 3, target 3 is ignored and -100 is as bad as -1
    x, ignore_index = _logits(4), 3
    values = [3, -100, -1, 5]
    bad, ignored, good = _rows(values, ignore_index)
    assert (bad, ignored, good) == ([1, 2], [0], [3])
    loss = generated.cross_entropy(x, _targets(values), ignore_index=ignore_index,
                                   reduction="none")
    assert torch.isnan(loss[bad]).all() and loss[ignored].item() == 0, loss
    assert torch.isfinite(loss[good]).all(), loss


def test_bad_targets_are_nan_through_the_registered_op():
    # the op torch.compile traces: its forward and backward kernels make the NaN
    x, target = _logits(), _targets(MIXED)
    for reduction in ("none", "sum"):
        loss, lse, denom = torch.ops.specgen.cross_entropy(x, target, None, -100, reduction, 0.0)
        assert torch.isnan(loss[BAD] if reduction == "none" else loss).all(), loss
        grad_loss = torch.ones_like(loss)
        grad = torch.ops.specgen.cross_entropy_backward(grad_loss, x, target, None, lse, denom,
                                                        -100, reduction, 0.0)
        assert torch.isnan(grad[BAD]).all() and (grad[IGNORED] == 0).all(), grad
        assert torch.isfinite(grad[GOOD]).all(), grad


def test_bad_targets_are_nan_in_a_backward_that_builds_a_graph():
    # create_graph=True takes torch's autograd of the reference, which would raise for a bad
    # target (or assert on a GPU): it reads class 0 there and the row is NaN, as from the kernel
    leaf = _logits().requires_grad_()
    target = _targets(MIXED)
    loss = generated.cross_entropy(leaf, target, reduction="sum")
    grad, = torch.autograd.grad(loss, leaf, create_graph=True)
    assert grad.requires_grad
    assert torch.isnan(grad[BAD]).all() and (grad[IGNORED] == 0).all(), grad
    kernel_grad, = torch.autograd.grad(generated.cross_entropy(leaf, target, reduction="sum"),
                                       leaf)
    testing.assert_matches(grad[GOOD], kernel_grad[GOOD].double(), "graph-building gradient")


@pytest.fixture
def verdicts(monkeypatch):
    """Counts the target-check verdicts made and read (the read is the sync)."""
    counts = {"made": 0, "read": 0}
    make, read = ce_runtime.TargetVerdict.__init__, ce_runtime.TargetVerdict.check

    def counted_make(self, *args, **kwargs):
        counts["made"] += 1
        make(self, *args, **kwargs)

    def counted_read(self, *args, **kwargs):
        counts["read"] += 1
        return read(self, *args, **kwargs)

    monkeypatch.setattr(ce_runtime.TargetVerdict, "__init__", counted_make)
    monkeypatch.setattr(ce_runtime.TargetVerdict, "check", counted_read)
    return counts


def _targets_launched(log):
    return [(launch.kernel, launch.kernels) for launch in log
            if launch.kernel == "targets" or TARGETS_KERNEL in launch.kernels]


def test_by_default_no_call_checks_or_reads_the_targets(verdicts):
    x, target = _logits(), _targets([0, 1, 2, 3, -100, 5, 6, 7])
    leaf = x.clone().requires_grad_()
    with runtime.record_launches() as log:
        for _ in range(2):   # a second call would count the first call's check to its forward
            generated.cross_entropy(x, target)
            loss = generated.cross_entropy(leaf, target)
            torch.autograd.grad(loss, leaf)
            generated.REGISTRY["cross_entropy"].op(x, target, None, -100, "mean", 0.0)
    assert [launch.kernel for launch in log] == ["forward", "forward", "backward", "forward"] * 2
    assert _targets_launched(log) == []
    assert verdicts == {"made": 0, "read": 0}


def test_validating_mode_checks_and_reads_the_targets_of_each_eager_call(verdicts):
    x, target = _logits(), _targets([0, 1, 2, 3, -100, 5, 6, 7])
    leaf = x.clone().requires_grad_()
    with runtime.validating(), runtime.record_launches() as log:
        generated.cross_entropy(x, target)
        generated.cross_entropy(leaf, target)
        generated.REGISTRY["cross_entropy"].op(x, target, None, -100, "mean", 0.0)
    assert _targets_launched(log) == [("targets", [TARGETS_KERNEL])] * 3
    assert verdicts == {"made": 3, "read": 3}


def test_a_default_replay_does_no_host_work_after_its_lookup(verdicts, monkeypatch):
    # the recorded forward replayed straight from the lookup: no target check, no verdict, not
    # even the eager forward's own path; a bad target in a replayed call is NaN
    calls = {"eager forward": 0}
    # the family's eager forward (specgen/runtime/cross_entropy.py), which its call goes through
    eager_forward = cross_entropy_rt._eager_forward

    def counted(*args, **kwargs):
        calls["eager forward"] += 1
        return eager_forward(*args, **kwargs)

    monkeypatch.setattr(cross_entropy_rt, "_eager_forward", counted)
    x = _logits(6, seed=1)
    good = _targets([0, 1, 2, 3, -100, 5])
    bad = good.clone()
    bad[2] = CLASSES
    replays = generated.REGISTRY["cross_entropy"].replays
    with replay.record_at_once():
        for reduction in ("mean", "none"):
            for _ in range(2):  # the first call may autotune (GPU), which is not recorded
                generated.cross_entropy(x, good, reduction=reduction)
        before, recorded = replays.replayed, calls["eager forward"]
        got = generated.cross_entropy(x, good)
        nan = generated.cross_entropy(x, bad)
        rows = generated.cross_entropy(x, bad, reduction="none")
    assert replays.replayed == before + 3
    assert calls["eager forward"] == recorded
    assert verdicts == {"made": 0, "read": 0}
    testing.assert_matches(got, F.cross_entropy(x.double(), good), "a replayed loss")
    assert torch.isnan(nan), nan
    assert torch.isnan(rows[2]) and torch.isfinite(rows[[0, 1, 3, 5]]).all() and rows[4] == 0, rows


def test_validating_mode_raises_the_eager_error_and_can_be_turned_off(monkeypatch):
    x, target = _logits(5), _targets([0, 1, 11, 3, -100])
    message = r"^cross_entropy: target\[2\] is 11, outside \[0, 11\) and not ignore_index \(-100\)$"
    assert not ce_runtime.validates()
    with runtime.validating():
        assert ce_runtime.validates()
        with pytest.raises(ValueError, match=message):
            generated.cross_entropy(x, target)
        with runtime.validating(False):      # the innermost block decides
            assert torch.isnan(generated.cross_entropy(x, target))
        with pytest.raises(ValueError, match=message):
            generated.cross_entropy(x, target)
    assert torch.isnan(generated.cross_entropy(x, target))
    # SPECGEN_VALIDATE=1 at import: the same, and validating(False) turns it off for a block
    monkeypatch.setattr(ce_runtime, "_environment_validates", True)
    with pytest.raises(ValueError, match=message):
        generated.cross_entropy(x, target)
    with runtime.validating(False):
        assert torch.isnan(generated.cross_entropy(x, target))


@pytest.mark.parametrize("value, on", [(None, False), ("", False), ("0", False), ("1", True),
                                       ("yes", True)])
def test_the_environment_variable(monkeypatch, value, on):
    if value is None:
        monkeypatch.delenv("SPECGEN_VALIDATE", raising=False)
    else:
        monkeypatch.setenv("SPECGEN_VALIDATE", value)
    assert ce_runtime._validate_from_environment() is on


def test_specgen_validate_in_a_fresh_process_raises():
    script = (
        "import torch, generated\n"
        f"x = torch.randn(3, 5, device='{testing.device()}')\n"
        f"t = torch.tensor([0, 5, 1], device='{testing.device()}')\n"
        "try:\n"
        "    generated.cross_entropy(x, t)\n"
        "except ValueError as error:\n"
        "    print('raised:', error)\n"
        "else:\n"
        "    print('no error')\n")
    env = {**os.environ, "SPECGEN_VALIDATE": "1", "PYTHONPATH": str(REPO)}
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True,
                            text=True, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert ("raised: cross_entropy: target[1] is 5, outside [0, 5) and not ignore_index (-100)"
            in result.stdout), result.stdout + result.stderr

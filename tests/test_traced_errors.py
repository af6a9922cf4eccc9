"""Calls that go through the registered op: bad arguments raise the eager error (gradients:
tests/test_autograd.py).

A call that anything observes (torch.compile, autograd, a function mode) goes through the
dispatcher, which checks argument types against the op's schema before our checks run: its error
is a RuntimeError in the schema's words. So every public function checks its scalar, choice and
dtype arguments itself, before it picks a path.
"""

import pytest
import torch

import generated
from specgen import runtime, testing


def _randn(*shape):
    return torch.randn(*shape, device=testing.device())


def _logits():
    return _randn(4, 6), torch.tensor([0, 5, 2, 1], device=testing.device())


CALLS = {
    "softmax dim": lambda: generated.softmax(_randn(3, 5), 1.0),
    "sum keepdim": lambda: generated.sum(_randn(3, 5), 1, 1),
    "sum dtype (not a dtype)": lambda: generated.sum(_randn(3, 5), 1, dtype="float32"),
    "mean dtype (unsupported)": lambda: generated.mean(_randn(3, 5), 1, dtype=torch.int64),
    "amax keepdim": lambda: generated.amax(_randn(3, 5), 1, "no"),
    "argmin keepdim": lambda: generated.argmin(_randn(3, 5), 1, 0),
    "cross_entropy ignore_index": lambda: generated.cross_entropy(*_logits(), ignore_index=1.5),
    "cross_entropy reduction": lambda: generated.cross_entropy(*_logits(), reduction="avg"),
    "cross_entropy label_smoothing": lambda: generated.cross_entropy(*_logits(),
                                                                    label_smoothing="0.1"),
    "addmm beta": lambda: generated.addmm(_randn(3, 5), _randn(3, 4), _randn(4, 5), beta="x"),
    "gelu approximate": lambda: generated.gelu(_randn(3), approximate="fast"),
    "rms_norm eps": lambda: generated.rms_norm(_randn(3, 5), [5], None, "1e-6"),
}


def _error(call):
    with runtime.record_launches() as launches, pytest.raises(Exception) as info:
        call()
    assert launches == [], "errors come before any launch"
    return type(info.value), str(info.value)


@pytest.mark.parametrize("case", sorted(CALLS))
def test_traced_calls_raise_the_eager_error(case):
    eager = _error(CALLS[case])
    assert eager[0] in (TypeError, ValueError), eager
    with testing.Observe():
        assert not runtime.runs_eagerly(_randn(1))
        traced = _error(CALLS[case])
    assert traced == eager

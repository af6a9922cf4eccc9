"""The C++ replay core (specgen/runtime/native.cpp): its signature agrees with the Python one, and
a replay made from a recording allocates, launches and returns as the recording did.

On a GPU machine every replayed call of the suite runs through it; here it is built for these
tests alone (about 15 s), and its driver launches, which need a GPU, are left to the GPU tier.
"""

import pytest
import torch

from specgen.runtime import native, replay


@pytest.fixture(scope="module")
def built():
    module = native.build()
    if module is None:
        pytest.skip("the C++ replay core does not build on this machine (see the warning)")
    return module


def _layouts():
    base = torch.randn(64)
    x = base[:24].view(4, 6)
    return {
        "x": x,
        "x again": x,
        "same layout": torch.randn(4, 6),
        "transposed": torch.randn(6, 4).t(),
        "shifted by one element": base[1:25].view(4, 6),
        "bfloat16": torch.randn(4, 6, dtype=torch.bfloat16),
        "other shape": torch.randn(3, 8),
        "0-dim": torch.tensor(2.0),
        "empty": torch.randn(0, 6),
    }


def test_the_signature_tells_apart_what_the_python_one_does(built):
    # native.key(*tensors) and replay.tensor_key(*tensors) must put two calls in one class
    # exactly when the other does (the formats differ: bytes, a tuple)
    tensors = _layouts()
    calls = [(tensors[a], tensors[b]) for a in tensors for b in tensors] + \
            [(tensors["x"], None), (None, tensors["x"]), (tensors["same layout"], None)]
    for first in calls:
        for second in calls:
            python = replay.tensor_key(*first) == replay.tensor_key(*second)
            assert (built.key(*first) == built.key(*second)) == python, (first, second)


def test_a_gradient_needed_is_part_of_the_signature(built):
    x, y = torch.randn(3, requires_grad=True), torch.randn(3)
    assert built.key(x) != built.key(y)             # x needs a gradient in grad mode
    with torch.no_grad():
        assert built.key(x) == built.key(y)
    assert (built.key(x) == built.key(y)) == (replay.tensor_key(x) == replay.tensor_key(y))
    # a parameter is keyed as a plain tensor (its gradient flag apart); another subclass is not
    assert built.key(torch.nn.Parameter(y, requires_grad=False)) == built.key(y)
    assert built.key(torch.nn.Parameter(y)) == built.key(x)
    assert built.key(torch.randn(3).as_subclass(_Subclass)) is None
    assert replay.tensor_key(torch.randn(3).as_subclass(_Subclass)) is None
    assert built.key(torch.randn(3), None) is not None


class _Subclass(torch.Tensor):
    pass


def test_a_replay_allocates_launches_and_returns_as_recorded(built):
    # two allocations (a layout made in C++, one a Python callable makes) and a launch through
    # Python, which receives the call's tensors and the new buffers; the result is (buffer 0,
    # input 1) in that order
    seen = []

    def launch(inputs, buffers):
        seen.append((inputs, buffers))
        buffers[0].copy_(inputs[0] * 2)

    poisoned = torch.full((2,), float("nan"))
    run = built.replay([(None, (2, 3), (1, 2), torch.float32, torch.device("cpu")),
                        (lambda: poisoned, (), (), None, None)],
                       [(launch, 0, (1, 1, 1), 0, 0, ())],
                       [(True, 0), (False, 1)], False, 2, -1, [], [], None, None)
    x, y = torch.randn(2, 3), torch.randn(5)
    out, same = run(x, y)
    assert same is y
    assert out.shape == (2, 3) and out.stride() == (1, 2) and out.dtype == torch.float32
    torch.testing.assert_close(out, x * 2)
    (inputs, buffers), = seen
    assert inputs[0] is x and inputs[1] is y and buffers[0] is out and buffers[1] is poisoned


def test_a_failing_launch_raises_and_returns_nothing(built):
    def launch(inputs, buffers):
        raise ValueError("bad launch")

    run = built.replay([(None, (3,), (1,), torch.float32, torch.device("cpu"))],
                       [(launch, 0, (1, 1, 1), 0, 0, ())], [(True, 0)], True, 1, -1, [], [],
                       None, None)
    with pytest.raises(ValueError, match="bad launch"):
        run(torch.randn(3))
    with pytest.raises(TypeError, match="2 tensors given, 1 expected"):
        run(torch.randn(3), torch.randn(3))


def test_a_replay_refuses_indices_out_of_range(built):
    # a replay reads only the tensors it is given and the buffers it makes
    # (a kernel parameter's index too: checked alike, for driver launches, which need a GPU)
    with pytest.raises(ValueError, match="result's index out of range"):
        built.replay([], [], [(False, 3)], True, 1, -1, [], [], None, None)
    with pytest.raises(ValueError, match="result's index out of range"):
        built.replay([(None, (1,), (1,), torch.float32, torch.device("cpu"))], [], [(True, 1)],
                     True, 1, -1, [], [], None, None)


def test_a_sparse_tensor_is_not_keyed(built):
    # its strides say nothing of its layout (a sparse tensor's may equal an expanded one's)
    sparse = torch.randn(3, 3).to_sparse()
    assert built.key(sparse) is None and replay.tensor_key(sparse) is None


def test_constant_parameters_are_packed_as_the_c_cast_gives_them():
    import struct
    assert replay.packed("i", -2) == int.from_bytes(struct.pack("<i", -2), "little")
    assert replay.packed("l", 2**40) == 2**40
    assert replay.packed("f", 0.5) == int.from_bytes(struct.pack("<f", 0.5), "little")
    assert replay.packed("d", 0.1) == int.from_bytes(struct.pack("<d", 0.1), "little")
    # beyond float32's range: inf, as Triton's launcher passes it (struct would raise)
    assert replay.packed("f", 1e39) == int.from_bytes(struct.pack("<f", float("inf")), "little")
    assert replay.packed("i", True) == 1


def test_a_replay_through_the_core_is_freed_with_its_signature(built, monkeypatch):
    # the core holds the replay's generic path and launches; none of them may hold the replay
    # itself (a cycle through a capsule, which the cycle collector does not see, is never freed)
    import gc
    import weakref

    monkeypatch.setattr(native, "module", lambda: built)
    layout = ((3,), (1,), torch.float32, torch.device("cpu"), False)
    recorded = replay.Replay(allocations=((None, layout),), launches=(), result=(("buf", 0),),
                             single=True, arity=1)
    out = recorded((torch.randn(3),))
    assert out.shape == (3,) and type(recorded.run).__name__ == "builtin_function_or_method"
    alive = weakref.ref(recorded)
    del recorded
    gc.collect()
    assert alive() is None

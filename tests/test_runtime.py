"""Launch-time logic: memory order, collapsing, index width, and the argument checks."""

import importlib
import sys
import threading
from pathlib import Path

import numpy
import pytest
import torch
import torch.nn.functional as F
import triton
from hypothesis import given
from hypothesis import strategies as st

import generated
from specgen import runtime, testing
from specgen.runtime.launch import shares_storage
from specgen.runtime.layout import (collapse, fast_setup_strides, has_internal_overlap,
                                    memory_order, storage_span)
from specgen.runtime.pointwise import empty_output, result_dtype


@given(shape=testing.shapes(min_rank=1, max_rank=4, allow_zero=False),
       data=st.data())
def test_output_layout_matches_torch(shape, data):
    a = testing.make_tensor(shape, torch.float32, data.draw(testing.layouts(len(shape))))
    b = testing.make_tensor(shape, torch.float32, data.draw(testing.layouts(len(shape))))
    ours = empty_output(shape, torch.float32, a.device, [a, b])
    theirs = a + b
    big = [d for d in range(len(shape)) if shape[d] > 1]
    assert [ours.stride(d) for d in big] == [theirs.stride(d) for d in big]


@given(shape=testing.shapes(min_rank=1, max_rank=4, allow_zero=False), data=st.data())
def test_fast_setup_strides_are_torchs_where_they_apply(shape, data):
    # size-1 dims of any stride, as views give them
    ones = [d for d in range(len(shape)) if shape[d] == 1]
    tensors = []
    for _ in range(2):
        t = testing.make_tensor(shape, torch.float32, data.draw(testing.layouts(len(shape))))
        strides = list(t.stride())
        for d in ones:
            strides[d] = data.draw(st.sampled_from([1, 3, 64]))
        tensors.append(t.as_strided(shape, strides))
    a, b = tensors
    strides = fast_setup_strides(shape, [(shape, a.stride()), (shape, b.stride())])
    if strides is not None:
        assert strides == (a + b).stride()


def test_fast_setup_strides_set_size_1_dims_as_torch():
    x = torch.empty_strided((1, 63, 5, 1), (315, 1, 63, 1))   # channels_last and not contiguous
    assert fast_setup_strides(x.shape, [(x.shape, x.stride())] * 2) == (x + x).stride() \
        == (315, 1, 63, 63)
    y = torch.empty_strided((2, 1, 3), (3, 99, 1))            # contiguous
    assert fast_setup_strides(y.shape, [(y.shape, y.stride())] * 2) == (y + y).stride() == (3, 3, 1)
    z = torch.empty(3, 4).t()                                 # of one dense layout
    assert fast_setup_strides(z.shape, [(z.shape, z.stride())] * 2) == (z + z).stride()
    assert fast_setup_strides((3, 4), [((3, 4), (4, 1)), ((3, 4), (1, 3))]) is None
    assert fast_setup_strides((3, 4), [((3, 4), (4, 1)), ((4,), (1,))]) is None   # broadcast
    # element-wise outputs take them: torch's unary functions are fast-set-up too
    assert empty_output(x.shape, x.dtype, x.device, [x]).stride() == torch.exp(x).stride()


def test_collapse_merges_dense_dims_and_keeps_transposes():
    x = torch.empty(4, 5, 6)
    assert collapse((4, 5, 6), [x.stride(), x.stride()]).dense
    t = torch.empty(6, 5).t()
    space = collapse((5, 6), [(6, 1), t.stride()])
    assert space.sizes == (5, 6) and not space.dense
    row = collapse((4, 6), [(6, 1), (0, 1)])  # a broadcast row vector
    assert row.sizes == (4, 6) and row.strides == ((6, 1), (0, 1))


def test_memory_order_follows_first_operand():
    assert memory_order((3, 4), [(1, 3), (4, 1)]) == [0, 1]
    assert memory_order((3, 4), [(4, 1), (1, 3)]) == [1, 0]


def test_storage_span_and_overlap():
    x = torch.empty(10, 10)
    assert storage_span(x) == 100 and storage_span(x[::2, ::3]) == 1 + 8 * 10 + 9
    assert storage_span(x[:, :0]) == 0
    assert has_internal_overlap(torch.empty(3, 1).expand(3, 4))
    assert not has_internal_overlap(x.t()[::2])


def test_result_dtype_follows_torch_promotion():
    half, bf16 = torch.empty(2, dtype=torch.float16), torch.empty(2, dtype=torch.bfloat16)
    scalar32 = torch.tensor(1.0)
    assert result_dtype([half, bf16]) == torch.promote_types(half.dtype, bf16.dtype)
    assert result_dtype([half, scalar32]) == torch.result_type(half, scalar32) == torch.float16


def test_int64_chosen_from_storage_span_not_numel():
    # a 2-element view whose elements are 2**31 apart needs 64-bit offsets; a meta tensor holds no memory
    far = torch.empty_strided((2,), (2**31,), device="meta")
    small = torch.empty(8, device="meta")
    assert runtime.use_int64("op", "auto", {"x": far}, max_tile=1024)
    assert not runtime.use_int64("op", "auto", {"x": small}, max_tile=1024)
    assert runtime.use_int64("op", "int64", {"x": small}, max_tile=1024)
    with runtime.override(indexing="int64"):
        assert runtime.use_int64("op", "auto", {"x": small}, max_tile=1024)
    with pytest.raises(ValueError, match=r"op: indexing is forced to int32, but 'x' spans "
                                         r"2,147,483,649 elements"):
        runtime.use_int64("op", "int32", {"x": far}, max_tile=1024)


def test_int64_counts_a_tile_of_masked_lanes_past_the_end():
    # a program's masked lanes form offsets up to one tile past a tensor's last element: int32
    # holds while span + tile <= 2**31 - 1, and not one element further
    tile = 1024
    # spans 2**31 - 1 - tile, and one more
    fits = torch.empty_strided((2,), (2**31 - 1 - tile - 1,), device="meta")
    over = torch.empty_strided((2,), (2**31 - tile - 1,), device="meta")
    assert storage_span(over) == storage_span(fits) + 1 == 2**31 - tile
    assert not runtime.use_int64("op", "auto", {"x": fits}, max_tile=tile)
    assert runtime.use_int64("op", "auto", {"x": over}, max_tile=tile)


def test_launch_log_records_the_specialization():
    x = testing.make_tensor((33,), torch.float32, testing.Layout.contiguous(1))
    with runtime.record_launches() as log:
        generated.relu(x)
        with runtime.override(indexing="int64"):
            generated.relu(x)
        generated.relu(x.view(3, 11).t())  # the output takes the input's order: still dense
        generated.relu(x.view(3, 11).t(), out=torch.empty(11, 3, device=x.device))
    assert [(l.kernel, l.index_bits) for l in log] == [
        ("dense", 32), ("dense", 64), ("dense", 32), ("tiled", 32)]


def _x(*shape, dtype=torch.float32, device=None):
    return testing.make_tensor(shape, dtype, testing.Layout.contiguous(len(shape)), device=device)


@pytest.mark.parametrize("call, error, words", [
    # a number beside a tensor is taken (tests/test_dtypes.py); numbers alone are not
    (lambda: generated.add(2.0, 3), TypeError, "add: argument 'x' must be a torch.Tensor, got float"),
    (lambda: generated.add(_x(3), 2j), TypeError, "add: argument 'y' must be a torch.Tensor, got complex"),
    # None omits an optional tensor only (torch: "argument 'input' must be Tensor, not NoneType")
    (lambda: generated.add(_x(3), None), TypeError, "add: argument 'y' must be a torch.Tensor, got NoneType"),
    (lambda: generated.softmax(None), TypeError, "softmax: argument 'x' must be a torch.Tensor, got NoneType"),
    (lambda: generated.addmm(None, _x(2, 3), _x(3, 4)), TypeError,
     "addmm: argument 'c' must be a torch.Tensor, got NoneType"),
    (lambda: generated.linear_residual(_x(2, 3), _x(4, 3), None, _x(2, 4)), TypeError,
     "linear_residual: argument 'bias' must be a torch.Tensor, got NoneType"),
    (lambda: generated.amax(None, 0), TypeError, "amax: argument 'x' must be a torch.Tensor, got NoneType"),
    (lambda: generated.cross_entropy(_x(2, 3), None), TypeError,
     "cross_entropy: argument 'target' must be a torch.Tensor, got NoneType"),
    (lambda: generated.cross_entropy(_x(2, 3), torch.zeros(2, dtype=torch.long, device=testing.device()),
                                     _x(3, dtype=torch.float16)), TypeError,
     "cross_entropy: argument 'weight' has dtype torch.float16, 'logits' torch.float32; they must match"),
    (lambda: generated.add(_x(3), _x(3, dtype=torch.complex64)), TypeError,
     "add: argument 'y' has dtype torch.complex64; supported: float16, bfloat16, float32, "
     "float64, bool, uint8, int8, int16, int32, int64"),
    (lambda: generated.add(_x(3), _x(4)), ValueError, "add: shapes do not broadcast: 'x' (3,), 'y' (4,)"),
    (lambda: generated.add(_x(3, device="cpu"), torch.empty(3, device="meta")), ValueError,
     "add: arguments 'x' (cpu) and 'y' (meta) are on different devices"),
    (lambda: generated.gelu(_x(3), approximate="fast"), ValueError,
     "gelu: argument 'approximate' must be one of 'none', 'tanh', got 'fast'"),
    (lambda: generated.add(_x(3), _x(3), out=_x(4)), ValueError, "add: 'out' has shape (4,), expected (3,)"),
    # torch raises RuntimeError for overlaps ("unsupported operation: ...")
    (lambda: generated.add(_x(3), _x(3), out=_x(1).expand(3)), RuntimeError,
     "add: 'out' has elements that share memory"),
])
def test_bad_arguments_raise_before_launch(call, error, words):
    with runtime.record_launches() as log:
        with pytest.raises(error) as err:
            call()
    assert words in str(err.value)
    assert log == [], "nothing may launch"


def _target(n, classes):
    return torch.arange(n, device=testing.device()) % classes


# torch's argument parser takes numpy scalars and 0-dim tensors for ints and floats: so do the
# ops, each called as torch is called (ours, torch's function), with the same arguments
NUMPY_SCALARS = {
    "softmax, numpy dim": (generated.softmax, torch.softmax, (numpy.int64(0),)),
    "softmax, 0-dim tensor dim": (generated.softmax, torch.softmax, (torch.tensor(0),)),
    "log_softmax, numpy dim": (generated.log_softmax, torch.log_softmax, (numpy.int32(-1),)),
    "logsumexp, numpy dims": (generated.logsumexp, torch.logsumexp, ([numpy.int64(1)],)),
    "layer_norm, numpy shape and eps": (
        generated.layer_norm, F.layer_norm, ((numpy.int64(5),), None, None, numpy.float32(0.5))),
    "rms_norm, numpy shape and eps": (
        generated.rms_norm, F.rms_norm, ((numpy.int16(5),), None, numpy.float64(0.25))),
    "sum, numpy dims": (generated.sum, torch.sum, ((numpy.int64(1),),)),
    "sum, 0-dim tensor dim": (generated.sum, torch.sum, (torch.tensor(0),)),
    # an int list (a reduction's dims, a normalized_shape) takes any one-element integer tensor,
    # a bool one too
    "sum, one-element tensor dims": (generated.sum, torch.sum, (torch.tensor([1]),)),
    "amax, one-element bool tensor dims": (generated.amax, torch.amax, (torch.tensor([[True]]),)),
    "logsumexp, one-element tensor dims": (
        generated.logsumexp, torch.logsumexp, (torch.tensor([1], dtype=torch.int8),)),
    "logsumexp, a list of one-element tensors": (
        generated.logsumexp, torch.logsumexp, ([torch.tensor([0]), torch.tensor(1)],)),
    "layer_norm, a shape of one-element tensors": (
        generated.layer_norm, F.layer_norm, ([torch.tensor([5])],)),
    "argmax, numpy dim": (generated.argmax, torch.argmax, (numpy.uint8(1),)),
    "cross_entropy, numpy ignore_index and label_smoothing": (
        lambda x, t: generated.cross_entropy(x, t, ignore_index=numpy.int64(2),
                                             label_smoothing=numpy.float32(0.25)),
        lambda x, t: F.cross_entropy(x, t, ignore_index=numpy.int64(2),
                                     label_smoothing=numpy.float32(0.25)),
        (_target(3, 5),)),
}


@pytest.mark.parametrize("case", sorted(NUMPY_SCALARS))
def test_numpy_scalars_and_0_dim_tensors_are_taken_as_torch_takes_them(case):
    ours, theirs, args = NUMPY_SCALARS[case]
    # three calls: the second is recorded and the third replayed (tests/test_replay.py)
    for _ in range(3):
        x = _x(3, 5)
        torch.testing.assert_close(ours(x, *args), theirs(x, *args))
    if case.startswith("argmax"):
        return  # no gradient
    x = _x(3, 5).requires_grad_()
    ours_out, theirs_out = ours(x, *args), theirs(x, *args)
    cotangent = torch.randn_like(theirs_out)
    torch.testing.assert_close(torch.autograd.grad(ours_out, x, cotangent),
                               torch.autograd.grad(theirs_out, x, cotangent))


def test_argument_helpers_trace_under_dynamo():
    # the public functions run them under torch.compile (the GPU tier compiles the ops; the
    # interpreter cannot): three values of each scalar make the ints symbolic (automatic dynamic)
    from specgen.runtime.checks import as_scalar
    from specgen.runtime.reduce import normalize_dims
    from specgen.runtime.rowwise import as_shape, reduced_by_dim

    def helpers(x, dim, k, eps):
        dims = normalize_dims("op", dim, x.dim())
        (row_dim,) = reduced_by_dim("op", "dim", x, dim)
        shape = as_shape("op", "normalized_shape", [x.shape[-1]])
        k = as_scalar("op", "k", k, int)
        eps = as_scalar("op", "eps", eps, float)
        return x.sum(dims) * shape[0] + x.amax(row_dim).sum() + k * eps

    compiled = torch.compile(helpers, backend="eager", fullgraph=True)
    try:
        for dim, k, eps in [(0, 1, 0.5), (1, 2, 0.25), (-1, 3, 2.0)]:
            x = _x(3, 5, device="cpu")
            torch.testing.assert_close(compiled(x, dim, k, eps), helpers(x, dim, k, eps))
    finally:
        torch._dynamo.reset()


def test_a_0_dim_tensor_dim_is_read_at_every_call():
    # a tensor hashes by identity: a replay keyed on it would keep its first value
    x, dim = _x(3, 5), torch.tensor(0)
    for value in (0, 0, 0, 1, 1):
        dim.fill_(value)
        torch.testing.assert_close(generated.softmax(x, dim), torch.softmax(x, value))


def test_out_may_alias_an_input_exactly_but_not_partly():
    x, y = _x(4, 8), _x(4, 8)
    expected = x + y
    assert generated.add(x, y, out=x) is x
    torch.testing.assert_close(x, expected)
    buffer = _x(40)
    with pytest.raises(RuntimeError, match="add: 'out' overlaps input 'x' in memory"):
        generated.add(buffer[:32], _x(32), out=buffer[8:])


TWO_OUTPUTS = """
[op]
name = "test_sum_and_gate"
family = "pointwise"
reference = "(a + b, torch.relu(a + b) * b)"

[args]
a = "tensor"
b = "tensor"

[compute]
s = "a + b"
gated = "relu(s) * b"
"""


def test_outputs_of_one_call_may_not_share_memory(authored):
    module = authored(TWO_OUTPUTS)
    a, b = _x(4, 8), _x(4, 8)
    s, gated = _x(4, 8), _x(4, 8)
    result = module.test_sum_and_gate(a, b, out=(s, gated))
    assert result[0] is s and result[1] is gated
    torch.testing.assert_close(gated, torch.relu(a + b) * b)
    buffer = _x(8, 8)
    for outs in [(s, s), (buffer[:4], buffer[2:6])]:
        with pytest.raises(RuntimeError, match="test_sum_and_gate: outputs 's' and 'gated' overlap "
                                             "in memory"):
            module.test_sum_and_gate(a, b, out=outs)
    module.test_sum_and_gate(a, b, out=(buffer[:4], buffer[4:]))
    torch.testing.assert_close(buffer[:4], a + b)


def test_arguments_that_share_storage_are_found():
    # such a launch autotunes on stand-ins: out=x would otherwise take every trial's update
    x, y = _x(4, 8), _x(4, 8)
    assert shares_storage([x, y, x, 7])
    assert shares_storage([x[1:], y, x.t()])
    assert not shares_storage([x, y, 7, None])
    assert not shares_storage([x, _x(0), _x(0)])  # empty tensors hold no memory


def test_rank_beyond_eight_uncollapsible_dims_is_a_clear_error():
    # every other dim permuted: no two neighbours merge, in any operand
    x = testing.make_tensor((2,) * 9, torch.float32, testing.Layout(
        (0, 2, 4, 6, 8, 1, 3, 5, 7), (1,) * 9))
    y = testing.make_tensor((2,) * 9, torch.float32, testing.Layout.contiguous(9))
    with pytest.raises(ValueError, match="add: the operands have 9 dimensions that cannot be collapsed"):
        generated.add(x, y)
    seven = (2, 3, 2, 3, 2, 3, 2)
    a = testing.make_tensor(seven, torch.float32, testing.Layout((6, 4, 2, 0, 1, 3, 5), (1,) * 7))
    b = testing.make_tensor(seven, torch.float32, testing.Layout.contiguous(7))
    torch.testing.assert_close(generated.add(a, b), a + b)


def test_non_tensor_out_is_a_type_error():
    with pytest.raises(TypeError, match=r"add: argument 'out\[0\]' must be a torch.Tensor, got list"):
        generated.add(_x(3), _x(3), out=[0.0, 0.0, 0.0])


def test_every_thread_gets_the_launch_allocator_and_a_users_is_kept():
    # triton's launch-time allocator (global memory a kernel asks for, such as the TMA matmul's
    # descriptors) lives in a context variable that a new thread starts without
    from triton.runtime import _allocation
    from specgen.runtime import context
    found = {}

    def fresh():
        context.ensure_allocator()
        found["fresh"] = _allocation._allocator.get()

    def users():
        def mine(size, alignment, stream):
            return torch.empty(size, dtype=torch.int8)
        triton.set_allocator(mine)
        context.ensure_allocator()
        found["users"] = (_allocation._allocator.get(), mine)

    for body in (fresh, users):
        thread = threading.Thread(target=body)
        thread.start()
        thread.join()
    assert found["fresh"] is context._scratch
    assert found["users"][0] is found["users"][1]


@pytest.mark.skipif(not runtime.interpreting(), reason="the interpreter's launch path (CPU tier)")
def test_interpreter_runs_any_forced_config_and_otherwise_the_first_untuned(monkeypatch):
    # the CPU tier's property suite forces configs as the GPU tier's does, so the interpreter
    # keeps the whole space; unforced, it runs the first that fits and never times configs
    module = importlib.import_module("generated.sum")
    kernel = module.inner_kernel
    assert len(kernel.configs) == len(module.INNER_CONFIGS)
    tiles = []
    run = kernel.fn.run

    def spy(*args, **kwargs):
        tiles.append((kwargs["BLOCK_K"], kwargs["BLOCK_R"], kwargs["num_warps"]))
        return run(*args, **kwargs)

    monkeypatch.setattr(kernel.fn, "run", spy)
    x = torch.randn(16, 16384)   # wide and long enough that every tile fits (no pruning)
    with runtime.override(strategy="inner"):
        for number in range(len(kernel.configs)):
            with runtime.override(config=number):
                torch.testing.assert_close(generated.sum(x, -1), x.sum(-1), rtol=1e-4, atol=1e-3)
        assert sorted(tiles) == sorted((c.kwargs["BLOCK_K"], c.kwargs["BLOCK_R"], c.num_warps)
                                       for c in kernel.configs)
        tiles.clear()
        generated.sum(x[:, 1:], -1)
    first = kernel.configs[0]
    assert tiles == [(first.kwargs["BLOCK_K"], first.kwargs["BLOCK_R"], first.num_warps)]
    assert not kernel.cache  # the autotuner never ran
    # a row-wise space leads with its interpreter tile there, then the GPU's space
    rows = importlib.import_module("generated.softmax")
    chunked = rows._softmax_looped_kernel.configs
    assert len(chunked) == 1 + len(rows.CHUNKED_CONFIGS)
    assert chunked[0].kwargs == {k: v for k, v in rows.INTERPRETER_CONFIG.items()
                                 if k != "num_warps"}


@pytest.mark.skipif(not runtime.interpreting(), reason="the interpreter's launch path (CPU tier)")
def test_a_config_past_the_gpus_resources_gives_way_to_the_next_that_fits(monkeypatch):
    # Triton's count of a kernel's shared memory moves with the arguments' alignment and its
    # version, which a prune's estimate does not see: an unforced launch whose config Triton
    # finds too large runs the next config the prune keeps, as autotuning would; a forced one
    # fails. Stood in for here by a kernel that raises Triton's error for its first config
    launch = importlib.import_module("specgen.runtime.launch")
    kernel = importlib.import_module("generated.sum").inner_kernel
    # a shape no other test calls sum on: no replay of it recorded before (a replay starts its
    # kernel directly, past the launcher)
    x = torch.randn(16, 16352)
    with runtime.override(strategy="inner"), launch.watch_autotuned() as seen:
        generated.sum(x, -1)
    kept = [(c.kwargs["BLOCK_K"], c.kwargs["BLOCK_R"], c.num_warps)
            for c in launch.pruned_configs(*seen[0])]
    first = kept[0]
    tried = []
    run = kernel.fn.run

    def first_too_large(*args, **kwargs):
        tiles = (kwargs["BLOCK_K"], kwargs["BLOCK_R"], kwargs["num_warps"])
        tried.append(tiles)
        if tiles == first:
            raise triton.runtime.OutOfResources(300000, 232448, "shared memory")
        return run(*args, **kwargs)

    monkeypatch.setattr(kernel.fn, "run", first_too_large)
    with runtime.override(strategy="inner"):
        torch.testing.assert_close(generated.sum(x, -1), x.sum(-1), rtol=1e-4, atol=1e-3)
        assert tried == [first, next(t for t in kept if t != first)]
        # forced, the config runs as asked or fails (the tests and specgen tune time that one)
        with runtime.override(config=0), pytest.raises(triton.runtime.OutOfResources):
            generated.sum(x, -1)

    def nothing_fits(*args, **kwargs):
        raise triton.runtime.OutOfResources(300000, 232448, "shared memory")

    # where no config fits, Triton's error reaches the caller, saying so (a shape of its own:
    # the calls above recorded a replay of theirs)
    monkeypatch.setattr(kernel.fn, "run", nothing_fits)
    with runtime.override(strategy="inner"), pytest.raises(triton.runtime.OutOfResources) as error:
        generated.sum(torch.randn(16, 16000), -1)
    assert "no config its prune keeps fits" in "".join(error.value.__notes__)


def test_stand_ins_copy_each_layout_and_keep_one_tensor_one():
    # a traced launch is tuned on stand-ins (launch.tune_on_stand_ins): real tensors laid out as
    # the tracer's fake ones, so that the kernel reads and writes what the real launch would
    from torch._subclasses.fake_tensor import FakeTensorMode, is_fake
    launch_module = importlib.import_module("specgen.runtime.launch")
    sources = (torch.randn(5, 7)[1:, 2:].t(),        # transposed, with a storage offset
               torch.randn(7)[None].expand(3, 7),      # a broadcast (stride-0) dim
               torch.zeros(4, dtype=torch.int64),      # indices: zeros, so reads stay in range
               torch.empty(0, 3)[:, 1:])               # no elements, still an offset
    mode = FakeTensorMode()
    fakes = [mode.from_tensor(t) for t in sources]
    made = {}
    reals = [launch_module.stand_in(t, made) for t in fakes]
    assert launch_module.stand_in(fakes[0], made) is reals[0], "one tensor passed twice"
    for fake, real in zip(fakes, reals):
        assert not is_fake(real)
        assert (real.shape, real.stride(), real.storage_offset(), real.dtype, real.device) == \
            (fake.shape, fake.stride(), fake.storage_offset(), fake.dtype, fake.device)
    assert reals[0].isfinite().all() and (reals[0] != 0).all(), "random floats, never zeros"
    assert (reals[2] == 0).all()
    # nothing to tune on where the launch cannot be repeated on a GPU
    kernel = importlib.import_module("generated.sum").inner_kernel
    assert not launch_module.tune_on_stand_ins(kernel, (1,), reals, {}, ("key",))


def test_an_op_named_as_a_shipped_one_is_refused_at_import(authored):
    # authored packages share the specgen:: namespace with generated/: a second registration of
    # specgen::relu would replace the shipped one in silence (torch.compile calls it)
    text = open(Path(__file__).parents[1] / "specs" / "relu.toml").read()
    text = text.replace('reference = "torch.relu(x)"', 'reference = "torch.relu(x) * 2"')
    text = text.replace('out = "relu(x)"', 'out = "relu(x) * 2"')
    with pytest.raises(ImportError, match=r"relu: the operator specgen::relu is already "
                                          r"registered by generated\.relu"):
        authored(text)
    x = _x(3, 5)
    torch.testing.assert_close(torch.ops.specgen.relu(x), torch.relu(x))


def _meta(*shape, dtype=torch.float32):
    return torch.empty(*shape, dtype=dtype, device="meta")


@pytest.mark.parametrize("name, call", [
    ("add", lambda f, m: f(m(3, 4), m(4))),
    ("gelu", lambda f, m: f(m(3, 4).t())),
    ("sum", lambda f, m: f(m(3, 4, 5), (0, 2))),
    ("argmax", lambda f, m: f(m(3, 4), 1)),
    ("softmax", lambda f, m: f(m(4, 3), 0)),
    ("softmax", lambda f, m: f(m(2, 300000), -1)),     # the split strategy's two launches
    ("logsumexp", lambda f, m: f(m(3, 4), 1)),
    ("layer_norm", lambda f, m: f(m(3, 4), [4], m(4), m(4))),
    ("rms_norm", lambda f, m: f(m(3, 4).t(), [3])),
    ("cross_entropy", lambda f, m: f(m(3, 4), m(3, dtype=torch.long))),
    ("mm", lambda f, m: f(m(3, 4), m(4, 5))),
    ("matmul", lambda f, m: f(m(2, 3, 4), m(4, 5))),
    ("bmm", lambda f, m: f(m(2, 3, 4), m(2, 4, 5))),
])
def test_meta_tensors_give_meta_results_as_torch_does(name, call):
    # nothing launches: the outputs' shapes, dtypes and strides are the call's result, as from
    # torch's meta kernels (the third call is a replay of the second's recording)
    torch_functions = {"add": torch.add, "gelu": torch.nn.functional.gelu, "sum": torch.sum,
                       "argmax": torch.argmax, "softmax": torch.softmax,
                       "logsumexp": torch.logsumexp, "layer_norm": torch.nn.functional.layer_norm,
                       "rms_norm": torch.nn.functional.rms_norm,
                       "cross_entropy": torch.nn.functional.cross_entropy, "mm": torch.mm,
                       "matmul": torch.matmul, "bmm": torch.bmm}
    want = call(torch_functions[name], _meta)
    for _ in range(3):
        got = call(getattr(generated, name), _meta)
        assert (got.device.type, got.shape, got.dtype, got.stride()) == \
            ("meta", want.shape, want.dtype, want.stride())


@pytest.mark.skipif(not runtime.interpreting(), reason="the interpreter's error: the GPU tier compiles")
@pytest.mark.parametrize("function", [lambda x: generated.add(x, x),
                                      # dynamo traces the number's wrapping up to the launch
                                      lambda x: generated.mul(generated.add(x, 2.5), 3)],
                         ids=["tensors", "a number"])
def test_compiling_under_the_interpreter_is_a_clear_error(function):
    compiled = torch.compile(function, backend="eager", fullgraph=True)
    try:
        with pytest.raises(Exception, match="torch.compile of specgen ops needs a GPU"):
            compiled(_x(3, 5))
    finally:
        torch._dynamo.reset()


INTEGER_LITERALS = """
[op]
name = "test_step_and_square"
family = "pointwise"
reference = "(torch.where(x > 0, 1.0, 0.0).to(x.dtype), torch.where(x > 0, 100000.0, 0.0) * 100000)"

[args]
x = "tensor"

[compute]
step = "where(x > 0, 1, 0)"
big = "where(x > 0, 100000, 0) * 100000"
"""


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_integer_literals_compute_in_float32(authored, dtype):
    # as int32, step was stored as its bits into a bfloat16 output (9e-41 for 1) and big wrapped
    module = authored(INTEGER_LITERALS)
    x = _x(4, 8, dtype=dtype)
    step, big = module.test_step_and_square(x)
    positive = x.double() > 0
    testing.assert_matches(step, positive.double(), "step")
    testing.assert_matches(big, positive.double() * 1e10, "big")


def test_the_compiled_public_functions_bind_only_reserved_names():
    # a spec argument named as a local of the public function that runtime/op.py compiles would
    # be overwritten there: every such local is reserved (PUBLIC_FUNCTION_NAMES)
    import ast
    from specgen.families.contract import PUBLIC_FUNCTION_NAMES
    from specgen.runtime.op import _public_source
    for name, info in generated.REGISTRY.items():
        op = sys.modules[info.function.__module__].OP
        tree = ast.parse(_public_source(op.description, op.family))
        function = tree.body[0]
        params = {a.arg for a in function.args.args + function.args.kwonlyargs}
        bound = {n.id for n in ast.walk(function) if isinstance(n, ast.Name)
                 and isinstance(n.ctx, ast.Store)}
        assert bound - params <= PUBLIC_FUNCTION_NAMES, (name, sorted(bound - params))

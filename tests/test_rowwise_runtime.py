"""Row-wise ops at launch: argument errors before any launch, the strategy a launch takes, the
(rows, N) view of odd layouts, and torch's edge cases (empty rows, 0-dim inputs, -inf rows)."""

import importlib
import math
import random

import numpy
import pytest
import torch
import torch.nn.functional as F

import generated
from specgen import runtime, testing
from specgen.runtime import rowwise
from specgen.runtime.launch import _tuned as tuned_configs
from specgen.runtime.launch import multiprocessors
from specgen.runtime.layout import dense_strides
from specgen.testing import device


def randn(*shape, dtype=torch.float32):
    return torch.randn(*shape, dtype=dtype, device=device())


@pytest.mark.parametrize("call, error, words", [
    (lambda x: generated.softmax(x, 2), IndexError, "argument 'dim' is 2, out of range"),
    (lambda x: generated.softmax(x, 1.0), TypeError, "argument 'dim' must be int"),
    # an int takes a 0-dim tensor only (torch's too); an int list takes one element, not two
    (lambda x: generated.softmax(x, torch.tensor([1])), TypeError, "argument 'dim' must be int"),
    (lambda x: generated.logsumexp(x, torch.tensor([0, 1])), TypeError,
     "'dim' must be an int or a sequence of ints, got Tensor"),
    (lambda x: generated.logsumexp(x, [1, -1]), RuntimeError,
     "'dim' names dim 1 more than once"),
    (lambda x: generated.logsumexp(x, []), ValueError, "argument 'dim' names no dim"),
    (lambda x: generated.logsumexp(x, 1.5), TypeError, "'dim' must be an int or a sequence"),
    (lambda x: generated.logsumexp(x, 1, 1), TypeError, "argument 'keepdim' must be bool"),
    (lambda x: generated.logsumexp(x, 1, numpy.bool_(True)), TypeError,
     "argument 'keepdim' must be bool, got numpy.bool"),
    (lambda x: generated.softmax(x, 1, "float32"), TypeError,
     "argument 'dtype' must be a torch.dtype or None"),
    (lambda x: generated.log_softmax(x, 1, torch.complex64), TypeError,
     "argument 'dtype' is torch.complex64; supported: float16, bfloat16, float32, float64"),
    (lambda x: generated.softmax(x.tolist()), TypeError, "argument 'x' must be a torch.Tensor"),
    (lambda x: generated.softmax(x.to(torch.complex64)), TypeError,
     "argument 'x' has dtype torch.complex64"),
    (lambda x: generated.layer_norm(x, [4]), ValueError,
     "argument 'normalized_shape' is [4], but the input's trailing dims are [5]"),
    (lambda x: generated.layer_norm(x, []), ValueError, "'normalized_shape' must have at least one"),
    (lambda x: generated.layer_norm(x, "5"), TypeError, "'normalized_shape' must be an int or a"),
    (lambda x: generated.layer_norm(x, (5.0,)), TypeError,
     "'normalized_shape' must be an int or a sequence of ints, but found element of type float "
     "at pos 0"),
    (lambda x: generated.layer_norm(x, 5, randn(4)), ValueError,
     "argument 'weight' has shape (4,), expected (5,)"),
    (lambda x: generated.rms_norm(x, [5], None, "1e-6"), TypeError, "argument 'eps' must be float"),
    (lambda x: generated.add_rms_norm(x, randn(5), randn(5)), ValueError,
     "argument 'residual' has shape (5,), expected the shape of 'x' (3, 5)"),
])
def test_bad_arguments(call, error, words):
    with runtime.record_launches() as launches, pytest.raises(error) as info:
        call(randn(3, 5))
    assert words in str(info.value)
    assert launches == [], "errors come before any launch"


def test_forcing_online_without_the_pattern_is_an_error():
    with runtime.override(strategy="online"), pytest.raises(ValueError) as info:
        generated.layer_norm(randn(3, 5), [5])
    assert "strategy 'online' is not available" in str(info.value)


def test_forcing_single_on_very_long_rows_is_an_error():
    with runtime.override(strategy="single"), runtime.record_launches() as launches, \
            pytest.raises(ValueError) as info:
        generated.softmax(torch.empty(2, (1 << 16) + 1, device=device()))
    assert "rows of 65537 elements are longer than 65536" in str(info.value)
    assert launches == []


@pytest.mark.parametrize("strategy", ["single", "looped", "online", "split"])
def test_forced_strategy_is_the_one_launched(strategy):
    x = randn(3, 40)
    with runtime.override(strategy=strategy), runtime.record_launches() as launches:
        out = generated.softmax(x, -1)
    assert [launch.kernel for launch in launches] == [strategy]
    # the kernels started, not only the plan's choice
    started = {"split": ["_softmax_split0_kernel", "_softmax_split_out_kernel"]}
    assert launches[0].kernels == started.get(strategy, [f"_softmax_{strategy}_kernel"])
    torch.testing.assert_close(out, torch.softmax(x, -1))


def test_a_kernel_counts_to_its_own_ops_launch():
    # cross_entropy checks its targets with a kernel before its loss's launch decision (in
    # validating mode, which this test runs under): that kernel must not be counted to the
    # softmax launched before it
    x = randn(3, 40)
    with runtime.validating(), runtime.record_launches() as launches:
        generated.softmax(x, -1)
        generated.cross_entropy(x, torch.tensor([0, 5, 39], device=x.device))
    assert launches[0].op == "softmax"
    assert launches[0].kernels == ["_softmax_single_kernel"]
    assert all(k.startswith("_cross_entropy") for launch in launches[1:] for k in launch.kernels)
    # the check is a launch decision of its own, with its kernel
    assert (launches[1].op, launches[1].kernel, launches[1].kernels) == (
        "cross_entropy", "targets", ["_cross_entropy_targets_kernel"])


@pytest.mark.parametrize("strategy", ["single", "looped", "online"])
@pytest.mark.parametrize("rows, n", [(4, 64), (3, 64), (4, 40), (1, 1)])
def test_whole_tiles_take_constant_masks(strategy, rows, n):
    # rows and row lengths that the tiles divide (masks folded to constants: M_ALIGN, N_ALIGN)
    # and ones they do not (the interpreter's tiles: 2 rows, 16-wide chunks)
    assert rowwise.alignment(64, 16) == 16 and rowwise.alignment(40, 1 << 16) == 8
    assert rowwise.alignment(0, 16) == 0
    x = randn(rows, n)
    weight = randn(n)
    with runtime.override(strategy=strategy):
        out = generated.softmax(x, -1)
        normed = generated.rms_norm(x, [n], weight) if strategy != "online" else None
    torch.testing.assert_close(out, torch.softmax(x, -1))
    if normed is not None:  # rms_norm has no online form (no max step)
        torch.testing.assert_close(normed, F.rms_norm(x, [n], weight))


@pytest.mark.parametrize("strategy", ["single", "looped", "online"])
def test_kernels_loop_over_rows_only_on_a_capped_grid(strategy):
    # a program per block of rows (no row loop), or a grid capped below the blocks that walks
    # them (ROW_LOOP). The single tile holds 16 rows of 40, so 20 rows are two blocks: two
    # programs cover them without a loop; a chunked kernel's plan counts rows (its BLOCK_M is the
    # autotuner's), so it loops
    x = randn(20, 40)
    for knobs, loops in (({}, False),
                         ({"launch": "persistent", "max_programs": 2}, strategy != "single"),
                         ({"launch": "persistent", "max_programs": 1}, True)):
        with runtime.override(strategy=strategy, **knobs), runtime.record_launches() as launches:
            out = generated.log_softmax(x, -1)
        assert [launch.details["row_loop"] for launch in launches] == [loops], knobs
        torch.testing.assert_close(out, torch.log_softmax(x, -1))


def _space(x, reduced, *elements):
    """The planner's (rows, N) view of ``x`` and its element-wise operands."""
    return rowwise.space_of("op", tuple(x.shape), reduced, [t.stride() for t in elements], [], [])


def test_strided_rows_are_told_from_rows_along_the_fast_dim():
    def kept(x, reduced):
        out = torch.empty(x.shape, device=device())
        space = _space(x, reduced, out, x)
        return rowwise.kept_layout(space, 1)
    x = randn(40, 48)
    assert kept(x, (0,)) and not kept(x, (1,))
    assert kept(randn(3, 40, 48), (1,)) and kept(randn(3, 40, 48), (0, 1))
    assert not kept(randn(3, 40, 48), (2,)) and not kept(randn(3, 40, 48), (0, 2))
    assert kept(x.t(), (1,))                         # a transposed x over its last dim
    assert not kept(x[:, ::2], (0,))                 # rows 2 apart: no run to read
    assert not kept(randn(1, 48), (0,))              # rows of one element


def kept_tile(launch):
    """The tile the planner gives strided rows for a logged launch (kept_config)."""
    return rowwise.kept_config(launch.details["rows"], launch.details["n"], launch.kernel,
                               multiprocessors(torch.device(device())))


# strided rows (the reduced dim strided, the kept one contiguous), several row blocks and chunks
# with ragged ends; (shape, dim) and the strategy auto takes for each
STRIDED = [((45, 20), 0, "single"), ((600, 20), 0, "online"), ((3, 45, 21), 1, "single"),
           ((2, 600, 11), 1, "online")]


@pytest.mark.parametrize("shape, dim, auto", STRIDED)
@pytest.mark.parametrize("strategy", [None, "single", "looped", "online"])
def test_strided_rows_take_many_rows_a_program(shape, dim, auto, strategy):
    x = randn(*shape) * 3
    x.select(dim, 1).fill_(-math.inf)           # one row all -inf (NaN in torch), one partly
    x.select(dim, 4).select(0, 0).fill_(-math.inf)
    x.requires_grad_()
    grad_y = randn(*shape)
    x64 = x.detach().double().requires_grad_()
    for ours, theirs in ((generated.softmax, torch.softmax),
                         (generated.log_softmax, torch.log_softmax)):
        with runtime.override(strategy=strategy, poison=True), \
                runtime.record_launches() as launches:
            y = ours(x, dim)
            grad, = torch.autograd.grad(y, x, grad_y)
        # the forward and its derived backward op, each on tiles of many rows
        assert [launch.op for launch in launches] == [ours.__name__, f"{ours.__name__}_backward"]
        for launch in launches:
            assert launch.kernel == (strategy or auto), launch
            assert launch.details["tile"] == kept_tile(launch), launch
        want = theirs(x64, dim)
        want_grad, = torch.autograd.grad(want, x64, grad_y.double())
        testing.assert_matches(y, want, f"{ours.__name__} over strided rows")
        testing.assert_matches(grad, want_grad, f"{ours.__name__} backward over strided rows")


@pytest.mark.parametrize("strategy", [None, "single", "looped"])
def test_strided_rows_keep_per_row_and_column_outputs(strategy):
    # logsumexp's value a row (stored along the contiguous kept axis), and layer_norm over a
    # transposed input, whose backward sums the weight's and bias's gradients over the rows
    x = randn(300, 37)
    with runtime.override(strategy=strategy, poison=True), runtime.record_launches() as launches:
        lse = generated.logsumexp(x, 0)
    assert launches[0].details["tile"] == kept_tile(launches[0])
    testing.assert_matches(lse, torch.logsumexp(x.double(), 0), "logsumexp over strided rows")
    xt = randn(300, 20).t().requires_grad_()       # (20, 300), rows contiguous
    weight, bias = randn(300).requires_grad_(), randn(300).requires_grad_()
    grad_y = randn(20, 300)
    with runtime.override(strategy=strategy, poison=True), runtime.record_launches() as launches:
        out = generated.layer_norm(xt, [300], weight, bias)
        grads = torch.autograd.grad(out, (xt, weight, bias), grad_y)
    assert [launch.op for launch in launches] == ["layer_norm", "layer_norm_backward"]
    assert all(launch.details["tile"] == kept_tile(launch) for launch in launches), launches
    inputs64 = [t.detach().double().requires_grad_() for t in (xt, weight, bias)]
    want = F.layer_norm(inputs64[0], [300], inputs64[1], inputs64[2])
    testing.assert_matches(out, want, "layer_norm over strided rows")
    for got, expected, name in zip(grads, torch.autograd.grad(want, inputs64, grad_y.double()),
                                   ("x", "weight", "bias")):
        testing.assert_matches(got, expected, f"layer_norm backward over strided rows: {name}")


@pytest.mark.parametrize("op", ["softmax", "log_softmax", "logsumexp", "layer_norm", "rms_norm",
                                "add_rms_norm"])
def test_a_split_row_combines_several_programs_partials(op):
    # 16-wide chunks with splits planned for them: a 70-element row takes five programs, whose
    # partials (max and sum, mean and M2, sums of squares) the second stage combines; the
    # backward runs its derived op split the same way. An all -inf row and scattered ones for the
    # exp family, whose partials are -inf where a program saw only those
    x = (torch.rand(3, 70, dtype=torch.float64) * 6 - 3).to(device())
    if op in ("softmax", "log_softmax", "logsumexp"):
        x[0] = -math.inf
        x[1, ::7] = -math.inf
    residual, weight = randn(3, 70).double(), randn(70).double()
    # each op as ours and as torch's, on x of either
    calls = {"softmax": (lambda x: generated.softmax(x, -1), lambda x: torch.softmax(x, -1)),
             "log_softmax": (lambda x: generated.log_softmax(x, -1),
                             lambda x: torch.log_softmax(x, -1)),
             "logsumexp": (lambda x: generated.logsumexp(x, -1), lambda x: torch.logsumexp(x, -1)),
             "layer_norm": (lambda x: generated.layer_norm(x, [70], weight.float()),
                            lambda x: F.layer_norm(x, [70], weight)),
             "rms_norm": (lambda x: generated.rms_norm(x, [70], weight.float(), 1e-6),
                          lambda x: F.rms_norm(x, [70], weight, 1e-6)),
             "add_rms_norm": (lambda x: generated.add_rms_norm(x, residual.float(),
                                                              weight.float())[1],
                              lambda x: F.rms_norm(x + residual, [70], weight, 1e-6))}
    ours, theirs = calls[op]
    x32 = x.float().requires_grad_()
    with runtime.override(strategy="split", config=0, split_chunk=16), \
            runtime.record_launches() as launches:
        y = ours(x32)
        grad_y = randn(*y.shape)
        grad, = torch.autograd.grad(y, x32, grad_y)
    assert launches[0].details["splits"] == 5, launches[0]
    if op != "logsumexp":  # (its backward is its reference's: no derived op)
        assert any(launch.op == f"{op}_backward" and launch.details["splits"] == 5
                   for launch in launches), [(launch.op, launch.details) for launch in launches]
    x64 = x.requires_grad_()
    want = theirs(x64)
    testing.assert_matches(y, want, f"{op} split")
    want_grad, = torch.autograd.grad(want, x64, grad_y.double())
    testing.assert_matches(grad, want_grad, f"{op} split backward")


def test_auto_strategy_and_int64():
    x = randn(4, 33)
    with runtime.record_launches() as launches:
        generated.rms_norm(x, [33])
    with runtime.override(indexing="int64"), runtime.record_launches() as wide:
        out = generated.rms_norm(x, [33])
    assert [(launch.kernel, launch.index_bits) for launch in launches] == [("single", 32)]
    assert [(launch.kernel, launch.index_bits) for launch in wide] == [("single", 64)]
    torch.testing.assert_close(out, F.rms_norm(x, [33]))


def test_forced_int32_names_the_tensor_too_large_for_it():
    x = torch.empty(2**16, 2**16, dtype=torch.bfloat16, device="meta")
    with runtime.override(indexing="int32"), pytest.raises(
            ValueError, match=r"softmax: indexing is forced to int32, but 'out' spans 4,294,967,296"):
        generated.softmax(x, -1)


@pytest.mark.parametrize("dtype", [
    torch.float16,
    pytest.param(torch.bfloat16, marks=pytest.mark.skipif(
        runtime.interpreting(), reason="the interpreter rounds float32 to bfloat16 toward zero "
        "(torch and the GPU round to nearest): the GPU tier runs this case")),
])
@pytest.mark.parametrize("strategy", ["single", "looped", "online", "split"])
def test_dtype_casts_the_input_before_the_op(strategy, dtype):
    """softmax and log_softmax with dtype= (narrower than x, then wider) against torch's rule."""
    # values near 256, where bfloat16 keeps only even numbers and float16 quarters: the result
    # for the cast input differs from the one for the float32 input by far more than an ulp
    x = 256 + 0.3 * torch.arange(2 * 37, dtype=torch.float32, device=device()).reshape(2, 37)
    ulp = {torch.float16: 2**-10, torch.bfloat16: 2**-7}[dtype]
    with runtime.override(strategy=strategy):
        for op, ref in ((generated.softmax, torch.softmax),
                        (generated.log_softmax, torch.log_softmax)):
            out = op(x, -1, dtype=dtype)
            assert out.dtype == dtype
            # within an ulp (of the result's dtype) of the cast input's exact result...
            torch.testing.assert_close(out.double(), ref(x.to(dtype).double(), -1), rtol=ulp,
                                       atol=1e-6)
            # ...and far from the uncast input's
            assert not torch.allclose(out.double(), ref(x.double(), -1), rtol=4 * ulp,
                                      atol=1e-6), "x was not cast"
            # a wider dtype keeps every input bit
            wide = op(x.to(dtype), 0, dtype=torch.float32)
            assert wide.dtype == torch.float32
            torch.testing.assert_close(wide, ref(x.to(dtype).double(), 0).float())


@pytest.mark.parametrize("strategy", ["single", "looped", "online", "split"])
def test_a_float64_input_is_cast_to_float16_as_torch_casts_it(strategy):
    """softmax(x, dtype=float16) of float64 data: torch converts each value through float32,
    rounding twice. 1024.5 + 2**-30 rounds to 1025 directly, but to the float32 1024.5 first,
    a tie the second rounding takes to the even 1024: so torch's softmax over (that, 1024) is
    (0.5, 0.5), and (0.73, 0.27) from the direct conversion."""
    x = torch.tensor([[1024.5 + 2**-30, 1024.0]] * 3, dtype=torch.float64, device=device())
    with runtime.override(strategy=strategy):
        for op, ref in ((generated.softmax, torch.softmax),
                        (generated.log_softmax, torch.log_softmax)):
            expected = ref(x, -1, dtype=torch.float16)
            assert expected[0, 0].item() == expected[0, 1].item()  # the case is as described
            torch.testing.assert_close(op(x, -1, dtype=torch.float16), expected)


def test_edge_cases_match_torch():
    empty_rows = randn(3, 0)
    torch.testing.assert_close(generated.logsumexp(empty_rows, 1), torch.logsumexp(empty_rows, 1))
    assert generated.softmax(empty_rows, 1).shape == (3, 0)
    scalar = randn(())
    torch.testing.assert_close(generated.softmax(scalar, 0), torch.softmax(scalar, 0))
    torch.testing.assert_close(generated.logsumexp(scalar, -1), torch.logsumexp(scalar, -1))
    cube = randn(3, 4, 5).transpose(0, 2)
    for strategy in ["single", "looped", "online", "split"]:
        with runtime.override(strategy=strategy):
            torch.testing.assert_close(generated.logsumexp(cube, (0, 2)),
                                       torch.logsumexp(cube, (0, 2)))
            # keepdim: the reduced dims stay as 1s, strides as torch's
            kept = generated.logsumexp(cube, (0, 2), keepdim=True)
            torch.testing.assert_close(kept, torch.logsumexp(cube, (0, 2), keepdim=True))
            assert kept.stride() == torch.logsumexp(cube, (0, 2), keepdim=True).stride()
    rows = randn(6, 37)                      # 37: several 16-wide chunks under the interpreter
    rows[0] = -math.inf
    rows[1, :3] = -math.inf
    rows[2, 20] = math.inf                   # torch: softmax NaN, logsumexp inf
    rows[3, 5], rows[3, 30] = math.inf, -math.inf
    rows[4, 33] = math.nan                   # NaN everywhere, logsumexp too
    for strategy in ["single", "looped", "online", "split"]:
        with runtime.override(strategy=strategy):
            torch.testing.assert_close(generated.softmax(rows, 1), torch.softmax(rows, 1),
                                       equal_nan=True)
            torch.testing.assert_close(generated.log_softmax(rows, 1),
                                       torch.log_softmax(rows, 1), equal_nan=True)
            torch.testing.assert_close(generated.logsumexp(rows, 1), torch.logsumexp(rows, 1),
                                       equal_nan=True)


def test_row_space_collapses_and_splits_dims():
    x = randn(6, 4, 5).permute(2, 1, 0)             # (5, 4, 6), strides (1, 5, 20)
    out = torch.empty(x.shape, device=device())
    space = _space(x, (1, 2), out, x)
    assert (space.rows, space.n) == (5, 24)
    # (4, 6) is one dense block in each tensor, but in opposite orders: two reduced dims,
    # fastest (in the output) first
    assert space.col_dims == 2 and space.row_dims == 1
    assert space.elem_cols == ((1, 6, 0), (20, 5, 0))
    merged = randn(4, 6, 5).permute(2, 0, 1)        # strides (1, 30, 5): (4, 6) merges
    assert _space(merged, (1, 2), out, merged).col_dims == 1
    dense = randn(2, 3, 4, 5)
    space = _space(dense, (3,), dense)
    assert (space.rows, space.row_dims, space.col_dims) == (24, 1, 1)


@pytest.mark.parametrize("strategy", ["single", "looped"])
def test_four_row_dims_that_do_not_merge(strategy):
    # every other element of each of four row dims: no two merge, so the kernels walk all
    # ROW_RANK of them (the property suite's shapes leave at most three)
    x = randn(6, 4, 8, 6, 9)[::2, ::2, ::2, ::2]    # (3, 2, 4, 3, 9)
    out = torch.empty(x.shape, device=device())
    space = _space(x, (4,), out, x)
    assert space.row_dims == rowwise.ROW_RANK == 4
    with runtime.override(strategy=strategy, config=0):
        got = generated.softmax(x, -1)
        normed = generated.rms_norm(x, [9])
    testing.assert_matches(got, torch.softmax(x.double(), -1), "softmax over 4 row dims")
    testing.assert_matches(normed, F.rms_norm(x.double(), [9]), "rms_norm over 4 row dims")


def test_layer_norm_over_dims_that_do_not_merge():
    x = randn(6, 4, 5).permute(2, 1, 0)
    weight, bias = randn(4, 6), randn(4, 6)
    for strategy in ["single", "looped", "split"]:
        with runtime.override(strategy=strategy):
            out = generated.layer_norm(x, [4, 6], weight, bias)
        torch.testing.assert_close(out, F.layer_norm(x, [4, 6], weight, bias),
                                   atol=2e-5, rtol=1e-5)
        assert out.is_contiguous()


FUSED = """
[op]
name = "test_norm_with_stats"
family = "rowwise"
# the reduced dim moved last, where bias broadcasts along it
reference = '''(torch.rsqrt(torch.var(x, dim, unbiased=False) + 0.001),
    torch.movedim(F.layer_norm(torch.movedim(x, dim, -1), (x.shape[dim],), eps=0.001)
                  + torch.softmax(torch.movedim(x, dim, -1) + bias, -1), -1, dim),
    torch.logsumexp(torch.movedim(x, dim, -1) + bias, -1),
    torch.mean(x, dim) - torch.amin(x, dim))'''

[args]
x = "tensor"
bias = "tensor"
dim = "int"

[rows]
tensor = "x"
dim = "dim"
along = ["bias"]

[reduce]
max = { op = "max", of = "x + bias" }
sum = { op = "sum", of = "exp(x + bias - max)" }
low = { op = "min", of = "x" }
mean = { op = "sum", of = "x", scale = "1 / N" }
var = { op = "sum", of = "(x - mean) * (x - mean)", scale = "1 / N" }

[compute]
rstd = "rsqrt(var + 0.001)"
out = "(x - mean) * rstd + exp(x + bias - max) / sum"
lse = "max + log(sum)"
spread = "mean - low"
"""


def test_an_authored_op_with_per_row_outputs(authored):
    """Element-wise and per-row outputs together, every step kind, in every strategy."""
    module = authored(FUSED)
    x = randn(6, 3, 7).permute(1, 2, 0)                 # (3, 7, 6): reduce the middle dim
    bias = randn(7)
    x64, b64 = x.double(), bias.double().view(1, 7, 1)
    shifted = x64 + b64
    mean = x64.mean(1)
    rstd = torch.rsqrt(x64.var(1, unbiased=False) + 0.001)
    expected = (rstd, (x64 - mean.unsqueeze(1)) * rstd.unsqueeze(1) + torch.softmax(shifted, 1),
                torch.logsumexp(shifted, 1), mean - x64.amin(1))
    for r, e in zip(module.reference(x64, bias.double(), 1), expected):
        torch.testing.assert_close(r, e)
    assert module.STRATEGIES == ("single", "looped", "online", "split")
    for strategy in module.STRATEGIES:
        with runtime.override(strategy=strategy):
            actual = module.test_norm_with_stats(x, bias, 1)
        assert [tuple(a.shape) for a in actual] == [(3, 6), (3, 7, 6), (3, 6), (3, 6)]
        for a, e in zip(actual, expected):
            torch.testing.assert_close(a.double(), e, rtol=1e-4, atol=1e-5)


NORMALIZE = """
[op]
name = "test_normalize_rows"
family = "rowwise"
reference = "F.normalize(x, dim=dim)"

[args]
x = "tensor"
dim = "int"

[rows]
tensor = "x"
dim = "dim"
layout = "elementwise"

[reduce]
ss = { op = "sum", of = "x * x" }

[compute]
out = "x / maximum(sqrt(ss), 1e-12)"
"""


def test_an_element_wise_layout_follows_the_input_as_the_composite_does(authored):
    """[rows] layout = "elementwise": F.normalize (x / norm) lays its result out like x, where
    torch's softmax and norm kernels (the default layout) return contiguous results."""
    module = authored(NORMALIZE)
    x = randn(5, 3, 4).permute(2, 0, 1)
    expected = F.normalize(x, dim=1)
    assert expected.stride() == x.stride() != expected.contiguous().stride()
    for strategy in module.STRATEGIES:
        with runtime.override(strategy=strategy):
            out = module.test_normalize_rows(x, 1)
        torch.testing.assert_close(out, expected)
        assert out.stride() == expected.stride(), strategy
    assert generated.softmax(x, 1).is_contiguous()


def test_rms_norm_keeps_channels_last_as_torch_does():
    """torch's rms_norm returns its input's suggested memory format (CPU and CUDA alike);
    layer_norm and softmax return contiguous results."""
    for x, kept in [(randn(2, 4, 5, 3).permute(0, 3, 1, 2), True),               # channels_last
                    (randn(2, 4, 10, 3).permute(0, 3, 1, 2)[..., ::2], True),    # like it, not dense
                    (randn(2, 4, 5, 6, 3).permute(0, 4, 1, 2, 3), True),         # channels_last_3d
                    (randn(5, 3, 4).permute(2, 0, 1), False)]:                   # contiguous result
        weight, residual = randn(x.shape[-1]), randn(x.shape)
        out = generated.rms_norm(x, (x.shape[-1],), weight)
        expected = F.rms_norm(x, (x.shape[-1],), weight)
        assert expected.is_contiguous() != kept, "torch's rule this test stands on"
        torch.testing.assert_close(out, expected)
        assert out.stride() == expected.stride()
        hidden, out = generated.add_rms_norm(x, residual, weight)
        expected = F.rms_norm(x + residual, (x.shape[-1],), weight, 1e-6)
        torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
        assert out.stride() == expected.stride()
        assert generated.layer_norm(x, (x.shape[-1],)).is_contiguous()


def test_add_rms_norm_takes_the_format_of_torchs_sum_where_size_1_dims_decide_it():
    """x + residual of one layout is laid out by TensorIterator's fast setup: of shape
    (1, 63, 5, 1) and strides (315, 1, 63, 1), both channels_last (size-1 dims' strides do not
    count), the sum is channels_last (strides (315, 1, 63, 63)), so torch's rms_norm of it is
    too; the general stride order alone keeps the last stride 1 and reads as contiguous. (A
    property-test draw found it.)"""
    x = randn(315).as_strided((1, 63, 5, 1), (315, 1, 63, 1))
    residual = randn(315).as_strided((1, 63, 5, 1), (315, 1, 63, 1))
    weight = randn(1)
    expected = F.rms_norm(x + residual, (1,), weight, 1e-6)
    assert not expected.is_contiguous(), "torch's rule this test stands on"
    hidden, out = generated.add_rms_norm(x, residual, weight)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    assert out.stride() == expected.stride()
    assert hidden.stride() == (x + residual).stride()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_rms_norm_eps_none_is_what_torch_computes(dtype):
    """torch's docs say eps=None is finfo(x.dtype).eps; its kernels take float32's for 16-bit
    inputs too (their math type). Rows of small values, where the two differ by 2x or more,
    against torch's own function at the same dtype, forward and backward."""
    generator = torch.Generator().manual_seed(0)
    x = (torch.randn(4, 16, generator=generator) * 1e-3).to(dtype).to(device())
    weight = torch.rand(16, generator=generator).to(dtype).to(device())
    grad_out = torch.randn(4, 16, generator=generator).to(dtype).to(device())
    results = []
    for f in (generated.rms_norm, F.rms_norm):
        leaf, w = x.clone().requires_grad_(), weight.clone().requires_grad_()
        out = f(leaf, [16], w)
        results.append((out, *torch.autograd.grad(out, (leaf, w), grad_out)))
    tolerance = {torch.float32: 1e-5}.get(dtype, 2e-2)
    for got, want in zip(*results):
        torch.testing.assert_close(got, want, rtol=tolerance, atol=tolerance)


def test_repeated_calls_reuse_the_launch_plan_and_the_tuned_config():
    x = randn(5, 40)
    for strategy in ["looped", "split"]:
        with runtime.override(strategy=strategy):
            first = generated.layer_norm(x, [40])
            plans, tuned = len(rowwise._plans), len(tuned_configs)
            second = generated.layer_norm(x.clone(), [40])        # cached plan, cached config
            assert (len(rowwise._plans), len(tuned_configs)) == (plans, tuned)
        torch.testing.assert_close(second, first)
        torch.testing.assert_close(first, F.layer_norm(x, [40]), atol=2e-5, rtol=1e-5)
    # the registered op (what torch.compile sees) computes the same through the dispatcher
    torch.testing.assert_close(torch.ops.specgen.softmax(x, 1), generated.softmax(x, 1))
    torch.testing.assert_close(torch.ops.specgen.logsumexp(x, [0]), torch.logsumexp(x, 0))


@pytest.mark.parametrize("strategy", ["single", "looped", "split"])
def test_a_constant_row_normalizes_to_the_bias_exactly(strategy):
    # the row's rounded sum misses its value by an ulp; rsqrt(var + eps) would scale that up
    # (0.3 off at 1234.567 with var ~ 0); the mean is corrected by the mean deviation from it
    n = 333
    x = torch.tensor([[2.5054], [-0.3141], [1234.567]], device=device()).expand(3, n)
    weight, bias = randn(n) * 3, randn(n)
    with runtime.override(strategy=strategy):
        out = generated.layer_norm(x, [n], weight, bias)
    torch.testing.assert_close(out, bias.expand(3, n), atol=0, rtol=0)


def test_one_pass_variance_is_exact_with_a_large_mean():
    # E[x^2] - E[x]^2 would lose every digit here (x^2 ~ 1e8, float32 ulp 8, variance 1)
    x = randn(3, 100) + 1e4
    expected = F.layer_norm(x.double(), [100])
    for strategy in ["looped", "split"]:
        with runtime.override(strategy=strategy):
            torch.testing.assert_close(generated.layer_norm(x, [100]).double(), expected,
                                       atol=5e-3, rtol=0)


@pytest.mark.parametrize("strategy", ["single", "looped"])
def test_a_programs_column_sums_keep_what_each_block_adds(strategy):
    # one program sums every row's grad_out into grad_bias. After the first row, each block of
    # rows (up to 128 of them) adds less than half an ulp of the running sum 2**20: a plain
    # float32 sum drops every such add (0.097 lost over 400 rows); a compensated one keeps them.
    # On a GPU the looped launch tunes here (a row length no other test takes): its timed trials
    # add to the same partials, which the autotuner must zero before the chosen config runs
    rows, n = 400, 72
    grad_out = torch.full((rows, n), 2.0**-12, device=device())
    grad_out[0] = 2.0**20
    x, weight, bias = randn(rows, n), randn(n), randn(n)
    with runtime.override(strategy=strategy, max_programs=1):
        grad_bias = generated.layer_norm_backward(x, weight, bias, grad_out, [n])[2]
    exact = 2.0**20 + (rows - 1) * 2.0**-12
    # float32's ulp there is 0.125: the sum must round to the nearest float32, as exact sums do
    assert (grad_bias.double() - exact).abs().max().item() <= 0.0625


def test_chunked_kernels_with_column_outputs_tune_on_zeroed_partials():
    # the GPU side of the test above, which the interpreter (it times no config) cannot show
    checked = []
    for name, info in generated.REGISTRY.items():
        module = importlib.import_module(f"generated.{name}")
        if info.family == "rowwise" and hasattr(module, f"_{name}_columns_kernel"):
            for kernel in (module.KERNELS[s] for s in ("looped", "online") if s in module.KERNELS):
                assert kernel.reset_to_zero == ["cols_ws_ptr"], name
            checked.append(name)
    assert {"layer_norm_backward", "rms_norm_backward"} <= set(checked)


def test_symbolic_sizes_get_computed_masks():
    # under torch.compile with dynamic shapes a size is a symbol: its factors are unknown (and
    # Inductor cannot print a bitwise and of one), so the masks stay computed
    from torch._dynamo.source import ConstantSource
    from torch.fx.experimental.symbolic_shapes import ShapeEnv
    env = ShapeEnv()
    n = env.create_symintnode(env.create_symbol(48, ConstantSource("n")), hint=48)
    assert rowwise.alignment(48, 16) == 16
    assert rowwise.alignment(n, 16) == 1


WEIGHTED = """
[op]
name = "test_weighted_rows"
family = "rowwise"
reference = "x * torch.rsqrt((x * x).sum(dim, keepdim=True) + 1) * w"  # w broadcasts: dim = -1

[args]
x = "tensor"
w = "tensor"
dim = "int"

[rows]
tensor = "x"
dim = "dim"
along = ["w"]

[reduce]
ss = { op = "sum", of = "x * x" }

[compute]
out = "x * rsqrt(ss + 1) * w"
"""


def test_a_0_dim_input_takes_a_0_dim_along_tensor(authored):
    # a 0-dim x is one row of one element: a tensor along it has the reduced shape, (), as the
    # property suite draws it (the runtime wanted (1,), which makes torch's x * w a (1,))
    module = authored(WEIGHTED)
    x, w = randn(()).requires_grad_(), randn(()).requires_grad_()
    out = module.test_weighted_rows(x, w, 0)
    x64, w64 = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    want = x64 * torch.rsqrt(x64 * x64 + 1) * w64
    assert out.shape == ()
    # float32 results against the float64 reference rounded to float32, at float32's tolerance
    # (compared as float64 they met float64's 1e-7, which a float32 rsqrt misses on some draws:
    # 5.4e-7 relative in a CPU run)
    torch.testing.assert_close(out, want.float())
    grads = torch.autograd.grad(out, (x, w))          # through the derived backward op
    want_grads = torch.autograd.grad(want, (x64, w64))
    assert [g.shape for g in grads] == [(), ()]
    for got, expected in zip(grads, want_grads):
        torch.testing.assert_close(got, expected.float())
    with pytest.raises(ValueError, match=r"argument 'w' has shape \(1,\), expected \(\)"):
        module.test_weighted_rows(x, randn(1), 0)


def _meta(shape, order=None, step=None):
    """A meta tensor of ``shape`` laid out in ``order`` (fastest dim first; contiguous when
    None), every ``step``-th element of a larger one along each dim where given."""
    full = tuple(s * (step or 1) for s in shape)
    order = list(range(len(shape)))[::-1] if order is None else order
    base = torch.empty_strided(full, dense_strides(full, order), device="meta")
    return base[tuple(slice(None, None, step) for _ in shape)] if step else base


def _plan(x, reduced, weight=True, per_row=False):
    """layer_norm's launch plan of ``x`` with its reduced dims (``per_row``: a per-row output
    beside the element-wise one, as a backward's statistics)."""
    spec = importlib.import_module("generated.layer_norm").LAUNCH
    out = torch.empty(x.shape, device="meta")
    along = [torch.empty(rowwise.column_shape(x, reduced), device="meta") if weight else None]
    row_outputs = [torch.empty(rowwise.row_shape(x, reduced), device="meta")] if per_row else []
    return rowwise.launch_plan("layer_norm", "auto", spec.strategies, "auto", spec.max_block,
                               spec.max_chunk, bool(row_outputs), x, reduced, [out, x], along,
                               row_outputs, ["out", "x", "weight"] + ["stat"] * per_row)


def test_plans_at_new_sizes_match_uncached_planning(monkeypatch):
    # a call at a new row count reuses the collapse of its reduced dims (cached on their sizes
    # and strides): the plan is the one planned from scratch, whatever the layout
    rng = random.Random(37)
    for _ in range(60):
        rank = rng.randint(1, 4)
        order = rng.sample(range(rank), rank)
        step = rng.choice([None, None, 2])
        reduced = tuple(range(rng.randint(1, rank) - 1, rank)) if rng.random() < 0.7 else \
            (rng.randrange(rank),)
        weight, per_row = rng.random() < 0.7, rng.random() < 0.5
        tail = [rng.choice([1, 3, 16, 40]) for _ in range(rank - 1)]
        for rows in rng.sample([0, 1, 2, 7, 64, 100, 1000], 4):
            x = _meta((rows, *tail), order, step)
            cached = _plan_or_error(x, reduced, weight, per_row)
            with monkeypatch.context() as patch:
                patch.setattr(rowwise, "_collapsed", rowwise._collapsed.__wrapped__)
                patch.setattr(rowwise, "_plans", {})
                fresh = _plan_or_error(x, reduced, weight, per_row)
            assert fresh == cached, (x.shape, x.stride(), reduced)


def _plan_or_error(*args):
    # (dims that do not merge into the kernels' ranks are refused, cached or not)
    try:
        return _plan(*args)
    except ValueError as error:
        return str(error)


def test_a_new_size_past_int32_takes_int64_after_cached_smaller_ones():
    small = _plan(_meta((8, 1024)), (1,))
    assert not small.index_64 and small.space.elem_cols[0][0] == 1
    # the same reduced dims (their collapse cached): 2**21 + 8 rows of 1024 pass 2**31 elements
    large = _plan(_meta((2**21 + 8, 1024)), (1,))
    assert large.index_64 and large.space.rows == 2**21 + 8
    assert large.space.elem_cols == small.space.elem_cols

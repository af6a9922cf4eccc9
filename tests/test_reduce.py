"""Reduce and cross_entropy beyond the registry-wide property test: planner and strategy choices,
argument errors, prod on signed values, and the cross-entropy gradient through autograd."""

import importlib
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import generated
from specgen import runtime, testing
from specgen.errors import SpecError
from specgen.families import reduce as reduce_family
from specgen.model import Source
from specgen.parse import parse_spec
from specgen.runtime import counters
from specgen.runtime import reduce as reduction

# the spec `specgen new --family reduce` writes: a sum of squares
SUM = reduce_family.scaffold("sumsq")


@pytest.fixture(autouse=True)
def on_test_device():
    """Tensors made here live where the tier runs kernels: CPU (interpreter) or CUDA."""
    with torch.device(testing.device()):
        yield


def parse(text):
    return parse_spec(text, Source("specs/bad.toml", "0" * 64, text))


@pytest.mark.parametrize("old, new, key, words", [
    ('combine = "sum"', 'combine = "median"', "reduce.combine", "expected one of sum, prod"),
    ('map = "x * x"', 'map = "y * y"', "reduce.map", "name 'y' is used but not declared"),
    ('map = "x * x"', 'finish = "acc / M"', "reduce.finish", "name 'M' is used but not declared"),
    ('map = "x * x"', 'map = "x * keepdim"', "reduce.map",
     "name 'keepdim' cannot be used here: a host argument"),
    ('map = "x * x"', 'finish = "acc / x"', "reduce.finish",
     "name 'x' cannot be used here: finish reads the reduced value acc and N"),
    ('combine = "sum"\nmap = "x * x"', 'combine = "argmax"\nmap = "x * x"', "reduce.map",
     "'argmax' returns an index: it takes no 'map'"),
    ('map = "x * x"', 'dim = "sometimes"', "reduce.dim", "expected one of optional, required"),
    ('x = "tensor"', 'x = "tensor"\ny = "tensor"', "args", "exactly one tensor argument"),
    ('x = "tensor"', 'x = "tensor"\nmode = { kind = "choice", values = ["a", "b"], default = "a" }',
     "args", "exactly one tensor argument, float, int and bool scalars"),
    ('map = "x * x"', 'map = "x * x"\nfinish = "acc * N * scale"', "reduce.finish",
     "name 'scale' is used but not declared"),
    ('x = "tensor"', 'x = "tensor"\nd = { kind = "dtype", optional = true }\n'
     'e = { kind = "dtype", optional = true }', "args", "at most one dtype argument"),
    ('x = "tensor"', 'x = "tensor"\nkeepdim = { kind = "dtype", optional = true }',
     "args.keepdim", "'keepdim' is the name of an argument the family adds"),
    ('map = "x * x"', 'map = "x"\n[tuning]\nINNER = [[3, 64]]', "tuning.INNER",
     "expected [kept, reduced] pairs of powers of two"),
    ('reference = "torch.sum(x * x, dim=dim, keepdim=keepdim)"', 'reference = "torch.sum(x, dims)"',
     "op.reference", "name 'dims' is used but not declared; a reference may use the arguments "
     "and dim, keepdim, torch, F, math, ref"),
    ('name = "sumsq"', 'name = "strided_offsets"', "op.name",
     "'strided_offsets' is the name of a reduce_lib helper"),
    ('name = "sumsq"', 'name = "sum_combine_f32"', "op.name", "reduce_lib helper"),
])
def test_reduce_spec_errors(old, new, key, words):
    assert old in SUM
    with pytest.raises(SpecError) as err:
        parse(SUM.replace(old, new, 1))
    assert str(err.value).startswith(f"specs/bad.toml: [{key}]: "), str(err.value)
    assert words in str(err.value), str(err.value)


def test_index_reductions_take_no_dtype():
    text = SUM.replace('map = "x * x"', "").replace('combine = "sum"', 'combine = "argmin"')
    text = text.replace('x = "tensor"', 'x = "tensor"\nd = { kind = "dtype", optional = true }')
    with pytest.raises(SpecError, match=r"^specs/bad.toml: \[args.d\]: 'argmin' returns an "
                                        r"int64 index: it takes no dtype argument"):
        parse(text)


def test_cross_entropy_spec_checks_signature():
    text = (Path(__file__).resolve().parent.parent / "specs" / "cross_entropy.toml").read_text()
    with pytest.raises(SpecError, match=r"\[args.ignore_index\]: expected an int, default -100"):
        parse(text.replace("default = -100", "default = -1"))
    with pytest.raises(SpecError, match=r"\[args\]: a cross_entropy op takes exactly logits, "
                                        r"target, weight, ignore_index, reduction, "
                                        r"label_smoothing, in this order; got logits, target"):
        parse(text.replace("weight", "w"))


def _problem(shape, dims, strides=None):
    x = torch.empty_strided(shape, strides or torch.empty(shape).stride())
    out_shape = reduction.output_shape(shape, dims, False)
    return reduction.problem(x, torch.empty(out_shape), dims, False, logical=False)


# the narrowest tile of each default config family (SPLIT_BLOCK_K of a generated module)
BLOCKS = {"inner": 1, "outer": 64}


def test_collapse_merges_reduced_and_kept_dims():
    prob = _problem((4, 5, 6, 7), (2, 3))
    assert prob.kept.sizes == (20,) and prob.reduced.sizes == (42,) and prob.inner
    prob = _problem((4, 5, 6), (0,))
    assert prob.kept.sizes == (30,) and prob.reduced.sizes == (4,) and not prob.inner
    # a transposed input reduced over its logical last dim reads along memory's slow dim
    prob = _problem((8, 9), (1,), strides=(1, 8))
    assert not prob.inner


@pytest.mark.parametrize("shape, dims, expected", [
    ((32768, 1024), (1,), "inner"),         # many rows: one level, rows along the fast dim
    ((32768, 1024), (0,), "last"),          # 1024 columns of 32768: too few tiles, split
    ((1 << 28,), (0,), "last"),             # a full reduction: split, in one launch
    ((8, 1 << 20), (0,), "outer"),          # wide enough for one level
    ((3, 5), (1,), "inner"),                # tiny: one level
])
def test_auto_strategy(shape, dims, expected, monkeypatch):
    monkeypatch.setattr(reduction, "max_programs", lambda device, launch: 528)  # an H200
    prob = _problem(shape, dims) if math.prod(shape) < 1 << 26 else reduction.Problem(
        reduction.Space((), ((), ())), reduction.Space(shape, ((1,),)))
    strategy = reduction.choose("sum", prob, torch.device("cpu"), "flat", "sum", BLOCKS)
    assert strategy.name == expected
    if expected == "last":
        assert strategy.splits * strategy.split_size >= prob.reduced.numel
        assert strategy.splits >= 2
        # aligned splits: the kernel's loads vectorize
        assert strategy.split_size % reduction.SPLIT_ALIGN == 0
        # argmax's partials carry indices: its split runs in two launches
        two = reduction.choose("argmax", prob, torch.device("cpu"), "flat", "argmax", BLOCKS)
        assert two.name == "split" and two.splits == strategy.splits


def test_last_launches_once_and_resets_its_tickets():
    # drawn on the CPU (the seeded generator is a CPU one), then moved to the tier's device
    x = torch.randn(300, 70, generator=torch.Generator().manual_seed(0),
                    device="cpu").to(testing.device())
    for dim in (0, None, 1):
        with runtime.record_launches() as log, runtime.override(strategy="last"):
            # float32 partial sums of up to 21000 values: a few 1e-5 off the float64 sum
            torch.testing.assert_close(generated.sum(x, dim), torch.sum(x.double(), dim).float(),
                                       rtol=1e-5, atol=1e-4)
        assert [l.kernel for l in log] == ["last"]
        assert not counters.tile_counters(x.device, 1).any()


def test_traced_last_counts_tickets_in_zeroed_counters_of_its_own(monkeypatch):
    # a graph cannot hold the counters untraced calls keep between calls: traced on fake tensors
    # (as torch.compile traces), the one-launch split allocates zeroed ones and never asks for ours
    from torch._subclasses.fake_tensor import FakeTensorMode, is_fake

    def kept_counters(*args):
        raise AssertionError("a traced call used the counters kept between calls")

    launches = []
    monkeypatch.setattr(counters, "tile_counters", kept_counters)
    # what the launch is given is the point here (the interpreter cannot run on fake tensors)
    # (the family's launcher starts each level with its pointers first: x, out, partials, counters)
    monkeypatch.setattr(reduction, "launch", lambda kernel, grid, *args, **options:
                        launches.append(args[:4]))
    with FakeTensorMode() as mode, runtime.override(strategy="last"):
        x = mode.from_tensor(torch.randn(300, 70, device=testing.device()))
        generated.sum(x, 0)
    (pointers,) = launches
    tickets = pointers[3]
    assert is_fake(tickets) and tickets.dtype == torch.int32


def test_fitting_tiles_prunes_wide_tiles():
    import triton
    configs = [triton.Config({"BLOCK_K": k, "BLOCK_R": r}) for k, r in
               ((4, 256), (1, 4096), (16, 256), (1, 16384))]

    def kept(num_kept, split_size):
        args = {"num_kept": num_kept, "split_size": split_size, "num_red": split_size}
        return [(c.kwargs["BLOCK_K"], c.kwargs["BLOCK_R"])
                for c in reduction.fitting_tiles(configs, args)]

    assert kept(1, 1 << 19) == [(1, 4096), (1, 16384)]       # a full reduction's split
    assert kept(32768, 1024) == [(4, 256), (16, 256)]        # short rows: no long chunks
    assert kept(1, 10) == [(4, 256)]                         # none fits: the smallest tile


def test_forced_strategies_and_their_errors():
    prob = _problem((6, 200), (1,))
    with runtime.override(strategy="split"):
        assert reduction.choose("sum", prob, torch.device("cpu"), "flat", "sum", BLOCKS).splits >= 2
    with runtime.override(strategy="atomic"), pytest.raises(ValueError, match="needs a sum"):
        reduction.choose("amax", prob, torch.device("cpu"), "flat", "max", BLOCKS)
    with runtime.override(strategy="fast"), pytest.raises(ValueError, match="unknown strategy"):
        reduction.choose("sum", prob, torch.device("cpu"), "flat", "sum", BLOCKS)


def test_argument_errors():
    x = torch.randn(3, 4)
    # the error types torch raises
    with pytest.raises(IndexError, match="'dim' is 2, out of range"):
        generated.sum(x, 2)
    with pytest.raises(RuntimeError, match="names a dim twice"):
        generated.sum(x, (1, -1))
    with pytest.raises(TypeError, match="'dim' must be an int"):
        generated.argmax(x, (0, 1))
    with pytest.raises(TypeError, match="'dim' must be an int or None, got \\(0,\\)"):
        generated.argmax(x, (0,))
    with pytest.raises(TypeError, match="'dim' must be an int or None, got tensor"):
        generated.argmax(x, torch.tensor(1))
    with pytest.raises(TypeError, match="'x' has dtype"):
        generated.sum(x.to(torch.complex64))   # (int32 and bool: tests/test_dtypes.py)
    # an empty reduction: torch's error types
    empty = torch.randn(0, 3)
    with pytest.raises(IndexError, match="amax: argument 'x' has size 0 in reduced dim 0"):
        generated.amax(empty, 0)
    with pytest.raises(IndexError, match="amin: argument 'x' has size 0 in reduced dim 0"):
        generated.amin(empty, (0, 1))
    for reduce_all in (None, ()):
        with pytest.raises(RuntimeError, match="amax: argument 'x' is empty; give a dim"):
            generated.amax(empty, reduce_all)
    with pytest.raises(IndexError, match="argmax: argument 'x' is empty; give a dim"):
        generated.argmax(empty)
    with pytest.raises(IndexError, match="argmin: argument 'x' has size 0 in reduced dim 0"):
        generated.argmin(empty, 0)
    assert generated.amax(empty, 1).shape == torch.amax(empty, 1).shape == (0,)
    # every other element of a 6-D tensor: 5 kept dims that do not merge
    sparse = torch.randn(*(3,) * 6)[(slice(None, None, 2),) * 6]
    with pytest.raises(ValueError, match=r"sum: argument 'x' has 5 kept dims that do not merge.*"
                                         r"pass x.contiguous\(\)"):
        generated.sum(sparse, 0)
    # dim defaults to None (the flattened index), as torch.argmax's
    assert generated.argmax(x).item() == torch.argmax(x).item()
    assert generated.argmin(x, keepdim=True).shape == torch.argmin(x, keepdim=True).shape
    assert torch.isnan(generated.mean(torch.randn(0, 3), 0)).all()
    assert (generated.sum(torch.randn(0, 3), 0) == 0).all()


def test_a_required_dim_has_no_default(authored):
    # [reduce] dim = "required": the function takes dim positionally, None still reduces every dim
    module = authored(SUM.replace('name = "sumsq"', 'name = "sumsq_over"')
                      .replace('combine = "sum"', 'combine = "sum"\ndim = "required"'))
    x = torch.randn(3, 4)
    with pytest.raises(TypeError, match="missing 1 required positional argument: 'dim'"):
        module.sumsq_over(x)
    torch.testing.assert_close(module.sumsq_over(x, 1), (x.double() ** 2).sum(1).float())
    torch.testing.assert_close(module.sumsq_over(x, None), (x.double() ** 2).sum().float())


def test_dim_as_int_tuple_or_list():
    # the property suite draws lists (what the registered op takes); the public functions also
    # take an int or a tuple, as torch does
    x = torch.randn(3, 4, 5)
    for dim in (1, -1, (0, 2), [2, 0]):
        want = torch.sum(x.double(), dim).float()
        torch.testing.assert_close(generated.sum(x, dim), want)
        torch.testing.assert_close(generated.sum(x, dim, keepdim=True),
                                   torch.sum(x.double(), dim, keepdim=True).float())


@pytest.mark.parametrize("strategy", [None, "inner", "outer", "split"])
def test_prod_of_signed_values_matches_torch(strategy):
    x = torch.randn(6, 129)  # signs and magnitudes torch.prod must agree on
    with runtime.override(strategy=strategy):
        for dim in (0, 1):
            torch.testing.assert_close(generated.prod(x, dim), torch.prod(x.double(), dim).float(),
                                       rtol=1e-4, atol=1e-30)


@pytest.mark.parametrize("dim", [1, (0, 2), None, []])
def test_prod_gradient_at_zeros_and_negative_values_matches_torch(dim):
    # the property suite draws prod's x near 1 (its products must stay finite in float16);
    # here signed values and exact zeros, one or two in a slice, whose gradients torch.prod
    # gives exactly (0 except at a lone zero, whose gradient is the product of the others)
    generator = torch.Generator().manual_seed(0)
    # drawn on the host (this file's tensors are made on the tier's device by default)
    x64 = torch.rand(3, 4, 2, generator=generator, dtype=torch.float64, device="cpu") * 3 - 1.5
    x64[0, 1, 0] = x64[1, 2, 1] = x64[1, 3, 1] = 0.0
    x = x64.float().to(testing.device()).requires_grad_()
    grad_out = torch.randn(generated.prod(x.detach(), dim).shape, generator=generator,
                           dtype=torch.float64, device="cpu")
    got, = torch.autograd.grad(generated.prod(x, dim), x, grad_out.float().to(testing.device()))
    # torch.prod takes one dim: the reduced dims moved last and flattened into one
    dims = (0, 1, 2) if dim in (None, []) else (dim,) if isinstance(dim, int) else dim
    leaf = x64.clone().requires_grad_()
    rows = leaf.movedim(dims, tuple(range(3 - len(dims), 3))).flatten(3 - len(dims))
    want, = torch.autograd.grad(torch.prod(rows, -1), leaf, grad_out)
    torch.testing.assert_close(got.cpu().double(), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [
    torch.float16,
    pytest.param(torch.bfloat16, marks=pytest.mark.skipif(
        runtime.interpreting(), reason="the interpreter rounds float32 to bfloat16 toward zero "
        "(torch and the GPU round to nearest): the GPU tier runs this case")),
])
@pytest.mark.parametrize("strategy", [None, "inner", "outer", "split", "atomic", "last"])
def test_dtype_casts_the_input_before_the_reduction(strategy, dtype):
    """sum, mean and prod with dtype= (narrower than x, then wider) against torch's rule."""
    # each column: k values v just above 256 (v rounds down to 256 in dtype) and k of -256, so
    # the cast input sums to 0 and the float32 one to k * (v - 256); a product of values just
    # above 1 (each rounds to 1) is 1 for the cast input, far above 1 for the float32 one
    k, step = 24, {torch.float16: 0.1, torch.bfloat16: 0.9}[dtype]
    ulp = {torch.float16: 2**-10, torch.bfloat16: 2**-7}[dtype]
    column = torch.cat([torch.full((k,), 256 + step), torch.full((k,), -256.0)])
    signed = column[:, None].expand(2 * k, 3).contiguous()
    near_one = torch.full((2 * k, 3), 1 + step / 256)
    if strategy == "atomic":
        cases = [(generated.sum, torch.sum, signed)]   # atomics add: sum only
    else:
        cases = [(generated.sum, torch.sum, signed), (generated.mean, torch.mean, signed),
                 (generated.prod, torch.prod, near_one)]
    with runtime.override(strategy=strategy):
        for op, ref, x in cases:
            for t, dim in ((x, 0), (x.t(), 1)):     # the reduced dim strided, then contiguous
                out = op(t, dim, dtype=dtype)
                assert out.dtype == dtype
                want = ref(t.to(dtype).double(), dim)
                # within an ulp (of the result's dtype) of the cast input's exact result...
                torch.testing.assert_close(out.double(), want, rtol=ulp, atol=1e-6)
                # ...far from the result for the uncast input
                assert not torch.allclose(out.double(), ref(t.double(), dim), rtol=1e-3,
                                          atol=1e-3), f"{op.__name__}: x was not cast"
                # a wider dtype keeps every input bit
                wide = op(t.to(dtype), dim, dtype=torch.float32)
                assert wide.dtype == torch.float32
                torch.testing.assert_close(wide, want.float())


def test_dtype_argument_errors():
    x = torch.randn(3, 4)
    with pytest.raises(TypeError, match="argument 'dtype' must be a torch.dtype or None"):
        generated.sum(x, 1, dtype="float16")
    with pytest.raises(TypeError, match="argument 'dtype' is torch.int64; supported"):
        generated.mean(x, 1, dtype=torch.int64)
    assert generated.sum(x, 1, False, torch.float16).dtype == torch.float16   # positional, too


def test_launches_are_recorded_with_their_strategy():
    x = torch.randn(7, 300)
    with runtime.record_launches() as log, runtime.override(strategy="atomic", indexing="int64"):
        generated.sum(x)
    assert [(l.kernel, l.index_bits) for l in log] == [("atomic", 64)]


def test_cross_entropy_rejects_bad_targets_and_shapes():
    logits = torch.randn(5, 11)
    for bad in (11, -1):
        target = torch.tensor([0, 1, bad, 3, 4])
        # a bad target raises in validating mode only (by default its row's loss is NaN:
        # tests/test_cross_entropy_targets.py)
        with runtime.validating(), \
                pytest.raises(ValueError, match=rf"target\[2\] is {bad}, outside \[0, 11\)"):
            generated.cross_entropy(logits, target)
    with pytest.raises(TypeError, match="class indices"):
        generated.cross_entropy(logits, torch.zeros(5))
    with pytest.raises(ValueError, match="must have shape"):
        generated.cross_entropy(logits, torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match="must be 2-D"):
        generated.cross_entropy(logits[0], torch.zeros((), dtype=torch.long))


def test_without_a_gpu_splits_are_planned_for_an_h100():
    # the CPU tier's property suite reaches the splits the GPU tier takes at the same sizes: a
    # full reduction of 1024 elements fills 4 x 132 programs as far as 64-element splits allow
    module = importlib.import_module("generated.sum")
    x = torch.empty(1024, dtype=torch.bfloat16, device="meta")
    out = torch.empty((), dtype=torch.bfloat16, device="meta")
    plan = reduction.plan_launch("sum", "auto", "flat", "sum", False, module.SPLIT_BLOCK_K,
                                 module.MAX_TILE, "x", x, out, (0,), False)
    assert plan.strategy.name == "last" and plan.strategy.splits == 16


def test_split_fills_the_gpu_with_the_narrowest_tile():
    # sum(x, 0) of 32768 x 1024 on 528 programs: the narrowest outer tile (64 columns) makes 16
    # output tiles, so 33 splits of 1008 rows; planned for the widest tile (512) it was 256 splits,
    # 4096 programs of the 64-wide tile the tuner picks (H200: 36.5 us against 27.1)
    module = importlib.import_module("generated.sum")
    assert module.SPLIT_BLOCK_K["outer"] == 64
    x = torch.empty(32768, 1024, dtype=torch.bfloat16, device="meta")
    out = torch.empty(1024, dtype=torch.bfloat16, device="meta")
    with runtime.override(max_programs=528):
        plan = reduction.plan_launch("sum", "auto", "flat", "sum", False, module.SPLIT_BLOCK_K,
                                     module.MAX_TILE, "x", x, out, (0,), False)
    strategy = plan.strategy
    assert (strategy.tiles, strategy.splits, strategy.split_size) == ("outer", 33, 1008)


def test_cross_entropy_target_check_on_every_path():
    # in validating mode (the whole test runs under it) the check kernel runs before the loss
    # kernel and the host reads its verdict while the loss kernel runs: first, recorded and
    # replayed eager calls, autograd and the registered op raise
    logits = torch.randn(5, 11)
    good = torch.tensor([0, 1, 2, 3, -100])
    bad = torch.tensor([0, 1, 11, 3, -100])
    message = r"target\[2\] is 11, outside \[0, 11\) and not ignore_index \(-100\)"
    with runtime.validating(), runtime.replay.record_at_once():
        for _ in range(3):
            generated.cross_entropy(logits, good)
            with pytest.raises(ValueError, match=message):
                generated.cross_entropy(logits, bad)
        with pytest.raises(ValueError, match=message):
            generated.cross_entropy(logits.clone().requires_grad_(), bad)
    with runtime.validating(), pytest.raises(ValueError, match=message):
        generated.REGISTRY["cross_entropy"].op(logits, bad, None, -100, "mean", 0.0)


def test_cross_entropy_non_finite_logits_match_torch():
    # per-lane online logsumexp: lanes that saw only -inf, a row of -inf, a NaN logit; several
    # chunks a row (64 wide) so that the lanes' maxima and sums carry across steps
    logits = torch.randn(4, 300) * 10
    logits[1] = float("-inf")
    logits[2, :150] = float("-inf")
    logits[3, 7] = float("nan")
    target = torch.tensor([3, 5, 200, 2])
    with runtime.override(config={"BLOCK_V": 64}):
        loss = generated.cross_entropy(logits, target, reduction="none")
    torch.testing.assert_close(loss, F.cross_entropy(logits, target, reduction="none"),
                               equal_nan=True)


@settings(max_examples=15)
@given(data=st.data())
def test_cross_entropy_gradient_matches_torch(data):
    info = generated.REGISTRY["cross_entropy"]
    case = data.draw(testing.CASES["cross_entropy"](info))
    args = dict(case.args)
    logits = args.pop("logits").detach().requires_grad_()
    ref_logits = logits.detach().double().requires_grad_()
    ref_args = {k: v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v
                for k, v in args.items()}
    ref = F.cross_entropy(ref_logits, **ref_args)
    grad_out = torch.rand_like(ref) + 0.5
    (ref_grad,) = torch.autograd.grad(ref, ref_logits, grad_out)
    rtol, atol = {torch.float32: (1e-4, 1e-6), torch.float16: (1e-2, 1e-4),
                  torch.bfloat16: (5e-2, 1e-3), torch.float64: (1e-10, 1e-12)}[logits.dtype]
    with runtime.override(**case.overrides), runtime.replay.record_at_once():
        # eager (an autograd.Function, its second call replayed) and the registered op's formula
        for loss in (generated.cross_entropy(logits, **args), generated.cross_entropy(logits, **args),
                     info.op(logits, **args)[0]):
            (grad,) = torch.autograd.grad(loss, logits, grad_out.to(loss.dtype))
            torch.testing.assert_close(grad.double(), ref_grad, rtol=rtol, atol=atol,
                                       equal_nan=True)


def test_reduce_lib_helpers_are_listed():
    # HELPERS guards op names against the helpers a generated module imports by name
    from specgen import reduce_lib
    # jit and interpreted functions both keep the decorated function as `fn`
    jitted = {name for name, value in vars(reduce_lib).items()
              if getattr(getattr(value, "fn", None), "__module__", None) == reduce_lib.__name__}
    assert jitted == reduce_lib.HELPERS


def test_index_width_counts_the_reduced_elements():
    """An expanded input has more elements than its storage: 2**32 reduced indices over 8 KB
    take int64 (an audit found int32 split starts wrapping negative there, reading before x;
    meta tensors: no memory, no launch)."""
    row = torch.empty(2048, device="meta")
    with runtime.record_launches() as log:
        generated.sum(row.expand(8, 2048))
        generated.sum(row.expand(2**21, 2048))
    assert [l.index_bits for l in log] == [32, 64]

"""Convolutions: torch's geometry arguments (checked before any launch, spelled out for the
registered operator), the strategies and what the launcher picks, the output's memory format,
and the [conv] spec errors. The property suite (tests/test_ops.py) checks conv2d and
conv2d_bias_silu against float64 F.conv2d over drawn geometry, groups, layouts and configs."""

import importlib
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import generated
from specgen import references
from specgen.errors import SpecError
from specgen.model import Source
from specgen.parse import parse_spec
from specgen.runtime import conv as conv_rt
from specgen.runtime import interpreting, override
from specgen.runtime.context import record_launches
from specgen.testing.core import device

REPO = Path(__file__).resolve().parents[1]
CONV_SPEC = (REPO / "specs" / "conv2d.toml").read_text()
SILU_SPEC = (REPO / "specs" / "conv2d_bias_silu.toml").read_text()


def _randn(*shape, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=generator).to(device())


@pytest.fixture(autouse=True)
def ieee_float32():
    """float32 convolutions in IEEE float32, not TF32 (torch's cuDNN default, which the kernels
    follow): the checks below hold them to 1e-4."""
    kept = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32 = kept


def _close(got, want):
    torch.testing.assert_close(got.double(), want.double(), rtol=1e-4, atol=1e-4)


# --- geometry ------------------------------------------------------------------------------------

GEOMETRY = [
    dict(padding="same"),                                # an odd filter: even pads
    dict(padding="same", dilation=(1, 2)),
    dict(padding="valid", stride=(2, 1)),
    dict(padding=(2, 0), stride=3, dilation=2),
]


@pytest.mark.parametrize("geometry", GEOMETRY, ids=[str(g) for g in GEOMETRY])
def test_geometry_as_torch(geometry):
    x, w, b = _randn(2, 5, 9, 11), _randn(4, 5, 3, 2, seed=1), _randn(4, seed=2)
    want = F.conv2d(x.double(), w.double(), b.double(), **geometry)
    got = generated.conv2d(x, w, b, **geometry)
    assert got.shape == want.shape
    _close(got, want)


def test_registered_operator_takes_four_pads():
    """"same" with an even filter pads one more row and column at the bottom and right, as
    torch does: the operator takes the four pads the public function spells out."""
    x, w = _randn(1, 3, 7, 6), _randn(2, 3, 4, 2, seed=1)
    want = F.conv2d(x.double(), w.double(), padding="same")
    got = torch.ops.specgen.conv2d(x, w, None, [1, 1], [1, 2, 0, 1], [1, 1], 1)
    _close(got, want)
    _close(generated.conv2d(x, w, padding="same"), want)


@pytest.mark.parametrize("device, float64, x_cl, w_cl, cudnn, want", [
    ("cpu", True, False, True, True, True),       # the CPU: channels-last where either is
    ("cpu", False, True, False, False, True),
    ("cpu", False, False, False, True, False),
    ("cuda:0", False, False, True, True, True),   # CUDA: as cuDNN, where either is
    ("cuda:0", False, True, False, True, True),
    ("cuda:0", True, False, True, True, False),   # but float64 stays contiguous
    ("cuda:0", False, True, True, False, False),  # and every dtype without cuDNN
])
def test_output_layout_is_torchs_rule_of_the_device(device, float64, x_cl, w_cl, cudnn, want):
    # a GPU draw: an unbatched float64 input with a channels_last weight came out channels-last,
    # where torch's CUDA convolution (cudnn_conv_suggest_memory_format) gives a contiguous result
    assert conv_rt.output_channels_last(device, float64, x_cl or w_cl, cudnn) is want
    if device.startswith("cuda") and not torch.cuda.is_available():
        return   # torch's CUDA rule is checked where there is a GPU (the GPU tier)
    dtype = torch.float64 if float64 else torch.float32
    x = torch.randn(2, 4, 5, 6, dtype=dtype, device=device)
    w = torch.randn(3, 4, 3, 3, dtype=dtype, device=device)
    x = x.to(memory_format=torch.channels_last) if x_cl else x
    w = w.to(memory_format=torch.channels_last) if w_cl else w
    with torch.backends.cudnn.flags(enabled=cudnn):
        out = F.conv2d(x, w)
    assert out.is_contiguous(memory_format=torch.channels_last) is want, "torch's rule"


@pytest.mark.parametrize("w_shape, w_strides", [
    ((4, 1, 1, 1), (2, 1, 2, 1)),   # channels-last by its strides; its channels-last copy is not
    ((4, 1, 1, 2), (2, 1, 2, 1)),   # channels-last, and its copy too
    ((4, 2, 1, 1), (4, 1, 4, 4)),
    ((4, 2, 1, 1), (2, 2, 1, 1)),   # contiguous
])
def test_output_layout_follows_torchs_second_look(w_shape, w_strides):
    # a CI draw: a (2, 1, 1, 1) weight of strides (2, 1, 2, 1) gave a channels-last result where
    # torch's (CPU) is contiguous; torch decides again from the tensors its backend takes: on
    # the CPU copies of both, under cuDNN the input's copy and the weight as given (checked
    # against torch on the device this machine has: the GPU tier checks cuDNN's)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    x = torch.randn(2, w_shape[1], 3, 4, device=device)
    w = torch.empty_strided(w_shape, w_strides, device=device).normal_()
    want = F.conv2d(x, w).is_contiguous(memory_format=torch.channels_last)
    got = conv_rt._channels_last_pair(x.shape, x.stride(), w.shape, w.stride(),
                                      weight_copied=device == "cpu")
    assert got is want


@pytest.mark.parametrize("dtype, x_shape, x_strides, w_strides", [
    # a CI draw (float16: the reference's upcast laid the weight out afresh too)
    (torch.float16, (1, 2, 1, 2), (4, 2, 2, 1), (2, 1, 2, 1)),
    (torch.float32, (1, 2, 3, 1), (12, 1, 4, 1), (8, 2, 4, 2)),
])
def test_reference_keeps_torchs_output_layout(dtype, x_shape, x_strides, w_strides):
    # the reference copies a weight whose strides are not its format's own (torch's CPU backward
    # needs it), and the copy of a (2, 1, 1, 1) weight of strides (2, 1, 2, 1) reads contiguous
    # where the weight read channels-last: with groups=2 torch's result was channels-last, the
    # reference's contiguous
    x = torch.empty_strided(x_shape, x_strides, dtype=dtype).normal_()
    w = torch.empty_strided((2, 1, 1, 1), w_strides, dtype=dtype).normal_()
    want = F.conv2d(x, w, groups=2)
    got = references.conv2d(x, w, groups=2)
    assert got.stride() == want.stride()


@pytest.mark.skipif(not interpreting(), reason="the interpreter's bfloat16 dot only")
def test_the_interpreter_refuses_a_bfloat16_convolution_with_dots():
    # the GEMM kernels would compute one wrongly (errors of 1e9) and say nothing; the depthwise
    # kernel has no dot and runs
    x, w = _randn(1, 4, 6, 6).bfloat16(), _randn(8, 4, 3, 3, seed=1).bfloat16()
    with record_launches() as log:
        with pytest.raises(NotImplementedError, match="computes a bfloat16 matrix product wrongly"):
            generated.conv2d(x, w)
    assert log == []
    depthwise = _randn(4, 1, 3, 3, seed=2).bfloat16()
    out = generated.conv2d(x, depthwise, groups=4)
    want = F.conv2d(x.double(), depthwise.double(), groups=4)
    torch.testing.assert_close(out.double(), want, rtol=1.6e-2, atol=1e-2)


BAD_GEOMETRY = [
    (dict(padding="full"), ValueError, "argument 'padding' must be an int, a pair of ints"),
    (dict(padding="same", stride=2), ValueError, "padding='same' is not supported for strided"),
    (dict(padding=-1), ValueError, "argument 'padding' must not be negative"),
    (dict(padding=(1, 2, 3)), ValueError, "argument 'padding' must be one int or 2 or 4 ints"),
    (dict(stride=0), ValueError, "argument 'stride' must be positive"),
    (dict(stride=1.5), TypeError, "argument 'stride' must be an int or a tuple of ints"),
    (dict(dilation=(1, 0)), ValueError, "argument 'dilation' must be positive"),
    (dict(groups=0), ValueError, "argument 'groups' must be positive"),
    (dict(groups=2), ValueError, "expected 'input' to have 6 channels, got 3"),
]


@pytest.mark.parametrize("geometry, kind, words", BAD_GEOMETRY,
                         ids=[str(g[0]) for g in BAD_GEOMETRY])
def test_bad_geometry_named_before_any_launch(geometry, kind, words):
    x, w = _randn(1, 3, 6, 6), _randn(4, 3, 3, 3, seed=1)
    with record_launches() as log, pytest.raises(kind, match=words.replace("(", r"\(")):
        generated.conv2d(x, w, **geometry)
    assert not log


BAD_TENSORS = [
    ("a 5-D input", lambda: (_randn(1, 1, 3, 6, 6), _randn(4, 3, 3, 3), None),
     "argument 'input' must be 3-D"),
    ("a 3-D weight", lambda: (_randn(1, 3, 6, 6), _randn(4, 3, 3), None),
     "argument 'weight' must be 4-D"),
    ("a filter larger than the padded input", lambda: (_randn(1, 3, 2, 6), _randn(4, 3, 3, 3), None),
     "smaller than the 'weight' filter's 3 x 3"),
    ("a bias of the wrong size", lambda: (_randn(1, 3, 6, 6), _randn(4, 3, 3, 3), _randn(5)),
     "argument 'bias' must have shape \\(4,\\)"),
    ("operands of two dtypes", lambda: (_randn(1, 3, 6, 6), _randn(4, 3, 3, 3).half(), None),
     "argument 'weight' has dtype torch.float16"),
]


@pytest.mark.parametrize("what, make, words", BAD_TENSORS, ids=[c[0] for c in BAD_TENSORS])
def test_bad_tensors_named_before_any_launch(what, make, words):
    x, w, b = make()
    with record_launches() as log, pytest.raises((ValueError, TypeError), match=words):
        generated.conv2d(x, w, b)
    assert not log


# --- strategies and layouts ----------------------------------------------------------------------

def _strategy(x, w, **geometry):
    with record_launches() as log:
        generated.conv2d(x, w, **geometry)
    return log[-1].kernel, log[-1].details


def _has_tma():
    return device() == "cuda" and torch.cuda.get_device_capability()[0] >= 9


def test_launcher_picks_by_layout_and_groups():
    w = _randn(16, 16, 3, 3)
    nchw = _randn(2, 16, 5, 5)
    # an NCHW input and weight copied to channels-last for the GEMM kernel's loads
    assert _strategy(nchw, w) == ("gemm_repack", {"repack_input": True, "repack_weight": True})
    channels_last = nchw.to(memory_format=torch.channels_last)
    assert _strategy(channels_last, w.to(memory_format=torch.channels_last))[0] == "gemm"
    # a 1 x 1 filter reads each input element once: no copy; at stride 1 without padding, the
    # flat kernel (a GEMM per image), over NCHW pixels or channels-last ones
    assert _strategy(nchw, _randn(8, 16, 1, 1)) == ("flat", {"repack_input": False,
                                                            "repack_weight": False})
    assert _strategy(nchw, _randn(8, 16, 1, 1), padding=1)[0] == "gemm"
    assert _strategy(channels_last, _randn(8, 16, 1, 1)) == ("flat", {"repack_input": False,
                                                                     "repack_weight": False})
    assert _strategy(channels_last, _randn(8, 16, 1, 1), stride=2)[0] == "gemm"
    assert _strategy(channels_last, _randn(8, 16, 1, 1), padding=1)[0] == "gemm"
    # rows of the input not a width apart (a column slice): pixels not one stride apart
    sliced = _randn(2, 16, 5, 7).to(memory_format=torch.channels_last)[..., :5]
    assert _strategy(sliced, _randn(8, 16, 1, 1))[0] == "gemm"
    # from 128 channels, Hopper's TMA kernel where it can take the call (stride 1, one group)
    wide = _randn(1, 128, 4, 4).to(memory_format=torch.channels_last)
    w_wide = _randn(16, 128, 3, 3).to(memory_format=torch.channels_last)
    assert _strategy(wide, w_wide)[0] == ("tma" if _has_tma() else "gemm")
    assert _strategy(wide, w_wide, stride=2)[0] == "gemm"
    # one input channel a group: the depthwise kernel
    assert _strategy(nchw, _randn(32, 1, 3, 3), groups=16)[0] == "depthwise"
    # few channels: a copy would not pay
    assert _strategy(_randn(2, 3, 5, 5), _randn(8, 3, 3, 3))[0] == "gemm"


# "tma" runs the TMA kernel on Hopper with int32 offsets (the call here is one it takes: stride
# 1, one group, channels-last); under the interpreter, and with int64 offsets, the call takes the
# pointer kernel, which this checks then; "flat" takes a 1 x 1 filter without padding
@pytest.mark.parametrize("strategy", conv_rt.STRATEGIES)
@pytest.mark.parametrize("indexing", ["int32", "int64"])
def test_every_strategy_matches(strategy, indexing):
    groups = {"depthwise": 4, "tma": 1}.get(strategy, 2)
    x = _randn(2, 4, 6, 7)
    w = _randn(8, 4 // groups, *((1, 1) if strategy == "flat" else (3, 2)), seed=1)
    b = _randn(8, seed=2)
    padding = 0 if strategy == "flat" else 1
    if strategy == "tma":
        x, w = x.to(memory_format=torch.channels_last), w.to(memory_format=torch.channels_last)
    want = F.conv2d(x.double(), w.double(), b.double(), padding=padding, groups=groups)
    with override(strategy=strategy, indexing=indexing), record_launches() as log:
        _close(generated.conv2d(x, w, b, padding=padding, groups=groups), want)
    ran = {"tma": "tma" if _has_tma() and indexing == "int32" else "gemm"}.get(strategy, strategy)
    assert log[-1].kernel == ran


@pytest.mark.parametrize("layout", ["channels_last", "image_slice", "nchw"])
@pytest.mark.parametrize("groups, indexing, image", [(1, "int32", (5, 7)), (2, "int32", (5, 7)),
                                                     (1, "int64", (5, 7)), (1, "int32", (4, 6))])
def test_flat_kernel_matches(layout, groups, indexing, image):
    # 1 x 1 filters over 5 x 7 = 35 pixels an image (pixel blocks past an image's end), or 4 x 6
    # = 24 (runs of 8 pixels under one mask, the kernel's hint), 3 images, 6 input channels a
    # group (a partial channel block), a bias; an input that is every other image of a larger
    # batch (its images' starts a stride apart); an NCHW input
    x = _randn(6 if layout == "image_slice" else 3, 6 * groups, *image)
    if layout != "nchw":
        x = x.to(memory_format=torch.channels_last)
    if layout == "image_slice":
        x = x[::2]
    w = _randn(10, 6, 1, 1, seed=1)
    b = _randn(10, seed=2)
    want = F.conv2d(x.double(), w.double(), b.double(), groups=groups)
    with override(indexing=indexing), record_launches() as log:
        got = generated.conv2d(x, w, b, groups=groups)
    assert log[-1].kernel == "flat"
    _close(got, want)
    # the output in torch's memory format: channels-last where the input is
    assert got.is_contiguous(memory_format=torch.channels_last) == (layout != "nchw")


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("image, run", [((5, 7), 1), ((4, 6), 8), ((56, 56), 16)])
def test_flat_plan_states_the_pixel_runs_its_mask_holds_over(image, run, channels_last):
    # the flat kernel's PIXEL_RUN hint (its pixel mask is constant over aligned runs of it, so
    # loads and stores along NCHW pixels vectorize) holds where an image's pixels are a
    # multiple, whatever the layouts
    x = torch.empty(2, 8, *image, device="meta")
    x = x.to(memory_format=torch.channels_last) if channels_last else x
    plan = conv_rt.conv_plan("conv2d", "auto", tuple(x.shape), x.stride(), (4, 8, 1, 1),
                             (8, 1, 1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1, (), 64, "flat", 2,
                             "cpu", True, (None,))
    assert plan.kernel == "flat" and plan.pixel_run == run


@pytest.mark.parametrize("channels, block", [(64, 64), (24, 32), (8, 16), (128, 128)])
def test_flat_plan_takes_a_groups_channels_as_one_block(channels, block):
    # the kernel loads its weight block once: C_BLOCK is the power of two at or above a
    # group's channels (at least 16), whole where it is theirs
    plan = conv_rt.conv_plan("conv2d", "auto", (2, channels, 7, 7), (49 * channels, 49, 7, 1),
                             (32, channels, 1, 1), (channels, 1, 1, 1), (1, 1), (0, 0, 0, 0),
                             (1, 1), 1, (), 64, "flat", 2, "cpu", True, (None,))
    assert plan.kernel == "flat" and plan.channel_block == block
    assert plan.even_c == (channels == block)


@pytest.mark.parametrize("dtype, channels, wide", [(torch.bfloat16, 128, True),
                                                   (torch.float64, 32, False)])
def test_flat_configs_fit_the_image_and_the_device(dtype, channels, wide, monkeypatch):
    # pixel blocks fitted to one image (7 x 7: 64); configs whose pipelined input tiles and one
    # weight block exceed the shared memory (an H100's 227 KiB), or whose accumulator takes more
    # than 128 registers a thread, dropped: at the widest channel blocks the planner gives the
    # kernel (256 bytes), bfloat16's 128 x 256 in 3 stages takes 160 KiB and 128 registers on 8
    # warps, float64's 160 KiB and 256 (two a value)
    monkeypatch.setattr(conv_rt, "shared_memory", lambda device: 232448)
    kernel = importlib.import_module("generated.conv2d")._conv2d_flat_kernel
    x = torch.empty(2, channels, 7, 7, device="meta", dtype=dtype)
    named = {"input_ptr": x, "M": 2 * 7 * 7, "N": 256, "C": channels, "out_h": 7, "out_w": 7}
    kept = conv_rt.prune_flat_configs(kernel.configs, named, C_BLOCK=channels)
    assert kept and all(c.kwargs["BLOCK_M"] == 64 for c in kept)
    named.update(input_ptr=torch.empty(2, channels, 32, 32, device="meta", dtype=dtype),
                 M=2 * 32 * 32, out_h=32, out_w=32)
    tiles = {(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"])
             for c in conv_rt.prune_flat_configs(kernel.configs, named, C_BLOCK=channels)}
    assert (64, 256) in tiles and ((128, 256) in tiles) == wide


@pytest.mark.parametrize("layout", ["nchw", "channels_last"])
@pytest.mark.parametrize("channels", [6, 16])
@pytest.mark.parametrize("programs", [2, 4])
def test_flat_kernel_walks_every_pixel_block(layout, channels, programs):
    # 16-pixel blocks, 3 an image of 5 x 7 (the last partial), over 3 images, and 2 groups of
    # one channel block: capped at 2 or 4 programs, one or two programs a group walk its 9
    # blocks; 6 channels a group (a partial channel block) or 16 (a whole one, unmasked)
    x = _randn(3, 2 * channels, 5, 7)
    if layout == "channels_last":
        x = x.to(memory_format=torch.channels_last)
    w = _randn(10, channels, 1, 1, seed=1)
    b = _randn(10, seed=2)
    small = {"BLOCK_M": 16, "BLOCK_N": 16, "num_warps": 4, "num_stages": 2}
    with override(config=small, launch="persistent", max_programs=programs), \
            record_launches() as log:
        got = generated.conv2d(x, w, b, groups=2)
    assert log[-1].kernel == "flat"
    _close(got, F.conv2d(x.double(), w.double(), b.double(), groups=2))


@pytest.mark.parametrize("channels, dtype, kernel", [
    (160, torch.float32, "gemm"), (64, torch.float32, "flat"), (96, torch.float32, "gemm"),
    (32, torch.float64, "flat"), (48, torch.float64, "gemm"), (128, torch.float16, "flat")])
def test_flat_kernel_takes_a_block_of_at_most_256_bytes(channels, dtype, kernel):
    # a group's channels are one block in shared memory, its width a power of two: past 256
    # bytes (96 float32 channels: a block of 128, 512 bytes) a forced flat falls back
    x = _randn(1, channels, 3, 3).to(dtype)
    w = _randn(8, channels, 1, 1, seed=1).to(dtype)
    with override(strategy="flat"), record_launches() as log:
        got = generated.conv2d(x, w)
    # (float16's output rounds to 2**-11 of its value)
    tolerance = 1e-3 if dtype == torch.float16 else 1e-4
    torch.testing.assert_close(got.double(), F.conv2d(x.double(), w.double()), rtol=tolerance,
                               atol=tolerance)
    assert log[-1].kernel == kernel


def test_flat_kernel_takes_every_channel_under_a_forced_small_tile():
    # the tests' small tile config (BLOCK_K 16) leaves the flat kernel's channel block to the
    # launcher: 17 channels are one block of 32, not 16 of them (a GPU hypothesis draw)
    x = _randn(17, 1, 1)
    w = _randn(1, 17, 1, 1, seed=1)
    small = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 1, "num_warps": 4,
             "num_stages": 2}
    with override(config=small), record_launches() as log:
        _close(generated.conv2d(x, w), F.conv2d(x.double(), w.double()))
    assert log[-1].kernel == "flat"


def test_flat_grid_shares_each_channel_block_among_programs():
    # (group, channel block) pairs by the programs walking their pixel blocks: 2 programs a
    # multiprocessor in all, at least one a pair, at most one a pixel block
    plan = conv_rt.conv_plan("conv2d", "auto", (32, 64, 56, 56), (200704, 1, 3584, 64),
                             (256, 64, 1, 1), (64, 1, 64, 64), (1, 1), (0, 0, 0, 0), (1, 1), 1,
                             (), 64, None, 2, "cpu", True, (None,))
    assert plan.kernel == "flat" and plan.even_c and plan.channel_block == 64
    sms = plan.sms
    assert plan.flat_grid({"BLOCK_M": 64, "BLOCK_N": 256, "PROGRAMS_PER_SM": 2}) == (1, 2 * sms)
    assert plan.flat_grid({"BLOCK_M": 64, "BLOCK_N": 128, "PROGRAMS_PER_SM": 2}) == (2, sms)
    # 4 images of 2 x 2 pixels: 4 blocks of 64
    small = conv_rt.conv_plan("conv2d", "auto", (4, 64, 2, 2), (256, 1, 128, 64),
                              (256, 64, 1, 1), (64, 1, 64, 64), (1, 1), (0, 0, 0, 0), (1, 1), 1,
                              (), 64, None, 2, "cpu", True, (None,))
    assert small.flat_grid({"BLOCK_M": 64, "BLOCK_N": 256, "PROGRAMS_PER_SM": 2}) == (1, 4)
    # 48 groups of 2 channel blocks: more pairs than 2 programs a multiprocessor leave one each
    c = 96 * 48
    grouped = conv_rt.conv_plan("conv2d", "auto", (1, c, 4, 4), (16 * c, 1, 4 * c, c),
                                (48 * 512, 96, 1, 1), (96, 1, 96, 96), (1, 1), (0, 0, 0, 0),
                                (1, 1), 48, (), 64, None, 2, "cpu", True, (None,))
    assert grouped.kernel == "flat" and not grouped.even_c  # 96 channels in a block of 128
    assert grouped.flat_grid({"BLOCK_M": 64, "BLOCK_N": 256, "PROGRAMS_PER_SM": 1}) == (96, 1)


def _index_bits(x, w, b=None, **geometry):
    with record_launches() as log:
        generated.conv2d(x, w, b, **geometry)
    return log[-1].index_bits


def test_index_width_counts_every_tensor_and_copy():
    """int64 offsets where any tensor a kernel reads spans past 2**31 elements: the bias (a
    view far into its storage), and the channels-last copy of an expanded NCHW input, which is
    dense however small the input's storage (meta tensors: no memory, no launch)."""
    x = torch.empty(3, 2, 4, 4, device="meta")
    w = torch.empty(3, 2, 1, 1, device="meta")
    assert _index_bits(x, w) == 32
    far_bias = torch.empty_strided((3,), (2**30,), device="meta")
    assert _index_bits(x, w, far_bias) == 64
    # one 16 x 128 x 128 image repeated 2**15 times: an output of 2**29 elements, a copy of 2**33
    image = torch.empty(1, 16, 128, 128, device="meta").expand(2**15, 16, 128, 128)
    one_filter = torch.empty(1, 16, 3, 3, device="meta")
    with override(strategy="gemm"):
        assert _index_bits(image, one_filter, padding=1) == 32
    assert _index_bits(image, one_filter, padding=1) == 64


def test_index_width_counts_the_filters_reach():
    """A tap's offset from a pixel's window address spans the filter's dilated extent in rows
    and columns, past 2**31 elements on an input that spans fewer (a review's find: the int32
    window addresses wrapped and read out of bounds under the interpreter)."""
    row, col = 3 * 2**29, 2**29 - 2**17
    x = torch.empty_strided((1, 1, 2, 2), (row + col + 1, 1, row, col), device="meta")
    w = torch.empty(1, 1, 2, 2, device="meta")
    with override(strategy="gemm"):
        assert _index_bits(x, w) == 32
        assert _index_bits(x, w, padding=1, dilation=2) == 64


def test_empty_images_and_filters_refused_as_torch():
    with pytest.raises(ValueError, match="argument 'input' is 0 x 5 per channel"):
        generated.conv2d(_randn(2, 3, 0, 5), _randn(4, 3, 1, 1), padding=1)
    with pytest.raises(ValueError, match="argument 'weight' has no output channels"):
        generated.conv2d(_randn(2, 3, 5, 5), _randn(0, 3, 3, 3))


@pytest.mark.parametrize("input_last, weight_last", [(False, False), (True, False), (False, True)])
def test_output_memory_format_is_torchs(input_last, weight_last):
    x, w = _randn(2, 4, 5, 5), _randn(6, 4, 3, 3, seed=1)
    if input_last:
        x = x.to(memory_format=torch.channels_last)
    if weight_last:
        w = w.to(memory_format=torch.channels_last)
    got = generated.conv2d(x, w)
    want = F.conv2d(x, w)
    assert got.stride() == want.stride()


def test_fused_epilogue_matches_conv_bias_silu():
    x, w, b = _randn(2, 8, 6, 6), _randn(5, 8, 3, 3, seed=1), _randn(5, seed=2)
    want = F.silu(F.conv2d(x.double(), w.double(), b.double(), stride=2, padding=1))
    _close(generated.conv2d_bias_silu(x, w, b, 2, 1), want)


# --- spec errors ---------------------------------------------------------------------------------

def _parse(text: str):
    return parse_spec(text, Source("specs/c.toml", "0" * 64, text))


SPEC_CASES = [
    ("a weight without dims", 'weight = { kind = "tensor", dims = ["K", "C", "R", "S"] }',
     'weight = { kind = "tensor", dims = ["K", "C"] }', "args.weight.dims", "expected one of"),
    ("an optional weight", 'weight = { kind = "tensor", dims = ["K", "C", "R", "S"] }',
     'weight = { kind = "tensor", dims = ["K", "C", "R", "S"], optional = true }',
     "args.weight.optional", "cannot be optional"),
    ("an unknown geometry argument", 'args = ["stride", "padding"]',
     'args = ["stride", "pad"]', "conv.args", "'pad' is not a geometry argument"),
    ("geometry out of order", 'args = ["stride", "padding"]', 'args = ["padding", "stride"]',
     "conv.args", "expected torch's order"),
    ("a geometry argument the reference ignores", 'args = ["stride", "padding"]',
     'args = ["stride", "padding", "groups"]', "op.reference",
     "argument 'groups' ([conv] args) is not used by the reference"),
    ("a reference naming one the op lacks", "bias, stride, padding))",
     "bias, stride, padding, dilation))", "op.reference",
     "'dilation' is not an argument of the op"),
    ("the input read in the epilogue", 'out = "silu(acc + bias)"', 'out = "silu(acc + input)"',
     "epilogue.out", "enter the epilogue only through acc"),
    # a user's trial: the op hands its reference padding as four ints, which F.conv2d refuses
    # (in the backward, through the reference, after the forward had run)
    ("F.conv2d with the op's padding", "F.silu(ref.conv2d(", "F.silu(F.conv2d(", "op.reference",
     "F.conv2d does not take the padding the op hands its reference"),
    ("a misspelled [conv] args", 'args = ["stride", "padding"]', 'arg = ["stride", "padding"]',
     "conv.arg", "unknown key 'arg'"),
    ("a misspelled [epilogue] promote", 'out = "silu(acc + bias)"',
     'out = "silu(acc + bias)"\npromot = ["bias"]', "epilogue.promot",
     "a misspelling of 'promote'"),
    # (a lone string is an expression: it would have been a second output)
    ("a misspelled promote of one name", 'out = "silu(acc + bias)"',
     'out = "silu(acc + bias)"\npromot = "bias"', "epilogue.promot",
     "a misspelling of 'promote'"),
    ("a misspelled [epilogue] dtype", 'out = "silu(acc + bias)"',
     'out = "silu(acc + bias)"\ndtyp = "float32"', "epilogue.dtyp",
     "a misspelling of 'dtype'"),
]


@pytest.mark.parametrize("what, old, new, key, words", SPEC_CASES, ids=[c[0] for c in SPEC_CASES])
def test_conv_spec_errors_are_located(what, old, new, key, words):
    # conv2d's bias is optional: an optional weight before it is the family's error
    base = CONV_SPEC if what == "an optional weight" else SILU_SPEC
    assert old in base, f"test table out of date: {old!r}"
    with pytest.raises(SpecError) as err:
        spec = _parse(base.replace(old, new, 1))
        # the reference's geometry names are checked when the op is planned
        from specgen.families import FAMILIES
        FAMILIES["conv"].plan(spec)
    message = str(err.value)
    assert message.startswith(f"specs/c.toml: [{key}]"), message
    assert words in message, message


def test_conv2d_spec_plans():
    from specgen.families import FAMILIES
    plan = FAMILIES["conv"].plan(_parse(CONV_SPEC))
    assert plan.geometry == ("stride", "padding", "dilation", "groups")
    assert [a.name for a in plan.args][-4:] == ["stride", "padding", "dilation", "groups"]

"""Quantized matmuls: the formats of specgen.quant, the kernels' unpacking on every nibble
position and group, the exact int32 product, bad formats refused before any launch, and the
[dequant] spec errors. The property suite (tests/test_ops.py) checks the three ops against the
float64 product with the dequantized weight over drawn shapes, layouts and groups."""

import dataclasses
import sys
from pathlib import Path

import pytest
import torch

import generated
from specgen import quant
from specgen.errors import SpecError
from specgen.families import FAMILIES
from specgen.model import Source
from specgen.parse import parse_spec
from specgen.runtime import matmul as matmul_rt
from specgen.runtime import override
from specgen.runtime.context import record_launches
from specgen.testing.core import device

REPO = Path(__file__).resolve().parents[1]
INT4_SPEC = (REPO / "specs" / "int4_weight_linear.toml").read_text()


def _randn(*shape, dtype=torch.float32, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=generator).to(dtype).to(device())


# --- specgen.quant: the formats -----------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_quantize_int8_is_symmetric_per_channel(dtype):
    w = _randn(12, 80, dtype=dtype)
    w[3] = 0  # an all-zero channel keeps a usable scale
    qweight, scales = quant.quantize_int8(w)
    assert qweight.dtype == torch.int8 and qweight.shape == (12, 80)
    assert scales.dtype == dtype and scales.shape == (12,)
    assert qweight.abs().max() <= 127 and (qweight.abs().amax(dim=1)[torch.arange(12) != 3] == 127).all()
    # each weight within half a step of what its integer stands for
    error = (quant.dequantize_int8(qweight, scales.float()) - w.float()).abs()
    assert (error <= scales.float()[:, None] / 2 * (1 + 1e-3)).all()


def test_quantize_int8_per_token_feeds_int8_linear():
    # activations (2, 3, K) scaled per row, float32 scales (..., 1): what int8_linear takes
    x, w = _randn(2, 3, 64, dtype=torch.float16), _randn(8, 64, seed=1)
    x[1, 2] = 0  # an all-zero token keeps a usable scale
    x_int8, x_scale = quant.quantize_int8_per_token(x)
    assert x_int8.dtype == torch.int8 and x_int8.shape == x.shape
    assert x_scale.dtype == torch.float32 and x_scale.shape == (2, 3, 1)
    assert (x_int8.abs().amax(dim=-1).flatten()[[0, 1, 2, 3, 4]] == 127).all()
    assert (x_int8[1, 2] == 0).all() and x_scale[1, 2] == 1
    error = (x_int8.float() * x_scale - x.float()).abs()
    assert (error <= x_scale / 2 * (1 + 1e-6)).all()
    qweight, scales = quant.quantize_int8(w)
    out = generated.int8_linear(x_int8, x_scale, qweight, scales, out_dtype=torch.float32)
    want = (x_int8.double() * x_scale.double()) @ quant.dequantize_int8(qweight.double(),
                                                                          scales.double()).T
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="expected a floating tensor"):
        quant.quantize_int8_per_token(x_int8)
    # one token, 1-D: its scale (1,) is its one row's, as the (1, K) row's (1, 1) is
    token_int8, token_scale = quant.quantize_int8_per_token(x[0, 0])
    assert token_scale.shape == (1,)
    one = generated.int8_linear(token_int8, token_scale, qweight, scales, out_dtype=torch.float32)
    assert one.shape == (8,)
    torch.testing.assert_close(one, out[0, 0], rtol=0, atol=0)


@pytest.mark.parametrize("group_size", quant.GROUP_SIZES)
def test_quantize_int4_packs_two_a_byte_low_nibble_first(group_size):
    n, k = 6, 2 * 256
    w = _randn(n, k, dtype=torch.float16, seed=group_size)
    qweight, scales, zeros = quant.quantize_int4(w, group_size)
    assert qweight.dtype == torch.uint8 and qweight.shape == (n, k // 2)
    assert scales.shape == zeros.shape == (n, k // group_size)
    assert scales.dtype == zeros.dtype == torch.float16
    q = quant.unpack_int4(qweight)
    assert torch.equal(q[:, 0::2], qweight & 0xF) and torch.equal(q[:, 1::2], qweight >> 4)
    assert torch.equal(quant.pack_int4(q), qweight)
    step = scales.float().repeat_interleave(group_size, dim=1)
    error = (quant.dequantize_int4(qweight, scales.float(), zeros.float(), group_size) - w.float())
    assert (error.abs() <= step / 2 * 1.01 + 1e-6).all()


def test_quantize_refuses_what_the_formats_cannot_hold():
    with pytest.raises(ValueError, match="K = 100 is not a multiple of group_size = 64"):
        quant.quantize_int4(torch.randn(4, 100), 64)
    with pytest.raises(ValueError, match="group_size must be one of"):
        quant.quantize_int4(torch.randn(4, 96), 48)
    with pytest.raises(ValueError, match="expected a 2-D floating weight"):
        quant.quantize_int8(torch.randint(0, 3, (4, 4)))


@pytest.fixture
def word_choices(monkeypatch):
    """What each GEMV launch's ``matmul_rt.reads_words`` decided, in order."""
    choices = []
    reads = matmul_rt.reads_words
    monkeypatch.setattr(matmul_rt, "reads_words",
                        lambda *args: choices.append(reads(*args)) or choices[-1])
    return choices


# --- the kernels --------------------------------------------------------------------------------


@pytest.mark.parametrize("group_size, groups, rows, strategy, dtype",
                         [(32, 3, 96, "direct", "float32"), (64, 1, 64, "direct", "float32"),
                          (32, 3, 16, "direct", "float32"), (32, 3, 1, "gemv", "float32"),
                          (64, 3, 8, "gemv", "float32"), (32, 3, 1, "gemv", "float16")])
def test_int4_unpacks_every_nibble_position_and_group(group_size, groups, rows, strategy, dtype,
                                                      word_choices):
    # x = I: row k of the result is column k of the dequantized weight, so every element of the
    # weight (both nibbles of every byte, every group) is read once; in launches of `rows` rows
    # (under 64 the per-block scaling, from 64 the value per weight element: PER_TILE; the GEMV
    # kernel a row a program, its K blocks of two groups here: a partial last block at 3; with
    # 16-bit activations its word form, each of the 8 places of a word)
    dtype = getattr(torch, dtype)
    k, n = group_size * groups, 24
    generator = torch.Generator().manual_seed(groups)
    qweight = torch.randint(0, 256, (n, k // 2), generator=generator, dtype=torch.uint8)
    scales = (torch.rand(n, groups, generator=generator) + 0.5).to(dtype)
    zeros = torch.randint(0, 16, (n, groups), generator=generator).to(dtype)
    args = [t.to(device()) for t in (qweight, scales, zeros)]
    eye = torch.eye(k, device=device(), dtype=dtype)
    with override(config={"BLOCK_M": 32, "BLOCK_N": 16, "BLOCK_K": 32 if strategy == "direct"
                          else 2 * group_size, "GROUP_M": 1, "num_warps": 4, "num_stages": 2},
                  strategy=strategy):
        result = torch.cat([generated.int4_weight_linear(eye[start:start + rows], *args, group_size)
                            for start in range(0, k, rows)])
    assert set(word_choices) == ({dtype == torch.float16} if strategy == "gemv" else set())
    expected = quant.dequantize_int4(args[0], args[1].float(), args[2].float(), group_size).T
    # (the K blocks' sums of x times the zero points cancel against their products with q, in
    # float32: a wrong nibble would be off by a whole scale, at least 0.5; float16 rounds the
    # result to 2**-11 of it, at most 22.5)
    tolerance = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(result.float(), expected, rtol=0, atol=tolerance)


def test_the_gemv_reads_b_as_words_where_its_rows_allow(word_choices):
    """The word form (matmul_rt.reads_words): 16-bit activations and B's bytes contiguous along
    K, every row on a word, B's start on 16 bytes; else the byte form, which computes the same
    sums."""
    n, k, group = 24, 256, 64
    generator = torch.Generator().manual_seed(5)
    qweight = torch.randint(0, 256, (n, k // 2), generator=generator, dtype=torch.uint8)
    scales = torch.rand(n, k // group, generator=generator) + 0.5
    zeros = torch.randint(0, 16, (n, k // group), generator=generator).float()
    x = torch.randn(1, k, generator=generator)
    # B 1 and 4 bytes into a wider buffer (its rows off words; on words but its start off 16
    # bytes), and rows 2 bytes longer than B's (off words from the second); made on the device:
    # a copy of the view there would be contiguous
    on_device = qweight.to(device())
    wide = torch.zeros(n, k // 2 + 16, dtype=torch.uint8, device=device())
    wide[:, 1:1 + k // 2] = on_device
    four_in = torch.zeros(n, k // 2 + 16, dtype=torch.uint8, device=device())
    four_in[:, 4:4 + k // 2] = on_device
    long_rows = torch.zeros(n, k // 2 + 2, dtype=torch.uint8, device=device())
    long_rows[:, :k // 2] = on_device
    cases = [(torch.float16, on_device, True), (torch.float16, wide[:, 1:1 + k // 2], False),
             (torch.float16, four_in[:, 4:4 + k // 2], False),
             (torch.float16, long_rows[:, :k // 2], False),
             (torch.float32, on_device, False), (torch.float16, on_device.T.contiguous().T, False)]
    results = []
    for dtype, b, _ in cases:
        with override(strategy="gemv"):
            results.append(generated.int4_weight_linear(
                x.to(dtype).to(device()), b, scales.to(dtype).to(device()),
                zeros.to(dtype).to(device()), group).float())
    assert word_choices == [want for _, _, want in cases]
    expected = x.double() @ quant.dequantize_int4(qweight, scales, zeros, group).double().T
    for result, (dtype, _, _) in zip(results, cases):
        error = ((result.double().cpu() - expected).norm() / expected.norm()).item()
        assert error < (2e-3 if dtype == torch.float16 else 1e-5), (dtype, error)


def test_int8_linear_accumulates_exactly_in_int32():
    # sums past 2**24, where float32 partial sums would round: one rounding, at the end
    m, n, k = 4, 8, 2048
    generator = torch.Generator().manual_seed(1)
    x = torch.randint(100, 128, (m, k), generator=generator, dtype=torch.int8).to(device())
    w = torch.randint(100, 128, (n, k), generator=generator, dtype=torch.int8).to(device())
    ones_m, ones_n = torch.ones(m, 1, device=device()), torch.ones(n, device=device())
    exact = (x.cpu().long() @ w.cpu().long().T).float().to(device())  # (CUDA has no int64 mm)
    assert exact.max() > 2 ** 24
    for strategy in ("direct", "two_stage:2", "atomic:2"):
        with override(strategy=strategy):
            result = generated.int8_linear(x, ones_m, w, ones_n, out_dtype=torch.float32)
        assert torch.equal(result, exact), strategy


def test_one_row_of_a_quantized_weight_takes_the_gemv_kernel():
    # at M = 1 (leading dims folded) the GEMV kernel; from 2 rows the tile kernels; never for an
    # int8 A (W8A8: exact int32 dots)
    # (plans read metadata only: meta tensors, as on the GPU tier, planned for an H100's 132
    # multiprocessors); a B of fewer columns than 4 a multiprocessor keeps the split tiles
    int4 = sys.modules["generated.int4_weight_linear"].LAYOUT
    for n, shape, gemv in ((1024, (1, 256), True), (1024, (256,), True),
                           (1024, (1, 1, 256), True), (1024, (2, 256), False),
                           (1024, (16, 256), False), (1024, (2, 1, 256), False),
                           (4 * 132, (1, 256), True), (4 * 132 - 16, (1, 256), False)):
        qweight = torch.zeros(n, 128, dtype=torch.uint8, device="meta")
        scales = torch.ones(n, 2, device="meta")
        x = torch.ones(shape, device="meta")
        plan = matmul_rt.launch_plan(int4, x, qweight, scales, scales, None, group=128)
        assert (plan.strategy.kind == "gemv") == gemv, (n, shape, plan.strategy)
    assert sys.modules["generated.int8_weight_linear"].LAYOUT.gemv
    assert not sys.modules["generated.int8_linear"].LAYOUT.gemv
    # W8A8 at one row and a B wide enough for the GEMV kernel's column rule: the tile kernels
    x = torch.ones(1, 64, dtype=torch.int8, device="meta")
    qweight = torch.ones(1024, 64, dtype=torch.int8, device="meta")
    # (in the layout's order: A, B, then the epilogue's operands)
    plan = matmul_rt.launch_plan(sys.modules["generated.int8_linear"].LAYOUT, x, qweight,
                                 torch.ones(1, device="meta"), torch.ones(1024, device="meta"),
                                 None)
    assert plan.strategy.kind != "gemv"


def test_deterministic_algorithms_get_the_ordered_split():
    args = ("atomic", 16, 4096, 8192, 1, torch.device("cpu"), (1, 2, 4, 8))
    assert matmul_rt.strategy(*args).kind == "atomic"
    # the setting is part of a replay's signature: a call replayed before it changes is planned
    # again after
    assert matmul_rt.RUNTIME.replay_state()()[1] is False
    torch.use_deterministic_algorithms(True)
    try:
        assert matmul_rt.strategy(*args).kind == "two_stage"
        assert matmul_rt.RUNTIME.replay_state()()[1] is True
    finally:
        torch.use_deterministic_algorithms(False)


def test_a_k_tail_past_the_dots_least_block_is_planned():
    # int8 dots take 32 columns of K: a spec space of BLOCK_K 16 runs 32 (prune_for), so K = 48
    # has a partial last block; the plan's even_k must judge the raised block, not the spec's
    layout = dataclasses.replace(sys.modules["generated.int8_linear"].LAYOUT, block_ks=(16,))
    x = torch.randint(-127, 128, (4, 48), dtype=torch.int8, device=device())
    w = torch.randint(-127, 128, (8, 48), dtype=torch.int8, device=device())
    x_scale, w_scale = torch.ones(4, 1, device=device()), torch.ones(8, device=device())
    assert not matmul_rt.launch_plan(layout, x, w, x_scale, w_scale, None).even_k
    x, w = x[:, :32], w[:, :32]
    assert matmul_rt.launch_plan(layout, x, w, x_scale, w_scale, None).even_k


def _int4_args(n=8, k=64, group_size=32):
    w = _randn(n, k)
    return (_randn(3, k), *quant.quantize_int4(w, group_size), group_size)


@pytest.mark.parametrize("change, error, words", [
    (lambda a: (a[0], a[1].view(torch.int8), *a[2:]), TypeError,
     "argument 'qweight' has dtype torch.int8; supported: uint8"),
    (lambda a: (a[0], torch.cat([a[1], a[1]], dim=1), *a[2:]), ValueError,
     "it stores 2 elements of K a byte"),
    (lambda a: (*a[:2], a[2][:, :1], *a[3:]), ValueError,
     "argument 'scales' must have shape (N, K / group_size) = (8, 2), got (8, 1) (which fits "
     "group_size=64)"),
    (lambda a: (*a[:2], a[2][:1], *a[3:]), ValueError,
     "argument 'scales' must have shape (N, K / group_size) = (8, 2), got (1, 2)"),
    (lambda a: (*a[:3], a[3].double(), a[4]), TypeError, "argument 'zeros' has dtype torch.float64"),
    (lambda a: (*a[:3], a[3].half(), a[4]), TypeError, "all operands must have the same dtype"),
    (lambda a: (*a[:4], 48), ValueError,
     "argument 'group_size' must be a power of two of at least 32"),
    (lambda a: (a[0][:, :48], a[1][:, :24], *a[2:4], 32), ValueError,
     "K = 48 is not a multiple of group_size = 32"),
])
def test_int4_bad_formats_are_named_before_any_launch(change, error, words):
    with pytest.raises(error) as raised:
        generated.int4_weight_linear(*change(_int4_args()))
    assert words in str(raised.value)


def test_int8_linear_takes_its_dtypes_and_scale_shapes():
    x = torch.randint(-127, 128, (2, 3, 32), dtype=torch.int8, device=device())
    w = torch.randint(-127, 128, (8, 32), dtype=torch.int8, device=device())
    x_scale, w_scale = torch.rand(2, 3, 1, device=device()), torch.rand(8, device=device())
    assert generated.int8_linear(x, x_scale, w, w_scale).dtype == torch.bfloat16
    column = generated.int8_linear(x, x_scale, w, w_scale, out_dtype=torch.float32)
    flat = generated.int8_linear(x, x_scale[..., 0], w, w_scale, out_dtype=torch.float32)
    assert torch.equal(column, flat)
    with pytest.raises(TypeError, match="argument 'x' has dtype torch.float32; supported: int8"):
        generated.int8_linear(x.float(), x_scale, w, w_scale)
    with pytest.raises(TypeError, match="argument 'w_scale' has dtype torch.float16"):
        generated.int8_linear(x, x_scale, w, w_scale.half())
    with pytest.raises(TypeError, match="argument 'out_dtype' must be a torch.dtype, got None"):
        generated.int8_linear(x, x_scale, w, w_scale, out_dtype=None)
    with pytest.raises(ValueError, match=r"'x_scale' has shape \(3, 2\), which does not broadcast "
                                         r"to \(2, 3\) \(\.\.\. x M\) or, of A's rank, \(\.\.\., M, 1\)"):
        generated.int8_linear(x, x_scale[..., 0].T, w, w_scale)


# --- the spec form ------------------------------------------------------------------------------


def _parse(text: str):
    return parse_spec(text, Source("specs/q.toml", "0" * 64, text))


DEQUANT_CASES = [
    ("bits not a power of two", "bits = 4", "bits = 3", "dequant.bits", "expected one of 1, 2, 4, 8"),
    ("signed sub-byte elements", 'dtypes = ["uint8"]', 'dtypes = ["int8"]', "dequant.bits",
     "4-bit elements are unpacked unsigned"),
    ("storage not declared", ', dtypes = ["uint8"], range = [0, 255]', "", "args.qweight",
     "must declare its storage"),
    ("a value without q", 'value = "(q - zeros) * scales"', 'value = "zeros * scales"',
     "dequant.value", "never reads q"),
    ("a value reading A", 'value = "(q - zeros) * scales"', 'value = "(q - zeros) * scales * x"',
     "dequant.value", "reads the unpacked integer q"),
    ("a value reading a scalar", 'value = "(q - zeros) * scales"',
     'value = "(q - zeros) * scales * group_size"', "dequant.value",
     "a dequant value reads q and the scale operands"),
    ("group naming a tensor", 'group = "group_size"', 'group = "scales"', "dequant.group",
     "got 'scales' (a tensor argument)"),
    ("a group default no launch takes", 'group_size = { kind = "int", default = 128 }',
     'group_size = { kind = "int", default = 100 }', "args.group_size.default",
     "a power of two of at least 32 for 4-bit elements, got 100"),
    ("a group default under the dots' K", 'group_size = { kind = "int", default = 128 }',
     'group_size = { kind = "int", default = 16 }', "args.group_size.default",
     "at least 32 for 4-bit elements, got 16"),
    ("group left out", 'group = "group_size"\n', "", "dequant",
     "name the int argument that sets the group size"),
    ("group misspelled", 'group = "group_size"', 'grup = "group_size"', "dequant",
     "found 'grup' (a misspelling of 'group'?)"),
    ("[dequant] misspelled", "[dequant]\n", "[dequnt]\n", "args.scales",
     "found 'dequnt' (a misspelling of 'dequant'?)"),
    ("a per-group operand never read", 'value = "(q - zeros) * scales"', 'value = "q * scales"',
     "args.zeros", "a per-group operand the dequant value never reads"),
    ("per-group scales in the epilogue", 'out = "acc + bias"', 'out = "acc + scales"',
     "epilogue.out", "per-group scales enter through the dequantized B"),
    ("per-group operands without [dequant]", "[dequant]\nbits = 4\ngroup = \"group_size\"\n"
     "value = \"(q - zeros) * scales\"      # per group: applied to each B tile in the K loop\n",
     "", "args.scales", "needs a [dequant] table"),
]


@pytest.mark.parametrize("what, old, new, key, words", DEQUANT_CASES,
                         ids=[c[0] for c in DEQUANT_CASES])
def test_dequant_spec_errors_are_located(what, old, new, key, words):
    assert old in INT4_SPEC, f"test table out of date: {old!r}"
    with pytest.raises(SpecError) as err:
        _parse(INT4_SPEC.replace(old, new, 1))
    message = str(err.value)
    assert message.startswith(f"specs/q.toml: [{key}]"), message
    assert words in message, message


def _dequant_spec(value: str, grouped: bool) -> str:
    """A quantized linear reading ``value`` with per-group (or per-channel) scales and zeros."""
    dims = '["N", "G"]' if grouped else '["N"]'
    names = ["scales"] + (["zeros"] if "zeros" in value else [])
    scales = "\n".join(f'{n} = {{ kind = "tensor", dims = {dims} }}' for n in names)
    group = ('group_size = { kind = "int", default = 128 }\n', 'group = "group_size"\n') \
        if grouped else ("", "")
    used = " + ".join(names + (["group_size"] if grouped else []))
    return f"""
[op]
name = "quantized"
family = "matmul"
doc = "d"
reference = "torch.mm(x, qweight.T) + {used}"
[args]
x = {{ kind = "tensor", dims = ["M", "K"] }}
qweight = {{ kind = "tensor", dims = ["N", "K"], dtypes = ["uint8"] }}
{scales}
{group[0]}[dequant]
bits = 4
{group[1]}value = "{value}"
[epilogue]
out = "acc"
"""


@pytest.mark.parametrize("value, grouped, mode, coef, offset", [
    ("q * scales", False, "channel", "scales", ""),                  # int8_weight_linear's
    ("scales * q / 2.0", False, "channel", "scales / 2.0", ""),
    ("(q - zeros) * scales", False, "block", "scales_channel", "-zeros_channel * scales_channel"),
    ("(q - zeros) * scales", True, "block", "scales_group", "-zeros_group * scales_group"),
    ("q * scales - zeros", True, "block", "scales_group", "-zeros_group"),
    ("-(q - 8.0) * scales", True, "block", "-scales_group", "8.0 * scales_group"),
    ("exp(q) * scales", True, "tile", "", ""),                       # not linear in q
    ("q * q * scales", False, "tile", "", ""),
])
def test_the_planner_applies_a_value_where_it_is_cheapest(value, grouped, mode, coef, offset):
    """Linear in q with per-channel factors only: after the K loop; linear with per-group
    operands or an offset: per K block; anything else: per weight element."""
    plan = FAMILIES["matmul"].plan(_parse(_dequant_spec(value, grouped)))
    assert (plan.dequant_mode, plan.coef_code, plan.offset_code) == (mode, coef, offset)


def test_the_gemv_space_keeps_a_channel_accumulator_in_registers():
    """Channel mode holds its (BLOCK_N, BLOCK_K / packed) products across the K loop: the space
    leaves out the blocks it would spill at, which block mode (sums a step) keeps; each leads
    with 16 columns x 8 KiB of B."""
    matmul = sys.modules["specgen.families.matmul"]
    eight_bit = _dequant_spec("q * scales", False).replace("bits = 4", "bits = 8")
    channel = FAMILIES["matmul"].plan(_parse(eight_bit))
    block = FAMILIES["matmul"].plan(_parse(_dequant_spec("(q - zeros) * scales", True)))
    assert channel.gemv_configs[0] == {"BLOCK_N": 16, "BLOCK_K": 512, "STAGES": 3, "num_warps": 4}
    assert block.gemv_configs[0] == {"BLOCK_N": 16, "BLOCK_K": 1024, "STAGES": 3, "num_warps": 4}

    def held(config):
        return config["BLOCK_N"] * config["BLOCK_K"] / (32 * config["num_warps"])
    assert max(map(held, channel.gemv_configs)) <= matmul.GEMV_ACC_PER_THREAD
    left_out = [c for c in block.gemv_configs if c not in channel.gemv_configs]
    assert left_out and min(map(held, left_out)) > matmul.GEMV_ACC_PER_THREAD


# formats no shipped spec has: 2-bit elements through a value not linear in q (computed per weight
# element, per-channel scales loaded before the K loop), and 1-bit ones through a linear value
# with an offset (scaled per K block); K off the blocks, so the last block is partial
TWO_BIT_EXP = """
[op]
name = "two_bit_exp_linear"
family = "matmul"
doc = "x @ (exp(q / 4) * scales).T, four 2-bit q a byte"
reference = "F.linear(x, torch.exp(torch.stack([qweight & 3, (qweight >> 2) & 3, (qweight >> 4) & 3, qweight >> 6], -1).reshape(qweight.shape[0], -1).to(x.dtype) * 0.25) * scales[:, None])"
[args]
x = { kind = "tensor", dims = ["M", "K"] }
qweight = { kind = "tensor", dims = ["N", "K"], dtypes = ["uint8"] }
scales = { kind = "tensor", dims = ["N"] }
[dequant]
bits = 2
value = "exp(q * 0.25) * scales"
[epilogue]
out = "acc"
"""
ONE_BIT_SIGN = """
[op]
name = "one_bit_sign_linear"
family = "matmul"
doc = "x @ ((2 q - 1) * scales).T, eight 1-bit q a byte"
reference = "F.linear(x, (torch.stack([(qweight >> 0) & 1, (qweight >> 1) & 1, (qweight >> 2) & 1, (qweight >> 3) & 1, (qweight >> 4) & 1, (qweight >> 5) & 1, (qweight >> 6) & 1, qweight >> 7], -1).reshape(qweight.shape[0], -1).to(x.dtype) * 2.0 - 1.0) * scales[:, None])"
[args]
x = { kind = "tensor", dims = ["M", "K"] }
qweight = { kind = "tensor", dims = ["N", "K"], dtypes = ["uint8"] }
scales = { kind = "tensor", dims = ["N"] }
[dequant]
bits = 1
value = "(q * 2.0 - 1.0) * scales"
[epilogue]
out = "acc"
"""


@pytest.mark.parametrize("text, mode, k", [(TWO_BIT_EXP, "tile", 200), (ONE_BIT_SIGN, "block", 272)])
def test_authored_formats_of_other_widths(authored, text, mode, k):
    module = authored(text)
    assert module.LAYOUT.dequant_mode == mode
    generator = torch.Generator().manual_seed(k)
    packed = module.LAYOUT.packed
    x = torch.randn(5, k, generator=generator).to(device())
    qweight = torch.randint(0, 256, (24, k // packed), generator=generator,
                            dtype=torch.uint8).to(device())
    scales = (torch.rand(24, generator=generator) + 0.5).to(device())
    # the GEMV kernel where the value is linear in q (block); a forced one runs the direct
    # kernel where the module has none (tile)
    assert module.LAYOUT.gemv == (mode == "block")
    for strategy in ("direct", "two_stage:2", "gemv"):
        with override(strategy=strategy), record_launches() as log:
            result = getattr(module, module.OP.name)(x, qweight, scales)
        ran = strategy.split(":")[0]
        if strategy == "gemv" and mode != "block":
            ran = "direct"
        assert log[-1].kernel == ran, (strategy, log[-1].kernel)
        expected = module.reference(x.double(), qweight, scales.double())
        torch.testing.assert_close(result.double(), expected, rtol=1e-5, atol=1e-4)


def test_one_bit_elements_take_the_word_form(authored, word_choices):
    # 32 elements a word, no groups (the value scaled per K block, with an offset): the word
    # form's 5 levels of splits of A's row and its 32 shifts, at M = 1 with float16 activations
    module = authored(ONE_BIT_SIGN)
    k = 256
    generator = torch.Generator().manual_seed(k)
    x = torch.randn(1, k, generator=generator).half().to(device())
    qweight = torch.randint(0, 256, (24, k // 8), generator=generator,
                            dtype=torch.uint8).to(device())
    scales = (torch.rand(24, generator=generator) + 0.5).half().to(device())
    with override(strategy="gemv"), record_launches() as log:
        result = getattr(module, module.OP.name)(x, qweight, scales)
    assert word_choices == [True] and log[-1].kernel == "gemv"
    expected = module.reference(x.double(), qweight, scales.double())
    error = ((result.double() - expected).norm() / expected.norm()).item()
    assert error < 2e-3, error


def test_int8_gemv_word_form_reads_every_signed_byte(word_choices):
    # x = I at M = 1 with float16 activations: row k of the result is column k of the weight
    # (per-channel scales), each of a word's 4 signed bytes read once, -128 and 127 included;
    # K off the blocks, so the last block is partial
    k, n = 72, 24
    generator = torch.Generator().manual_seed(8)
    qweight = torch.randint(-128, 128, (n, k), generator=generator, dtype=torch.int8)
    qweight[0, :2] = torch.tensor([-128, 127], dtype=torch.int8)
    scales = (torch.rand(n, generator=generator) + 0.5).half()
    qweight, scales = qweight.to(device()), scales.to(device())
    eye = torch.eye(k, device=device(), dtype=torch.float16)
    with override(strategy="gemv", config={"BLOCK_N": 16, "BLOCK_K": 32, "STAGES": 2,
                                           "num_warps": 4}):
        result = torch.cat([generated.int8_weight_linear(eye[i:i + 1], qweight, scales)
                            for i in range(k)])
    assert set(word_choices) == {True}
    expected = quant.dequantize_int8(qweight, scales.float()).T
    # (a wrong byte is off by a whole scale at least; float16 rounds to 2**-11 of at most 192)
    torch.testing.assert_close(result.float(), expected, rtol=0, atol=0.1)


def test_a_traced_gemv_decides_its_word_form_from_the_offset(monkeypatch):
    # fake tensors have no addresses: their offset into an allocation decides (as for TMA), and
    # WORDS stays a plain bool; a slice one byte in keeps the bytes
    from torch.fx.experimental.proxy_tensor import make_fx
    import importlib
    launch_module = importlib.import_module("specgen.runtime.launch")
    launched = []
    monkeypatch.setattr(launch_module, "wrap_triton", lambda kernel: type(
        "Grid", (), {"__getitem__": lambda self, grid: lambda *a, **kw: launched.append(kw)})())
    n, k, group = 32, 256, 64
    qweight, scales, zeros = (t.to(device()) for t in quant.quantize_int4(torch.randn(n, k), group))
    wide = torch.zeros(n, k // 2 + 4, dtype=torch.uint8, device=device())
    wide[:, 1:1 + k // 2] = qweight
    x = torch.randn(1, k, device=device()).half()
    for b in (qweight, wide[:, 1:1 + k // 2]):
        with override(strategy="gemv"):
            make_fx(lambda x, b, s, z: generated.int4_weight_linear(x, b, s, z, group),
                    tracing_mode="fake")(x, b, scales.half(), zeros.half())
    assert [kw["WORDS"] for kw in launched] == [True, False]
    assert all(type(kw["WORDS"]) is bool for kw in launched)


def test_a_replayed_gemv_keeps_its_form_to_its_alignment(word_choices):
    # a replay's signature records whether each tensor starts on 16 bytes: a B 16 bytes into a
    # buffer reads words, and its recording replays; one 4 bytes in is another signature, read
    # as bytes (words there would share a recording with a B 1 byte in, misaligned on a GPU)
    n, k, group = 24, 256, 64
    qweight, scales, zeros = quant.quantize_int4(torch.randn(n, k), group)
    buffer = torch.zeros(n * k // 2 + 64, dtype=torch.uint8, device=device())
    x = torch.randn(1, k).half().to(device())
    args = (scales.half().to(device()), zeros.half().to(device()), group)
    expected = x.double() @ quant.dequantize_int4(qweight, scales.half().float(),
                                                  zeros.half().float(), group).double().T.to(device())
    choices = []
    for offset in (16, 4, 1):
        b = buffer[offset:offset + n * k // 2].view(n, k // 2)
        b.copy_(qweight.to(device()))
        before = len(word_choices)
        with override(strategy="gemv"):
            for _ in range(4):  # runs, records, then replays
                result = generated.int4_weight_linear(x, b, *args)
                error = ((result.double() - expected).norm() / expected.norm()).item()
                assert error < 2e-3, (offset, error)
        choices.append(set(word_choices[before:]))
    # (the B 1 byte in shares the signature of the B 4 bytes in: it replays that recording)
    assert choices == [{True}, {False}, set()]

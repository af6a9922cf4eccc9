"""The attention family beyond the property suite: the key bounds the planner derives from a mask
(checked against the mask itself, key by key), the row logsumexp the forward saves, and the
errors bad calls and bad specs get before any launch."""

import ast
import itertools
import math
import sys

import numpy
import pytest
import torch

import generated
from specgen import derive
from specgen import references as ref
from specgen.errors import SpecError
from specgen.families import attention as family
from specgen.model import Source
from specgen.parse import parse_spec
from specgen.runtime import attention as runtime
from specgen.runtime import interpreting, override
from specgen.runtime.context import record_launches
from specgen.testing import device
from specgen.testing.core import compiled_kernel_counts, nvidia_backend_missing


class _Index(float):
    """A floor or ceil result: ``.to(tl.int32)`` makes it an int, as in the kernel."""

    def to(self, _dtype):
        return int(self)


class _TL:
    """The few tl functions bound code calls, on Python numbers."""

    int32 = "int32"

    @staticmethod
    def abs(x):
        return abs(x)

    @staticmethod
    def minimum(a, b):
        return min(a, b)

    @staticmethod
    def maximum(a, b):
        return max(a, b)

    @staticmethod
    def where(c, a, b):
        return a if c else b

    float32, float64 = "float32", "float64"

    @staticmethod
    def cast(x, dtype):
        return numpy.float32(x) if dtype == "float32" else numpy.float64(x)

    @staticmethod
    def floor(x):
        return _Index(math.floor(x))

    @staticmethod
    def ceil(x):
        return _Index(math.ceil(x))


MASKS = [
    "j <= i", "j < i", "j >= i", "j > i - window and j <= i", "i - window < j",
    "j <= i + window", "2 * j <= i + 3", "j * 2 > i - 1", "not (j > i)", "j == i",
    "j <= i or j < window", "j >= i or j + window <= i", "i < window", "j != i",
    "j * j <= i", "not (j <= i and j > i - window)", "window > 3 and j <= i",
    "j <= i / 2 + 0.5", "9 * j <= i - 6", "3 * j < i - 8", "j > i - abs(window)",
    "j <= i + 2 ** -1", "j - j + i < 3",
]


def _bound_code(code: str):
    """Bound code as the kernel computes it: rows cast to float64 where a bound is fractional,
    Python float constants taking that type (Triton's constants take the tensor's), floor and
    ceil made ints by ``.to(tl.int32)``; rounding can still land a whole number one off (9 * j
    <= i - 6 at i = 150), which the bounds' widening by a key covers."""
    return compile(code, "<bound>", "eval")


@pytest.mark.parametrize("source", MASKS)
def test_key_bounds_hold_key_by_key(source):
    # for every block of rows: no key outside `any` is visible to a row, and every key inside
    # `all` is visible to every row (the kernel skips the first and leaves the test out of the
    # second); exact bounds where the mask compares j with an expression linear in i
    tree = ast.parse(source, mode="eval").body
    blocks = family.mask_blocks(tree, {}, frozenset({"i", "j", "window"}))
    nonlinear = source in ("j * j <= i", "j != i", "j - j + i < 3")
    assert blocks.exact is not nonlinear, blocks
    condition = compile(source, "<mask>", "eval")
    bound = {name: _bound_code(code)
             for name, code in zip(("any_lo", "any_hi", "all_lo", "all_hi"), (*blocks.any, *blocks.all))}
    keys = 60
    for window, first, size in itertools.product((0, 1, 4, 30), range(0, 160, 7), (1, 4, 7)):
        last = first + size - 1
        scope = {"tl": _TL, "row_first": first, "row_last": last, "S": keys, "window": window}
        any_lo, any_hi, all_lo, all_hi = (eval(code, scope) for code in bound.values())
        for j in range(keys):
            seen = [eval(condition, {"i": i, "j": j, "window": window})
                    for i in range(first, last + 1)]
            if any(seen):
                assert any_lo <= j < any_hi, (source, window, first, last, j)
            if all_lo <= j < all_hi:
                assert all(seen), (source, window, first, last, j)


def test_a_fractional_bound_with_terms_past_float32s_range(authored):
    # the bound (i + 41) / 2 is computed in float64 in the kernel: in float32 its terms
    # (500000020.5) round to 500000032, and the blocks taken as wholly visible held keys the
    # mask hides, which then took part unmasked
    text = _spec_text(
        'mask = "2 * j <= i + 1000000041 - 1000000000"', name="test_far_constant_mask",
        reference="F.scaled_dot_product_attention(query, key, value, attn_mask=2 * torch.arange("
                  "key.shape[-2], device=query.device) <= torch.arange(query.shape[-2], "
                  "device=query.device)[:, None] + 41)")
    op = authored(text).test_far_constant_mask
    q, k, v = _randn64((1, 2, 64, 16), (1, 2, 64, 16), (1, 2, 64, 8), seed=21)
    with override(config=SMALL_TILES):
        out = op(q.float(), k.float(), v.float())
    visible = 2 * torch.arange(64, device=q.device) <= torch.arange(64, device=q.device)[:, None] + 41
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=visible)
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-5)


def test_causal_bounds_read_as_written():
    # the plan is data: for is_causal the rows' keys end after the last row, whole before the
    # first (so the kernel skips the blocks above the diagonal and tests only the diagonal's)
    spec = _spec('mask = "not is_causal or j <= i"', 'is_causal = { kind = "bool", default = false }',
                 reference="F.scaled_dot_product_attention(query, key, value, is_causal=is_causal)")
    variants = {v.test: v for v in family.plan(spec).variants}
    causal, full = variants["IS_CAUSAL"], variants["not IS_CAUSAL"]
    assert (causal.any, causal.all) == (("0", "row_last + 1"), ("0", "row_first + 1"))
    assert causal.visible == "col_j <= row_i"
    assert (full.any, full.all, full.visible) == (("0", "S"), ("0", "S"), "")


def test_forward_saves_each_rows_logsumexp():
    op = generated.REGISTRY["sliding_window_attention"]
    module = __import__("generated.sliding_window_attention", fromlist=["OP"])
    generator = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 3, 20, 8, generator=generator).to(device()) for _ in range(3))
    window = 5
    out, lse = runtime.forward(module.OP, (q, k, v, window, None))
    scores = (q.double() @ k.double().mT) / math.sqrt(8)
    i = torch.arange(20, device=q.device)[:, None]
    j = torch.arange(20, device=q.device)[None, :]
    scores = scores.masked_fill(~((j <= i) & (j > i - window)), float("-inf"))
    torch.testing.assert_close(lse.double(), torch.logsumexp(scores, -1), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.double(), op.reference(q.double(), k.double(), v.double(), window),
                               rtol=1e-5, atol=1e-5)


def test_a_row_that_sees_no_key_gives_zeros_and_its_logsumexp_is_minus_infinity():
    module = __import__("generated.scaled_dot_product_attention", fromlist=["OP"])
    q, k, v = (torch.randn(1, 2, 5, 8).to(device()) for _ in range(3))
    mask = torch.ones(5, 5, dtype=torch.bool, device=q.device)
    mask[2] = False
    out, lse = runtime.forward(module.OP, (q, k, v, mask, 0.0, False, None, False))
    assert (out[:, :, 2] == 0).all() and torch.isinf(lse[:, :, 2]).all()
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("heads, heads_kv, length, gqa", [(0, 2, 5, True), (0, 1, 5, False),
                                                          (4, 2, 0, True)])
def test_no_rows_or_no_heads_give_zero_gradients_of_the_inputs_shapes(heads, heads_kv, length,
                                                                       gqa):
    # nothing to launch (no query heads, or no rows), every gradient zeros of its input's shape:
    # the key's and value's head count is the key's own, not the query's over the group (0 here)
    q = torch.randn(1, heads, length, 8, device=device(), requires_grad=True)
    k, v = (torch.randn(1, heads_kv, 7, 8, device=device(), requires_grad=True) for _ in range(2))
    out = generated.scaled_dot_product_attention(q, k, v, enable_gqa=gqa)
    grads = torch.autograd.grad(out.sum(), (q, k, v))
    want = torch.autograd.grad(torch.nn.functional.scaled_dot_product_attention(
        q, k, v, enable_gqa=gqa).sum(), (q, k, v), allow_unused=True, materialize_grads=True)
    for got, expected in zip(grads, want):
        assert got.shape == expected.shape
        torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("scale", [-0.4, -0.0, 0.0, 0.4])
@pytest.mark.parametrize("causal", [False, True])
def test_any_scale_in_the_blocks_every_row_sees_whole(scale, causal):
    # 16-key blocks over 53 keys: whole blocks take the fused max and FMA, which need a scale of
    # at least 0 (the kernel flips a negative one into the query), the last block the tested
    # path. Queries of 12 times the keys' size spread a row's scores past exp2's range, where a
    # maximum taken with the wrong sign overflows (the online softmax hides any smaller error)
    module = __import__("generated.scaled_dot_product_attention", fromlist=["OP"])
    q, k, v = _randn64((2, 2, 53, 16), (2, 2, 53, 16), (2, 2, 53, 8), seed=5)
    q = q * 12
    args = (q.float(), k.float(), v.float(), None, 0.0, causal, scale, False)
    with override(config=SMALL_TILES):
        out, lse = runtime.forward(module.OP, args)
    want = ref.scaled_dot_product_attention(q, k, v, None, 0.0, causal, scale, False)
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-5)
    scores = q @ k.mT * scale
    if causal:
        scores = scores.masked_fill(torch.ones(53, 53, dtype=torch.bool, device=q.device)
                                    .triu(1), float("-inf"))
    torch.testing.assert_close(lse.double(), torch.logsumexp(scores, -1), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("splits", [1, 3])
def test_decoding_takes_a_negative_scale(splits):
    # packed grouped heads, split keys merged: the flip reaches decoding's kernel too (queries
    # 40 times the keys' size spread the scores past exp2's range, as above)
    q, k, v = _randn64((3, 4, 2, 16), (3, 2, 50, 16), (3, 2, 50, 16), seed=13)
    q = q * 40
    lengths = torch.tensor([50, 7, 23], dtype=torch.int32, device=q.device)
    with override(strategy=f"split:{splits}", config=SMALL_TILES):
        out = generated.decode_attention(q.float(), k.float(), v.float(), lengths, scale=-0.3,
                                         enable_gqa=True)
    want = ref.decode_attention(q, k, v, lengths, -0.3, True)
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("causal", [False, True])
def test_a_softcap_of_zero_caps_nothing(causal):
    # FlashAttention's softcap=0.0: the scores as they are, forward and backward (the capped
    # form divides by 0 there, in the kernel's unselected branch only)
    q, k, v = (t.float().requires_grad_() for t in _randn64((1, 2, 21, 16), (1, 2, 21, 16),
                                                             (1, 2, 21, 8), seed=3))
    out = generated.softcap_attention(q, k, v, 0.0, is_causal=causal)
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), grad)
    expected = torch.autograd.grad(want, (q, k, v), grad)
    for g, e in zip(got, expected):
        assert torch.isfinite(g).all()
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(
        generated.softcap_attention(q, k, v, 0.0).detach(),
        ref.softcap_attention(q.detach(), k.detach(), v.detach(), 0.0), rtol=1e-5, atol=1e-5)


def _qkv(*shape_q, s=6, e=8, ev=8, hkv=None):
    *batch, h, l, _ = shape_q
    hkv = hkv or h
    return (torch.randn(*shape_q).to(device()), torch.randn(*batch, hkv, s, e).to(device()),
            torch.randn(*batch, hkv, s, ev).to(device()))


@pytest.mark.parametrize("call, error, match", [
    (lambda q, k, v: generated.scaled_dot_product_attention(q, k, v, dropout_p=0.1),
     NotImplementedError, "dropout_p=0.1"),
    (lambda q, k, v: generated.scaled_dot_product_attention(
        q, k, v, attn_mask=torch.ones(4, 6, dtype=torch.bool, device=q.device), is_causal=True),
     ValueError, "attn_mask and is_causal"),
    (lambda q, k, v: generated.scaled_dot_product_attention(
        q, k, v, attn_mask=torch.ones(4, 6, dtype=torch.int32, device=q.device)),
     TypeError, "argument 'attn_mask' has dtype torch.int32"),
    (lambda q, k, v: generated.scaled_dot_product_attention(
        q, k, v, attn_mask=torch.ones(5, 6, dtype=torch.bool, device=q.device)),
     ValueError, "does not broadcast"),
    (lambda q, k, v: generated.scaled_dot_product_attention(q, k[..., :3], v),
     ValueError, "head dim 8 differs from key's 3"),
    (lambda q, k, v: generated.scaled_dot_product_attention(q, k, v.half()),
     TypeError, "one dtype"),
    (lambda q, k, v: generated.alibi_attention(q, k, v, torch.ones(3, device=q.device)),
     ValueError, "argument 'slopes' has shape"),
    (lambda q, k, v: generated.decode_attention(q, k, v, torch.tensor([3.0, 1.0], device=q.device)),
     TypeError, "argument 'cache_seqlens' has dtype torch.float32; expected int32 or int64"),
    (lambda q, k, v: generated.decode_attention(q, k, v, torch.tensor([3, 1, 2], device=q.device)),
     ValueError, r"argument 'cache_seqlens' has shape \(3,\); expected \(2,\)"),
    # a per-batch tensor indexes one batch dim: two batch dims (which the kernel would flatten
    # under cache_seqlens' (B,)) and none are refused
    (lambda q, k, v: generated.decode_attention(q[None], k[None], v[None],
                                                torch.tensor([3, 1], device=q.device)),
     ValueError, r"argument 'query' has 5 dims; expected 4 \(batch, heads, length, head dim\): "
                 r"cache_seqlens holds a value per batch element"),
    (lambda q, k, v: generated.decode_attention(q[0], k, v, torch.tensor([3, 1], device=q.device)),
     ValueError, r"argument 'query' has 3 dims; expected 4"),
])
def test_bad_calls_are_refused_before_any_launch(call, error, match):
    q, k, v = _qkv(2, 2, 4, 8)
    with pytest.raises(error, match=match):
        call(q, k, v)


def test_heads_that_do_not_group_name_enable_gqa():
    q, k, v = _qkv(1, 4, 4, 8, hkv=2)
    with pytest.raises(ValueError, match="pass enable_gqa=True"):
        generated.scaled_dot_product_attention(q, k, v)
    # grouping asked for, but 3 query heads do not share 2 key heads
    q, k, v = _qkv(1, 3, 4, 8, hkv=2)
    with pytest.raises(ValueError, match="query's head count must be a multiple of key's"):
        generated.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    with pytest.raises(ValueError, match="expected equal head counts or one head on either side$"):
        generated.scaled_dot_product_attention(q, k, v)
    q, k, v = _qkv(1, 3, 4, 300, e=300)
    with pytest.raises(ValueError, match="at most 256"):
        generated.scaled_dot_product_attention(q, k, v)


def _spec_text(attention: str, extra_args: str = "",
               reference: str = "F.scaled_dot_product_attention(query, key, value)",
               name: str = "variant") -> str:
    """An attention spec of query, key and value, ``extra_args`` and the ``[attention]`` table."""
    return f'''
[op]
name = "{name}"
family = "attention"
reference = "{reference}"

[args]
query = {{ kind = "tensor", dims = ["...", "H", "L", "E"] }}
key = {{ kind = "tensor", dims = ["...", "Hkv", "S", "E"] }}
value = {{ kind = "tensor", dims = ["...", "Hkv", "S", "Ev"] }}
{extra_args}

[attention]
{attention}
'''


def _spec(attention: str, extra_args: str = "",
          reference: str = "F.scaled_dot_product_attention(query, key, value)") -> object:
    text = _spec_text(attention, extra_args, reference)
    return parse_spec(text, Source("specs/variant.toml", "0" * 64, text))


@pytest.mark.parametrize("attention, extra, match", [
    ('mask = "j + 1"', "", r"\[attention.mask\].*is a value, and this entry is a condition"),
    ('score = "j <= i"', "", r"\[attention.score\].*is a condition"),
    ('mask = "s > 0"', "", r"\[attention.mask\].*name 's' cannot be used here"),
    ('score = "s + key"', "", r"\[attention.score\].*'key' cannot be used here: a tensor operand"),
    ('mask = "j <= i"', 'scale = { kind = "float", default = 1.0 }',
     r"\[args.scale\].*defaults to None"),
    ('mask = "j <= i"', 'bias = { kind = "tensor", dims = ["N"] }',
     r"\[args.bias.dims\]: expected the dims of an attention operand"),
    ('mask = "j <= i"', 'mode = { kind = "choice", values = ["a", "b"] }',
     r"\[args.mode\]: the attention family takes no choice arguments"),
    ('shape = "j <= i"', "", r"\[attention.shape\]: unknown key"),
])
def test_spec_errors_name_file_and_key(attention, extra, match):
    with pytest.raises(SpecError, match=match):
        _spec(attention, extra)


@pytest.mark.parametrize("splits", [1, 2, 3, 7])
def test_split_keys_merge_to_one_softmax(splits):
    # flash decoding: programs share a row's keys, a second kernel merges their partial results
    # by their logsumexps; a batch element with no keys (length 0) gives zeros, and splits with
    # no keys weigh nothing
    from specgen.runtime import override

    generator = torch.Generator().manual_seed(splits)
    q = torch.randn(3, 4, 2, 16, generator=generator).to(device())
    key, value = (torch.randn(3, 2, 200, 16, generator=generator).to(device()) for _ in range(2))
    lengths = torch.tensor([200, 0, 33], dtype=torch.int32, device=q.device)
    with override(strategy=f"split:{splits}"):
        out = generated.decode_attention(q, key, value, lengths, enable_gqa=True)
    want = ref.decode_attention(q.double(), key.double(), value.double(), lengths, None, True)
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-5)
    assert (out[1] == 0).all()


def test_split_count_fills_the_gpu_only_where_rows_do_not():
    # the planner's choice: one program per row block where those fill the multiprocessors
    # (2 per SM, 264 on an H100); else the most splits that keep the grid within that, each of
    # at least SPLIT_MIN_KEYS keys, at most MAX_SPLITS
    cpu = torch.device("cpu")
    assert runtime._splits(264, 32768, cpu) == 1
    assert runtime._splits(200, 32768, cpu) == 1           # two splits: 400 programs, past 264
    assert runtime._splits(64, 32768, cpu) == 4            # B8 Hkv8, a group packed a program
    assert runtime._splits(32, 131072, cpu) == 8           # B1 H32, one row each: 256, not 288
    assert runtime._splits(8, 1000, cpu) == 1              # too few keys to share
    assert runtime._splits(1, 10**6, cpu) == runtime.MAX_SPLITS


@pytest.mark.parametrize("splits", [1, 3])
def test_grouped_heads_packed_into_one_program_read_their_keys_once(splits):
    # decoding with grouped heads: a program takes the group's query heads as rows (PACKED),
    # with the rows' own heads for loads and stores; a mask tensor or a spec that reads the
    # head keeps a program per head
    from specgen.runtime import override, record_launches

    generator = torch.Generator().manual_seed(5)
    q = torch.randn(2, 6, 3, 16, generator=generator).to(device()).transpose(1, 2).contiguous()
    q = q.transpose(1, 2)                                   # the (B, L, H, E) layout
    key, value = (torch.randn(2, 2, 70, 16, generator=generator).to(device()) for _ in range(2))
    lengths = torch.tensor([70, 9], dtype=torch.int64, device=q.device)
    with override(strategy=f"split:{splits}"), record_launches() as logs:
        out = generated.decode_attention(q, key, value, lengths, enable_gqa=True)
        sdpa = generated.scaled_dot_product_attention(q, key, value, is_causal=True,
                                                      enable_gqa=True)
        masked = generated.scaled_dot_product_attention(
            q, key, value, attn_mask=torch.ones(3, 70, dtype=torch.bool, device=q.device),
            enable_gqa=True)
    packed = [launch.details.get("packed") for launch in logs if launch.kernel == "forward"]
    assert packed == [True, True, False], packed
    want = ref.decode_attention(q.double(), key.double(), value.double(), lengths, None, True)
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-5)
    q64, k64, v64 = q.double(), key.double(), value.double()
    torch.testing.assert_close(sdpa.double(), torch.nn.functional.scaled_dot_product_attention(
        q64, k64, v64, is_causal=True, enable_gqa=True), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(masked.double(), torch.nn.functional.scaled_dot_product_attention(
        q64, k64, v64, enable_gqa=True), rtol=1e-5, atol=1e-5)


def test_a_score_that_gives_minus_infinity_leaves_no_nan(tmp_path, monkeypatch):
    # a spec's score may hide keys itself (log(0) is -inf) in blocks with no element-wise test:
    # the softmax subtracts 0 there, not -inf, as for masked rows
    from click.testing import CliRunner

    from specgen.cli import main
    from specgen.runtime import override

    monkeypatch.chdir(tmp_path)
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs" / "later_keys.toml").write_text('''
[op]
name = "later_keys"
family = "attention"
reference = "F.scaled_dot_product_attention(query, key, value)"

[args]
query = { kind = "tensor", dims = ["...", "H", "L", "E"] }
key = { kind = "tensor", dims = ["...", "Hkv", "S", "E"] }
value = { kind = "tensor", dims = ["...", "Hkv", "S", "Ev"] }

[attention]
score = "s + log(where(j >= i, 1.0, 0.0))"
''')
    result = CliRunner().invoke(main, ["build", "specs", "--out", "later_ops"])
    assert result.exit_code == 0, result.output
    monkeypatch.syspath_prepend(str(tmp_path))
    import importlib
    op = importlib.import_module("later_ops").later_keys
    q, k, v = (torch.randn(1, 1, 40, 16).to(device()) for _ in range(3))
    with override(config={"BLOCK_M": 16, "BLOCK_N": 16, "num_warps": 4, "num_stages": 1}):
        out = op(q, k, v)
    i = torch.arange(40)[:, None]
    j = torch.arange(40)[None, :]
    want = torch.nn.functional.scaled_dot_product_attention(
        q.double(), k.double(), v.double(), attn_mask=(j >= i).to(q.device))
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-5)


def test_masks_as_torch_takes_them():
    # a float32 mask with a half query (torch adds it in float32); a mask that would grow the
    # scores' shape is refused, as torch refuses it
    q, k, v = (t.half() for t in _qkv(1, 3, 4, 8))
    mask = torch.randn(4, 6, device=q.device)
    out = generated.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    want = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double(),
                                                            attn_mask=mask.double())
    torch.testing.assert_close(out.double(), want, rtol=2e-3, atol=3e-3)
    for shape in [(2, 1, 3, 4, 6), (2, 3, 4, 6)]:
        with pytest.raises(ValueError, match="does not broadcast to the scores'"):
            generated.scaled_dot_product_attention(q, k, v, attn_mask=torch.zeros(shape, device=q.device))


def test_errors_name_the_ops_own_arguments():
    q, k, v = _qkv(2, 2, 4, 8)
    with pytest.raises(ValueError, match="key_cache has 6 keys and value_cache 5"):
        generated.decode_attention(q, k, v[..., :5, :], torch.tensor([1, 2], device=q.device))


@pytest.mark.skipif(not interpreting(), reason="the interpreter's bfloat16 dot only")
@pytest.mark.parametrize("call", [
    lambda q, k, v: generated.scaled_dot_product_attention(q, k, v),
    lambda q, k, v: generated.softcap_attention(q, k, v, 20.0),
    lambda q, k, v: generated.decode_attention(q[..., :1, :], k, v, torch.tensor([6, 3])),
], ids=["sdpa", "softcap", "decode"])
def test_the_interpreter_refuses_bfloat16_attention(call):
    # it would compute one wrongly (errors of 1e9) and say nothing, as a matmul would
    q, k, v = (t.bfloat16() for t in _qkv(2, 2, 4, 8))
    with record_launches() as log:
        with pytest.raises(NotImplementedError, match="computes a bfloat16 matrix product wrongly"):
            call(q, k, v)
    assert log == []


def test_configs_are_pruned_to_the_shared_memory(monkeypatch):
    # the estimate is Triton's count where it ran out on an H100 (E 256, Ev 16, float16, 64 x
    # 128 blocks, 3 stages: 241664 of 232448 bytes); where no config fits (float32, head dims
    # of 256) smaller tiles and fewer stages run
    import triton

    def configs(*points):
        return [triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=4, num_stages=s)
                for m, n, s in points]

    monkeypatch.setattr(runtime, "shared_memory", lambda device: 232448)
    half = torch.empty(1, dtype=torch.float16)
    kept = runtime.prune_configs(configs((64, 128, 3), (64, 64, 3)), {"q": half},
                                 BLOCK_E=256, BLOCK_EV=16)
    assert [(c.kwargs["BLOCK_N"], c.num_stages) for c in kept] == [(64, 3)]
    single = torch.empty(1, dtype=torch.float32)
    kept = runtime.prune_configs(configs((64, 64, 3), (128, 64, 3)), {"q": single},
                                 BLOCK_E=256, BLOCK_EV=256)
    # 4 * (2 stages * 32 * 512 + 64 * 256) = 196608 bytes
    assert [(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_stages) for c in kept] == \
        [(64, 32, 2)]
    # a tensor mask's tile counts: float32 at E 256, Ev 64 on 2 stages of 64 x 64 is 229376
    # bytes, Triton's count to the byte, and fits; a bool mask adds its 4096-byte tile (233472,
    # Triton's count too, ptxas for sm_90 under Triton 3.6 and 3.8) and does not fit
    kept = runtime.prune_configs(configs((64, 64, 2)), {"q": single},
                                 BLOCK_E=256, BLOCK_EV=64)
    assert [(c.kwargs["BLOCK_N"], c.num_stages) for c in kept] == [(64, 2)]
    flags = torch.empty(1, dtype=torch.bool)
    kept = runtime.prune_configs(configs((64, 64, 2)), {"q": single, "mask_ptr": flags},
                                 BLOCK_E=256, BLOCK_EV=64, MASK_KIND=1)
    assert [(c.kwargs["BLOCK_N"], c.num_stages) for c in kept] == [(32, 2)]
    # a float32 mask's tiles are pipelined as the keys' are: at E 16 over a 300-wide mask, 128 x
    # 128 blocks in 3 stages took 238080 bytes (Triton 3.6's count), in 2 stages 156160
    kept = runtime.prune_configs(configs((128, 128, 3), (128, 128, 2)),
                                 {"q": single, "mask_ptr": single},
                                 BLOCK_E=16, BLOCK_EV=16, MASK_KIND=2)
    assert [c.num_stages for c in kept] == [2]
    bf16 = torch.empty(1, dtype=torch.bfloat16)
    kept = runtime.prune_configs(configs((128, 64, 2)), {"q": bf16}, BLOCK_E=256, BLOCK_EV=256)
    assert [(c.kwargs["BLOCK_M"], c.num_stages) for c in kept] == [(128, 2)]
    kept = runtime.prune_configs(configs((128, 64, 4), (128, 128, 4)), {"q": bf16},
                                 BLOCK_E=128, BLOCK_EV=128)
    assert [(c.kwargs["BLOCK_N"], c.num_stages) for c in kept] == [(64, 4)]
    # the backward's key pass holds BLOCK_N keys and values and streams BLOCK_M query rows and
    # their output gradients: the same rule, roles swapped (2 * (4 stages * 64 * 256 + 128 *
    # 256) = 196608 bytes at E 128 fits; 4 stages of 128 rows do not)
    kept = runtime.prune_key_pass_configs(configs((128, 128, 4), (64, 128, 4)), {"q": half},
                                          BLOCK_E=128, BLOCK_EV=128)
    assert [(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"]) for c in kept] == [(64, 128)]
    # float32 at E 256: 4 * (2 * 32 * 512 + 64 * 512) = 262144 bytes overflows, one stage fits
    kept = runtime.prune_key_pass_configs(configs((64, 64, 3)), {"q": single},
                                          BLOCK_E=256, BLOCK_EV=256)
    assert [(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_stages) for c in kept] == \
        [(32, 64, 1)]
    # the key pass turns its scores into dV's operand through shared memory beside its tiles:
    # float32 at E 64 on 64 x 128 blocks in 3 stages, 197632 bytes without a mask (the tiles
    # are 163840), 263168 with a float32 one (Triton 3.6's counts)
    kept = runtime.prune_key_pass_configs(configs((64, 128, 3), (32, 64, 3)),
                                          {"q": single, "mask_ptr": single},
                                          BLOCK_E=64, BLOCK_EV=64, MASK_KIND=2)
    assert [(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"]) for c in kept] == [(32, 64)]
    # the query pass holds its rows' queries and output gradients: 128 rows at E 256 in bf16,
    # 2 * (3 * 64 * 512 + 128 * 512) = 327680 bytes, do not fit where the forward's 64 would
    kept = runtime.prune_query_pass_configs(configs((128, 64, 3), (64, 64, 2)), {"q": half},
                                            BLOCK_E=256, BLOCK_EV=256)
    assert [(c.kwargs["BLOCK_M"], c.num_stages) for c in kept] == [(64, 2)]


def test_the_score_derivatives_are_derived_at_build_time():
    softcap = family.plan(_spec('score = "30.0 * tanh(s / 30.0)"'))
    assert "tanh" in softcap.score_grad and softcap.head_grads == ()
    slopes = 'slopes = { kind = "tensor", dims = ["H"] }'
    alibi = family.plan(_spec('score = "s - slopes * abs(i - j)"', slopes,
                              "ref.alibi_attention(query, key, value, slopes)"))
    assert alibi.score_grad == "1.0"
    (name, grad), = alibi.head_grads
    assert name == "slopes" and "abs" in grad and "row_i" in grad
    # a per-head tensor the score reads where its derivative is 0 gets no gradient term
    constant = family.plan(_spec('score = "s + 0.0 * slopes"', slopes,
                                 "ref.alibi_attention(query, key, value, slopes)"))
    assert constant.head_grads == ()


def test_a_score_without_a_derivative_is_a_spec_error(monkeypatch):
    # every function of the expression language has a rule today; a new one without must stop
    # the build at the score, never give a wrong gradient
    def refuse(tree, name):
        raise derive.NotDifferentiable("newfn() has no derivative rule")

    monkeypatch.setattr(derive, "partial", refuse)
    with pytest.raises(SpecError, match=r"specs/variant.toml.*attention\.score.*newfn\(\)"):
        _spec('score = "s * 2.0"')


# ---- float64: computed in float64, as torch's math backend computes it ----------------------------

SMALL_TILES = {"BLOCK_M": 16, "BLOCK_N": 16, "num_warps": 4, "num_stages": 1}


def _randn64(*shapes, seed):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(*shape, generator=generator, dtype=torch.float64).to(device())
            for shape in shapes]


def _float64_exact(got, want, float32_result):
    """``got`` (our float64 result) within 1e-12 of torch's float64 ``want``, where the same
    call in float32 (``float32_result``) is more than 1e-7 off: float32 math, or a float32
    statistic or scale anywhere, would fail this."""
    assert got.dtype == torch.float64
    float32_error = (float32_result.double() - want).abs().max().item()
    assert float32_error > 1e-7, float32_error
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("masked", [False, True])
def test_float64_attention_is_computed_in_float64(masked, splits):
    # grouped heads, a float mask (or the causal one), a scale that float32 cannot hold, split
    # keys merged (flash decoding's workspaces): the output and each row's logsumexp
    module = __import__("generated.scaled_dot_product_attention", fromlist=["OP"])
    q, k, v, mask = _randn64((2, 4, 9, 16), (2, 2, 37, 16), (2, 2, 37, 8), (9, 37), seed=11)
    mask = mask if masked else None
    scale = 0.3
    args = (q, k, v, mask, 0.0, not masked, scale, True)
    with override(strategy=f"split:{splits}", config=SMALL_TILES):
        out, lse = runtime.forward(module.OP, args)
        public = generated.scaled_dot_product_attention(*args)
    assert torch.equal(out, public)
    want = ref.scaled_dot_product_attention(*args)
    narrow = [t.float() if t is not None else None for t in (q, k, v, mask)]
    _float64_exact(out, want, ref.scaled_dot_product_attention(*narrow, *args[4:]))
    scores = q @ k.repeat_interleave(2, dim=1).mT * scale
    if masked:
        scores = scores + mask
    else:
        scores = scores.masked_fill(torch.ones(9, 37, dtype=torch.bool, device=q.device)
                                    .triu(1), float("-inf"))
    assert lse.dtype == torch.float64
    torch.testing.assert_close(lse, torch.logsumexp(scores, -1), rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("splits", [1, 3])
def test_float64_decoding_is_computed_in_float64(splits):
    # a KV cache of grouped heads (their query heads packed into one program), split keys
    # merged, a batch element with no keys; the default scale 1 / sqrt(E) whole
    q, k, v = _randn64((3, 4, 2, 16), (3, 2, 50, 16), (3, 2, 50, 16), seed=12)
    lengths = torch.tensor([50, 0, 23], dtype=torch.int32, device=q.device)
    with override(strategy=f"split:{splits}", config=SMALL_TILES):
        out = generated.decode_attention(q, k, v, lengths, enable_gqa=True)
    want = ref.decode_attention(q, k, v, lengths, None, True)
    narrow = ref.decode_attention(q.float(), k.float(), v.float(), lengths, None, True)
    _float64_exact(out, want, narrow)
    assert (out[1] == 0).all()


def test_float64_takes_tiles_of_its_own(monkeypatch):
    # float64 elements take two registers each: the spaces' tiles (sized for 16-bit inputs)
    # spill. A float64 call tunes over FLOAT64_CONFIGS, by pass and head dims, every one of
    # which fits an H100's shared memory; so a frozen table's entries (tuned in bfloat16: a
    # launch takes only an entry whose config its prune keeps) cannot start a float64 launch
    # on tiles that spill. 16-bit and float32 calls keep the space's
    monkeypatch.setattr(runtime, "shared_memory", lambda device: 232448)
    module = sys.modules["generated.scaled_dot_product_attention"]
    double, half = torch.empty(1, dtype=torch.float64), torch.empty(1, dtype=torch.bfloat16)
    for suffix, prune, role, held, streamed in (
            ("kernel", runtime.prune_configs, "forward", "BLOCK_M", "BLOCK_N"),
            ("backward_query", runtime.prune_query_pass_configs, "query", "BLOCK_M", "BLOCK_N"),
            ("backward_key", runtime.prune_key_pass_configs, "key", "BLOCK_N", "BLOCK_M")):
        kernel = getattr(module, f"_scaled_dot_product_attention_{suffix}")
        space = [(c.kwargs[held], c.kwargs[streamed], c.num_warps, c.num_stages)
                 for c in kernel.configs]
        for dim, bound in ((16, 64), (64, 64), (80, 128), (128, 128), (256, 256)):
            block = max(16, 1 << (dim - 1).bit_length())
            kept = prune(kernel.configs, {"q": double}, BLOCK_E=block, BLOCK_EV=16)
            tiles = [(c.kwargs[held], c.kwargs[streamed], c.num_warps, c.num_stages)
                     for c in kept]
            assert tiles == list(runtime.FLOAT64_CONFIGS[role][bound]), (role, dim)
            assert not set(tiles) & set(space), (role, dim)
        # (every config of the space fits at E 64 in bfloat16)
        kept = prune(kernel.configs, {"q": half}, BLOCK_E=64, BLOCK_EV=64)
        assert [(c.kwargs[held], c.kwargs[streamed], c.num_warps, c.num_stages)
                for c in kept] == space, role


def test_float64_kernels_compile_for_sm90_with_no_float32_math():
    # the interpreter lets a loop-carried value change type and shows no float32 intermediate:
    # every attention kernel is compiled for float64 inputs (sm_90, no GPU needed: Triton's
    # NVIDIA backend ships ptxas), on its pass's float64 tiles, and its TTGIR holds no f32
    missing = nvidia_backend_missing()
    if missing:
        pytest.skip(missing)
    names = sorted(n for n, i in generated.REGISTRY.items() if i.family == "attention")
    compiled = compiled_kernel_counts("specgen.families.attention", names)
    assert compiled == {name: 4 for name in names}, compiled


def test_index_width_counts_the_per_head_and_per_batch_vectors():
    """ALiBi's slopes and decoding's cache lengths are read at a head's or a batch element's
    stride: views reaching past 2**31 elements into their storage take int64 (an audit found
    them left out of the choice; meta tensors: no memory, no launch)."""
    far = 2**30 + 1

    def bits(op, *args):
        with record_launches() as log:
            op(*args)
        return [launch.index_bits for launch in log]

    q, k, v = (torch.empty(1, 3, 64, 64, device="meta", dtype=torch.float16) for _ in range(3))
    near_slopes = torch.empty(3, device="meta", dtype=torch.float16)
    far_slopes = torch.empty_strided((3,), (far,), device="meta", dtype=torch.float16)
    assert bits(generated.alibi_attention, q, k, v, near_slopes) == [32]
    assert bits(generated.alibi_attention, q, k, v, far_slopes) == [64]
    query = torch.empty(3, 3, 1, 64, device="meta", dtype=torch.float16)
    caches = [torch.empty(3, 3, 64, 64, device="meta", dtype=torch.float16) for _ in range(2)]
    far_lengths = torch.empty_strided((3,), (far,), device="meta", dtype=torch.int32)
    assert bits(generated.decode_attention, query, *caches, far_lengths) == [64]

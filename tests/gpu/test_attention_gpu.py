"""Attention on the GPU: bfloat16 at real sizes (the interpreter computes a bfloat16 tl.dot
wrongly), int64 indexing past 2**31 elements, and torch.compile with no graph break."""

import importlib
import math

import pytest
import torch
import torch.nn.functional as F

import generated
from specgen import references as ref
from specgen import runtime
from specgen.runtime import tuned

# the module (specgen.runtime exports its launch function under the same name)
launch = importlib.import_module("specgen.runtime.launch")

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _reference(q, k, v, **kwargs):
    return F.scaled_dot_product_attention(q.double(), k.double(), v.double(), **kwargs)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dim", [64, 128, 256, 80])
def test_bfloat16_matches_float64_at_real_sizes(causal, dim):
    torch.manual_seed(dim)
    # (B, L, H, E) viewed as (B, H, L, E), grouped heads, L != S and not multiples of a block
    q = torch.randn(2, 1000, 8, dim, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    k = torch.randn(2, 2, 1100, dim, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(2, 2, 1100, dim, device="cuda", dtype=torch.bfloat16)
    out = generated.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
    want = _reference(q, k, v, is_causal=causal, enable_gqa=True)
    torch.testing.assert_close(out.double(), want, rtol=1e-2, atol=2e-2)


def test_variants_match_their_references_in_bfloat16():
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 777, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    slopes = torch.rand(4, device="cuda")
    q64, k64, v64 = q.double(), k.double(), v.double()
    for got, want in [
        (generated.softcap_attention(q, k, v, 20.0, True),
         ref.softcap_attention(q64, k64, v64, 20.0, True)),
        (generated.alibi_attention(q, k, v, slopes, True),
         ref.alibi_attention(q64, k64, v64, slopes.double(), True)),
        (generated.sliding_window_attention(q, k, v, 100),
         ref.sliding_window_attention(q64, k64, v64, 100)),
    ]:
        torch.testing.assert_close(got.double(), want, rtol=1e-2, atol=2e-2)


@pytest.mark.big_memory
def test_int64_indexing_past_two_to_the_31_elements():
    # key and value heads 2**31 elements apart in their storage: the second head's offsets pass
    # int32 (a KV cache that large), while only 2 x 512 x 64 elements are read
    heads, keys, dim = 2, 512, 64
    gap = 2**31
    storage = torch.empty(gap + keys * dim, device="cuda", dtype=torch.bfloat16)
    for t in (storage,):
        t[:keys * dim].normal_()
        t[gap:].normal_()
    key = storage.as_strided((1, heads, keys, dim), (0, gap, dim, 1))
    value = storage.as_strided((1, heads, keys, dim), (0, gap, dim, 1))
    q = torch.randn(1, heads, 40, dim, device="cuda", dtype=torch.bfloat16)
    out = generated.scaled_dot_product_attention(q, key, value, is_causal=True)
    want = _reference(q, key.contiguous(), value.contiguous(), is_causal=True)
    torch.testing.assert_close(out.double(), want, rtol=1e-2, atol=2e-2)
    del storage


def test_torch_compile_with_no_graph_break():
    q, k, v = (torch.randn(2, 4, 300, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    mask = torch.rand(300, 300, device="cuda") > 0.2

    @torch.compile(fullgraph=True)
    def block(q, k, v, mask):
        a = generated.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        b = generated.sliding_window_attention(q, k, v, 64)
        return a * 2 + b

    got = block(q, k, v, mask)
    want = (generated.scaled_dot_product_attention(q, k, v, attn_mask=mask) * 2
            + generated.sliding_window_attention(q, k, v, 64))
    torch.testing.assert_close(got, want, rtol=1e-2, atol=2e-2)
    assert math.isfinite(got.float().abs().max().item())


@pytest.mark.big_memory
def test_decoding_against_a_long_cache():
    # one query row per batch element against 131072 cached keys, grouped heads, lengths of
    # their own (the full cache, a short one, none): split over programs, then merged
    torch.manual_seed(0)
    batch, heads, heads_kv, keys, dim = 3, 8, 2, 131072, 128
    q = torch.randn(batch, heads, 1, dim, device="cuda", dtype=torch.bfloat16)
    cache = [torch.randn(batch, heads_kv, keys, dim, device="cuda", dtype=torch.bfloat16)
             for _ in range(2)]
    lengths = torch.tensor([keys, 1000, 0], device="cuda", dtype=torch.int32)
    out = generated.decode_attention(q, *cache, lengths, enable_gqa=True)
    want = ref.decode_attention(q.double(), cache[0].double(), cache[1].double(), lengths,
                                None, True)
    torch.testing.assert_close(out.double(), want, rtol=1e-2, atol=1e-2)
    assert (out[2] == 0).all()


# ---- the backward ------------------------------------------------------------------------------

def _grad_errors(fn, reference, inputs, *extra, **kwargs):
    """Each input's gradient error (norm of the difference over the norm) of ``fn`` and of
    torch's SDPA at the inputs' dtype (``reference`` at it), both against float64: torch's own
    error at bfloat16 is the scale ours is held to."""
    grad = torch.randn_like(reference(*inputs, *extra, **kwargs))
    wide = [t.detach().double().requires_grad_() for t in inputs]
    want = torch.autograd.grad(reference(*wide, *extra, **kwargs), wide, grad.double())
    errors = {}
    for name, f in (("ours", fn), ("torch", reference)):
        leaves = [t.detach().requires_grad_() for t in inputs]
        got = torch.autograd.grad(f(*leaves, *extra, **kwargs), leaves, grad)
        errors[name] = [((g.double() - w).norm() / w.norm()).item() for g, w in zip(got, want)]
    return errors


@pytest.mark.parametrize("case", ["causal L < S", "causal L > S", "gqa", "E256"])
def test_backward_in_bfloat16_at_real_sizes(case):
    torch.manual_seed(1)
    shapes = {
        "causal L < S": ((2, 8, 700, 128), (2, 8, 1100, 128), {"is_causal": True}),
        "causal L > S": ((2, 8, 1100, 128), (2, 8, 700, 128), {"is_causal": True}),
        "gqa": ((2, 8, 1000, 64), (2, 2, 1000, 64), {"enable_gqa": True, "is_causal": True}),
        "E256": ((1, 4, 900, 256), (1, 4, 900, 256), {}),
    }
    query_shape, key_shape, kwargs = shapes[case]
    q = torch.randn(*query_shape, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(*key_shape, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    errors = _grad_errors(generated.scaled_dot_product_attention,
                          F.scaled_dot_product_attention, [q, k, v], **kwargs)
    for ours, theirs in zip(errors["ours"], errors["torch"]):
        assert ours <= 2 * theirs + 1e-3, errors


def test_backward_of_the_variants_in_bfloat16():
    torch.manual_seed(2)
    q, k, v = (torch.randn(2, 4, 777, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    slopes = torch.rand(4, device="cuda")
    for fn, reference, inputs, extra in [
        (generated.softcap_attention, ref.softcap_attention, [q, k, v], (20.0, True)),
        (generated.alibi_attention, ref.alibi_attention, [q, k, v, slopes], (True,)),
        (generated.sliding_window_attention, ref.sliding_window_attention, [q, k, v], (100,)),
    ]:
        grad = torch.randn(2, 4, 777, 128, device="cuda", dtype=torch.bfloat16)
        leaves = [t.detach().requires_grad_() for t in inputs]
        got = torch.autograd.grad(fn(*leaves, *extra), leaves, grad)
        wide = [t.detach().double().requires_grad_() for t in inputs]
        want = torch.autograd.grad(reference(*wide, *extra), wide, grad.double())
        for g, w in zip(got, want):
            assert ((g.double() - w).norm() / w.norm()).item() < 2e-2, fn.__name__


@pytest.mark.big_memory
def test_backward_of_a_long_sequence_holds_no_length_by_keys_matrix():
    # B1 H8 S32768 E128: an L x S matrix of bfloat16 would be 16 GiB; the backward's own
    # allocations are the three gradients and two row statistics (some 200 MiB)
    q, k, v = (torch.randn(1, 8, 32768, 128, device="cuda", dtype=torch.bfloat16,
                           requires_grad=True) for _ in range(3))
    grad = torch.randn_like(q)
    # a first step compiles the kernels (where autotuning is asked for, its timing allocates a
    # 256 MiB buffer of its own to flush the L2 cache), then the step measured
    torch.autograd.grad(generated.scaled_dot_product_attention(q, k, v, is_causal=True),
                        (q, k, v), grad)
    out = generated.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    out.backward(grad)
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - before
    assert extra < 512 * 2**20, f"the backward allocated {extra / 2**20:.0f} MiB at its peak"
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))


def test_backward_under_torch_compile_with_no_graph_break():
    torch.manual_seed(3)
    inputs = [torch.randn(2, 4, 300, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3)]

    def loss(q, k, v):
        a = generated.scaled_dot_product_attention(q, k, v, is_causal=True)
        b = generated.sliding_window_attention(q, k, v, 64)
        return (a * 2 + b).float().square().sum()

    grads = []
    for f in (torch.compile(loss, fullgraph=True), loss):
        leaves = [t.detach().requires_grad_() for t in inputs]
        grads.append(torch.autograd.grad(f(*leaves), leaves))
    for got, want in zip(*grads):
        torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)


# ---- float64 -----------------------------------------------------------------------------------

def _float64_close(got, want, float32_result):
    """float64-tight: within 1e-10 of torch's float64 result (relative, and absolute against
    the largest element), where float32's is more than 1e-7 off relative to the largest element
    (decoding's outputs are 0.01 to 0.08: float32's 4e-8 there is 6e-7 of them)."""
    assert got.dtype == torch.float64
    scale = max(want.abs().max().item(), 1e-30)
    assert (float32_result.double() - want).abs().max().item() / scale > 1e-7
    torch.testing.assert_close(got, want, rtol=1e-10,
                               atol=1e-11 * max(1.0, want.abs().max().item()))


@pytest.mark.parametrize("dim", [64, 80, 128, 256])
def test_float64_forward_and_backward_at_real_sizes(dim):
    # float64 tiles of its own per head dim (FLOAT64_CONFIGS), grouped heads, a causal mask,
    # L != S off every block, the (B, L, H, E) layout: forward and backward against torch's
    # float64 attention
    torch.manual_seed(dim)
    q = torch.randn(2, 333, 4, dim, device="cuda", dtype=torch.float64).transpose(1, 2)
    k, v = (torch.randn(2, 2, 401, dim, device="cuda", dtype=torch.float64) for _ in range(2))
    inputs = [t.detach().requires_grad_() for t in (q, k, v)]
    kwargs = {"is_causal": True, "enable_gqa": True}
    out = generated.scaled_dot_product_attention(*inputs, **kwargs)
    want = ref.scaled_dot_product_attention(*inputs, **kwargs)
    narrow = [t.detach().float().requires_grad_() for t in inputs]
    want32 = ref.scaled_dot_product_attention(*narrow, **kwargs)
    _float64_close(out, want, want32)
    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, inputs, grad)
    wants = torch.autograd.grad(want, inputs, grad)
    wants32 = torch.autograd.grad(want32, narrow, grad.float())
    for g, w, w32 in zip(got, wants, wants32):
        _float64_close(g, w, w32)


def test_float64_decoding_split_and_the_variants():
    # flash decoding's split keys and merge in float64 (few programs: the keys are split), a
    # group of query heads packed; then the variants' scores and masks
    torch.manual_seed(4)
    q = torch.randn(2, 8, 1, 128, device="cuda", dtype=torch.float64)
    cache = [torch.randn(2, 2, 5000, 128, device="cuda", dtype=torch.float64) for _ in range(2)]
    lengths = torch.tensor([5000, 1234], device="cuda", dtype=torch.int32)
    out = generated.decode_attention(q, *cache, lengths, enable_gqa=True)
    _float64_close(out, ref.decode_attention(q, *cache, lengths, None, True),
                   ref.decode_attention(q.float(), *(c.float() for c in cache), lengths, None,
                                        True))
    q, k, v = (torch.randn(2, 4, 257, 64, device="cuda", dtype=torch.float64) for _ in range(3))
    slopes = torch.rand(4, device="cuda", dtype=torch.float64)
    narrow = [t.float() for t in (q, k, v)]
    for fn, reference, tensors, extra in [
        (generated.softcap_attention, ref.softcap_attention, [], (20.0, True)),
        (generated.alibi_attention, ref.alibi_attention, [slopes], (True,)),
        (generated.sliding_window_attention, ref.sliding_window_attention, [], (100,)),
    ]:
        _float64_close(fn(q, k, v, *tensors, *extra), reference(q, k, v, *tensors, *extra),
                       reference(*narrow, *(t.float() for t in tensors), *extra))


def _mask(kind, dtype, length, keys):
    if kind == "bool":
        return torch.rand(length, keys, device="cuda") > 0.2
    return None if kind is None else torch.randn(length, keys, device="cuda", dtype=dtype)


@pytest.mark.parametrize("dtype, mask, dim", [
    (torch.float32, "float", 16), (torch.float32, "float", 64), (torch.float32, "bool", 256),
    (torch.bfloat16, "float", 256), (torch.float16, "bool", 128), (torch.float32, None, 256),
])
def test_every_config_the_prunes_keep_fits_the_shared_memory(dtype, mask, dim):
    # the prunes' estimates against Triton's own count: every config they keep for the forward
    # and the backward's two passes compiles within the GPU's shared memory (a tensor mask's
    # tiles were once left out: float32 masks are pipelined as the keys are)
    torch.manual_seed(dim)
    q, k, v = (torch.randn(2, 3, 300, dim, device="cuda", dtype=dtype, requires_grad=True)
               for _ in range(3))
    with launch.watch_autotuned() as seen:
        out = generated.scaled_dot_product_attention(q, k, v, _mask(mask, dtype, 300, 300))
        out.sum().backward()
    limit = launch.shared_memory(q.device)
    assert len({kernel for kernel, _, _ in seen}) == 3
    over = []
    for kernel, args, kwargs in seen:
        for config in launch.pruned_configs(kernel, args, kwargs):
            meta = tuned.entry_config(config)
            compiled = kernel.fn.warmup(*args, grid=(1,), **kwargs, **meta)
            if compiled.metadata.shared > limit:
                over.append((kernel.fn.__name__, meta, compiled.metadata.shared))
    assert over == [], f"past {limit} bytes: {over}"


def test_a_config_past_the_shared_memory_gives_way_to_the_next_that_fits(monkeypatch):
    # a prune that keeps every config, and a space led by one Triton refuses (float32 with a
    # 333-wide float32 mask at E 16, 128 x 128 blocks in 4 stages: 320000 bytes by Triton 3.6's
    # count, compiled for sm_90 on a CPU): an unforced call runs the next config the prune keeps
    import triton

    kernel = importlib.import_module(
        "generated.scaled_dot_product_attention")._scaled_dot_product_attention_kernel
    too_large = triton.Config({"BLOCK_M": 128, "BLOCK_N": 128}, num_warps=4, num_stages=4)
    monkeypatch.setattr(importlib.import_module("specgen.runtime.attention"), "shared_memory",
                        lambda device: 2**30)
    monkeypatch.setattr(kernel, "configs", [too_large, *kernel.configs])
    torch.manual_seed(0)
    # sizes no other test takes: no launch of this key was cached before
    q, k, v = (torch.randn(1, 2, 333, 16, device="cuda") for _ in range(3))
    mask = torch.randn(333, 333, device="cuda")
    with launch.watch_autotuned() as seen:
        out = generated.scaled_dot_product_attention(q, k, v, mask)
    # a float32 result, compared at float32's tolerances
    torch.testing.assert_close(out, _reference(q, k, v, attn_mask=mask.double()).float())
    _, args, kwargs = seen[0]
    counted = kernel.fn.warmup(*args, grid=(1,), **kwargs,
                               **tuned.entry_config(too_large)).metadata.shared
    assert counted > launch.shared_memory(q.device), "the stand-in config fits: pick a larger one"

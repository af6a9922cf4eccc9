"""The attention family's backward beyond the property suite's gradient check: the two known
failure modes of the Triton tutorial's backward (causal ignored where L != S; wrong at head dim
128), grouped heads summed in the kernel, the per-head and mask gradients, determinism, and the
autograd rules (double backward refused, an input changed in place refused). The derivatives
the planner derives from a score: tests/test_attention.py."""

import sys

import pytest
import torch

import generated
from specgen import references as ref
from specgen.runtime import override, record_launches, replay
from specgen.testing import device

F = torch.nn.functional
# float32 on the CPU tier: the kernels' float32 dots are exact there (ieee), so the gradients
# agree with float64 autograd to a few ulps of the sums
RTOL, ATOL = 1e-4, 1e-5
SMALL = {"BLOCK_M": 16, "BLOCK_N": 16, "num_warps": 4, "num_stages": 1}


def _inputs(*shapes, seed=0, dtype=torch.float32):
    generator = torch.Generator().manual_seed(seed)
    return [(torch.rand(*shape, generator=generator, dtype=torch.float64) * 4 - 2).to(dtype)
            .to(device()).requires_grad_() for shape in shapes]


def _check(ours, reference, inputs, *extra, config=SMALL, **kwargs):
    """Our gradients of every input against float64 autograd of ``reference``."""
    with override(**({"config": config} if config else {})):
        out = ours(*inputs, *extra, **kwargs)
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(7),
                       dtype=torch.float64).to(out.device)
    got = torch.autograd.grad(out, inputs, grad.to(out.dtype))
    wide = [t.detach().double().requires_grad_() for t in inputs]
    want = torch.autograd.grad(reference(*wide, *extra, **kwargs), wide, grad)
    for name, g, w in zip("abcdefgh", got, want):
        assert g.shape == w.shape, name
        torch.testing.assert_close(g.double(), w, rtol=RTOL, atol=ATOL, msg=f"input {name}")


@pytest.mark.parametrize("length, keys", [(37, 21), (21, 37), (40, 40)])
def test_causal_gradients_where_the_lengths_differ(length, keys):
    # the tutorial's backward ignored the causal mask outside the square case
    q, k, v = _inputs((2, 2, length, 16), (2, 2, keys, 16), (2, 2, keys, 8))
    _check(generated.scaled_dot_product_attention, F.scaled_dot_product_attention, [q, k, v],
           is_causal=True)


def test_gradients_at_head_dim_128():
    # the tutorial's backward was wrong at a head dim of 128
    q, k, v = _inputs((1, 2, 20, 128), (1, 2, 24, 128), (1, 2, 24, 128), seed=1)
    _check(generated.scaled_dot_product_attention, F.scaled_dot_product_attention, [q, k, v])


def test_grouped_heads_sum_their_key_and_value_gradients():
    q, k, v = _inputs((2, 6, 19, 16), (2, 2, 23, 16), (2, 2, 23, 24), seed=2)
    _check(generated.scaled_dot_product_attention, F.scaled_dot_product_attention, [q, k, v],
           is_causal=True, enable_gqa=True)


def test_broadcast_batch_and_head_gradients_are_summed():
    # one key/value head for every query head, and key/value batch dims of one
    q, k, v = _inputs((3, 4, 17, 16), (1, 1, 20, 16), (1, 1, 20, 16), seed=3)
    _check(generated.scaled_dot_product_attention, F.scaled_dot_product_attention, [q, k, v])


def test_an_output_gradient_in_a_layout_of_its_own():
    # three batch dims merge in the inputs' layouts; the output's gradient, permuted over them,
    # does not merge with them (the backward lays it out as the output). That copy is no
    # launch: such a signature is never replayed, and each call is right
    replays = _op("scaled_dot_product_attention").state.backward_replays
    replayed = replays.replayed
    with replay.record_at_once():
        for step in range(3):
            q, k, v = _inputs((2, 3, 2, 1, 9, 16), (2, 3, 2, 1, 10, 16), (2, 3, 2, 1, 10, 16),
                              seed=10 + step)
            out = generated.scaled_dot_product_attention(q, k, v)
            grad = torch.randn(2, 2, 3, 1, 9, 16).to(device()).permute(0, 2, 1, 3, 4, 5)
            got = torch.autograd.grad(out, (q, k, v), grad)
            wide = [t.detach().double().requires_grad_() for t in (q, k, v)]
            want = torch.autograd.grad(F.scaled_dot_product_attention(*wide), wide,
                                       grad.double())
            for g, w in zip(got, want):
                torch.testing.assert_close(g.double(), w, rtol=RTOL, atol=ATOL)
    assert replays.replayed == replayed
    assert "copied to the output's layout" in " ".join(replays.failures.values())


def test_a_float_mask_gets_its_gradient():
    q, k, v, mask = _inputs((2, 2, 18, 16), (2, 2, 22, 16), (2, 2, 22, 16), (2, 1, 18, 22),
                            seed=4)
    _check(generated.scaled_dot_product_attention, F.scaled_dot_product_attention,
           [q, k, v, mask])


def test_a_bool_mask_takes_part_in_the_gradients():
    q, k, v = _inputs((1, 2, 18, 16), (1, 2, 22, 16), (1, 2, 22, 16), seed=5)
    mask = torch.rand(18, 22, generator=torch.Generator().manual_seed(5)).to(device()) > 0.4
    mask[3] = False     # a row that sees no key: zeros, and no gradient
    _check(generated.scaled_dot_product_attention, ref.scaled_dot_product_attention,
           [q, k, v], mask)


def test_score_expressions_and_per_head_gradients():
    q, k, v = _inputs((2, 3, 21, 16), (2, 3, 26, 16), (2, 3, 26, 16), seed=6)
    slopes, = _inputs((3,), seed=7)
    _check(generated.alibi_attention, ref.alibi_attention, [q, k, v, slopes], True)
    _check(generated.softcap_attention, ref.softcap_attention, [q, k, v], 3.0, True)
    _check(generated.sliding_window_attention, ref.sliding_window_attention, [q, k, v], 5)


def test_decoding_gradients_per_cache_length():
    q, k, v = _inputs((3, 4, 2, 16), (3, 2, 40, 16), (3, 2, 40, 16), seed=8)
    lengths = torch.tensor([40, 0, 17], device=device())
    _check(generated.decode_attention, ref.decode_attention, [q, k, v], lengths,
           enable_gqa=True)


def test_the_backward_runs_two_kernels_and_is_deterministic():
    q, k, v = _inputs((2, 2, 33, 16), (2, 2, 33, 16), (2, 2, 33, 16), seed=9)
    runs = []
    for _ in range(2):
        with override(config=SMALL), record_launches() as log:
            out = generated.scaled_dot_product_attention(q, k, v, is_causal=True)
            runs.append(torch.autograd.grad(out.sum(), (q, k, v)))
    kernels = [launch.kernel for launch in log]
    assert kernels == ["forward", "backward_query", "backward_key"], kernels
    for first, second in zip(*runs):
        assert torch.equal(first, second)


def _op(name):
    return sys.modules[f"generated.{name}"].OP


def test_a_repeated_training_step_replays_both_directions():
    # an eager training step repeats its signature: once it is recorded, the forward and the
    # backward replay their launches (no checks, no planning), on each step's fresh values
    op = _op("scaled_dot_product_attention")

    def steps(count, seed):
        for step in range(count):
            q, k, v = _inputs((2, 2, 19, 16), (2, 2, 23, 16), (2, 2, 23, 8), seed=seed + step)
            # (no forced config: a test's override keys no call)
            _check(generated.scaled_dot_product_attention, F.scaled_dot_product_attention,
                   [q, k, v], config=None, is_causal=True)

    with replay.record_at_once():
        # recorded by then (on a GPU the first step autotunes, and a call that tunes is not)
        steps(2, seed=20)
        forward, backward = op.replays.replayed, op.state.backward_replays.replayed
        steps(2, seed=22)
    # each step replays its kept call, its forward and its backward
    assert op.state.backward_replays.replayed == backward + 2
    assert op.replays.replayed == forward + 4


def test_a_step_without_keys_replays_zero_gradients():
    # no keys: no launch, every gradient 0, from allocations a replay makes zeroed again
    op = _op("scaled_dot_product_attention")
    backward = op.state.backward_replays.replayed
    with replay.record_at_once():
        for step in range(3):
            q, k, v = _inputs((1, 2, 5, 16), (1, 2, 0, 16), (1, 2, 0, 16), seed=30 + step)
            out = generated.scaled_dot_product_attention(q, k, v)
            grads = torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
            assert all(g.shape == t.shape and not g.any() for g, t in zip(grads, (q, k, v)))
    assert op.state.backward_replays.replayed == backward + 2


def test_double_backward_is_refused():
    q, k, v = _inputs((1, 1, 5, 16), (1, 1, 5, 16), (1, 1, 5, 16))
    out = generated.scaled_dot_product_attention(q, k, v)
    with pytest.raises(RuntimeError, match="double backward"):
        torch.autograd.grad(out.sum(), q, create_graph=True)


def test_an_input_changed_in_place_after_the_forward_is_refused():
    q, k, v = _inputs((1, 1, 5, 16), (1, 1, 5, 16), (1, 1, 5, 16))
    out = generated.scaled_dot_product_attention(q, k, v)
    with torch.no_grad():
        k.mul_(2)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()


@pytest.mark.parametrize("op", ["scaled_dot_product_attention", "alibi_attention",
                                "decode_attention"])
def test_float64_gradients_are_computed_in_float64(op):
    # float64 autograd to 1e-11 where float32's gradients are more than 1e-7 off: float32 math,
    # a float32 statistic (logsumexp, delta) or buffer (the mask's gradient, grouped or
    # broadcast heads summed, ALiBi's per-head slots) anywhere would fail it
    if op == "scaled_dot_product_attention":
        # grouped heads (dK and dV summed over a group), a float mask with its gradient, a
        # batch dim the key and value broadcast over
        inputs = _inputs((2, 4, 19, 16), (1, 2, 23, 16), (1, 2, 23, 8), (19, 23), seed=20,
                         dtype=torch.float64)
        extra, kwargs = (0.0, False, 0.3), {"enable_gqa": True}
    elif op == "alibi_attention":
        inputs = _inputs((2, 3, 21, 16), (2, 3, 26, 16), (2, 3, 26, 16), (3,), seed=21,
                         dtype=torch.float64)
        extra, kwargs = (True,), {}
    else:
        inputs = _inputs((3, 4, 2, 16), (3, 2, 40, 16), (3, 2, 40, 16), seed=22,
                         dtype=torch.float64)
        extra, kwargs = (torch.tensor([40, 0, 17], device=device()),), {"enable_gqa": True}
    ours, reference = getattr(generated, op), getattr(ref, op)
    with override(config=SMALL):
        out = ours(*inputs, *extra, **kwargs)
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(7),
                       dtype=torch.float64).to(out.device)
    got = torch.autograd.grad(out, inputs, grad)
    want = torch.autograd.grad(reference(*inputs, *extra, **kwargs), inputs, grad)
    narrow = [t.detach().float().requires_grad_() for t in inputs]
    float32 = torch.autograd.grad(reference(*narrow, *extra, **kwargs), narrow, grad.float())
    for name, g, w, f in zip("abcdefgh", got, want, float32):
        assert g.dtype == torch.float64, name
        assert (f.double() - w).abs().max() > 1e-7, f"input {name}: float32 is as close"
        torch.testing.assert_close(g, w, rtol=1e-11, atol=1e-12, msg=f"input {name}")

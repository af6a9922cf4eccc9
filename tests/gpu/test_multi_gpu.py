"""Inputs on a GPU other than the current one: the kernels run on the inputs' GPU, as torch's ops
do (Triton launches on the current device; specgen's launch switches to the tensors'), in full
calls, replays, backward passes and compiled graphs. Needs two GPUs."""

import pytest
import torch

import generated
from tests.gpu.test_replay_gpu import CASES, run_case

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(
    torch.cuda.device_count() < 2, reason="needs two GPUs (the GPU tier's second machine kind)")]


def _on_second_gpu(make):
    with torch.cuda.device(1):
        return make()


@pytest.mark.parametrize("name", CASES)
def test_calls_on_the_second_gpu_match_torch(name):
    torch.cuda.set_device(0)
    _, outs = run_case(name, lambda: _on_second_gpu(CASES[name][0]))
    assert torch.cuda.current_device() == 0
    assert all(out.device == torch.device("cuda", 1) for out in outs)


def test_mm_through_tma_on_the_second_gpu():
    # the TMA kernel asks Triton for global memory at launch (its descriptors): on the launch's GPU
    a, b = _on_second_gpu(lambda: (torch.randn(2048, 1024, device="cuda", dtype=torch.bfloat16),
                                   torch.randn(1024, 2048, device="cuda", dtype=torch.bfloat16)))
    for _ in range(3):
        out = generated.mm(a, b)
        error = (out.double() - a.double() @ b.double()).norm() / (a.double() @ b.double()).norm()
        assert error < 1e-2


def test_backward_and_compile_on_the_second_gpu():
    x, w = _on_second_gpu(lambda: (torch.randn(64, 1000, device="cuda", requires_grad=True),
                                   torch.randn(1000, device="cuda", requires_grad=True)))
    grad = _on_second_gpu(lambda: torch.randn(64, 1000, device="cuda"))

    def f(x, w):
        return generated.layer_norm(generated.softmax(x, -1), [1000], w)

    def g(x, w):
        return torch.nn.functional.layer_norm(torch.softmax(x.double(), -1), [1000], w.double())

    want = torch.autograd.grad(g(x, w), (x, w), grad.double())
    for run in (f, torch.compile(f)):
        got = torch.autograd.grad(run(x, w), (x, w), grad)
        for a, b in zip(got, want):
            assert a.device == torch.device("cuda", 1)
            # (b: the float64 reference's gradient with respect to the float32 x and w)
            torch.testing.assert_close(a.double(), b.double(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("call", [
    lambda x, y: generated.add(x, y),
    lambda x, y: generated.layer_norm(x, [x.shape[-1]], y[0]),
    lambda x, y: generated.mm(x, y.t()),
], ids=["add", "layer_norm", "mm"])
def test_tensors_on_two_gpus_are_refused(call):
    x = torch.randn(4, 8, device="cuda:0")
    y = torch.randn(4, 8, device="cuda:1")
    with pytest.raises(ValueError, match=r"\(cuda:0\) .*\(cuda:1\) are on different devices"):
        call(x, y)


def test_both_gpus_from_two_threads_at_once():
    # a thread a GPU, each calling (then replaying) the same ops on its own device while the
    # other does: every result on its own GPU and right
    import threading

    failures = []

    def work(device):
        try:
            torch.cuda.set_device(device)
            for _ in range(20):
                x = torch.randn(256, 1000, device=device)
                w = torch.randn(1000, device=device)
                out = generated.layer_norm(generated.softmax(x, -1), [1000], w)
                want = torch.nn.functional.layer_norm(torch.softmax(x.double(), -1), [1000],
                                                      w.double())
                assert out.device == torch.device("cuda", device)
                torch.testing.assert_close(out.double(), want, rtol=1e-4, atol=1e-5)
        except BaseException as error:  # reported by the test's own thread
            failures.append(error)

    threads = [threading.Thread(target=work, args=(device,)) for device in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures, failures

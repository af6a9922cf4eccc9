"""Host time of a fwd+bwd call (softmax 4096x4096 bf16, H200): torch eager, our op, and
autograd.Function forms that isolate the nested autograd.grad of our backward; then where our
call's host time goes: its parts alone (the forward, the derived backward op), an empty
autograd.Function (the floor of any Function), the call with every replayed launch skipped (its
Python alone), and cProfile's functions of most own time (``--cprofile N``).

``--flushed``: each op's fwd+bwd (4096x4096) timed as bench/ times it (a 256 MB fill, then the
call between CUDA events), with the host's own time of the call beside the events' span, and a
count of the calls that synchronize with the device (torch's sync debug mode).

Usage (GPU machine): PYTHONPATH=. python3 tools/perf/probe_backward_host.py [--cprofile N] [--flushed]
"""

import argparse
import cProfile
import pstats
import time

import torch

import generated
from specgen.runtime import replay


def host_us(fn, calls=50):
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    host = (time.perf_counter() - start) / calls * 1e6
    torch.cuda.synchronize()
    wall = (time.perf_counter() - start) / calls * 1e6
    return host, wall


class View(torch.autograd.Function):
    """An empty Function: the floor of any Python Function's forward + backward."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return g


class Launch(torch.autograd.Function):
    """Our forward and derived backward ops, replayed, in the least Python a Function needs."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return generated.softmax(x, -1)

    @staticmethod
    def backward(ctx, g):
        x, = ctx.saved_tensors
        return generated.softmax_backward(x, g, -1)


class TorchOps(torch.autograd.Function):
    """torch's softmax kernels in a Function: backward by its formula, no nested engine call."""

    @staticmethod
    def forward(ctx, x):
        y = torch._softmax(x, -1, False)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, g):
        y, = ctx.saved_tensors
        return torch._softmax_backward_data(g, y, -1, y.dtype)


class Nested(torch.autograd.Function):
    """torch's softmax forward; backward by recomputing it and a nested autograd.grad."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return torch.softmax(x, -1)

    @staticmethod
    def backward(ctx, grad):
        x, = ctx.saved_tensors
        with torch.enable_grad():
            y = torch.softmax(x, -1)
        return torch.autograd.grad(y, x, grad)[0]


def parts(x, g, calls: int = 50) -> None:
    """Our softmax fwd+bwd's parts, and the whole of it with no launches (64x64: host-bound)."""
    w = torch.randn(x.shape[-1], device=x.device, dtype=x.dtype, requires_grad=True)
    b = torch.randn_like(w, requires_grad=True)
    forms = {
        "softmax fwd+bwd": lambda: torch.autograd.grad(generated.softmax(x, -1), x, g),
        "softmax forward, no grad": lambda: generated.softmax(x.detach(), -1),
        "softmax forward, grad": lambda: generated.softmax(x, -1),
        "softmax_backward op": lambda: generated.softmax_backward(x.detach(), g, -1),
        "layer_norm fwd+bwd": lambda: torch.autograd.grad(
            generated.layer_norm(x, x.shape[-1:], w, b), (x, w, b), g),
        "torch layer_norm fwd+bwd": lambda: torch.autograd.grad(
            torch.nn.functional.layer_norm(x, x.shape[-1:], w, b), (x, w, b), g),
        "empty Function fwd+bwd": lambda: torch.autograd.grad(View.apply(x), x, g),
        "empty Function forward": lambda: View.apply(x),
        "minimal Function fwd+bwd": lambda: torch.autograd.grad(Launch.apply(x), x, g),
        "minimal Function forward": lambda: Launch.apply(x),
    }
    for name, fn in forms.items():
        host, wall = host_us(fn, calls)
        print(f"parts {name:28s}: host {host:7.1f} us/call, wall {wall:7.1f}")
    launch = replay._Launch.__call__
    replay._Launch.__call__ = lambda self, inputs, buffers: None
    try:
        for name in ("softmax fwd+bwd", "layer_norm fwd+bwd"):
            host, _ = host_us(forms[name], calls)
            print(f"parts {name + ', no launches':28s}: host {host:7.1f} us/call")
    finally:
        replay._Launch.__call__ = launch


def flushed(iterations: int = 60) -> None:
    """bench/'s fwd+bwd rows, call by call: the events' span against the host's time of the call."""
    import warnings

    x = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    g = torch.randn_like(x)
    w = torch.randn(4096, device="cuda", dtype=x.dtype, requires_grad=True)
    b = torch.randn_like(w, requires_grad=True)
    F = torch.nn.functional
    forms = {
        "softmax ours": lambda: torch.autograd.grad(generated.softmax(x, -1), x, g),
        "softmax torch": lambda: torch.autograd.grad(torch.softmax(x, -1), x, g),
        "layer_norm ours": lambda: torch.autograd.grad(generated.layer_norm(x, [4096], w, b), (x, w, b), g),
        "layer_norm torch": lambda: torch.autograd.grad(F.layer_norm(x, [4096], w, b), (x, w, b), g),
        "rms_norm ours": lambda: torch.autograd.grad(generated.rms_norm(x, [4096], w), (x, w), g),
        "rms_norm torch": lambda: torch.autograd.grad(F.rms_norm(x, [4096], w), (x, w), g),
    }
    cache = torch.empty(256 * 2**20, dtype=torch.int8, device="cuda")
    for name, fn in forms.items():
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            fn()
            torch.cuda.set_sync_debug_mode("default")
        syncs = [str(c.message).splitlines()[0] for c in caught]
        spans, hosts = [], []
        for _ in range(iterations):
            cache.zero_()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            t0 = time.perf_counter()
            fn()
            hosts.append((time.perf_counter() - t0) * 1e6)
            end.record()
            spans.append((start, end))
        torch.cuda.synchronize()
        events = sorted(s.elapsed_time(e) * 1e3 for s, e in spans)
        hosts.sort()
        mid = iterations // 2
        print(f"flushed {name:18s}: events {events[mid]:7.1f} us (p10 {events[iterations // 10]:7.1f}, "
              f"p90 {events[-iterations // 10]:7.1f}); host {hosts[mid]:7.1f} us "
              f"(p10 {hosts[iterations // 10]:7.1f}, p90 {hosts[-iterations // 10]:7.1f}); "
              f"syncs {len(syncs)} {syncs[:2]}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--cprofile", type=int, default=0)
    parser.add_argument("--flushed", action="store_true")
    args = parser.parse_args()
    if args.flushed:
        flushed()
    x = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    g = torch.randn_like(x)
    small = torch.randn(64, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    gs = torch.randn_like(small)
    forms = {
        "torch eager": lambda x, g: torch.autograd.grad(torch.softmax(x, -1), x, g),
        "ours": lambda x, g: torch.autograd.grad(generated.softmax(x, -1), x, g),
        "ours forward only": lambda x, g: generated.softmax(x, -1),
        "ours via torch.ops": lambda x, g: torch.autograd.grad(torch.ops.specgen.softmax(x, -1, None), x, g),
        "Function, nested grad": lambda x, g: torch.autograd.grad(Nested.apply(x), x, g),
        "Function, direct": lambda x, g: torch.autograd.grad(TorchOps.apply(x), x, g),
    }
    for rnd in range(2):
        for name, fn in forms.items():
            for label, (a, b) in (("4096^2", (x, g)), ("64^2", (small, gs))):
                host, wall = host_us(lambda: fn(a, b))
                print(f"round {rnd} {name:24s} {label}: host {host:7.1f} us/call, wall {wall:7.1f}")
    parts(small, gs)
    if args.cprofile:
        profiler = cProfile.Profile()
        profiler.runcall(lambda: [forms["ours"](small, gs) for _ in range(200)])
        pstats.Stats(profiler).sort_stats("tottime").print_stats(args.cprofile)


if __name__ == "__main__":
    main()

"""Host time of a fwd+bwd call (softmax 4096x4096 bf16, H200): torch eager, our op, and
autograd.Function forms that isolate the nested autograd.grad of our backward.

Usage (GPU machine): PYTHONPATH=. python3 tools/probe_backward_host.py
"""

import time

import torch

import generated


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


class Direct(torch.autograd.Function):
    """torch's softmax forward; backward by its formula, no nested engine call."""

    @staticmethod
    def forward(ctx, x):
        y = torch.softmax(x, -1)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad):
        y, = ctx.saved_tensors
        return torch._softmax_backward_data(grad, y, -1, y.dtype)


def main():
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
        "Function, direct": lambda x, g: torch.autograd.grad(Direct.apply(x), x, g),
    }
    for rnd in range(2):
        for name, fn in forms.items():
            for label, (a, b) in (("4096^2", (x, g)), ("64^2", (small, gs))):
                host, wall = host_us(lambda: fn(a, b))
                print(f"round {rnd} {name:24s} {label}: host {host:7.1f} us/call, wall {wall:7.1f}")


if __name__ == "__main__":
    main()

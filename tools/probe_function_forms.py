"""Host time of torch.autograd.Function forms that do no device work (64x64 bf16 on a GPU): which
part of a Function's forward + backward costs what, next to torch's own softmax.

Usage (GPU machine): PYTHONPATH=. python3 tools/probe_function_forms.py
"""

import time

import torch
from torch.autograd.function import once_differentiable

import generated


def host_us(fn, calls=300):
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    best = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best.append((time.perf_counter() - start) / calls * 1e6)
        torch.cuda.synchronize()
    return min(best)


class View(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return g


class Fresh(torch.autograd.Function):
    """A new output and a new gradient (allocations only)."""

    @staticmethod
    def forward(ctx, x):
        return torch.empty_like(x)

    @staticmethod
    def backward(ctx, g):
        return torch.empty_like(g)


class Saved(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return torch.empty_like(x)

    @staticmethod
    def backward(ctx, g):
        x, = ctx.saved_tensors
        return torch.empty_like(g)


class Extra(torch.autograd.Function):
    """As ours: callables and scalars among the arguments."""

    @staticmethod
    def forward(ctx, f, r, b, x, dim, dtype):
        ctx.save_for_backward(x)
        ctx.scalars = (None, dim, dtype)
        return torch.empty_like(x)

    @staticmethod
    def backward(ctx, g):
        x, = ctx.saved_tensors
        return None, None, None, torch.empty_like(g), None, None


class NoMaterialize(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        ctx.set_materialize_grads(False)
        return torch.empty_like(x)

    @staticmethod
    @once_differentiable
    def backward(ctx, g):
        x, = ctx.saved_tensors
        return torch.empty_like(g)


class Launch(torch.autograd.Function):
    """Our forward and backward ops, replayed."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return generated.softmax(x, -1)

    @staticmethod
    def backward(ctx, g):
        x, = ctx.saved_tensors
        return generated.softmax_backward(x, g, -1)


class TorchOps(torch.autograd.Function):
    """torch's softmax kernels in a Function."""

    @staticmethod
    def forward(ctx, x):
        y = torch._softmax(x, -1, False)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, g):
        y, = ctx.saved_tensors
        return torch._softmax_backward_data(g, y, -1, y.dtype)


class SavedTorchKernel(torch.autograd.Function):
    """A torch kernel in the backward."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return torch.empty_like(x)

    @staticmethod
    def backward(ctx, g):
        x, = ctx.saved_tensors
        return g * 2


class SavedTriton(torch.autograd.Function):
    """One of our replayed pointwise launches in the backward."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return torch.empty_like(x)

    @staticmethod
    def backward(ctx, g):
        x, = ctx.saved_tensors
        return generated.relu(g)


class OursThenTorch(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        y = generated.softmax(x, -1)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, g):
        y, = ctx.saved_tensors
        return torch._softmax_backward_data(g, y, -1, y.dtype)


class TorchThenOurs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return torch._softmax(x, -1, False)

    @staticmethod
    def backward(ctx, g):
        x, = ctx.saved_tensors
        return generated.softmax_backward(x, g, -1)


def main():
    x = torch.randn(64, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    g = torch.randn_like(x)
    xd = x.detach()
    forms = {
        "torch softmax fwd+bwd": lambda: torch.autograd.grad(torch.softmax(x, -1), x, g),
        "torch softmax fwd": lambda: torch.softmax(x, -1),
        "torch softmax fwd, no grad": lambda: torch.softmax(xd, -1),
        "autograd.grad of x*1 (C++ node)": lambda: torch.autograd.grad(x.view_as(x), x, g),
        "View fwd+bwd": lambda: torch.autograd.grad(View.apply(x), x, g),
        "View fwd": lambda: View.apply(x),
        "Fresh fwd+bwd": lambda: torch.autograd.grad(Fresh.apply(x), x, g),
        "Saved fwd+bwd": lambda: torch.autograd.grad(Saved.apply(x), x, g),
        "Extra fwd+bwd": lambda: torch.autograd.grad(Extra.apply(None, None, None, x, -1, None), x, g),
        "NoMaterialize fwd+bwd": lambda: torch.autograd.grad(NoMaterialize.apply(x), x, g),
        "TorchOps fwd+bwd": lambda: torch.autograd.grad(TorchOps.apply(x), x, g),
        "SavedTorchKernel fwd+bwd": lambda: torch.autograd.grad(SavedTorchKernel.apply(x), x, g),
        "SavedTriton fwd+bwd": lambda: torch.autograd.grad(SavedTriton.apply(x), x, g),
        "OursThenTorch fwd+bwd": lambda: torch.autograd.grad(OursThenTorch.apply(x), x, g),
        "TorchThenOurs fwd+bwd": lambda: torch.autograd.grad(TorchThenOurs.apply(x), x, g),
        "our relu, no grad": lambda: generated.relu(g),
        "torch g * 2": lambda: g * 2,
        "Launch fwd+bwd": lambda: torch.autograd.grad(Launch.apply(x), x, g),
        "Launch fwd": lambda: Launch.apply(x),
        "ours fwd+bwd": lambda: torch.autograd.grad(generated.softmax(x, -1), x, g),
        "our forward, no grad": lambda: generated.softmax(xd, -1),
        "our backward op": lambda: generated.softmax_backward(xd, g, -1),
        "empty_like": lambda: torch.empty_like(xd),
    }
    for rnd in range(2):
        for name, fn in forms.items():
            print(f"round {rnd} {name:34s} {host_us(fn):7.1f} us/call")


if __name__ == "__main__":
    main()

"""What ``generated.REGISTRY`` holds about each op (enough for tests and tools to call it), and the
registration of each op's torch operator."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from specgen.runtime.checks import OUT_NOT_DIFFERENTIABLE, check_no_grad


@dataclass(frozen=True)
class ArgInfo:
    """One argument of an op, as the property tests need it."""

    name: str
    # tensor, float, int, bool, choice, shape, dtype, dim(s), pair, padding (conv2d), groups
    kind: str
    default: object = None          # None: required (or an omitted optional tensor)
    optional: bool = False
    choices: tuple[str, ...] = ()
    low: float = -3.0               # tensors are drawn uniformly from [low, high]
    high: float = 3.0
    dims: tuple[str, ...] = ()      # named dims, for families whose operands have fixed ranks
    promotes: bool = False          # a matmul epilogue operand of its own dtype ([epilogue] promote)
    constexpr: str = ""             # a choice's name in the kernels (a constexpr)
    range: tuple[float, float] | None = None   # a float or int scalar: where tests draw it
    dtypes: tuple[torch.dtype, ...] = ()   # a tensor of its own dtypes (a quantized weight's)


@dataclass(frozen=True)
class OpInfo:
    name: str
    family: str
    spec_path: str
    spec_sha256: str
    doc: str
    args: tuple[ArgInfo, ...]
    outputs: tuple[str, ...]
    dtypes: tuple[torch.dtype, ...]
    indexing: str
    autocast: str                   # the spec's policy under torch.autocast (runtime/autocast.py)
    function: Callable              # generated.<name>
    op: Callable                    # torch.ops.specgen.<name>, the registered op
    reference: Callable
    replays: object                 # the generated module's runtime.Replays (tests, tools)
    launch: object                  # the family's launch data (its description's `launch`): the
                                    # roles of the arguments, which tests draw calls by


# the module that registered each operator name (specgen::<op>), in this process
_owners: dict[str, str] = {}


def triton_op(name: str, mutates_args):
    """``torch.library.triton_op``, refusing a name another generated module registered first.

    Every package of generated ops registers under one namespace, ``specgen::``: an authored op
    named as a shipped one (a spec named ``gelu``), imported beside ``generated``, would replace
    the first registration in silence, and ``torch.ops.specgen.gelu`` (what torch.compile calls)
    would take the other op's arguments. The same module registering again (a reload) is its own
    name."""
    def register(fn):
        owner = _owners.setdefault(name, fn.__module__)
        if owner != fn.__module__:
            raise ImportError(f"{fn.__module__}: the operator {name} is already registered by "
                              f"{owner}; generated ops share the specgen:: namespace, so this "
                              f"op's spec needs another [op] name")
        registered = torch.library.triton_op(name, mutates_args=mutates_args)(fn)
        if mutates_args:
            _refuse_grad(name)
        return registered
    return register


# the libraries holding each out= op's autograd kernels, kept alive (and replaced on a reload)
_autograd_libs: dict[str, torch.library.Library] = {}


def _refuse_grad(name: str) -> None:
    """Gives the out= op ``name`` torch's rule for out=: with grad mode on, an argument that
    requires grad is an error.

    Such an op has no gradient, and torch.library refuses an autograd formula for a mutating op;
    the kernel it registers under ``Autograd`` then runs the op as if it were differentiable and
    writes ``out`` where autograd never sees it. A kernel under each backend's own autograd key
    takes precedence over that alias: it refuses, or runs the op below autograd as torch's does.
    """
    short = name.split("::")[1]
    op = getattr(torch.ops.specgen, short).default
    names = [argument.name for argument in op._schema.arguments]

    def autograd_kernel(keyset, *args):
        tensors = {n: a for n, a in zip(names, args) if isinstance(a, torch.Tensor)}
        check_no_grad(short, tensors, OUT_NOT_DIFFERENTIABLE)
        with torch._C._AutoDispatchBelowAutograd():
            return op.redispatch(keyset & torch._C._after_autograd_keyset, *args)

    if name in _autograd_libs:
        _autograd_libs.pop(name)._destroy()
    lib = _autograd_libs[name] = torch.library.Library("specgen", "IMPL")
    for key in ("AutogradCPU", "AutogradCUDA"):
        lib.impl(short, autograd_kernel, key, with_keyset=True)

"""What ``generated.REGISTRY`` holds about each op (enough for tests and tools to call it), and the
registration of each op's torch operator."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch


@dataclass(frozen=True)
class ArgInfo:
    """One argument of an op, as the property tests need it."""

    name: str
    kind: str                       # tensor | float | int | bool | choice | shape | dtype
    default: object = None          # None: required (or an omitted optional tensor)
    optional: bool = False
    choices: tuple[str, ...] = ()
    low: float = -3.0               # tensors are drawn uniformly from [low, high]
    high: float = 3.0
    dims: tuple[str, ...] = ()      # named dims, for families whose operands have fixed ranks


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
    function: Callable              # generated.<name>
    op: Callable                    # torch.ops.specgen.<name>, the registered op
    reference: Callable
    replays: object                 # the generated module's runtime.Replays (tests, tools)


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
        return torch.library.triton_op(name, mutates_args=mutates_args)(fn)
    return register

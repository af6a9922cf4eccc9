"""What ``generated.REGISTRY`` holds about each op: enough for tests and tools to call it."""

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

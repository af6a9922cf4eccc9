"""Configurations tuned ahead of time, frozen per GPU in the repo (``specgen tune`` writes them).

A table is a JSON file in ``specgen/tuned/``, named for the device and its compute capability
(``nvidia-h100-80gb-hbm3-sm90.json``). Each entry is one autotuned kernel (``module:function``)
at one autotuning key (the values of the arguments its ``@triton.autotune(key=...)`` names, then
the dtypes of its tensor arguments, as Triton's autotuner keys) and the config that won there.

A launch looks its kernel up in the table of the current device; nothing autotunes unless asked:

- **Which table.** The device's own; else, of the tables of its architecture (the same major
  compute capability), the one with the highest capability not above the device's (the last
  by name among equals: an H100's table serves an H200 that has none); none otherwise (tiles
  tuned for another architecture may not even fit its shared memory).
- **Which entry.** The kernel's entries whose key agrees with the launch's in every constexpr
  part (a head dim, a mask kind, a layout, an index width); among them the nearest: the least
  sum over the sizes (the key's arguments that are not constexprs) of
  |log2(1 + launch) - log2(1 + tuned)|, plus ``DTYPE_MISMATCH`` for each tensor dtype that
  differs (a float32 launch takes a bfloat16 entry only where no float32 one exists: a
  4096-row softmax takes the 8192-row entry over the 512-row one, a float32 one over both); the
  first in the file on a tie. Only entries whose config the kernel's own prune keeps for this
  launch compete (``launch._frozen``: tiles that fit this device's shared memory and this dtype,
  of this autotuner's space), so an older table, a distant entry or another dtype's can never
  start a launch that fails.
- **Not found:** the family's heuristic, the first config the kernel's prune keeps for the
  launch (each family's space leads with its general-purpose config), untimed.
- **Autotuning asked for** (``SPECGEN_AUTOTUNE=1``, or ``autotune(True)``): no table is read,
  and each launch key's first launch autotunes over the pruned space, as Triton's autotuner
  does (seconds on a first call, in every new process).

Both are read at a key's first launch: a process keeps the configs its launches took
(``launch._tuned``, and its replays).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
import math
import os
import re
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import torch
import triton

TABLE_DIR = Path(__file__).resolve().parents[1] / "tuned"
# a tensor dtype that differs from an entry's counts as this many octaves of size: any entry of
# the launch's own dtypes is nearer than every entry of another's
DTYPE_MISMATCH = 1000.0
_autotune = False
_held_off = 0


def autotune(on: bool) -> None:
    """Autotunes each launch key's first launch (``on``) instead of reading the frozen tables and
    falling back to the heuristics (the default); ``SPECGEN_AUTOTUNE=1`` does the same."""
    global _autotune
    _autotune = on


def autotuning() -> bool:
    return not _held_off and (_autotune or os.environ.get("SPECGEN_AUTOTUNE", "") == "1")


@contextlib.contextmanager
def no_autotuning() -> Iterator[None]:
    """Inside the block nothing autotunes, whatever ``autotune`` or the environment ask
    (``specgen tune``: its calls must launch what the runtime's own default would)."""
    global _held_off
    _held_off += 1
    try:
        yield
    finally:
        _held_off -= 1


def table_name(device_name: str, capability: tuple[int, int]) -> str:
    """``NVIDIA H100 80GB HBM3``, (9, 0) -> ``nvidia-h100-80gb-hbm3-sm90.json``."""
    slug = re.sub(r"[^a-z0-9]+", "-", device_name.lower()).strip("-")
    return f"{slug}-sm{capability[0]}{capability[1]}.json"


def kernel_id(kernel: Any) -> str:
    """An autotuned kernel's name in the tables: its function's module and name."""
    while hasattr(kernel, "fn"):
        kernel = kernel.fn
    return f"{kernel.__module__}:{kernel.__name__}"


def key_of(kernel: triton.runtime.Autotuner, args: Sequence, kwargs: Mapping) -> list:
    """The launch's autotuning key, as the kernel's autotuner forms it: the values of the
    arguments ``key=`` names, then the dtypes of its tensor arguments (as strings)."""
    return key_and_parts(kernel, args, kwargs)[0]


def key_and_parts(kernel: triton.runtime.Autotuner, args: Sequence, kwargs: Mapping
                  ) -> tuple[list, list[str]]:
    """``key_of``, and what each of its parts is: a ``SIZE`` (a key argument that is not a
    constexpr), an ``EXACT`` constexpr, or a tensor's ``DTYPE``."""
    named = {**dict(zip(kernel.arg_names, args)), **kwargs}
    constexprs = _constexprs(kernel)
    keyed = [name for name in kernel.keys if name in named]
    dtypes = [str(a.dtype) for a in (*args, *kwargs.values()) if hasattr(a, "dtype")]
    return ([*(_plain(named[name]) for name in keyed), *dtypes],
            [*(EXACT if name in constexprs else SIZE for name in keyed), *[DTYPE] * len(dtypes)])


SIZE, DTYPE, EXACT = "size", "dtype", "exact"


def _constexprs(kernel: Any) -> frozenset[str]:
    """The kernel's parameters annotated ``tl.constexpr`` (read from the Python function under
    its Autotuner, JITFunction or interpreter wrapper)."""
    while hasattr(kernel, "fn"):
        kernel = kernel.fn
    return _annotated_constexpr(kernel)


@functools.lru_cache(maxsize=None)
def _annotated_constexpr(function: Any) -> frozenset[str]:
    # (inspect.signature takes tens of microseconds: once per kernel)
    return frozenset(name for name, p in inspect.signature(function).parameters.items()
                     if p.annotation is triton.language.constexpr
                     or "constexpr" in str(p.annotation))


def _plain(value: Any) -> Any:
    # JSON keeps ints, floats, bools and strings; anything else (a dtype) as its string
    return value if isinstance(value, (bool, int, float, str)) or value is None else str(value)


def lookup(kernel: triton.runtime.Autotuner, args: Sequence, kwargs: Mapping,
           device: torch.device, allowed: Sequence[Mapping] | None = None
           ) -> triton.Config | None:
    """The frozen config of this launch (the module docstring's rules), or None; ``allowed``:
    the configs (as ``entry_config`` writes them) the launch may take, its prune's."""
    if autotuning():
        return None
    table = _table_for(device.index if device.index is not None else torch.cuda.current_device())
    if not table:
        return None
    entries = table.get(kernel_id(kernel))
    if not entries:
        return None
    return nearest(entries, *key_and_parts(kernel, args, kwargs), allowed)


def nearest(entries: Sequence[Mapping], key: Sequence, parts: Sequence[str],
            allowed: Sequence[Mapping] | None = None) -> triton.Config | None:
    """The config of the entry nearest ``key`` among those equal to it in its ``EXACT`` parts
    whose config is ``allowed`` (None: any). One function may stand under several autotuners
    (a reduction's inner and outer tile spaces): an entry of another's space is not allowed."""
    best, best_distance = None, math.inf
    for entry in entries:
        tuned = entry["key"]
        if allowed is not None and entry["config"] not in allowed:
            continue
        if len(tuned) != len(key) or any(
                a != b and not (part == DTYPE or part == SIZE and _size(a) and _size(b))
                for a, b, part in zip(key, tuned, parts)):
            continue
        distance = sum(abs(math.log2(1 + a) - math.log2(1 + b)) if a != b and part == SIZE
                       else DTYPE_MISMATCH if a != b else 0.0
                       for a, b, part in zip(key, tuned, parts))
        if distance < best_distance:
            best, best_distance = entry, distance
    return None if best is None else config_of(best["config"])


def _size(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def config_of(entry: Mapping) -> triton.Config:
    meta = {k: v for k, v in entry.items() if k not in ("num_warps", "num_stages")}
    return triton.Config(meta, num_warps=entry.get("num_warps", 4),
                         num_stages=entry.get("num_stages", 1))


def entry_config(config: triton.Config) -> dict:
    """A config as a table writes it, and as a launch passes it: its meta-parameters, warps and
    stages, one mapping."""
    return {**config.kwargs, "num_warps": config.num_warps, "num_stages": config.num_stages}


@functools.lru_cache(maxsize=None)
def _table_for(index: int) -> dict[str, list]:
    name = torch.cuda.get_device_name(index)
    capability = torch.cuda.get_device_capability(index)
    path = find_table(name, capability)
    return {} if path is None else read_table(path)["kernels"]


def find_table(device_name: str, capability: tuple[int, int],
               folder: Path | None = None) -> Path | None:
    """The device's table, else the newest of its architecture family below its capability."""
    folder = folder or TABLE_DIR
    own = folder / table_name(device_name, capability)
    if own.exists():
        return own
    older = []
    for path in folder.glob("*.json"):
        found = re.search(r"-sm(\d+)\.json$", path.name)
        if found:
            major, minor = divmod(int(found.group(1)), 10)
            if major == capability[0] and minor <= capability[1]:
                older.append(((major, minor), path.name, path))
    return max(older)[2] if older else None


def read_table(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def write_table(path: Path, device_name: str, capability: tuple[int, int],
                kernels: Mapping[str, Sequence[Mapping]]) -> None:
    """Writes a table deterministically (kernels sorted, each kernel's entries by key, an entry a
    line with its keys sorted: the same winners give the same bytes), whole to a temporary file
    that then replaces the old one (a run stopped meanwhile leaves the last whole table)."""
    lines = ["{", f'"device": {json.dumps(device_name)},',
             f'"capability": {json.dumps(list(capability))},', '"kernels": {']
    names = sorted(kernels)
    for n, name in enumerate(names):
        entries = sorted(kernels[name], key=lambda e: json.dumps(e["key"]))
        lines.append(f" {json.dumps(name)}: [")
        lines += [f"  {json.dumps(e, sort_keys=True)}" + ("," if i < len(entries) - 1 else "")
                  for i, e in enumerate(entries)]
        lines.append(" ]" + ("," if n < len(names) - 1 else ""))
    lines += ["}", "}"]
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".json.tmp")
    temporary.write_text("\n".join(lines) + "\n", encoding="utf-8")
    temporary.replace(path)

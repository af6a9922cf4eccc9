"""``specgen tune``: each autotuned kernel's config space searched at the benchmark shapes on this
GPU, every candidate checked against eager torch before it is timed, the winners frozen in the
device's table (specgen/runtime/tuned.py says how launches read it).

A call may start several autotuned kernels (a split reduction and its combine, the attention
backward's two passes); they are searched one at a time, in launch order, each with the ones
before it at their winners and the ones after it launching as usual. A kernel whose entry (its
autotuning key) the table has already is skipped: a run stopped part way (Ctrl-C; the table is
rewritten whole after each kernel) resumes where it stopped, and a kernel launched at the same
key by two cases is searched once. A kernel a call starts twice at different keys is searched at
its first launch; its other launches run the same candidate while it is searched and autotune
(or read the table) otherwise.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
import triton

from bench import harness
from specgen.runtime import override, record_launches, tuned

launch = importlib.import_module("specgen.runtime.launch")


@dataclass(frozen=True)
class Found:
    """One kernel's search at one case."""

    kernel: str                 # tuned.kernel_id
    key: list                   # its autotuning key there
    config: dict | None         # the winner (None: no candidate passed the check)
    ms: float | None
    candidates: int
    rejected: int               # candidates whose result failed the check


def tune(cases: list[harness.Case], table: Path, device_name: str,
         capability: tuple[int, int], timer: Callable[[Callable], float] | None = None,
         check: Callable = harness.check, echo: Callable[[str], None] = print) -> list[Found]:
    """Searches the kernels of ``cases`` and writes the winners into ``table``."""
    timer = timer or harness.bench_ms
    kernels = tuned.read_table(table)["kernels"] if table.exists() else {}
    found = []
    # the calls launch what a user's would (no autotuning, no split-K timing: a kernel that
    # only autotuning's trials start is not searched); those not being searched take the table
    # or the heuristic
    with tuned.no_autotuning():
        for number, case in enumerate(cases, 1):
            label = f"[{number}/{len(cases)}] {case.op} {case.shape}"
            inputs = case.make_inputs()
            # (a watched call is never a replay, which would start its kernels unseen)
            with record_launches(), launch.watch_autotuned() as seen:
                case.specgen(*inputs)
            fixed: dict[str, int] = {}
            for kernel, args, kwargs in _unique(seen):
                name = tuned.kernel_id(kernel)
                key = tuned.key_of(kernel, args, kwargs)
                candidates = launch.pruned_configs(kernel, args, kwargs)
                # (one function may stand under several autotuners: an entry of another's
                # space is not this one's)
                space = [tuned.entry_config(config) for config in candidates]
                done = next((e for e in kernels.get(name, ())
                             if e["key"] == key and e["config"] in space), None)
                if done is not None:
                    echo(f"{label} {name}: in the table already")
                    fixed[name] = _index(candidates, done["config"])
                    continue
                result = _search(case, inputs, name, key, candidates, fixed, timer, check,
                                 lambda text: echo(f"{label} {name} {text}"))
                found.append(result)
                if result.config is None:
                    continue
                fixed[name] = _index(candidates, result.config)
                kernels.setdefault(name, []).append({"key": key, "config": result.config})
                tuned.write_table(table, device_name, capability, kernels)
    return found


def _search(case, inputs, name, key, candidates, fixed, timer, check, echo) -> Found:
    best, best_ms, rejected = None, None, 0
    for index, config in enumerate(candidates):
        with override(kernel_configs=tuple({**fixed, name: index}.items())):
            # (checked unreplayed, so that its launches are seen)
            with record_launches(), launch.watch_autotuned() as launched:
                verdict = check(case.specgen, case.eager, inputs, case.dtype)
            if verdict.startswith("PASS") and name not in {
                    tuned.kernel_id(kernel) for kernel, _, _ in launched}:
                verdict = "FAIL (the call did not launch this kernel)"
            if not verdict.startswith("PASS"):
                rejected += 1
                echo(f"{_bar(index + 1, len(candidates))} config {index}: {verdict}, skipped")
                continue
            ms = timer(lambda: case.specgen(*inputs))
        if best_ms is None or ms < best_ms:
            best, best_ms = config, ms
        echo(f"{_bar(index + 1, len(candidates))} config {index}: {ms:.3f} ms, best {best_ms:.3f}")
    return Found(name, key, None if best is None else tuned.entry_config(best), best_ms,
                 len(candidates), rejected)


def _unique(seen: list) -> list:
    """Each kernel once, at its first launch."""
    firsts = {}
    for kernel, args, kwargs in seen:
        firsts.setdefault(tuned.kernel_id(kernel), (kernel, args, kwargs))
    return list(firsts.values())


def _index(candidates: list[triton.Config], entry: dict) -> int:
    """The candidate a table entry names (its first, where the space has changed since)."""
    for index, config in enumerate(candidates):
        if tuned.entry_config(config) == entry:
            return index
    return 0


def _bar(done: int, total: int, width: int = 20) -> str:
    filled = width * done // total
    return f"[{'#' * filled}{'-' * (width - filled)}] {done}/{total}"


def device() -> tuple[str, tuple[int, int]]:
    return torch.cuda.get_device_name(), torch.cuda.get_device_capability()

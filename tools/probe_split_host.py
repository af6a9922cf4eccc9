"""Host time of a replayed row-wise call, part by part: the signature lookup, each allocation and
each launch of the replay, against the whole call (H200 host; no device work is waited for).

Usage (GPU machine): PYTHONPATH=. python3 tools/probe_split_host.py
"""

from __future__ import annotations

import time

import torch

import generated
from specgen.runtime import replay


def per_call_us(fn, calls: int = 2000) -> float:
    """The median over 5 batches of ``calls`` back-to-back calls, with a sync between batches."""
    times = []
    for _ in range(5):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - start) / calls * 1e6)
    torch.cuda.synchronize()
    return sorted(times)[2]


def main() -> None:
    bf16 = dict(device="cuda", dtype=torch.bfloat16)
    for rows, n in ((4096, 4096), (8, 262144)):
        x, w, b = torch.randn(rows, n, **bf16), torch.randn(n, **bf16), torch.randn(n, **bf16)
        cases = {"softmax": ((x,), (-1, None), lambda: generated.softmax(x, -1)),
                 "layer_norm": ((x, w, b), ((n,), 1e-5),
                                lambda: generated.layer_norm(x, (n,), w, b)),
                 "rms_norm": ((x, w), ((n,), None), lambda: generated.rms_norm(x, (n,), w))}
        for name, (tensors, scalars, call) in cases.items():
            for _ in range(4):
                call()
            replays = generated.REGISTRY[name].replays
            key, found = replays.lookup(tensors, scalars)
            assert found is not None, replays.failures
            buffers = [make() for make in found.allocations]
            parts = {"whole call": call, "lookup": lambda: replays.lookup(tensors, scalars),
                     "replay": lambda: found(tensors)}
            for i, make in enumerate(found.allocations):
                parts[f"allocation {i} {tuple(make().shape)}"] = make
            for i, launch in enumerate(found.launches):
                parts[f"launch {i} {launch.fn.__name__} ({len(launch.args)} args)"] = (
                    lambda launch=launch: launch(tensors, buffers))
                scratch = launch.compiled.metadata.global_scratch_size
                parts[f"  (global scratch {scratch} bytes)"] = lambda: None
            print(f"{name} {rows}x{n}:", flush=True)
            for part, fn in parts.items():
                print(f"  {per_call_us(fn):7.2f} us  {part}", flush=True)


if __name__ == "__main__":
    main()

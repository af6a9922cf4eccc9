"""Ticket counters of one-launch splits, kept zero between launches.

A split whose partial results are combined in the same launch (reduce's ``last`` strategy, the
matmul family's split-K) counts its programs in per output tile: each program takes a ticket
after storing its partial, and the one that takes the last sums the partials, writes the tile
and resets the counter. Allocating and zeroing counters each call would cost the launch the
split saves, so they are kept between launches: one set per (device, stream), since launches on
one stream run one after another and launches on two streams may run at once.
"""

from __future__ import annotations

import torch

from specgen.runtime.context import untraced
from specgen.runtime.replay import persistent, zeros

# (device, stream) -> int32 tickets, zero between launches: the last program of each output tile
# resets its own
_counters: dict[tuple[torch.device, int | None], torch.Tensor] = {}
# outgrown counters stay allocated: a captured CUDA graph may still use them
_retired: list[torch.Tensor] = []


def tile_counters(device: torch.device, count: int) -> torch.Tensor:
    """At least ``count`` zeroed ticket counters for the current stream of ``device`` (allocated
    once, grown as needed). A replayed call looks them up again, on its own stream."""
    return persistent(_stream_counters(device, count), lambda: _stream_counters(device, count))


def _capturing(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def _stream_counters(device: torch.device, count: int) -> torch.Tensor:
    if _capturing(device):
        # a CUDA graph being captured gets counters of its own, zeroed by the graph each replay:
        # a set made here and kept would be zeroed only when this graph replays, and graphs
        # share their capture stream (torch.cuda.graph's default)
        return torch.zeros(max(count, 1), dtype=torch.int32, device=device)
    # the raw stream query (Triton's own): torch.cuda.current_stream builds a Stream object,
    # several microseconds of a replayed call
    stream = torch._C._cuda_getCurrentRawStream(device.index) if device.type == "cuda" else None
    counters = _counters.get((device, stream))
    if counters is None or counters.numel() < count:
        if counters is not None:
            _retired.append(counters)
        size = max(count, 1024, 2 * counters.numel() if counters is not None else 0)
        counters = torch.zeros(size, dtype=torch.int32, device=device)
        _counters[device, stream] = counters
    return counters


def launch_counters(x: torch.Tensor, count: int) -> torch.Tensor:
    """The ticket counters of a one-launch split on ``x``'s device, which the kernel leaves zero:
    kept between untraced calls (``tile_counters``); a traced call (a graph) allocates zeroed
    ones each run, as a graph cannot hold ours."""
    if untraced([x]):
        return tile_counters(x.device, count)
    return zeros((count,), torch.int32, x.device)

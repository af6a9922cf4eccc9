"""GPU sweep of the row-wise planner constants and strategies: one line per variant.

For softmax, layer_norm (weight and bias) and rms_norm (weight), bf16, as in the row-wise
family's bench rows (specgen/families/rowwise.py, BENCH_SHAPES and bench_cases) (``--only`` also takes log_softmax and logsumexp; ``--dtype`` another input dtype):

- part ``single``: the single-tile kernel at 32768x1024 and 4096x4096 over
  ``TILE_TARGET`` x ``ELEMENTS_PER_THREAD`` (specgen.runtime.rowwise constants, patched here;
  variants that give the same BLOCK_M / num_warps are timed once), then the planner's choice on
  a persistent grid of 1, 2 and 4 programs per SM;
- part ``chunked``: 1024x32768 with each strategy forced (looped, online where the op has it,
  single), the chunked kernels tuned (also on persistent grids of 1, 2, 4 programs per SM: fewer
  rows in flight keep the re-read rows in L2), then with each config of their space forced, then
  two wider chunks outside it;
- part ``split``: 8x262144 split (tuned, then each config), looped/online for comparison;
- part ``long``: looped against online (the ops that have it), each tuned, over rows from 32768
  to 262144 elements and as many rows as fill the GPU or more: which ``auto`` should pick past
  the single tile, and where the rows in flight stop fitting in L2.

Columns: ``graph`` = do_bench median of a CUDA-graph replay of the op call (L2 flushed before each
replay; the graph leaves out the host's launch path, so this is the kernels' device time);
``prof`` = torch.profiler device time of the kernels of one direct call, L2 warm (what
tools/perf/profile_cases.py reports; an 8x262144 case fits in L2); ``sol`` = bytes moved (x read, out
written, weight/bias read) over the measured copy bandwidth, and ``graph`` as a share of it.

Reading it: the fastest single line per shape sets ``TILE_TARGET`` / ``ELEMENTS_PER_THREAD``
(specgen/runtime/rowwise.py); single vs looped/online at 1024x32768 sets ``SINGLE_MAX``; the
configs the tuner never picks can leave the family's default chunked space (``CHUNK`` x
``num_warps`` in specgen/families/rowwise.py, or a spec's ``[tuning]``); a persistent line that
beats the flat one says ``launch_plan`` should cap that strategy's grid.

Usage (GPU machine, one call, about 3 minutes, most of it compiling):
    PYTHONPATH=. python3 tools/perf/sweep_rowwise.py [--only OP ...] [--part single|chunked|split ...]
"""

from __future__ import annotations

import argparse
import importlib
import itertools

import torch
import triton
import triton.testing
from torch.profiler import ProfilerActivity, profile

from bench import harness
from specgen.runtime import override, rowwise

# the module (specgen.runtime exports its function launch under the same name)
launch = importlib.import_module("specgen.runtime.launch")

OPS = ("softmax", "layer_norm", "rms_norm", "log_softmax", "logsumexp")
VECTORS = {"softmax": 0, "layer_norm": 2, "rms_norm": 1, "log_softmax": 0,
           "logsumexp": 0}   # weight, bias
DTYPE = torch.bfloat16
TILE_TARGETS = (2048, 4096, 8192, 16384)
ELEMENTS_PER_THREAD = (8, 16, 32)
# persistent grids: programs per SM
PERSISTENT_PER_SM = (1, 2, 4)
# part long: (rows, N) past the single tile's 16384, from one wave of programs to many, and rows
# whose programs in flight hold more than L2
LONG_SHAPES = ((264, 32768), (1024, 32768), (4096, 32768), (512, 65536), (2048, 65536),
               (256, 131072), (4096, 131072), (1024, 262144))
# configs outside the spec's chunked space: wider chunks (num_stages is left at 1: these loops
# have no load Triton's pipeliner takes, the TTGIR is the same at 3 stages)
EXTRA_CHUNKED = ({"BLOCK_M": 1, "BLOCK_N": 8192, "num_warps": 16},
                 {"BLOCK_M": 1, "BLOCK_N": 8192, "num_warps": 32},
                 # several rows a program: each chunk of the weight and bias read from L2 serves
                 # them all
                 {"BLOCK_M": 2, "BLOCK_N": 4096, "num_warps": 16},
                 {"BLOCK_M": 2, "BLOCK_N": 4096, "num_warps": 32},
                 {"BLOCK_M": 2, "BLOCK_N": 8192, "num_warps": 32},
                 {"BLOCK_M": 4, "BLOCK_N": 2048, "num_warps": 16},
                 {"BLOCK_M": 4, "BLOCK_N": 4096, "num_warps": 32})


def module(op: str):
    return importlib.import_module(f"generated.{op}")


def call(op: str, x: torch.Tensor, vectors: list[torch.Tensor]):
    fn = getattr(module(op), op)
    if op in ("softmax", "log_softmax", "logsumexp"):
        return lambda: fn(x, -1)
    return lambda: fn(x, [x.shape[-1]], *vectors)


def graph_us(fn) -> float:
    """Device time of ``fn``'s kernels: a CUDA graph of one call, replayed after an L2 flush."""
    fn()  # compiles and tunes outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return triton.testing.do_bench(graph.replay, warmup=10, rep=40, return_mode="median") * 1e3


def profiled_us(fn, calls: int = 5) -> float:
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    return sum(e.device_time for e in prof.events()
               if e.device_type == torch.autograd.DeviceType.CUDA) / calls


def tuned_configs(op: str) -> str:
    """The configs the autotuner chose for this op's kernels (launch's cache of them)."""
    chosen = [f"{kernel.fn.__name__.removeprefix(f'_{op}_')}: "
              f"{dict(config.kwargs, num_warps=config.num_warps, num_stages=config.num_stages)}"
              for (kernel, _, _), config in launch._tuned.items()
              if kernel.fn.__name__.startswith(f"_{op}_")]
    return "; ".join(chosen)


class Sweep:
    def __init__(self, copy_gbps: float):
        self.copy_gbps = copy_gbps

    def run(self, op: str, rows: int, n: int, variant: str, knobs: dict, note: str = "") -> None:
        x = torch.randn(rows, n, device="cuda", dtype=DTYPE)
        vectors = [torch.randn(n, device="cuda", dtype=DTYPE) for _ in range(VECTORS[op])]
        # logsumexp writes a value a row
        full = 1 if op == "logsumexp" else 2
        sol = DTYPE.itemsize * (full * rows * n + len(vectors) * n) / (self.copy_gbps * 1e3)
        fn = call(op, x, vectors)
        rowwise._plans.clear()     # the single-tile config is part of the cached launch plan
        launch._tuned.clear()
        head = f"{op:10s} {f'{rows}x{n}':11s} {variant:34s}"
        try:
            with override(**knobs):
                graph = graph_us(fn)
                prof = profiled_us(fn)
                note = note or tuned_configs(op)
        except Exception as exc:  # noqa: BLE001 - a sweep reports a failing variant and goes on
            print(f"{head} FAILED {type(exc).__name__}: {str(exc)[:160]}", flush=True)
            return
        print(f"{head} graph {graph:7.1f} us  prof {prof:7.1f} us  sol {sol:6.1f} us "
              f"{100 * sol / graph:4.0f}%  {note}", flush=True)

    def single(self, op: str) -> None:
        saved = rowwise.TILE_TARGET, rowwise.ELEMENTS_PER_THREAD
        try:
            for rows, n in ((32768, 1024), (4096, 4096)):
                seen = set()
                for tile, ept in itertools.product(TILE_TARGETS, ELEMENTS_PER_THREAD):
                    rowwise.TILE_TARGET, rowwise.ELEMENTS_PER_THREAD = tile, ept
                    config = rowwise.single_config(rows, n)
                    if tuple(config.items()) in seen:
                        continue
                    seen.add(tuple(config.items()))
                    self.run(op, rows, n, f"single TILE_TARGET={tile} EPT={ept}",
                             {"strategy": "single"}, str(config))
                rowwise.TILE_TARGET, rowwise.ELEMENTS_PER_THREAD = saved
                self.persistent(op, rows, n, "single", {"strategy": "single"},
                                str(rowwise.single_config(rows, n)))
        finally:
            rowwise.TILE_TARGET, rowwise.ELEMENTS_PER_THREAD = saved

    def chunked(self, op: str, rows: int, n: int, strategies: tuple[str, ...]) -> None:
        for strategy in strategies:
            if strategy not in module(op).STRATEGIES:
                continue
            self.run(op, rows, n, f"{strategy} tuned", {"strategy": strategy})
            if strategy != "split":
                self.persistent(op, rows, n, f"{strategy} tuned", {"strategy": strategy})
            for index, config in enumerate(module(op).CHUNKED_CONFIGS):
                self.run(op, rows, n, f"{strategy} config {index}", {"strategy": strategy,
                                                                       "config": index}, str(config))
            for config in EXTRA_CHUNKED:
                self.run(op, rows, n, f"{strategy} extra", {"strategy": strategy,
                                                            "config": config}, str(config))

    def persistent(self, op: str, rows: int, n: int, variant: str, knobs: dict,
                   note: str = "") -> None:
        """The planner's choice with the grid capped at a few programs per SM (each loops over
        row blocks): fewer rows in flight, so a chunked row's re-read more likely hits L2."""
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        for per_sm in PERSISTENT_PER_SM:
            self.run(op, rows, n, f"{variant} {per_sm}/SM", {**knobs, "launch": "persistent",
                                                              "max_programs": per_sm * sms}, note)

    def single_long(self, op: str, rows: int, n: int) -> None:
        saved = rowwise.ELEMENTS_PER_THREAD
        try:
            for ept in (32, 64):
                rowwise.ELEMENTS_PER_THREAD = ept
                self.run(op, rows, n, f"single EPT={ept}", {"strategy": "single"},
                         str(rowwise.single_config(rows, n)))
        finally:
            rowwise.ELEMENTS_PER_THREAD = saved


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", action="append", choices=OPS)
    parser.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default="bfloat16")
    parser.add_argument("--part", action="append", choices=("single", "chunked", "split", "long"))
    args = parser.parse_args()
    global DTYPE
    DTYPE = getattr(torch, args.dtype)
    parts = args.part or ("single", "chunked", "split", "long")
    copy = harness.measure_copy_bandwidth()
    print(f"# {torch.cuda.get_device_name()}, triton {triton.__version__}, torch "
          f"{torch.__version__}, copy {copy:.0f} GB/s", flush=True)
    sweep = Sweep(copy)
    for op in args.only or OPS[:3]:
        if "single" in parts:
            sweep.single(op)
        if "chunked" in parts:
            sweep.chunked(op, 1024, 32768, ("looped", "online"))
            sweep.single_long(op, 1024, 32768)
        if "split" in parts:
            sweep.chunked(op, 8, 262144, ("split",))
            for strategy in ("looped", "online"):
                if strategy in module(op).STRATEGIES:
                    sweep.run(op, 8, 262144, f"{strategy} tuned", {"strategy": strategy})
        if "long" in parts:
            for rows, n in LONG_SHAPES:
                for strategy in ("looped", "online"):
                    if strategy in module(op).STRATEGIES:
                        sweep.run(op, rows, n, f"{strategy} tuned", {"strategy": strategy})
                torch.cuda.empty_cache()
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()

"""Where each benchmark case's time goes: host time per call, device time per kernel.

For every case of the chosen bench families (specgen and eager; torch.compile is left to
``python3 -m bench``): the do_bench median as the benchmark takes it, the host time of one call
(no sync), and the device time of each kernel the call starts (torch.profiler).

Usage (GPU machine): PYTHONPATH=. python3 tools/perf/profile_cases.py [--only FAMILY ...]
[--match TEXT] [--cprofile N]; --match keeps the cases whose op contains TEXT, --cprofile prints
the N functions of most cumulative host time in 20 calls of specgen's side (cProfile inflates
Python frames: compare within one run).
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import importlib
import pstats
import time

import torch
from torch.profiler import ProfilerActivity, profile

from bench import harness
from bench.command import FAMILIES

# by module path: the package's attribute `launch` is the function of that name
launch_module = importlib.import_module("specgen.runtime.launch")


def host_us(fn, inputs, calls: int = 20) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn(*inputs)
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / calls * 1e6


def kernels(fn, inputs, calls: int = 5) -> list[tuple[str, float, int]]:
    """(kernel name, device us per call, launches per call), slowest first."""
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn(*inputs)
        torch.cuda.synchronize()
    total = collections.defaultdict(float)
    count = collections.Counter()
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            total[event.name] += event.device_time
            count[event.name] += 1
    return sorted(((name[:70], us / calls, count[name] // calls) for name, us in total.items()),
                  key=lambda item: -item[1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", action="append", choices=FAMILIES)
    parser.add_argument("--match", default="")
    parser.add_argument("--cprofile", type=int, default=0)
    args = parser.parse_args()
    for family in args.only or FAMILIES:
        for case in FAMILIES[family](False):
            if args.match not in case.op:
                continue
            inputs = case.make_inputs()
            for impl, fn in (("specgen", case.specgen), ("eager", case.eager)):
                try:
                    fn(*inputs)  # compiles and tunes
                    ms = harness.time_rotating(fn, [inputs])
                    line = (f"[{family}] {case.op} {case.shape} {impl}: bench {ms * 1e3:.1f} us, "
                            f"host {host_us(fn, inputs):.1f} us/call")
                    print(line, flush=True)
                    for name, us, launches in kernels(fn, inputs):
                        print(f"      {us:8.1f} us  x{launches}  {name}", flush=True)
                    if impl == "specgen" and args.cprofile:
                        profiler = cProfile.Profile()
                        profiler.runcall(lambda: [fn(*inputs) for _ in range(20)])
                        pstats.Stats(profiler).sort_stats("cumulative").print_stats(args.cprofile)
                    if impl == "specgen":
                        for (kernel, _, kwargs), config in launch_module._tuned.items():
                            print(f"      tuned {kernel.fn.__name__} {dict(kwargs)}: {config}")
                        launch_module._tuned.clear()
                except Exception as exc:  # noqa: BLE001 - a diagnostic run reports and goes on
                    print(f"[{family}] {case.op} {case.shape} {impl}: FAILED {exc!r}", flush=True)
            del inputs
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()

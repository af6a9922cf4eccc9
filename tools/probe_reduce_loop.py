"""GPU probe: does the reduce kernel's grid-stride loop cost time when it runs once? (one call)

The row-wise single tile lost 1.2-2.5 us of 38 to a loop over row blocks that ran once a program
(tools/probe_ln_gen.py). The reduce kernel walks its output tiles in the same kind of loop, also
under a flat launch (a program a tile). This probe copies generated/sum.py and mean.py with that
loop replaced by one guarded tile a program, registers the copies under other op names, checks
them against torch and times both next to each other (do_bench median, L2 flushed, two input
sets rotated), three interleaved rounds.

Usage (GPU machine): PYTHONPATH=. python3 tools/probe_reduce_loop.py [--check-only]
"""

from __future__ import annotations

import argparse
import importlib.util
import pathlib
import tempfile

import torch

LOOP = "    for tile in range(pid, num_tiles, tl.num_programs(0)):\n"
ONCE = "    tile = pid\n    if tile < num_tiles:\n"


def unlooped(name: str, folder: pathlib.Path):
    source = pathlib.Path(f"generated/{name}.py").read_text()
    assert source.count(LOOP) == 1, f"generated/{name}.py: the tile loop is not where expected"
    source = source.replace(LOOP, ONCE).replace(f'"specgen::{name}"', f'"specgen::{name}_once"')
    path = folder / f"{name}_once.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(f"{name}_once", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, name)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--check-only", action="store_true",
                        help="small shapes, no timing (TRITON_INTERPRET=1 on a CPU)")
    args = parser.parse_args()
    device = "cpu" if args.check_only else "cuda"
    rows, n = (6, 40) if args.check_only else (32768, 1024)
    import generated
    folder = pathlib.Path(tempfile.mkdtemp())
    ops = {"sum": (generated.sum, unlooped("sum", folder)),
           "mean": (generated.mean, unlooped("mean", folder))}
    sets = [(torch.randn(rows, n, device=device, dtype=torch.bfloat16),) for _ in range(2)]
    cases = [(name, dim) for name in ops for dim in (-1, 0)]
    for name, dim in cases:
        x = sets[0][0]
        ref = getattr(torch, name)(x.double(), dim)
        for fn in ops[name]:
            torch.testing.assert_close(fn(x, dim).double(), ref, atol=2e-2, rtol=2e-2)
    if args.check_only:
        print("both forms match torch", flush=True)
        return

    from bench.harness import measure_copy_bandwidth
    from tools.probe_memory import bench_us
    copy_gbps = measure_copy_bandwidth()
    print("device", torch.cuda.get_device_name(), "torch", torch.__version__, flush=True)
    nbytes = rows * n * 2
    for round_ in range(3):
        for name, dim in cases:
            for label, fn in zip(("generated (loop)", "one tile a program"), ops[name]):
                us = bench_us(lambda x, fn=fn, dim=dim: fn(x, dim), sets)
                print(f"round {round_} {name}(x, {dim}) {label:20s} {us:6.1f} us "
                      f"{100 * nbytes / us / 1e3 / copy_gbps:4.0f}% copy", flush=True)


if __name__ == "__main__":
    main()

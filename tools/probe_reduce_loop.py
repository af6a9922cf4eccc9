"""GPU probe: does the reduce kernel's grid-stride loop cost time when it runs once? (one call)

The row-wise single tile lost 1.2-2.5 us of 38 to a loop over row blocks that ran once a program
(tools/probe_ln_gen.py). The reduce kernel walked its output tiles in the same kind of loop, also
under a flat launch (a program a tile); it now takes the loop only where reduction.Level sets
TILE_LOOP. This probe copies generated/sum.py and mean.py twice, with the loop forced on and
forced off, registers the copies under other op names, checks them against torch and times them
next to the generated ops (do_bench median, L2 flushed, two input sets rotated), three
interleaved rounds.

Usage (GPU machine): PYTHONPATH=. python3 tools/probe_reduce_loop.py [--check-only]
"""

from __future__ import annotations

import argparse
import importlib.util
import pathlib
import tempfile

import torch

CHOICE = "    if TILE_LOOP:\n"


def forced(name: str, loop: bool, folder: pathlib.Path):
    """generated/{name}.py with the tile loop forced on or off, as an op of another name."""
    source = pathlib.Path(f"generated/{name}.py").read_text()
    assert source.count(CHOICE) == 1, f"generated/{name}.py: the loop choice is not where expected"
    tag = "loop" if loop else "once"
    source = source.replace(CHOICE, f"    if {loop}:\n").replace(f'"specgen::{name}"',
                                                              f'"specgen::{name}_{tag}"')
    path = folder / f"{name}_{tag}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(f"{name}_{tag}", path)
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
    ops = {name: (getattr(generated, name), forced(name, True, folder), forced(name, False, folder))
           for name in ("sum", "mean")}
    sets = [(torch.randn(rows, n, device=device, dtype=torch.bfloat16),) for _ in range(2)]
    cases = [(name, dim) for name in ops for dim in (-1, 0)]
    for name, dim in cases:
        x = sets[0][0]
        ref = getattr(torch, name)(x.double(), dim)
        for fn in ops[name]:
            torch.testing.assert_close(fn(x, dim).double(), ref, atol=2e-2, rtol=2e-2)
    if args.check_only:
        print("every form matches torch", flush=True)
        return

    from bench.harness import measure_copy_bandwidth
    from tools.probe_memory import bench_us
    copy_gbps = measure_copy_bandwidth()
    print("device", torch.cuda.get_device_name(), "torch", torch.__version__, flush=True)
    nbytes = rows * n * 2
    for round_ in range(3):
        for name, dim in cases:
            for label, fn in zip(("generated", "loop forced", "one tile forced"), ops[name]):
                us = bench_us(lambda x, fn=fn, dim=dim: fn(x, dim), sets)
                print(f"round {round_} {name}(x, {dim}) {label:20s} {us:6.1f} us "
                      f"{100 * nbytes / us / 1e3 / copy_gbps:4.0f}% copy", flush=True)


if __name__ == "__main__":
    main()

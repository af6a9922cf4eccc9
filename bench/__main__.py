"""Benchmarks specgen ops against eager PyTorch and torch.compile on a CUDA GPU.

    python3 -m bench [--only FAMILY ...] [--quick] [--out bench/RESULTS.md]
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

import torch

from bench import harness, host
from specgen.families import FAMILIES as KERNEL_FAMILIES
from specgen.families.contract import resolve

# family -> cases(quick) -> list[harness.Case], from each kernel family's `bench` (a family whose
# rows another's section holds has none). Each gets its own `## family` section.
FAMILIES = {name: resolve(family.bench) for name, family in KERNEL_FAMILIES.items()
            if family.bench}
# Sections that are not harness.Case rows timed by do_bench: name -> section(run) -> markdown.
# host: host time per call on tiny inputs against eager (bench/host.py); --quick leaves it as is;
# then each kernel family's own (`bench_section`: attention against SDPA's backends).
SECTIONS = {"host": host.section,
            **{name: resolve(family.bench_section) for name, family in KERNEL_FAMILIES.items()
               if family.bench_section}}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python3 -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", choices=[*FAMILIES, *SECTIONS], metavar="FAMILY",
                        help=f"run only this family (repeatable; one of: {', '.join([*FAMILIES, *SECTIONS])})")
    parser.add_argument("--quick", action="store_true", help="16x smaller sizes, for smoke tests")
    parser.add_argument("--out", type=Path, default=Path("bench/RESULTS.md"),
                        help="markdown report; sections of families not run are kept (default: %(default)s)")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench needs a CUDA GPU")

    run = harness.Run(command=shlex.join(["python3", "-m", "bench", *sys.argv[1:]]),
                      copy_gbps=harness.measure_copy_bandwidth())
    print(f"copy bandwidth: {run.copy_gbps:.0f} GB/s", flush=True)

    sections = {}
    for family in dict.fromkeys(args.only or [*FAMILIES, *SECTIONS]):  # dedupe, keep order
        if family in SECTIONS:
            sections[family] = SECTIONS[family](run)
            continue
        rows = harness.run_cases(FAMILIES[family](args.quick))
        sections[family] = harness.format_section(family, rows, run)

    old = args.out.read_text() if args.out.exists() else ""
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(harness.merge_report(old, harness.report_header(run), sections))
    print(f"\nwrote {args.out}\n")
    print("\n".join(sections.values()), end="")


if __name__ == "__main__":
    main()

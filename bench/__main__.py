"""Benchmarks specgen ops against eager PyTorch and torch.compile on a CUDA GPU.

    python3 -m bench [--only FAMILY ...] [--quick] [--out bench/RESULTS.md]

(``specgen bench`` is the same run, with ops to narrow it to: bench/command.py.)
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

import torch

from bench import command


def parse_args() -> argparse.Namespace:
    names = [*command.FAMILIES, *command.SECTIONS]
    parser = argparse.ArgumentParser(prog="python3 -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", choices=names, metavar="FAMILY",
                        help=f"run only this family (repeatable; one of: {', '.join(names)})")
    parser.add_argument("--quick", action="store_true", help="16x smaller sizes, for smoke tests")
    parser.add_argument("--out", type=Path, default=Path("bench/RESULTS.md"),
                        help="markdown report; sections of families not run are kept (default: %(default)s)")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench needs a CUDA GPU")
    selection = command.select(tuple(args.only or ()), quick=args.quick)
    print(command.run(selection, args.out, shlex.join(["python3", "-m", "bench", *sys.argv[1:]])),
          end="")


if __name__ == "__main__":
    main()

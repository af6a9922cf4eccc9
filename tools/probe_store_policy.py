"""GPU probe: the eviction policy of the chunked row-wise kernels' output stores (one device call).

A looped (or split) row-wise kernel reads each row twice: once for its statistics (``evict_last``,
so that the row stays in L2) and once more to write the outputs. Its output stores compete in L2
with the rows other programs will read again. This probe times each generated row-wise op next
to a copy of its module whose element-output stores in the chunked and split kernels carry the
policy ``--policy`` (the single tile's store is left as generated), as bench/ times (do_bench
median, L2 flushed, input sets rotated), in three interleaved rounds.

The copy is the generated source with those stores rewritten and the op registered under another
name (``specgen::<op>_probe``), loaded from a temporary file (``triton.jit`` reads the source).

Usage (GPU machine): PYTHONPATH=. python3 tools/probe_store_policy.py [--policy evict_first]
    [--shape 1024x32768 ...] [--check-only]
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import re
import sys
import tempfile
from pathlib import Path

import torch

from tools.probe_memory import bench_us

DTYPE = torch.bfloat16
OPS = ("softmax", "layer_norm", "rms_norm")
SHAPES = ("1024x32768", "8x262144")
# the element-output store of a generated row kernel (templates/_rowwise_macros.py.jinja)
STORE = re.compile(r"(tl\.store\((\w+)_ptr \+ \2_row \+ \2_col, .*?, mask=mask)(, eviction_policy=\"\w*\")?\)")
# the kernels whose stores change: the chunked rows helpers and the split output kernel
CHUNKED = re.compile(r"^def _\w+_(looped|online)_rows\(|^def _\w+_split_out_kernel\(")


def with_store_policy(source: str, op: str, policy: str) -> str:
    """The generated module's source with the chunked kernels' output stores under ``policy``."""
    lines, changed, inside = [], 0, False
    for line in source.splitlines():
        if line.startswith("def "):
            inside = bool(CHUNKED.match(line))
        if inside:
            line, n = STORE.subn(
                lambda m: m.group(1) + (f', eviction_policy="{policy}"' if policy else "") + ")", line)
            changed += n
        lines.append(line)
    if not changed:
        raise SystemExit(f"{op}: no chunked output store found to rewrite")
    text = "\n".join(lines) + "\n"
    return text.replace(f'triton_op("specgen::{op}"', f'triton_op("specgen::{op}_probe"')


def load_variant(op: str, policy: str, folder: Path):
    module = importlib.import_module(f"generated.{op}")
    path = folder / f"{op}_probe.py"
    path.write_text(with_store_policy(Path(module.__file__).read_text(), op, policy))
    spec = importlib.util.spec_from_file_location(f"{op}_probe", path)
    variant = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = variant
    spec.loader.exec_module(variant)
    return module, variant


def call(module, op: str, x, vectors):
    n = x.shape[-1]
    if op == "softmax":
        return module.softmax(x, -1)
    if op == "layer_norm":
        return module.layer_norm(x, [n], *vectors)
    return module.rms_norm(x, [n], vectors[0])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--policy", default="evict_first", choices=("", "evict_first", "evict_last"))
    parser.add_argument("--shape", action="append", help=f"ROWSxN (default: {', '.join(SHAPES)})")
    parser.add_argument("--check-only", action="store_true",
                        help="check every variant against the op, time none (TRITON_INTERPRET=1)")
    args = parser.parse_args()
    device = "cpu" if args.check_only else "cuda"
    shapes = [tuple(map(int, s.split("x"))) for s in (args.shape or SHAPES)]
    if args.check_only:
        shapes = [(3, 40)]
    folder = Path(tempfile.mkdtemp(prefix="specgen_probe_"))
    variants = {op: load_variant(op, args.policy, folder) for op in OPS}
    print(f"policy of the chunked output stores in the variant: {args.policy or '-'}", flush=True)
    for rows, n in shapes:
        count = 2 if rows * n >= 1 << 24 else 8
        sets = [(torch.randn(rows, n, device=device, dtype=DTYPE), None) for _ in range(count)]
        vectors = [torch.randn(n, device=device, dtype=DTYPE) for _ in range(2)]
        moved = 2 * rows * n * DTYPE.itemsize
        for op, (module, variant) in variants.items():
            x = sets[0][0]
            torch.testing.assert_close(call(variant, op, x, vectors), call(module, op, x, vectors))
        if args.check_only:
            print(f"{rows}x{n}: every variant matches its op", flush=True)
            continue
        for round_ in range(3):
            for op, (module, variant) in variants.items():
                for label, mod in (("generated", module), ("variant", variant)):
                    us = bench_us(lambda x, o, mod=mod, op=op: call(mod, op, x, vectors), sets)
                    print(f"round {round_} {op} {rows}x{n} {label:9s} {us:7.1f} us "
                          f"{moved / us / 1e3:6.0f} GB/s", flush=True)


if __name__ == "__main__":
    main()

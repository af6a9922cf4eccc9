"""GPU sweep of decode_attention (flash decoding): device time per split count and tile.

    PYTHONPATH=. python3 tools/perf/sweep_decode.py            # the bench's two cells, ~3 minutes
    PYTHONPATH=. python3 tools/perf/sweep_decode.py --quick    # the planner's split, every tile
    PYTHONPATH=. python3 tools/perf/sweep_decode.py --splits 4,8 --tiles 16x128x4x2 --repeat 2

At the bench's decoding cells (bf16, one query row, full caches), each forced split count
(``override(strategy="split:N")``) and tile (``override(config=...)``, BLOCK_M 16 or 64: one
query row, or a packed group of four, fills a fraction of a 64-row tile) is timed as
bench/attention.py times the op (do_bench's median, L2 flushed), the merge kernel included, next
to a device copy of the same bytes timed the same way; "auto" is the planner's split and the
frozen table's tile. One line per variant, its share of the copy; then the ten best per cell.
``--repeat`` times each variant again after the others (best of the rounds, and the slowest), to
tell a variant that is slow from one that met a slow moment. The numbers set the split planner
(``_splits`` in specgen/runtime/attention.py) and the decode spec's tiles (docs/performance.md,
item 000y).
"""

from __future__ import annotations

import argparse
import itertools

import torch
import triton

import generated
from bench import attention, harness
from specgen import runtime

SPLITS = (4, 8, 12, 16, 24, 32, 48, 64)
# (BLOCK_M, BLOCK_N, num_warps, num_stages)
TILES = list(itertools.product((16, 64), (64, 128, 256), (4, 8), (2, 3)))


def _counts(text: str) -> list[int]:
    """``4,8``: split counts, each at least 1, in order, without repeats."""
    counts = [int(n) for n in text.split(",")]
    if min(counts) < 1:
        raise argparse.ArgumentTypeError(f"split counts are at least 1, got {text}")
    return list(dict.fromkeys(counts))


def _tiles(text: str) -> list[tuple[int, ...]]:
    """``16x128x4x2,64x64x4x3``: BLOCK_M x BLOCK_N x warps x stages, in order, without repeats."""
    tiles = [tuple(int(n) for n in tile.split("x")) for tile in text.split(",")]
    if any(len(tile) != 4 for tile in tiles):
        raise argparse.ArgumentTypeError(f"a tile is BLOCK_MxBLOCK_NxWARPSxSTAGES, got {text}")
    return list(dict.fromkeys(tiles))


def _rounds(text: str) -> int:
    if int(text) < 1:
        raise argparse.ArgumentTypeError(f"at least one round, got {text}")
    return int(text)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="the planner's split, every tile")
    parser.add_argument("--splits", type=_counts, help="split counts, as 4,8 (default: the "
                        "sweep's; not with --quick)")
    parser.add_argument("--tiles", type=_tiles,
                        help="tiles BLOCK_MxBLOCK_NxWARPSxSTAGES, as 16x128x4x2,64x64x4x3")
    parser.add_argument("--repeat", type=_rounds, default=1, help="rounds over the variants")
    options = parser.parse_args()
    if options.quick and options.splits:
        parser.error("--quick times the planner's split: --splits goes without it")
    splits, tiles = options.splits or SPLITS, options.tiles or TILES
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__,
          flush=True)
    for batch, heads, heads_kv, keys, dim in attention.DECODE_SHAPES:
        cell = f"B{batch} Hq{heads} Hkv{heads_kv} S{keys} E{dim}"
        q, k, v, lengths, moved = attention.decode_inputs(batch, heads, heads_kv, keys, dim)
        copy = attention.same_bytes_copy(moved)
        copy_ms = harness.bench_ms(copy)
        want = torch.nn.functional.scaled_dot_product_attention(
            q.float(), k.float(), v.float(), enable_gqa=True)

        def call():
            return generated.decode_attention(q, k, v, lengths, enable_gqa=True)

        # the planner's own split, as its launch notes it
        with runtime.record_launches() as log:
            call()
        planned = next(launch.details["splits"] for launch in log if "splits" in launch.details)
        print(f"\n{cell}: copy of the same {moved / 2**20:.0f} MiB {copy_ms * 1e3:.1f} us; "
              f"the planner splits {planned} ways", flush=True)
        variants = [("auto", None, None)]
        for count, (m, n, w, s) in ([(planned, tile) for tile in tiles] if options.quick
                                    else itertools.product(splits, tiles)):
            name = f"split {count:2d}, {m:3d} x {n:3d}, {w} warps, {s} stages"
            config = {"BLOCK_M": m, "BLOCK_N": n, "num_warps": w, "num_stages": s}
            variants.append((name, f"split:{count}", config))
        rounds: dict[str, list] = {name: [] for name, _, _ in variants}
        for round_ in range(options.repeat):
            if round_:
                print(f"  round {round_ + 1}", flush=True)
            for name, strategy, config in variants:
                with runtime.override(strategy=strategy, config=config):
                    result = _timed(call, want)
                rounds[name].append(result)
                print(f"  {name:34s} {_line(result, copy_ms)}", flush=True)
        timed = sorted(((name, min(times), max(times)) for name, times in rounds.items()
                        if not any(isinstance(t, str) for t in times)), key=lambda r: r[1])
        print(f"{cell}, best first" + (" (best of the rounds; slowest)" if options.repeat > 1
                                        else "") + ":")
        for name, best, worst in timed[:10]:
            spread = f"  slowest {worst * 1e3:.1f} us" if options.repeat > 1 else ""
            print(f"  {name:34s} {_line(best, copy_ms)}{spread}")
        del q, k, v, copy


def _timed(call, want: torch.Tensor) -> float | str:
    """The call's median ms, or why it failed; a wrong result is a failure, not a time."""
    try:
        error = (call().float() - want).abs().max().item()
        if not error < 2e-2:
            return f"wrong: max error {error:.1e}"
        return harness.bench_ms(call)
    except Exception as err:  # one variant that does not compile must not end the sweep
        return f"failed: {type(err).__name__}: {str(err)[:100]}"


def _line(result: float | str, copy_ms: float) -> str:
    if isinstance(result, str):
        return result
    return f"{result * 1e3:8.1f} us  {100 * copy_ms / result:5.1f}% of copy"


if __name__ == "__main__":
    main()

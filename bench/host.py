"""Host cost: microseconds of host time per call on tiny inputs, specgen against torch eager, and
the latency of a first call.

At 8x1024 every kernel takes a few microseconds, so a stream of calls is bound by the host (the
Python, checks and launches of each call), the regime of small batches and of a training step's
many small ops. specgen's answer is the replay of a repeated call's recorded launches (README,
"Repeated eager calls are replayed"); this section measures what a replayed call still costs.

The first call at a new shape plans its launches, looks its configs up (specgen/runtime/tuned.py:
the frozen table, else the heuristic; nothing autotunes unless asked) and cannot replay. Its
latency, compilation excluded, is the "first call" column: the call's time up to a synchronize,
at each of ``FIRST_ROWS`` (row counts the op has not seen, of the same divisibility as ``ROWS``,
so the same compiled kernels serve) where Triton produced no kernel binary, the median of the
first ``FIRST_SAMPLES`` such sizes. One size alone is one sample of a noisy quantity: on an H200
host (2026-11-29) layer_norm's fwd+bwd read 3150 us in the bench's single sample and 1142-1754
us at eight fresh sizes in a probe of the same tree.

    python3 -m bench --only host                 # the `## host` section of bench/RESULTS.md
    python3 -m bench.host                        # the same table, printed only
    python3 -m bench.host --cprofile layer_norm+bwd [--sort cumulative]   # one case's specgen calls
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import pstats
import statistics
import sys
import time
import traceback
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F
import triton

from bench import harness

DEVICE = "cuda"
DTYPE = torch.bfloat16
ROWS, N = 8, 1024
# The first call compiles (its configs from the frozen table), the second or third records its
# launches, later ones replay them; warming up well past that times replays only (autograd's
# backward ops likewise).
WARMUP = 20
CALLS = 200  # per round, timed as one loop
ROUNDS = 5  # interleaved (specgen, eager, specgen, ...), so a transient moves both impls
IMPLS = ("specgen", "eager")
# the project's targets: specgen's host time at most this multiple of eager's
TARGETS = {"fwd": 1.3, "fwd+bwd": 1.5}
FORWARD = ["add", "gelu", "softmax", "layer_norm", "rms_norm", "sum", "mm", "cross_entropy"]
TRAINING = ["layer_norm", "rms_norm", "softmax", "geglu", "cross_entropy"]
KEYS = FORWARD + [f"{op}+bwd" for op in TRAINING]  # case names for --cprofile
# fresh row counts for the first calls (ROWS is 8: neither 1 nor a multiple of 16, as these);
# the fwd+bwd cases take their own, so that their forward is a first call too
FIRST_ROWS = {"fwd": tuple(range(24, 264, 16)), "fwd+bwd": tuple(range(264, 504, 16))}
FIRST_SAMPLES = 5  # first calls timed (at sizes that compiled nothing); the column is their median
FIRST_CALL_TARGET_US = 1000.0


@dataclass
class HostCase:
    key: str  # the op, "+bwd" for fwd+bwd: "layer_norm+bwd"
    op: str  # row label, e.g. "layer_norm(x, (1024,), w, b)"
    make_inputs: Callable[[bool, int], tuple]  # fresh CUDA tensors (requires_grad, rows)
    specgen: Callable
    eager: Callable

    @property
    def kind(self) -> str:
        return "fwd+bwd" if self.key.endswith("+bwd") else "fwd"


@dataclass
class HostRow:
    case: HostCase
    inputs: str = ""
    us: dict[str, list[float]] = field(default_factory=dict)  # host us per call, one per round
    wall: dict[str, list[float]] = field(default_factory=dict)  # the same up to the final sync
    first_us: list[float] = field(default_factory=list)  # specgen's first calls at new shapes
    error: str = ""  # "ERROR: ..." when the case failed


def cases() -> list[HostCase]:
    import generated as g  # here, so that --help works where `generated` cannot be imported

    def inputs(*shapes):  # make_inputs: a function of requires_grad and the row count
        return lambda grad, rows=ROWS: tuple(
            torch.randn((rows, N) if s == x else s, device=DEVICE, dtype=DTYPE,
                        requires_grad=grad) for s in shapes)

    x, v = "rows x N", (N,)     # x: the inputs of `rows` rows
    # op -> (label, make_inputs, specgen, eager); eager is the op's `reference` (generated/<op>.py)
    ops = {
        "add": ("add(x, y)", inputs(x, x), g.add, torch.add),
        "gelu": ("gelu(x)", inputs(x), g.gelu, F.gelu),
        "softmax": ("softmax(x, -1)", inputs(x), lambda x: g.softmax(x, -1),
                    lambda x: torch.softmax(x, -1)),
        "layer_norm": (f"layer_norm(x, ({N},), w, b)", inputs(x, v, v),
                       lambda x, w, b: g.layer_norm(x, (N,), w, b),
                       lambda x, w, b: F.layer_norm(x, (N,), w, b)),
        "rms_norm": (f"rms_norm(x, ({N},), w)", inputs(x, v), lambda x, w: g.rms_norm(x, (N,), w),
                     lambda x, w: F.rms_norm(x, (N,), w)),
        "sum": ("sum(x, -1)", inputs(x), lambda x: g.sum(x, -1), lambda x: torch.sum(x, -1)),
        "mm": ("mm(a, b)", inputs(x, (N, N)), g.mm, torch.mm),
        # no target check by default (a bad target's row is NaN; runtime.validating() checks)
        "cross_entropy": ("cross_entropy(logits, target)",
                          lambda grad, rows=ROWS: (*inputs(x)(grad, rows),
                                                   torch.randint(0, N, (rows,), device=DEVICE)),
                          g.cross_entropy, F.cross_entropy),
        "geglu": ("geglu(a, b)", inputs(x, x), g.geglu,
                  lambda a, b: F.gelu(a, approximate="tanh") * b),
    }
    return [HostCase(key, *ops[key.removesuffix("+bwd")]) for key in KEYS]


def bind(fn: Callable, inputs: tuple, training: bool,
         like: torch.Tensor | None = None) -> Callable[[], object]:
    """A call of ``fn`` with no arguments; ``training``: the forward and every input's gradient
    (shaped as ``like``, else as a call's output)."""
    if not training:
        return lambda: fn(*inputs)
    wrt = tuple(t for t in inputs if t.requires_grad)
    grad = torch.randn_like(fn(*inputs) if like is None else like)  # 0-dim for a loss
    # autograd.grad rather than backward(): no .grad accumulation kernels inside the loop
    return lambda: torch.autograd.grad(fn(*inputs), wrt, grad)


def time_calls(fn: Callable[[], object], calls: int = CALLS) -> tuple[float, float]:
    """Host us per call (the loop alone) and wall us per call (up to the final synchronize).

    Nothing in the loop synchronizes, so the host runs ahead of the device. At these sizes a
    call's kernels take less time than its host work, so the queue never fills and the loop
    measures the host; if the device were the bottleneck, wall would clearly exceed host (and a
    full launch queue would turn host time into device time), so the log prints both.
    """
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    host = time.perf_counter() - start
    torch.cuda.synchronize()
    return host / calls * 1e6, (time.perf_counter() - start) / calls * 1e6


def run_case(case: HostCase) -> HostRow:
    row = HostRow(case)
    try:
        inputs = case.make_inputs(case.kind == "fwd+bwd")
        row.inputs = ", ".join("x".join(map(str, t.shape)) for t in inputs)
        fns = {impl: bind(getattr(case, impl), inputs, case.kind == "fwd+bwd") for impl in IMPLS}
        for fn in fns.values():
            time_calls(fn, WARMUP)
        for _ in range(ROUNDS):
            for impl, fn in fns.items():
                host, wall = time_calls(fn)
                row.us.setdefault(impl, []).append(host)
                row.wall.setdefault(impl, []).append(wall)
    except Exception as exc:  # recorded in the row; the other cases still run
        row.error = "ERROR: " + harness.describe(exc)
        traceback.print_exc()
    try:
        row.first_us = first_calls(case)
    except Exception:  # the first-call cell stays "-"; the timings above stand
        traceback.print_exc()
    # every round, and the wall time beside the host time (see time_calls)
    print(f"[host] {case.key}: " + "; ".join(
        f"{impl} {statistics.median(us):.1f} us (rounds {', '.join(f'{t:.1f}' for t in us)}; "
        f"wall {statistics.median(row.wall[impl]):.1f})" for impl, us in row.us.items()),
        f"; first calls {', '.join(f'{t:.0f}' for t in row.first_us)} us" if row.first_us
        else "", row.error, flush=True)
    return row


def _print_profile(profiler: cProfile.Profile, top: int = 30) -> None:
    """The functions of most own time, in microseconds (pstats prints milliseconds: a first call
    spreads its time over hundreds of calls of a few microseconds)."""
    stats = pstats.Stats(profiler).stats
    rows = sorted(stats.items(), key=lambda item: -item[1][2])[:top]
    print(f"{'own us':>8} {'cum us':>8} {'calls':>6}  function")
    for (path, line, name), (_, calls, own, cumulative, _) in rows:
        print(f"{own * 1e6:8.0f} {cumulative * 1e6:8.0f} {calls:6d}  {path}:{line}({name})")


def first_calls(case: HostCase, profile: bool = False) -> list[float]:
    """specgen's first calls at shapes it has not seen, each up to a synchronize, in
    microseconds: at the first FIRST_SAMPLES of FIRST_ROWS where Triton produced no kernel binary
    (a config another size takes may need one; such a size is passed over). ``profile``: the
    first such call only, with its cProfile and eager's time for the same call printed."""
    produced = []
    hook = triton.knobs.runtime.jit_cache_hook
    # (returning None, the hook lets every compilation go on)
    triton.knobs.runtime.jit_cache_hook = lambda *args, **kwargs: produced.append(1)
    training = case.kind == "fwd+bwd"
    took_us = []
    try:
        for rows in FIRST_ROWS[case.kind]:
            inputs = case.make_inputs(training, rows)
            # the gradient's shape from eager (a specgen call would be the first)
            like = case.eager(*inputs) if training else None
            call = bind(case.specgen, inputs, training, like=like)
            produced.clear()
            profiler = cProfile.Profile() if profile else contextlib.nullcontext()
            with profiler:
                took, host = _timed_once(call)
            if produced:
                continue
            if profile:
                eager, _ = _timed_once(bind(case.eager, inputs, training, like=like))
                print(f"first call at {rows} rows: {took:.0f} us, {host:.0f} before the "
                      f"synchronize (profiled); eager's {eager:.0f} us")
                _print_profile(profiler)
                return [took]
            took_us.append(took)
            if len(took_us) == FIRST_SAMPLES:
                break
        return took_us
    finally:
        triton.knobs.runtime.jit_cache_hook = hook


def _timed_once(call: Callable[[], object]) -> tuple[float, float]:
    """One call's microseconds up to a synchronize, and up to its return (the host's part)."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    call()
    host = time.perf_counter()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1e6, (host - start) * 1e6


COLUMNS = ("op", "kind", "inputs", "specgen us", "eager us", "specgen / eager", "target",
           "first call us")


def table(rows: list[HostRow]) -> str:
    lines = []
    for row in rows:
        us = {impl: statistics.median(t) for impl, t in row.us.items() if len(t) == ROUNDS}
        ratio, target = "-", row.error
        if not row.error:
            limit = TARGETS[row.case.kind]
            ratio = f"{us['specgen'] / us['eager']:.3f}"  # 1.296 must not read as 1.30
            target = f"{'pass' if us['specgen'] <= limit * us['eager'] else 'miss'} (<= {limit}x)"
        first = "-"
        if row.first_us:
            median = statistics.median(row.first_us)
            first = (f"{median:.0f} ({min(row.first_us):.0f}-{max(row.first_us):.0f}) of "
                     f"{len(row.first_us)} ({'pass' if median < FIRST_CALL_TARGET_US else 'miss'})")
        lines.append([f"`{row.case.op}`", row.case.kind, row.inputs or "-", *(
            f"{us[i]:.1f} ({min(row.us[i]):.1f}-{max(row.us[i]):.1f})" if i in us else "-"
            for i in IMPLS), ratio, target, first])
    return harness.markdown_table(COLUMNS, lines)


def section(run: harness.Run) -> str:
    """The `## host` section of bench/RESULTS.md (bench/command.py's SECTIONS)."""
    rows = [run_case(case) for case in cases()]
    return (f"## host\n\nMeasured {run.date} on {run.device} by `{run.command}`. Host time in us "
            f"per call on bf16 inputs: {CALLS} calls timed by `time.perf_counter` around a loop "
            f"with no synchronization inside (synchronized before and after), after {WARMUP} warm-up "
            f"calls; median of {ROUNDS} interleaved rounds (specgen, eager, ...), min-max of the "
            "rounds in parentheses. fwd+bwd is the forward and `torch.autograd.grad` of every "
            "floating input. cross_entropy runs without its target check (the default: a bad "
            "target's row is NaN; `runtime.validating()` checks, with a sync). Targets: specgen "
            f"/ eager <= {TARGETS['fwd']} for fwd, <= {TARGETS['fwd+bwd']} for fwd+bwd; the "
            "run's log has every round and the wall time to the final synchronize. First call: "
            "specgen's first call at a row count it has not seen (new launch plans, config "
            "lookups, no replay) up to a synchronize, at each of up to "
            f"{FIRST_SAMPLES} such row counts where Triton produced no kernel binary "
            "(compilation excluded): their median, min-max and count (target: median < "
            f"{FIRST_CALL_TARGET_US:.0f} us)."
            f"\n\n{table(rows)}\n")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python3 -m bench.host", description=__doc__.splitlines()[0])
    parser.add_argument("--cprofile", choices=KEYS, metavar="CASE",
                        help=f"cProfile {CALLS} calls of one case's specgen side instead of timing "
                             f"(one of: {', '.join(KEYS)}); cProfile inflates Python frames")
    parser.add_argument("--sort", default="tottime", choices=("tottime", "cumulative"),
                        help="cProfile order (default: %(default)s)")
    parser.add_argument("--first", action="store_true",
                        help="with --cprofile: profile the case's first call at a new shape "
                             "(after one call at ROWS), by cumulative time")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench needs a CUDA GPU")
    if args.cprofile and args.first:
        case = next(c for c in cases() if c.key == args.cprofile)
        time_calls(bind(case.specgen, case.make_inputs(case.kind == "fwd+bwd"),
                        case.kind == "fwd+bwd"), WARMUP)
        first_calls(case, profile=True)
        return
    if not args.cprofile:
        print(table([run_case(case) for case in cases()]))
        return
    case = next(c for c in cases() if c.key == args.cprofile)
    fn = bind(case.specgen, case.make_inputs(case.kind == "fwd+bwd"), case.kind == "fwd+bwd")
    time_calls(fn, WARMUP)
    with cProfile.Profile() as profiler:
        time_calls(fn)
    pstats.Stats(profiler).sort_stats(args.sort).print_stats(30)


if __name__ == "__main__":
    main()

"""Timing and reporting shared by all benchmark families.

Each case is timed three ways in the same process: the specgen op, plain eager PyTorch and
``torch.compile`` of the eager function. Throughput is *effective*: it counts the bytes an ideal
kernel must move (each input read once, the output written once), so an implementation that
spills intermediates (eager ``gelu(a) * b``) is charged for its extra traffic through its time.
"""

from __future__ import annotations

import itertools
import math
import platform
import re
import statistics
import traceback
from dataclasses import dataclass, field
from datetime import datetime
from typing import Callable

import torch
import triton
import triton.testing

IMPLS = ("specgen", "eager", "compile")

# Relative-error bound (in float64 norms) for a specgen output to PASS against eager.
TOLERANCE = {torch.bfloat16: 2e-2, torch.float16: 1e-2, torch.float32: 1e-5}

DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}

# A case whose working set is below this gets several input sets to cycle through, so that
# repeated calls cannot be served from L2 (50 MB on H100, 60 MB on H200).
ROTATION_BYTES = 200 * 10**6

COPY_BYTES = 2**30

# Each impl is timed in this many interleaved rounds (specgen, eager, compile, specgen, ...) and
# reported as the median of its rounds: a transient state of the machine (clocks, a busy host)
# then moves one round of every impl rather than one impl's whole number. Single rounds of the
# short row-wise cases moved 2x between runs (8x262144: ours 12-30 us, compile 16-100 us).
ROUNDS = 3


@dataclass
class Case:
    """One benchmark row: an op at one shape and dtype, with its specgen and eager versions."""

    family: str
    op: str  # label, e.g. "geglu = gelu_tanh(a)*b"
    shape: str  # label, e.g. "8192x8192"
    dtype: torch.dtype
    make_inputs: Callable[[], tuple]  # fresh random CUDA tensors on every call
    specgen: Callable
    eager: Callable
    bytes_moved: int  # each input read once + output written once
    flops: int | None = None  # when set, the case is reported in TFLOP/s rather than GB/s


def ours():
    """The `generated` package, imported at the first call of a row's specgen function: `bench
    --help` works before a build, and a missing op fails only the specgen column of its rows."""
    import generated

    return generated


def gradient_of(fn: Callable) -> Callable:
    """A training step of ``fn`` as a case's function: its forward and the gradients of every
    input, given the output's gradient (the first argument); returns the first input's
    gradient, which the check compares (the others are computed too)."""
    def run(grad_out, *inputs):
        return torch.autograd.grad(fn(*inputs), inputs, grad_out)[0]
    return run

@dataclass
class Row:
    """What was measured for one case; a missing entry in ``ms`` means that impl failed."""

    case: Case
    ms: dict[str, float] = field(default_factory=dict)      # the median of the rounds
    rounds: dict[str, list[float]] = field(default_factory=dict)
    check: str = ""
    errors: list[str] = field(default_factory=list)


@dataclass
class Run:
    """Facts about this invocation, shared by the report header and the sections it writes."""

    command: str
    copy_gbps: float
    date: str = field(default_factory=lambda: datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z"))
    device: str = field(default_factory=lambda: torch.cuda.get_device_name())


def bench_ms(fn: Callable[[], object]) -> float:
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def measure_copy_bandwidth() -> float:
    """GB/s of a 1 GiB float32 device-to-device copy, bytes read + written: the memory ceiling."""
    src = torch.randn(COPY_BYTES // 4, device="cuda")
    dst = torch.empty_like(src)
    ms = bench_ms(lambda: dst.copy_(src))
    src = dst = None  # free the 2 GiB before the cases run
    torch.cuda.empty_cache()
    return 2 * COPY_BYTES / (ms * 1e6)


# --- running cases ---------------------------------------------------------------------------


def run_cases(cases: list[Case]) -> list[Row]:
    rows = []
    for case in cases:
        rows.append(run_case(case))
        print(progress_line(rows[-1]), flush=True)
    return rows


def run_case(case: Case) -> Row:
    """Checks and times one case. A failure is recorded in the row, never raised."""
    row = Row(case)
    try:
        input_sets = [case.make_inputs() for _ in range(input_set_count(case))]
        impls = {
            "specgen": case.specgen,
            "eager": case.eager,
            "compile": torch.compile(case.eager, dynamic=False),
        }
        ready = {}
        for impl, fn in impls.items():
            # Each impl is guarded on its own so that a missing specgen op still leaves baselines.
            try:
                if impl == "specgen":
                    row.check = check(fn, case.eager, input_sets[0], case.dtype)
                warm_up(fn, input_sets)
                ready[impl] = fn
            except Exception as exc:
                failed(row, impl, exc)
        for _ in range(ROUNDS):
            for impl in list(ready):
                try:
                    row.rounds.setdefault(impl, []).append(time_rotating(ready[impl], input_sets))
                except Exception as exc:
                    failed(row, impl, exc)
                    del ready[impl]
                    row.rounds.pop(impl, None)
        row.ms = {impl: statistics.median(times) for impl, times in row.rounds.items()}
    except Exception as exc:  # making inputs failed: nothing to time
        row.errors.append(describe(exc))
        traceback.print_exc()
    finally:
        input_sets = impls = None
        # Each case compiles a fresh function; resetting keeps dynamo under its recompile limit.
        torch._dynamo.reset()
        torch.cuda.empty_cache()
    return row


def failed(row: Row, impl: str, exc: Exception) -> None:
    row.errors.append(f"{impl}: {describe(exc)}")
    traceback.print_exc()


def input_set_count(case: Case) -> int:
    # do_bench also flushes L2 before each timed call; rotating makes the numbers independent of
    # that flush. Only small cases get extra sets, so their memory stays near ROTATION_BYTES.
    return max(1, math.ceil(ROTATION_BYTES / case.bytes_moved))


def warm_up(fn: Callable, input_sets: list[tuple]) -> None:
    """One call per input set: compiles (torch.compile, triton) and checks every set's guards."""
    for inputs in input_sets:
        fn(*inputs)
    torch.cuda.synchronize()


def time_rotating(fn: Callable, input_sets: list[tuple]) -> float:
    """Median ms of ``fn`` called on each input set in turn."""
    cycle = itertools.cycle(input_sets)
    return bench_ms(lambda: fn(*next(cycle)))


def check(specgen: Callable, eager: Callable, inputs: tuple, dtype: torch.dtype) -> str:
    out, ref = specgen(*inputs), eager(*inputs)
    if out.shape != ref.shape or out.dtype != ref.dtype:
        return f"FAIL ({out.dtype} {tuple(out.shape)}, expected {ref.dtype} {tuple(ref.shape)})"
    error = relative_error(out, ref)
    verdict = "PASS" if error < TOLERANCE[dtype] else "FAIL"  # NaN fails too
    return f"{verdict} ({error:.1e})"


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.double(), ref.double()
    return (torch.linalg.vector_norm(out - ref) / torch.linalg.vector_norm(ref)).item()


def describe(exc: Exception) -> str:
    """An exception as one table-friendly line (the full traceback goes to stderr)."""
    text = " ".join(f"{type(exc).__name__}: {exc}".split())
    return text if len(text) <= 300 else text[:297] + "..."


def progress_line(row: Row) -> str:
    c = row.case
    times = ", ".join(f"{impl} {row.ms[impl]:.3f} ms "
                      f"({', '.join(f'{t:.3f}' for t in row.rounds[impl])})"
                      for impl in IMPLS if impl in row.ms)
    return f"[{c.family}] {c.op} {c.shape} {dtype_name(c.dtype)}: {times or 'no timings'}; {check_cell(row)}"


# --- report ----------------------------------------------------------------------------------

COLUMNS = ("op", "shape", "dtype", "specgen ms", "eager ms", "compile ms", "specgen GB/s",
           "eager GB/s", "compile GB/s", "specgen % copy", "vs compile (x)", "check")


def report_header(run: Run) -> str:
    return "\n".join([
        "# specgen benchmarks",
        "",
        f"- Device: {run.device}",
        f"- torch {torch.__version__}, triton {triton.__version__}, Python {platform.python_version()}, "
        f"CUDA {torch.version.cuda}",
        f"- Date: {run.date}",
        f"- Copy bandwidth: {run.copy_gbps:.0f} GB/s (1 GiB fp32 `dst.copy_(src)`, bytes read + written)",
        f"- Command: `{run.command}`",
        "",
        f"Times are the median of {ROUNDS} interleaved rounds (specgen, eager, compile, then "
        "again) of do_bench medians; the run's log lists every round. GB/s is effective: each "
        "input read once plus the output written once, over the time. For cases with a FLOP "
        "count the throughput columns show TFLOP/s. `% copy` is specgen GB/s over the copy "
        "bandwidth; `vs compile` is compile ms / specgen ms (above 1: specgen is faster). "
        "`check` is ‖specgen − eager‖ / ‖eager‖ in float64.",
        "",
    ])


def format_section(family: str, rows: list[Row], run: Run) -> str:
    # Sections outlive the header when other families are rerun, so each says where it came from.
    provenance = (f"Measured {run.date} on {run.device} (copy {run.copy_gbps:.0f} GB/s) "
                  f"by `{run.command}`.")
    table = markdown_table(COLUMNS, [table_cells(row, run.copy_gbps) for row in rows])
    return f"## {family}\n\n{provenance}\n\n{table}\n"


def table_cells(row: Row, copy_gbps: float) -> list[str]:
    c, ms = row.case, row.ms
    throughput = {impl: throughput_cell(c, ms[impl]) if impl in ms else "-" for impl in IMPLS}
    copy_share = "-"
    if "specgen" in ms and c.flops is None:
        # one decimal and three: a cell a target reads (85% of copy, 1x compile) must not round
        # across it (84.7% is not 85%, 0.996 not 1.00)
        copy_share = f"{c.bytes_moved / (ms['specgen'] * 1e6) / copy_gbps:.1%}"
    speedup = f"{ms['compile'] / ms['specgen']:.3f}" if {"specgen", "compile"} <= ms.keys() else "-"
    return [
        f"`{c.op}`", c.shape, dtype_name(c.dtype),
        *(f"{ms[impl]:.3f}" if impl in ms else "-" for impl in IMPLS),
        *throughput.values(),
        copy_share, speedup, check_cell(row),
    ]


def throughput_cell(case: Case, ms: float) -> str:
    if case.flops is not None:
        return f"{case.flops / (ms * 1e9):.1f} TFLOP/s"
    return f"{case.bytes_moved / (ms * 1e6):.0f}"


def check_cell(row: Row) -> str:
    parts = [row.check] if row.check else []
    parts += [f"ERROR: {error}" for error in row.errors]
    return "; ".join(parts) or "-"


def dtype_name(dtype: torch.dtype) -> str:
    return DTYPE_NAMES.get(dtype, str(dtype).removeprefix("torch."))


def markdown_table(header: tuple[str, ...], rows: list[list[str]]) -> str:
    """A GitHub table padded to aligned columns, so it also reads well on a terminal."""
    rows = [[cell.replace("|", "\\|") for cell in row] for row in rows]
    widths = [max(len(cell) for cell in column) for column in zip(header, *rows)]

    def line(cells):
        return "| " + " | ".join(cell.ljust(width) for cell, width in zip(cells, widths)) + " |"

    return "\n".join([line(header), line(["-" * w for w in widths]), *map(line, rows)])


def merge_report(old: str, header: str, sections: dict[str, str], keep_header: bool = False) -> str:
    """``old`` with its header replaced (kept, with ``keep_header``, where ``old`` has one: a run
    of some families, whose sections say where they came from) and the given ``## family``
    sections replaced or appended.

    Sections of families not run this time are kept as they were, in their original order.
    """
    parts = re.split(r"(?m)^(?=## )", old)
    merged = {}
    for part in parts[1:]:  # [0] is the old header
        merged[part.split("\n", 1)[0].removeprefix("## ").strip()] = part
    merged.update(sections)
    if keep_header and parts[0].strip():
        header = parts[0]
    return "\n".join([header.strip() + "\n", *(part.strip() + "\n" for part in merged.values())])

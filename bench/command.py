"""What a benchmark run takes and how it runs: shared by ``python3 -m bench`` and ``specgen bench``.

``select`` decides, before any GPU work, which case rows and which sections a run takes (and
refuses an unknown op or family with the names it knows); ``run`` times them on the current GPU
and merges the sections into the report.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from bench import harness, host, quant
from specgen.families import FAMILIES as KERNEL_FAMILIES
from specgen.families.contract import resolve

# family -> cases(quick) -> list[harness.Case], from each kernel family's `bench` (a family with
# a section of its own has none: attention). Each gets its own `## family` section.
FAMILIES = {name: family.bench for name, family in KERNEL_FAMILIES.items() if family.bench}
# Sections that are not harness.Case rows timed by do_bench: name -> section(run) -> markdown.
# host: host time per call on tiny inputs against eager (bench/host.py); --quick leaves it as is;
# quantized: the matmul family's quantized ops against bf16 F.linear, torch's int4 and cuBLAS
# int8 kernels (bench/quant.py); then each kernel family's own (`bench_section`: attention
# against SDPA's backends).
SECTIONS = {"host": host.section, "quantized": quant.section,
            **{name: resolve(family.bench_section) for name, family in KERNEL_FAMILIES.items()
               if family.bench_section}}


# what `specgen tune` searches for a section: name -> cases(quick)
TUNE_CASES = {"quantized": quant.tune_cases,
              **{name: resolve(family.tune_cases) for name, family in KERNEL_FAMILIES.items()
                 if family.tune_cases}}


@dataclass(frozen=True)
class Selection:
    """The case rows of each harness family and the sections, in the order they run."""

    cases: dict[str, list[harness.Case]]
    sections: tuple[str, ...]

    @property
    def names(self) -> tuple[str, ...]:
        return (*self.cases, *self.sections)


def case_op(case: harness.Case) -> str:
    """The op a case times: its label's first word ("sum(x, -1)" times sum)."""
    return re.match(r"\w+", case.op).group(0)


def select(only: tuple[str, ...] = (), ops: tuple[str, ...] = (), quick: bool = False,
           op_families: dict[str, str] | None = None) -> Selection:
    """The run's rows: every family's (or ``only``'s), narrowed to ``ops`` where given. A section
    runs whole: named by ``only``, or holding one of ``ops`` (its family is the op's,
    ``op_families``: op -> family, the generated registry's by default; or its tuning cases time
    the op, as the quantized section's do the matmul family's). ValueError names what is unknown
    and what is known."""
    known = [*FAMILIES, *SECTIONS]
    unknown = [name for name in only if name not in known]
    if unknown:
        raise ValueError(f"unknown family {', '.join(unknown)}; the families are: "
                         f"{', '.join(known)}")
    if op_families is None:
        import generated

        op_families = {name: info.family for name, info in generated.REGISTRY.items()}
    unknown = [op for op in ops if op not in op_families]
    if unknown:
        raise ValueError(f"unknown op {', '.join(unknown)}; the ops are: "
                         f"{', '.join(sorted(op_families))}")
    names = list(dict.fromkeys(only or known))     # dedupe, keep order
    cases = {}
    for name in (n for n in names if n in FAMILIES):
        rows = [case for case in FAMILIES[name](quick) if not ops or case_op(case) in ops]
        if rows:
            cases[name] = rows
    sections = tuple(name for name in names if name in SECTIONS
                     and (not ops or name in only or _section_times(name, ops, op_families)))
    if ops and not cases and not sections:
        raise ValueError(f"no benchmark case times {', '.join(ops)}"
                         + (f" in {', '.join(only)}" if only else ""))
    return Selection(cases, sections)


def _section_times(name: str, ops: tuple[str, ...], op_families: dict[str, str]) -> bool:
    """Whether section ``name`` times one of ``ops``: an op of the family it is named after, or
    an op of its tuning cases (the quantized section's ops are the matmul family's)."""
    if any(op_families[op] == name for op in ops):
        return True
    # the quick cases name the same ops; building them makes no tensors (make_inputs does)
    return name in TUNE_CASES and any(case_op(case) in ops for case in TUNE_CASES[name](True))


# families whose every tensor argument is a floating tensor: `--shapes NAME=SHAPE,...` draws them
DRAWN_FAMILIES = ("pointwise", "rowwise", "reduce", "matmul")


def argument_cases(ops: tuple[str, ...], shapes: tuple[str, ...], dtype: torch.dtype,
                   registry=None, device: str = "cuda") -> list[harness.Case]:
    """`specgen tune OP --shapes "x=4096x1024,normalized_shape=1024"`: each op of ``ops`` at each
    of ``shapes``, a call's arguments by name (a tensor's shape as ``AxB``, a shape's likewise,
    an int, a float, ``true``/``false``, a choice or a dtype by name; the others at their
    defaults), its tensors drawn as the property suite draws them, checked against the op's
    reference. ValueError names the op and the argument at fault."""
    if registry is None:
        import generated

        registry = generated.REGISTRY
    if not ops:
        raise ValueError("--shapes NAME=SHAPE,... needs the ops it is for (specgen tune OP ...)")
    cases = []
    for op in ops:
        info = registry.get(op)
        if info is None:
            raise ValueError(f"unknown op {op}; the ops are: {', '.join(sorted(registry))}")
        if info.family not in DRAWN_FAMILIES:
            raise ValueError(f"{op}: --shapes NAME=SHAPE draws the floating tensors of "
                             f"{', '.join(DRAWN_FAMILIES)} ops; pick a benchmark shape label "
                             f"for a {info.family} op")
        for text in shapes:
            cases.append(_argument_case(info, text, dtype, device))
    return cases


def _argument_case(info, text: str, dtype: torch.dtype, device: str) -> harness.Case:
    given = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, equals, value = item.partition("=")
        if not equals:
            raise ValueError(f"{info.name}: '{item}' in --shapes is not NAME=VALUE (sizes are "
                             f"written 4096x1024)")
        if name.strip() in given:
            raise ValueError(f"{info.name}: --shapes gives '{name.strip()}' twice")
        given[name.strip()] = value.strip()
    args = {arg.name: arg for arg in info.args}
    unknown = [name for name in given if name not in args]
    if unknown:
        raise ValueError(f"{info.name}: no argument {', '.join(unknown)}; it takes "
                         f"{', '.join(args)}")
    tensors, scalars = {}, {}
    for arg in info.args:
        if arg.name not in given:
            if arg.default is None and not arg.optional:
                raise ValueError(f"{info.name}: --shapes gives no '{arg.name}' ({arg.kind}), "
                                 f"which has no default")
            continue
        value = given[arg.name]
        try:
            if arg.kind == "tensor":
                tensors[arg.name] = (arg, _sizes(value))
            else:
                scalars[arg.name] = _scalar(arg.kind, value)
        except ValueError:
            raise ValueError(f"{info.name}: '{arg.name}={value}' is not "
                             f"{_KIND_NAMES.get(arg.kind, arg.kind)}") from None

    def make_inputs():
        return tuple(torch.empty(shape, device=device, dtype=dtype).uniform_(arg.low, arg.high)
                     for arg, shape in tensors.values())

    names = list(tensors)
    try:   # the op's own checks, on meta tensors: no GPU work, nothing launched
        info.function(**{name: torch.empty(shape, device="meta", dtype=dtype)
                         for name, (_, shape) in tensors.items()}, **scalars)
    except (TypeError, ValueError, RuntimeError, NotImplementedError) as err:
        raise ValueError(f"{info.name} at --shapes \"{text}\": {err}") from None
    elements = sum(math.prod(shape) for _, shape in tensors.values())
    return harness.Case(
        family=info.family, op=info.name,
        shape=", ".join(f"{n}={'x'.join(map(str, shape))}" for n, (_, shape) in tensors.items()),
        dtype=dtype, make_inputs=make_inputs,
        specgen=lambda *t: info.function(**dict(zip(names, t)), **scalars),
        eager=lambda *t: info.reference(**dict(zip(names, t)), **scalars),
        bytes_moved=dtype.itemsize * elements)


_KIND_NAMES = {"tensor": "a tensor's sizes (4096x1024)", "shape": "a shape (1024, or 4x1024)",
               "int": "an int", "dim": "a dim (an int)", "dims": "dims (-1, or 0x1)",
               "float": "a float", "bool": "true or false", "dtype": "a torch dtype (float32)"}


def _sizes(value: str) -> tuple[int, ...]:
    sizes = _ints(value)
    if any(n < 0 for n in sizes):
        raise ValueError(value)
    return sizes


def _ints(value: str) -> tuple[int, ...]:
    # ints joined by x; the sign of each is its own ("-1x-2")
    return tuple(int(n) for n in value.split("x")) if value else ()


def _scalar(kind: str, value: str):
    if kind == "shape":
        return _ints(value)
    if kind in ("int", "dim"):
        return int(value)
    if kind == "dims":
        dims = _ints(value)
        return dims[0] if len(dims) == 1 else dims
    if kind == "float":
        return float(value)
    if kind == "bool":
        if value.lower() not in ("true", "false"):
            raise ValueError(value)
        return value.lower() == "true"
    if kind == "dtype":
        dtype = getattr(torch, value, None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(value)
        return dtype
    return value    # a choice: the op checks it before any launch


def tune_cases(selection: Selection, ops: tuple[str, ...] = (), quick: bool = False
               ) -> list[harness.Case]:
    """The cases `specgen tune` searches for a selection: its rows, and for its sections the
    families' tuning cases (narrowed to ``ops`` where given)."""
    cases = [case for rows in selection.cases.values() for case in rows]
    for name in selection.sections:
        if name in TUNE_CASES:
            cases += [case for case in TUNE_CASES[name](quick) if not ops or case_op(case) in ops]
    return cases


def run(selection: Selection, out: Path | None, command: str) -> str:
    """Times the selection on the current GPU and merges its sections into ``out`` (the others
    kept, and the report's header where this run is not the whole bench; None: written
    nowhere). Returns them."""
    run = harness.Run(command=command, copy_gbps=harness.measure_copy_bandwidth())
    print(f"copy bandwidth: {run.copy_gbps:.0f} GB/s", flush=True)
    sections = {}
    for name in selection.names:
        if name in SECTIONS:
            sections[name] = SECTIONS[name](run)
        else:
            sections[name] = harness.format_section(name, harness.run_cases(selection.cases[name]),
                                                    run)
    if out is not None:
        whole = set(selection.names) == {*FAMILIES, *SECTIONS}
        old = out.read_text() if out.exists() else ""
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(harness.merge_report(old, harness.report_header(run), sections,
                                            keep_header=not whole))
        print(f"\nwrote {out}\n")
    return "\n".join(sections.values())

"""What a benchmark run takes and how it runs: shared by ``python3 -m bench`` and ``specgen bench``.

``select`` decides, before any GPU work, which case rows and which sections a run takes (and
refuses an unknown op or family with the names it knows); ``run`` times them on the current GPU
and merges the sections into the report.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

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


# what `specgen tune` searches for a family whose benchmark is a section: name -> cases(quick)
TUNE_CASES = {name: resolve(family.tune_cases) for name, family in KERNEL_FAMILIES.items()
              if family.tune_cases}


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
    ``op_families``: op -> family, the generated registry's by default). ValueError names what
    is unknown and what is known."""
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
                     and (not ops or name in only or any(op_families[op] == name for op in ops)))
    if ops and not cases and not sections:
        raise ValueError(f"no benchmark case times {', '.join(ops)}"
                         + (f" in {', '.join(only)}" if only else ""))
    return Selection(cases, sections)


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

"""What a kernel family declares to the generator, the test suite and the benchmarks.

Each family module ends with ``FAMILY = Family(...)``; ``specgen.families`` finds them by importing
the modules of its package, so a new family is registered by its module alone.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Callable

# the names the public function that runtime/op.py compiles for every op binds besides its
# parameters: an argument of one of these names would be overwritten (tests/test_runtime.py
# checks the compiled source against it). They start with "_", which no spec name does: torch's
# attention takes an argument named `key`
PUBLIC_FUNCTION_NAMES = frozenset({"_key", "_replay"})


@dataclass(frozen=True)
class Family:
    """A kernel family: its spec stage (parsing, derived ops), planning, template, runtime, and
    its property tests, opcheck samples and benchmark cases."""

    name: str
    parse_body: Callable          # (top Table, args, op name) -> the family's frozen body
    body_names: Callable          # body -> ((name, key path), ...): the names the body declares
    plan: Callable                # OpSpec -> the frozen plan its template reads
    scaffold: Callable            # op name -> a starting spec's TOML (`specgen new`)
    # names its generated code binds for itself, which a spec may not declare (an entry ending
    # in "_" stands for its numbered forms), and prefixes of such names
    generated_names: frozenset[str]
    generated_prefixes: tuple[str, ...] = ()
    # the suffixes its code derives names with from a tensor's or output's name (x -> x_ptr,
    # x_stride_m): a declared name extending another by one of them collides ((): by any)
    derived_suffixes: tuple[str, ...] = ()
    # operators its modules register beside specgen::<op>, as <op><suffix>
    operator_suffixes: tuple[str, ...] = ()
    # argument forms it opts into, of "dtype argument", "shape argument", "optional scalar" (the
    # other families' templates have no code for them: parse.py refuses them there)
    takes: frozenset[str] = frozenset()
    reference_names: tuple[str, ...] = ()   # names its references may use besides the arguments
    # (body, args) -> ((argument, what would read it), ...): the arguments its kernels' expressions
    # must read and do not (an op would take and ignore them); None: it checks none
    unread_args: Callable | None = None
    # which spec key sets its ops' output layout, for the property check's message when it
    # differs from torch's ("": the layout follows from the inputs, as torch's)
    layout_hint: str = ""
    # "module:function" making the ops a spec derives (OpSpec -> tuple of OpSpec: a row-wise
    # backward), called at the spec stage, before planning ("": none)
    derive: str = ""
    # its property tests and benchmark rows, functions of its family module that tests and bench
    # call (they import hypothesis, specgen.testing and bench inside, which the generator needs
    # not): draw_case(draw, OpInfo) -> testing.Case, one property-test call of an op, with
    # hypothesis's draw; samples(OpInfo, testing.samples.Make) -> {operator: [args, ...]}, opcheck
    # calls of every operator an op registers; bench(quick) -> [bench.harness.Case], the family's
    # rows of the benchmark (None: another family's rows or its own section hold its ops)
    draw_case: Callable = field(kw_only=True)
    samples: Callable = field(kw_only=True)
    bench: Callable | None = None
    # "module:function" of a benchmark section of its own (bench.harness.Run -> markdown), for a
    # family whose peers are not harness.Case's eager and compiled columns (attention: SDPA's
    # backends, FlexAttention)
    bench_section: str = ""
    # "module:function" of the cases `specgen tune` searches where the benchmark is such a
    # section (quick -> list of bench.harness.Case)
    tune_cases: str = ""

    @property
    def template(self) -> str:
        return f"{self.name}.py.jinja"


def resolve(path: str) -> Callable:
    """The function a "module:function" path names."""
    module, _, function = path.partition(":")
    return getattr(importlib.import_module(module), function)

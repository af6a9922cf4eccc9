"""Kernel families. Each has a module with ``parse_body``, ``body_names``, ``plan`` and
``scaffold``, the names its generated code binds for itself (``GENERATED_NAMES``,
``GENERATED_PREFIXES``: a spec may not declare them), and a template. Optional: the flags
``DTYPE_ARGS``, ``SHAPE_ARGS`` and ``OPTIONAL_SCALARS`` (the argument forms it takes; parse.py
refuses them elsewhere), ``REFERENCE_NAMES`` (names its reference may use besides the
arguments), ``OPERATOR_SUFFIXES`` (the operators it registers beside ``specgen::<op>``, as
``<op><suffix>``: build.py refuses an op name that takes one) and ``derived_ops``.

To add a family: write ``families/<name>.py`` (a body dataclass, its parser, a planner returning a
frozen plan the template reads) and ``templates/<name>.py.jinja``, then list it here
(tests/test_spec_errors.py checks the generated names against what the template binds).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

from specgen.families import cross_entropy, matmul, pointwise, reduce, rowwise


@dataclass(frozen=True)
class Family:
    name: str
    module: ModuleType

    @property
    def template(self) -> str:
        return f"{self.name}.py.jinja"


FAMILIES = {f.name: f for f in (Family("pointwise", pointwise), Family("reduce", reduce),
                                 Family("cross_entropy", cross_entropy), Family("matmul", matmul),
                                 Family("rowwise", rowwise))}

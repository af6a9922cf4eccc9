"""Kernel families. Each module of this package that declares ``FAMILY`` (a ``Family``, see
contract.py) is one: its body dataclass, parser, planner and scaffold, the names its generated
code binds for itself, its property-test calls, opcheck samples and benchmark rows; its template
is ``templates/<name>.py.jinja`` and its runtime module ``specgen/runtime/<name>.py``.

To add a family: write ``families/<name>.py`` ending in ``FAMILY = Family(...)``, its template,
its runtime module (a ``specgen.runtime.op.FamilyRuntime`` subclass as ``RUNTIME``) and specs; this
package finds the module (tests/test_spec_errors.py checks the generated names against what the
template binds). docs/families.md, "Adding a family".
"""

from __future__ import annotations

import importlib
import pkgutil

from specgen.families.contract import Family


def _discover() -> dict[str, Family]:
    found = {}
    for module_info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{__name__}.{module_info.name}")
        family = getattr(module, "FAMILY", None)
        if isinstance(family, Family):
            if family.name in found:
                raise ImportError(f"{module.__name__}: family '{family.name}' is declared by "
                                  f"{found[family.name].plan.__module__} too")
            found[family.name] = family
    return found


FAMILIES: dict[str, Family] = _discover()

__all__ = ["FAMILIES", "Family"]

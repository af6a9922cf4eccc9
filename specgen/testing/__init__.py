"""Hypothesis strategies and checks for property-testing generated ops against their references.

``CASES`` maps each family to a strategy of ``Case``s for one op (its ``Family.draw_case``);
``tests/test_ops.py`` draws from it for every op in ``generated.REGISTRY`` and checks each case
with ``check_case`` (``tests/test_autograd.py``: its gradients with ``check_grad``).
"""

from typing import Callable

from hypothesis import strategies as st

from specgen.families import FAMILIES
from specgen.runtime import OpInfo
from specgen.testing.check import check_case
from specgen.testing.core import (SPECIAL_SIZES, TOLERANCES, Case, Layout, Observe,
                                  assert_matches, broadcast_operand, device, draw_case, knobs, layouts, make_tensor, max_numel,
                                  reference64, scalar_value, shapes, sizes)
from specgen.testing.grad import PATHS, check_grad
from specgen.testing.profiles import use_profile

CASES: dict[str, Callable[[OpInfo], st.SearchStrategy[Case]]] = {
    name: st.composite(family.draw_case) for name, family in FAMILIES.items()}

__all__ = [
    "CASES", "Case", "Layout", "Observe", "SPECIAL_SIZES", "TOLERANCES", "assert_matches", "broadcast_operand",
    "check_case", "check_grad", "device", "draw_case", "knobs", "layouts", "make_tensor", "max_numel", "reference64",
    "PATHS", "scalar_value", "shapes", "sizes", "use_profile",
]

"""Every registered op against its torch reference in float64, over drawn shapes, layouts, dtypes.

Parametrized over ``generated.REGISTRY``: a new spec is tested here with no new test code.
"""

import pytest
from hypothesis import given
from hypothesis import strategies as st

import generated
from specgen import testing


@pytest.mark.parametrize("name", sorted(generated.REGISTRY))
@given(data=st.data())
def test_matches_reference(name, data):
    info = generated.REGISTRY[name]
    testing.check_case(info, testing.draw_case(data, info))

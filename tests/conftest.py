"""Hypothesis profiles for the two tiers; pick one with SPECGEN_PROFILE (default: by tier)."""

import os

import pytest
from hypothesis import HealthCheck, Phase, settings

from specgen.runtime import interpreting

_SLOW_OK = [HealthCheck.too_slow, HealthCheck.data_too_large]

# CPU tier: the interpreter runs every program in numpy, so few, small examples per op
settings.register_profile("ci", max_examples=25, deadline=None, suppress_health_check=_SLOW_OK,
                          print_blob=True)
# GPU tier: real compilation, many more examples
settings.register_profile("gpu", max_examples=50, deadline=None, suppress_health_check=_SLOW_OK,
                          print_blob=True)
# hunting a rare failure: many examples (SPECGEN_EXAMPLES), no shrinking, which on a GPU can
# outlast a device call; the failing example is reported as drawn
settings.register_profile("hunt", max_examples=int(os.environ.get("SPECGEN_EXAMPLES", "500")),
                          deadline=None, suppress_health_check=_SLOW_OK, print_blob=True,
                          phases=[Phase.explicit, Phase.reuse, Phase.generate])
# a quick look while editing
settings.register_profile("dev", max_examples=5, deadline=None, suppress_health_check=_SLOW_OK)

settings.load_profile(os.environ.get("SPECGEN_PROFILE", "ci" if interpreting() else "gpu"))


def pytest_collection_modifyitems(config, items):
    """GPU-marked tests need CUDA and real compilation; say so instead of failing."""
    import torch

    if torch.cuda.is_available() and not interpreting():
        return
    reason = "GPU tier: needs a CUDA device without TRITON_INTERPRET (see README, Tests)"
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(pytest.mark.skip(reason=reason))

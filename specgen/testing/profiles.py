"""Hypothesis profiles for property tests of generated ops, ours and an author's alike.

A drawn case runs every program of its kernels in numpy under the interpreter (a second or more),
and compiles new kernels on a GPU: hypothesis's default deadline (200 ms) and example count do not
fit either. ``use_profile`` loads one of these, by ``SPECGEN_PROFILE`` or by tier.
"""

from __future__ import annotations

import os

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


def use_profile(name: str | None = None) -> str:
    """Loads the profile ``name``, else ``SPECGEN_PROFILE``, else ``ci`` under the interpreter
    and ``gpu`` on a GPU; returns its name."""
    name = name or os.environ.get("SPECGEN_PROFILE") or ("ci" if interpreting() else "gpu")
    settings.load_profile(name)
    return name

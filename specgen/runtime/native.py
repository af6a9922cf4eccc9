"""The replay core in C++ (native.cpp): a repeated eager call's signature, allocations and kernel
launches without Python in between, so that a replayed call costs about what torch's own eager
op does (docs/performance.md, item 000s).

It is built with torch's extension builder the first time a process on a CUDA machine needs it
(about 15 s; later processes load the cached build from torch's extensions folder) and is used
only there: under Triton's interpreter, without CUDA, with ``SPECGEN_NATIVE=0``, or where the
build fails (a warning says why), replays run as Python functions written for them
(runtime/replay.py), which start kernels through torch's ``_StaticCudaLauncher`` instead.
"""

from __future__ import annotations

import functools
import os
import warnings
from pathlib import Path
from types import ModuleType

import torch

from specgen.runtime.context import interpreting

SOURCE = Path(__file__).with_name("native.cpp")


def wanted() -> bool:
    """Whether this process replays through the C++ core: a CUDA machine, kernels compiled for
    it (not the interpreter), and not turned off by ``SPECGEN_NATIVE=0``."""
    return (os.environ.get("SPECGEN_NATIVE", "1") != "0" and not interpreting()
            and torch.version.hip is None and torch.cuda.is_available())


@functools.cache
def module() -> ModuleType | None:
    """The built module, or None where it is not wanted or does not build."""
    if not wanted():
        return None
    return build()


def build() -> ModuleType | None:
    """Builds (or loads the cached build of) native.cpp; None, with a warning, on failure."""
    from torch.utils import cpp_extension
    try:
        return cpp_extension.load(name="specgen_native", sources=[str(SOURCE)],
                                  extra_cflags=["-O2"], verbose=False)
    except Exception as error:  # no compiler, no ninja, headers missing: the Python path serves
        warnings.warn(f"specgen: the C++ replay core did not build ({type(error).__name__}: "
                      f"{str(error).strip().splitlines()[-1] if str(error).strip() else ''}); "
                      "replays run as Python functions", RuntimeWarning, stacklevel=2)
        return None

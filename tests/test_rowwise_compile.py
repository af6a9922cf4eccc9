"""Every row-wise kernel compiles for an H100 (sm_90), on the CPU tier too.

The interpreter runs kernels as Python, so compile errors (a loop-carried value that changes
shape, say) would otherwise surface only on the GPU tier. Compiling needs no GPU: Triton's NVIDIA
backend ships ptxas. It runs in a subprocess without TRITON_INTERPRET, under which jit functions
are interpreted objects the compiler does not take.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

import generated

ROOT = Path(__file__).resolve().parent.parent
ROWWISE = sorted(name for name, info in generated.REGISTRY.items() if info.family == "rowwise")

SCRIPT = """
import importlib, sys
from specgen.testing.rowwise import compile_kernels
for name in sys.argv[1:]:
    print(name, len(compile_kernels(importlib.import_module(f"generated.{name}"))))
"""


def _backend_missing() -> str | None:
    try:
        from triton.backends.nvidia import compiler  # noqa: F401
    except Exception as err:  # the wheel was built without the NVIDIA backend
        return f"Triton's NVIDIA backend is not installed ({err})"
    return None


@pytest.mark.skipif(_backend_missing() is not None, reason=str(_backend_missing()))
def test_rowwise_kernels_compile_for_sm90():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    result = subprocess.run([sys.executable, "-c", SCRIPT, *ROWWISE], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    compiled = dict(line.split() for line in result.stdout.splitlines())
    assert set(compiled) == set(ROWWISE) and all(int(n) >= 8 for n in compiled.values())

"""Every row-wise kernel compiles for an H100 (sm_90), on the CPU tier too.

The interpreter runs kernels as Python, so compile errors (a loop-carried value that changes
shape, say) would otherwise surface only on the GPU tier. Compiling needs no GPU: Triton's NVIDIA
backend ships ptxas. It runs in a subprocess without TRITON_INTERPRET, under which jit functions
are interpreted objects the compiler does not take.
"""

import pytest

import generated
from specgen.testing.core import compiled_kernel_counts, nvidia_backend_missing

ROWWISE = sorted(name for name, info in generated.REGISTRY.items() if info.family == "rowwise")


@pytest.mark.skipif(nvidia_backend_missing() is not None, reason=str(nvidia_backend_missing()))
def test_rowwise_kernels_compile_for_sm90():
    compiled = compiled_kernel_counts("specgen.families.rowwise", ROWWISE)
    assert set(compiled) == set(ROWWISE) and all(n >= 8 for n in compiled.values())

"""GPU tier: every op under CUDA autocast against torch's autocast of its reference (the dtype
torch gives, the values against float64 on the inputs torch's autocast casts), eager and inside a
compiled graph, where dynamo traces the policy's casts."""

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import generated
from specgen import testing
from specgen.runtime import override
from specgen.testing.autocast import TORCH_POLICY, supported, torch_autocast_args
from specgen.testing.core import assert_matches, cast_first, outputs, reference64

pytestmark = pytest.mark.gpu


def _draw(name, dtype, data):
    """An op's info and a drawn case whose inputs the op takes in the dtypes autocast casts to."""
    info = generated.REGISTRY[name]
    case = testing.draw_case(data, info)
    assume(supported(info, case, dtype))
    return info, case


def _check(info, case, dtype, results):
    """``results`` (ours under autocast) against torch's autocast of the reference."""
    with torch.autocast("cuda", dtype=dtype):
        torchs = outputs(info.reference(**case.args))
    # reference_args: an eps of None spelled out as float32's, which autocast's float32 keeps
    cast_args = torch_autocast_args(info.name, case.reference_args or case.args, dtype)
    cast = cast_args.get("dtype")
    if TORCH_POLICY.get(info.name) == "float32 dtype" and cast is not None \
            and cast.is_floating_point:
        # torch casts the first input to dtype before the op: float64 starts from those values
        # (an integer dtype= keeps the reference exact as it is, as the family's draw says)
        first = info.args[0].name
        cast_args = cast_first(cast_args, first, "dtype")
    wants = outputs(reference64(info, cast_args))
    for output, got, want, torch_result in zip(info.outputs, results, wants, torchs):
        assert got.dtype == torch_result.dtype, \
            f"{info.name} {output}: {got.dtype} under autocast, torch's {torch_result.dtype}"
        assert_matches(got, want, f"{info.name} {output} (autocast)", case.tolerances,
                       torch_result)


@pytest.mark.parametrize("name", sorted(generated.REGISTRY))
@settings(max_examples=6)
@given(data=st.data(), dtype=st.sampled_from([torch.bfloat16, torch.float16]))
def test_autocast_matches_torch(name, dtype, data):
    info, case = _draw(name, dtype, data)
    with override(**case.overrides), torch.autocast("cuda", dtype=dtype):
        results = outputs(case.call(info))
    _check(info, case, dtype, results)


@pytest.mark.parametrize("name", sorted(TORCH_POLICY))
@settings(max_examples=2)
@given(data=st.data(), dtype=st.sampled_from([torch.bfloat16, torch.float16]))
def test_autocast_compiled_matches_torch(name, dtype, data):
    """The ops that autocast changes, inside a compiled graph entered under autocast."""
    info, case = _draw(name, dtype, data)
    torch._dynamo.reset()
    compiled = torch.compile(lambda args: info.function(**args), fullgraph=True)
    with torch.autocast("cuda", dtype=dtype):
        results = outputs(compiled(case.args))
    _check(info, case, dtype, results)

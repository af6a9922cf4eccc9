"""The check every drawn case of an op goes through (``tests/test_ops.py`` for the shipped ops; an
author's own package the same way): its results against the float64 reference, then torch's
result dtype and layout.
"""

from collections.abc import Mapping

from specgen.families import FAMILIES
from specgen.runtime import OpInfo, override, replay
from specgen.testing.core import Case, assert_matches, nearby_errors, outputs, reference64


def check_case(info: OpInfo, case: Case) -> None:
    """Calls the op on ``case`` as a user would (a fresh call, a replayed repeat, the registered
    ``torch.ops.specgen`` op, ``out=`` where it has one) and asserts each result matches."""
    name = info.name
    expected = outputs(reference64(info, case.reference_args or case.args))
    # torch's own result: its dtype and layout are the contract, its error bounds ill-conditioned
    # elements (see assert_matches)
    eager = outputs(info.reference(**case.args))
    nearby = nearby_errors(case.nearby, len(expected), case.args, case.reference_args or case.args,
                           lambda args, args64: (outputs(info.reference(**args)),
                                                 outputs(reference64(info, args64))))

    # outputs start as NaN (poison), as out= tensors do: an element a kernel fails to write
    # cannot pass on what the memory held
    with override(**case.overrides, poison=True):
        with replay.record_at_once():
            fresh = outputs(case.call(info))
            # the same call again is replayed from a recording of the first (runtime/replay.py)
            replayed_before = info.replays.replayed
            replayed = outputs(case.call(info))
        if not isinstance(case.overrides.get("config"), Mapping):  # a mapping is not hashable
            assert info.replays.replayed == replayed_before + 1, \
                f"{name}: not replayed ({list(info.replays.failures.values())})"
        # the registered op (what torch.compile and autograd see) computes the same
        via_op = outputs(info.op(**(case.op_args or case.args)))
        if case.outs:
            # out= tensors start as NaN: an element the kernel fails to write cannot pass
            returned = case.call(info, out=case.outs if len(case.outs) > 1 else case.outs[0])
            assert all(r is o for r, o in zip(outputs(returned), case.outs)), "out= is returned"
            for output, written, want, torch_result in zip(info.outputs, case.outs, expected,
                                                            eager):
                assert_matches(written, want, f"{name} {output} (out=)", case.tolerances,
                               torch_result)

    for output, allocated, again, from_op, want, torch_result, near in zip(
            info.outputs, fresh, replayed, via_op, expected, eager, nearby):
        assert_matches(allocated, want, f"{name} {output}", case.tolerances, torch_result, near)
        assert_matches(again, want, f"{name} {output} (replayed)", case.tolerances, torch_result,
                       near)
        assert again.stride() == allocated.stride(), f"{name} {output}: replayed layout"
        assert_matches(from_op, want, f"{name} {output} (torch.ops.specgen)", case.tolerances,
                       torch_result, near)
        # torch semantics beyond values: the result dtype and memory layout torch would give
        assert allocated.dtype == torch_result.dtype, f"{name} {output}: dtype"
        layout = torch_result if isinstance(case.layout_reference, str) else case.layout_reference
        if layout is not None and allocated.numel() > 0:
            big = [d for d in range(allocated.dim()) if allocated.shape[d] > 1]
            assert [allocated.stride(d) for d in big] == [layout.stride(d) for d in big], \
                f"{name} {output}: layout differs from torch's{_layout_hint(info.family)}"


def _layout_hint(family: str) -> str:
    """Which spec key sets an op's output layout (the family's ``layout_hint``), for the
    message of a layout unlike torch's."""
    hint = FAMILIES[family].layout_hint
    return f" ({hint})" if hint else ""

"""Cases for the cross_entropy family: any logits layout, ignored rows, weights, smoothing."""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from specgen.runtime import OpInfo
from specgen.testing.core import Case, device, knobs, layouts, make_tensor, sizes
from specgen.testing.samples import Make

# float32 math over C classes (float64 for float64 logits); the loss is rounded once to the
# logits dtype
_TOLERANCES = {
    torch.float32: (1e-4, 1e-5),
    torch.float16: (1e-3, 1e-4),
    torch.bfloat16: (8e-3, 1e-4),
    torch.float64: (1e-10, 1e-12),
}


@st.composite
def cross_entropy_cases(draw, info: OpInfo) -> Case:
    n_rows = draw(sizes(40))
    n_classes = draw(sizes(300, allow_zero=False))
    dtype = draw(st.sampled_from(info.dtypes))
    seed = draw(st.integers(0, 2**31 - 1))
    logits = make_tensor((n_rows, n_classes), dtype, draw(layouts(2, allow_broadcast=False)),
                         low=-8.0, high=8.0, seed=seed)
    generator = torch.Generator(device="cpu").manual_seed(seed)
    target = torch.randint(0, n_classes, (n_rows,), generator=generator, device="cpu")
    ignore_index = draw(st.sampled_from([-100, 0, 3]))
    if n_rows and draw(st.booleans()):
        target[torch.rand(n_rows, generator=generator, device="cpu") < 0.3] = ignore_index
    weight = None
    if draw(st.booleans()):
        weight = make_tensor((n_classes,), dtype, draw(layouts(1, allow_broadcast=False)),
                             low=0.25, high=2.0, seed=seed + 1)
    args = {"logits": logits, "target": target.to(device()), "weight": weight,
            "ignore_index": ignore_index,
            "reduction": draw(st.sampled_from(["mean", "sum", "none"])),
            "label_smoothing": draw(st.sampled_from([0.0, 0.0, 0.1, 1.0]))}
    return Case(args, (), draw(knobs()), tolerances=_TOLERANCES,
                describe=f"logits {tuple(logits.shape)} {dtype} strides {logits.stride()}; "
                         f"weight {weight is not None}; {args['reduction']} "
                         f"smoothing {args['label_smoothing']} ignore {ignore_index}")


def cross_entropy_samples(info: OpInfo, make: Make) -> dict[str, list[tuple]]:
    """Mean over 3 rows of 5 classes; then per row, transposed logits, class weights, an ignored
    row and label smoothing; its backward operator on what the forward saves."""
    target = torch.tensor([0, 4, 2], device=make.device)
    forward = [(make.r(3, 5, g=True), target, None, -100, "mean", 0.0),
               (make.t(3, 5, g=True), torch.tensor([1, -100, 3], device=make.device),
                make.r(5, lo=0.5), -100, "none", 0.1)]
    logits = make.r(3, 5)
    _, lse, denom = getattr(torch.ops.specgen, info.name)(logits, target, None, -100, "mean", 0.0)
    backward = [(torch.ones((), device=make.device), logits, target, None, lse, denom, -100,
                 "mean", 0.0)]
    return {info.name: forward, f"{info.name}_backward": backward}

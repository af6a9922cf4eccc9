"""Cases for the convolution family: stride, padding (ints, pairs, "same", "valid"), dilation,
groups (depthwise included), filters of 1 to 7, non-square inputs, batched and unbatched inputs,
NCHW, channels-last and arbitrary layouts of the input and the weight, epilogue operands.

Every case forces a strategy (the implicit GEMM on the tensors as they are, after a channels-last
repack, or the depthwise kernel where a group has one input channel) or leaves it to the
launcher, and forces a config: one of the spec's space by number, or a small tile config outside
it so that small images span several tiles.
"""

from __future__ import annotations

from typing import Any

import torch
from hypothesis import strategies as st

from specgen.runtime import OpInfo, interpreting
from specgen.testing.core import Case, broadcast_operand, knobs, layouts, make_tensor
from specgen.testing.matmul import matmul_tolerances
from specgen.testing.samples import Make

SMALL_CONFIGS = (
    {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 1, "num_warps": 4, "num_stages": 2},
    {"BLOCK_M": 32, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 2, "num_warps": 4, "num_stages": 2},
    {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 3, "num_warps": 4, "num_stages": 3},
    {"BLOCK_M": 64, "BLOCK_N": 32, "BLOCK_K": 16, "GROUP_M": 8, "num_warps": 4, "num_stages": 3},
)


def _kinds(info: OpInfo) -> dict[str, str]:
    return {a.name: a.kind for a in info.args}


def _role(info: OpInfo, dims: tuple[str, ...]) -> str:
    return next(a.name for a in info.args if a.kind == "tensor" and tuple(a.dims) == dims)


def four_pads(padding: Any, kernel: tuple[int, int], dilation: tuple[int, int]) -> list[int]:
    """torch's padding as the registered operator takes it: (top, bottom, left, right)."""
    if padding == "valid":
        return [0, 0, 0, 0]
    if padding == "same":
        pads = []
        for size, d in zip(kernel, dilation):
            total = d * (size - 1)
            pads += [total // 2, total - total // 2]
        return pads
    h, w = (padding, padding) if isinstance(padding, int) else padding
    return [h, h, w, w]


def _pair(value: Any) -> tuple[int, int]:
    return (value, value) if isinstance(value, int) else tuple(value)


@st.composite
def conv_cases(draw, info: OpInfo) -> Case:
    kinds = _kinds(info)
    x_name, w_name = _role(info, ("N", "C", "H", "W")), _role(info, ("K", "C", "R", "S"))
    overrides = draw(knobs())
    if draw(st.booleans()):
        overrides["config"] = draw(st.sampled_from(SMALL_CONFIGS))
    # under the interpreter every program runs in numpy: small images and channel counts
    small = interpreting()
    groups = 1
    depthwise = False
    if "groups" in kinds:
        depthwise = draw(st.integers(0, 3)) == 0
        groups = draw(st.integers(1, 4 if small else 8))
    c_group = 1 if depthwise else draw(st.integers(1, 20 if small else 70))
    k_group = draw(st.integers(1, 3)) if depthwise else draw(st.integers(1, 20 if small else 70))
    kh, kw = draw(st.integers(1, 7)), draw(st.integers(1, 7))
    stride = draw(st.sampled_from([1, 1, 2, 3, (1, 2), (2, 1)])) if "stride" in kinds else 1
    dilation = draw(st.sampled_from([1, 2, (1, 2), (2, 1)])) if "dilation" in kinds else 1
    padding: Any = 0
    if "padding" in kinds:
        forms = [0, 1, 2, (0, 1), (3, 2), "valid"] + (["same"] if stride == 1 else [])
        padding = draw(st.sampled_from(forms))
    (sh, sw), (dh, dw) = _pair(stride), _pair(dilation)
    pads = four_pads(padding, (kh, kw), (dh, dw))
    # the input at least the dilated filter once padded; non-square
    least_h = max(1, dh * (kh - 1) + 1 - pads[0] - pads[1])
    least_w = max(1, dw * (kw - 1) + 1 - pads[2] - pads[3])
    height = least_h + draw(st.integers(0, 6 if small else 20))
    width = least_w + draw(st.integers(0, 6 if small else 20))
    unbatched = draw(st.integers(0, 5)) == 0
    batch = draw(st.integers(0 if draw(st.integers(0, 7)) == 0 else 1, 2 if small else 4))
    channels = c_group * groups
    out_channels = k_group * groups
    # "tma" where the TMA kernel can take the call (stride 1, one group, Hopper: the GPU tier),
    # else the GEMM kernel after the same copies
    strategy = draw(st.sampled_from([None, "gemm", "gemm_repack", "tma"]
                                    + (["depthwise"] if c_group == 1 else [])))
    if strategy is not None:
        overrides["strategy"] = strategy

    dtypes = [d for d in info.dtypes if d != torch.bfloat16 or not interpreting()]
    dtype = draw(st.sampled_from(dtypes))
    seed = draw(st.integers(0, 2**31 - 1))
    out_h = (height + pads[0] + pads[1] - dh * (kh - 1) - 1) // sh + 1
    out_w = (width + pads[2] + pads[3] - dw * (kw - 1) - 1) // sw + 1
    out_shape = (out_channels, out_h, out_w) if unbatched else (batch, out_channels, out_h, out_w)
    args: dict[str, Any] = {}
    notes = [f"groups={groups} C/g={c_group} K/g={k_group} filter={kh}x{kw} stride={stride} "
             f"padding={padding} dilation={dilation} input {height}x{width}"]
    for i, arg in enumerate(info.args):
        if arg.kind != "tensor":
            continue
        if arg.optional and draw(st.integers(0, 2)) == 0:
            args[arg.name] = None
            continue
        if arg.name == x_name:
            shape = (channels, height, width) if unbatched else (batch, channels, height, width)
        elif arg.name == w_name:
            shape = (out_channels, c_group, kh, kw)
        elif tuple(arg.dims) == ("K",):
            shape = (out_channels,)
        else:
            shape = draw(broadcast_operand(out_shape))
        # NCHW, channels-last (order N, H, W, C) or any drawn layout
        form = draw(st.sampled_from(["contiguous", "channels_last", "drawn"]))
        layout = draw(layouts(len(shape), allow_broadcast=False))
        own = draw(st.sampled_from(info.dtypes)) if arg.promotes else dtype
        tensor = make_tensor(shape, own, layout if form == "drawn" else type(layout).contiguous(
            len(shape)), low=arg.low, high=arg.high, seed=seed + i)
        if form == "channels_last" and tensor.dim() == 4:
            tensor = tensor.to(memory_format=torch.channels_last)
        args[arg.name] = tensor
        notes.append(f"{arg.name}: {shape} {own} {form} {layout if form == 'drawn' else ''}")
    geometry = {"stride": stride, "padding": padding, "dilation": dilation, "groups": groups}
    op_args = dict(args)
    for name, value in geometry.items():
        if name in kinds:
            args[name] = value
            op_args[name] = (pads if name == "padding" else
                             list(_pair(value)) if name in ("stride", "dilation") else value)
    tf32 = dtype == torch.float32 and not interpreting() and torch.backends.cudnn.allow_tf32
    # the gradients sum other terms: the input's over K/groups x R x S, the weight's over
    # N x P x Q (torch's convolution backward, rounded to the dtype)
    sums = max(c_group * kh * kw, k_group * kh * kw, max(batch, 1) * out_h * out_w)
    return Case(args, (), overrides, describe="; ".join(notes),
                tolerances=matmul_tolerances(c_group * kh * kw, tf32=tf32),
                grad_tolerances=matmul_tolerances(sums, tf32=tf32), op_args=op_args)


def conv_samples(info: OpInfo, make: Make) -> dict[str, list[tuple]]:
    """An NCHW call with every argument, a channels-last one without the optional operands, and
    a grouped one where the op takes groups; geometry spelled out as the operator takes it."""
    kinds = _kinds(info)

    def call(channels_last: bool, full: bool, groups: int) -> tuple:
        args = []
        for a in info.args:
            if a.kind == "pair":
                args.append([2, 1] if a.name == "stride" and full else [1, 1])
            elif a.kind == "padding":
                args.append([1, 0, 1, 2] if full else [0, 0, 0, 0])
            elif a.kind == "groups":
                args.append(groups)
            elif a.kind != "tensor":
                args.append(a.default)
            elif a.optional and not full:
                args.append(None)
            else:
                dims = tuple(a.dims)
                shape = {("N", "C", "H", "W"): (2, 4, 6, 5), ("K", "C", "R", "S"): (6, 4 // groups, 3, 2),
                         ("K",): (6,)}.get(dims)
                if shape is None:
                    shape = (2, 6, 1, 1)     # an output-shaped operand, broadcast
                t = make.r(*shape)
                if channels_last and t.dim() == 4:
                    t = t.to(memory_format=torch.channels_last)
                args.append(t.requires_grad_(True))
        return tuple(args)

    calls = [call(False, True, 1), call(True, False, 1)]
    if "groups" in kinds:
        calls.append(call(False, True, 2))
    return {info.name: calls}

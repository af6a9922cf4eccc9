"""Cases for the attention family: batch and head counts (grouped heads where the op takes
``enable_gqa``), query and key lengths off every block size (1 included), head dims up to 256
on the GPU, layouts (the ``(B, L, H, E).transpose(1, 2)`` view, permuted, sliced, offset), bool
and float attention masks that broadcast, causal calls and the spec's own scalars.

The interpreter computes a bfloat16 ``tl.dot`` wrongly, so the CPU tier draws float16, float32
and float64; the GPU tier draws bfloat16 too.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from hypothesis import strategies as st

from specgen.families.attention import ROLES
from specgen.runtime import OpInfo, interpreting
from specgen.testing.core import (FLOAT_RANGE, Case, Layout, broadcast_operand, device, knobs,
                                  layouts, make_tensor, scalar_value, sizes)
from specgen.testing.samples import Make, default

# |actual - expected| <= atol + rtol * |expected|. The softmax weights are rounded to the inputs'
# dtype before they meet the values (as every flash kernel does): up to one rounding of each
# weight, times values up to 3 in magnitude, plus the output's own rounding. float64 computes in
# float64 throughout (its weights are not rounded): float32 math would be 1e-7 off
TOLERANCES = {
    torch.float32: (2e-5, 3e-5),
    torch.float16: (2e-3, 3e-3),
    torch.bfloat16: (1e-2, 2.5e-2),
    torch.float64: (1e-10, 1e-11),
}
# the gradients, atol relative to each gradient's largest element (at least 1): the backward
# rounds each probability and each score's gradient to the inputs' dtype before they meet the
# values, the keys and the queries, and takes each row's dO . O from the output as stored, not
# from the probabilities (as every flash kernel does); dQ and dK sum a row's or a key's terms,
# which may be larger than the sum. Seen: float16 at L = S = 32, 0.014 off at an element of -0.40
# (the gradient's largest 15); float16 with two equal keys (a key of stride 0), where dQ is 0,
# 0.009 (dO . O from the float16 output against the probabilities' sum); float32 with one key,
# where the gradients are 0, up to 2.2e-5. A wrong mask, scale or head sum is off by the
# gradient itself; the GPU tier's tests hold bfloat16 to twice torch's own error besides
GRAD_TOLERANCES = {
    torch.float32: (5e-5, 5e-5),
    torch.float16: (5e-3, 1.5e-2),
    torch.bfloat16: (4e-2, 1e-1),
    torch.float64: (1e-10, 1e-11),
}
# small tiles reach several query and key blocks, partial ones and the bounds of a mask on the
# interpreter's small inputs
SMALL_CONFIGS = (
    {"BLOCK_M": 16, "BLOCK_N": 16, "num_warps": 4, "num_stages": 1},
    {"BLOCK_M": 32, "BLOCK_N": 16, "num_warps": 4, "num_stages": 2},
    {"BLOCK_M": 16, "BLOCK_N": 32, "num_warps": 4, "num_stages": 2},
)


def roles(info: OpInfo) -> dict[str, str]:
    """The op's tensor arguments by role (query, key, value, attn_mask; the family's ``ROLES``),
    per-head and per-batch ones apart."""
    return {ROLES[a.dims]: a.name for a in info.args
            if a.kind == "tensor" and ROLES.get(a.dims) not in (None, "per_head", "per_batch")}


@st.composite
def attention_cases(draw, info: OpInfo) -> Case:
    role = roles(info)
    overrides = draw(knobs())
    # the interpreter runs every program in numpy: small tiles over small problems still span
    # several query and key blocks; the GPU tier runs the space's configs too
    # (number 0 there: the interpreter's own first config, 16 x 16)
    if interpreting():
        overrides["config"] = draw(st.sampled_from((0, *SMALL_CONFIGS)))
    elif draw(st.booleans()):
        overrides["config"] = draw(st.sampled_from(SMALL_CONFIGS))
    names = {a.name for a in info.args}
    gqa = "enable_gqa" in names and draw(st.booleans())
    small = interpreting()
    limit = 40 if small else 300
    length, keys = draw(sizes(limit, allow_zero=False)), draw(sizes(limit, allow_zero=False))
    dims = [1, 3, 8, 16, 17] if small else [1, 3, 8, 16, 17, 32, 40, 64, 80, 128, 256]
    dim, value_dim = draw(st.sampled_from(dims)), draw(st.sampled_from(dims))
    heads_kv = draw(st.integers(1, 2 if small else 3))
    group = draw(st.integers(1, 3)) if gqa else 1
    heads = heads_kv * group
    # an op with per-batch tensors (a KV cache's lengths) takes one batch dim, B
    per_batch = any(a.kind == "tensor" and a.dims == ("B",) for a in info.args)
    batch = tuple(draw(st.lists(st.integers(1, 2 if small else 3), min_size=int(per_batch),
                                max_size=1 if per_batch else 2)))
    # several programs sharing a row block's keys (flash decoding), forced now and then
    if draw(st.booleans()):
        overrides["strategy"] = f"split:{draw(st.integers(1, 4))}"
    dtypes = [d for d in info.dtypes if d != torch.bfloat16 or not interpreting()]
    dtype = draw(st.sampled_from(dtypes))
    seed = draw(st.integers(0, 2**31 - 1))

    def operand(shape: tuple[int, ...], index: int) -> torch.Tensor:
        # the (B, L, H, E) layout viewed as (B, H, L, E), or any other
        if draw(st.booleans()) and len(shape) >= 3:
            rank = len(shape)
            order = (*range(rank - 3), rank - 2, rank - 3, rank - 1)
            layout = Layout(order, (1,) * rank)
        else:
            layout = draw(layouts(len(shape)))
        return make_tensor(shape, dtype, layout, seed=seed + index)

    args: dict[str, Any] = {}
    notes = [f"batch={batch} Hq={heads} Hkv={heads_kv} L={length} S={keys} E={dim} "
             f"Ev={value_dim} {dtype} config={overrides['config']}"]
    for i, arg in enumerate(info.args):
        name = arg.name
        if name == role["query"]:
            query_batch = batch if per_batch else draw(broadcast_operand(batch))
            args[name] = operand((*query_batch, heads, length, dim), i)
        elif name == role["key"]:
            kv_batch = batch if per_batch else draw(broadcast_operand(batch))
            args[name] = operand((*kv_batch, heads_kv, keys, dim), i)
        elif name == role["value"]:
            args[name] = operand((*kv_batch, heads_kv, keys, value_dim), i)
        elif name == role.get("attn_mask"):
            # no more dims than the scores have (torch adds the mask to them in place)
            scores = torch.broadcast_shapes(query_batch, kv_batch)
            args[name] = draw(_mask(scores, heads, length, keys, dtype, seed + i))
        elif arg.kind == "tensor" and arg.dims == ("B",):   # keys in use, 0 to S
            lengths = draw(st.lists(st.integers(0, keys), min_size=batch[0], max_size=batch[0]))
            args[name] = torch.tensor(lengths, dtype=draw(st.sampled_from(
                [torch.int32, torch.int64])), device=device())
        elif arg.kind == "tensor":       # per-head values, of a dtype of their own
            own = draw(st.sampled_from(info.dtypes))
            args[name] = make_tensor((heads,), own, draw(layouts(1)), low=arg.low,
                                     high=arg.high, seed=seed + i)
        elif name == "dropout_p":
            args[name] = 0.0             # the only value taken (others raise, tested apart)
        elif name == "enable_gqa":
            args[name] = gqa
        elif name == "scale":
            # float64 math takes a scale whole (float32 math, rounded to float32)
            width = 64 if dtype == torch.float64 else 32
            args[name] = draw(st.one_of(st.none(), st.floats(0.0625, 1.0, width=width)))
        elif arg.kind == "float" and dtype == torch.float64:
            # at full precision: float64 math takes a float argument whole, as torch's does
            args[name] = draw(st.floats(*(arg.range or FLOAT_RANGE)))
        else:
            args[name] = scalar_value(draw, arg)
        if arg.kind == "tensor" and args[name] is not None:
            t = args[name]
            notes.append(f"{name}: {tuple(t.shape)} {t.dtype} strides {t.stride()}")
        elif arg.kind != "tensor":
            notes.append(f"{name}={args[name]!r}")
    if role.get("attn_mask") and args.get(role["attn_mask"]) is not None and "is_causal" in args:
        args["is_causal"] = False        # torch refuses both (tested apart)
    # a float mask's element and a per-head value sum the gradients of the scores they meet
    scores = math.prod(torch.broadcast_shapes(query_batch, kv_batch)) * heads * length * keys
    summed = [a.name for a in info.args if a.kind == "tensor" and a.dims == ("H",)]
    if role.get("attn_mask"):
        summed.append(role["attn_mask"])
    grad_sums = {name: max(1, scores // args[name].numel()) for name in summed
                 if args.get(name) is not None and args[name].is_floating_point()
                 and args[name].numel()}
    # the layout is flash's ((..., L, H, Ev) in memory), where torch's math gives another
    return Case(args, (), overrides, describe="; ".join(notes), tolerances=TOLERANCES,
                grad_tolerances=GRAD_TOLERANCES, grad_sums=grad_sums, layout_reference=None)


@st.composite
def _mask(draw, batch, heads, length, keys, dtype, seed) -> torch.Tensor | None:
    kind = draw(st.sampled_from(["none", "bool", "float"]))
    if kind == "none":
        return None
    full = (*batch, heads, length, keys)
    # at least (L, S): torch refuses a mask of fewer dims
    last = tuple(size if draw(st.integers(0, 3)) else 1 for size in full[-2:])
    shape = (*draw(broadcast_operand(full[:-2])), *last)
    if kind == "float":
        return make_tensor(shape, dtype, draw(layouts(len(shape))), low=-4.0, high=1.0,
                           seed=seed)
    # True takes part; now and then a row sees no key (it gives zeros); bool masks are made
    # dense, and laid out transposed now and then
    transposed = draw(st.booleans())
    drawn = (*shape[:-2], shape[-1], shape[-2]) if transposed else shape
    dense = make_tensor(drawn, torch.float32, Layout.contiguous(len(drawn)), low=0.0, high=1.0,
                        seed=seed)
    mask = dense > draw(st.sampled_from([0.1, 0.5, 0.9]))
    return mask.mT if transposed else mask


def attention_samples(info: OpInfo, make: Make) -> dict[str, list[tuple]]:
    """A batched call with every argument at its default (the mask given, then omitted), and a
    query in the (B, L, H, E) layout; its sizes (B 2, H 2, L 3, S 5, E 4, Ev 6) differ from each
    other but for B and H, so that most dims mixed up fail."""
    role = roles(info)

    def call(masked: bool, transposed: bool) -> tuple:
        args = []
        for a in info.args:
            if a.name == role["query"]:
                q = (make.r(2, 3, 2, 4).transpose(1, 2).detach().requires_grad_(True)
                     if transposed else make.r(2, 2, 3, 4, g=True))
                args.append(q)
            elif a.name == role["key"]:
                args.append(make.r(2, 2, 5, 4, g=True))
            elif a.name == role["value"]:
                args.append(make.r(2, 2, 5, 6, g=True))
            elif a.name == role.get("attn_mask"):
                args.append(make.r(3, 5, lo=-1.0, hi=1.0) if masked else None)
            elif a.kind == "tensor" and a.dims == ("B",):
                args.append(torch.tensor([5, 2], dtype=torch.int32, device=make.device))
            elif a.kind == "tensor":
                args.append(make.r(2, g=True, lo=0.0, hi=1.0))
            elif a.kind == "float" and a.default is None and not a.optional:
                args.append(2.0 if a.range is None else (a.range[0] + a.range[1]) / 2)
            elif a.kind == "int" and a.default is None:
                args.append(2)
            else:
                args.append(default(a))
        return tuple(args)

    calls = [call(True, False), call(False, True)]
    # the backward operator: the output's gradient, the forward's output and row logsumexps,
    # the arguments (none requiring grad: the backward has no gradient of its own), and whether
    # the mask wants its gradient
    backward = []
    operator = getattr(torch.ops.specgen, info.name)
    for args in calls:
        args = tuple(a.detach() if isinstance(a, torch.Tensor) else a for a in args)
        with torch.no_grad():
            out, lse = operator(*args)
        masked = role.get("attn_mask") is not None and any(
            a.name == role["attn_mask"] and v is not None for a, v in zip(info.args, args))
        backward.append((make.r(*out.shape), out, lse, *args, masked))
    return {info.name: calls, f"{info.name}_backward": backward}


def compile_kernels(module, dim: int = 64, arch: int = 90) -> list[str]:
    """Compiles every kernel of a generated attention module for float64 inputs to a CUDA binary,
    without a GPU, on the first of ``FLOAT64_CONFIGS``' tiles for its pass at head dim ``dim``
    (a causal call with a float mask and its gradient, split keys), and raises where the
    compiled kernel computes anything in float32.

    The interpreter runs kernels as Python: it lets a loop-carried value change type (a float32
    accumulator that a float64 dot makes float64), which the compiler refuses, and cannot show a
    float32 intermediate. Needs Triton's NVIDIA backend (ptxas ships with it) and no
    TRITON_INTERPRET. Returns one line per kernel."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from specgen.runtime.attention import FLOAT64_CONFIGS

    floats = {arg.name for arg in module.DESCRIPTION.args if arg.kind == "float"}
    # each kernel's tiles: its pass's, as (held, streamed)
    roles = {"forward": ("forward", "BLOCK_M", "BLOCK_N"),
             "merge": ("forward", "BLOCK_M", "BLOCK_N"),
             "backward_query": ("query", "BLOCK_M", "BLOCK_N"),
             "backward_key": ("key", "BLOCK_N", "BLOCK_M")}
    bound = min(b for b in FLOAT64_CONFIGS["forward"] if dim <= b)
    block = max(16, 1 << (dim - 1).bit_length())
    done = []
    for role, kernel in module.KERNELS.items():
        fn = kernel
        while not isinstance(fn, triton.runtime.JITFunction):
            fn = fn.fn
        space, held, streamed = roles[role]
        rows, keys, warps, stages = FLOAT64_CONFIGS[space][bound][0]
        if role == "merge":
            warps, stages = 4, 1
        constexprs = {"E": dim, "EV": dim, "BLOCK_E": block, "BLOCK_EV": block, held: rows,
                      streamed: keys, "INDEX_64": False, "INPUT_PRECISION": "ieee",
                      "MASK_KIND": 2, "MASK_GRAD": True, "SPLIT": True, "PACKED": False,
                      "NUM_SPLITS": 4, "IS_CAUSAL": True}
        signature, constants = {}, {}
        for i, (arg, param) in enumerate(zip(fn.arg_names, fn.params)):
            if param.is_constexpr:
                signature[arg] = "constexpr"
                constants[(i,)] = constexprs.get(arg, False)
            elif arg.endswith("_ptr"):
                # the cache lengths are int32; every other tensor (the mask, statistics,
                # workspaces and gradient buffers included) float64
                per_batch = any(arg == f"{a.name}_ptr" and a.dims == ("B",)
                                for a in module.DESCRIPTION.args if a.kind == "tensor")
                signature[arg] = "*i32" if per_batch else "*fp64"
            elif arg in floats or arg == "scale":
                signature[arg] = "fp64"
            else:
                signature[arg] = "i32"
        binary = triton.compile(ASTSource(fn, signature, constants),
                                target=GPUTarget("cuda", arch, 32),
                                options={"num_warps": warps, "num_stages": stages})
        narrow = [line.strip() for line in binary.asm["ttgir"].splitlines() if "f32" in line]
        if narrow:
            raise AssertionError(f"{module.__name__} {role}: float32 in float64 math: {narrow[:3]}")
        done.append(f"{role} {rows}x{keys}")
    return done

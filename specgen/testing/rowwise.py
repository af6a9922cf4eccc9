"""Cases for the row-wise family: a row tensor in any layout, reduced over a drawn dim or over its
trailing dims, with companions of its shape, tensors along the row (or omitted), -inf entries, and
every strategy forced in turn."""

from __future__ import annotations

import math
import sys
from typing import Any

import torch
from hypothesis import strategies as st

from specgen.runtime import OpInfo, interpreting
from specgen.runtime.rowwise import compute_dtype, single_fits
from specgen.testing.core import (Case, cast_first, dtype_arg, knobs, layouts, make_tensor,
                                  max_numel, scalar_value, shapes)
from specgen.testing.samples import Make, default

# float32 sums over a row round at every step; the bound grows a little with the length
TOLERANCES = {
    torch.float32: (5e-5, 2e-5),
    torch.float16: (1e-3, 1e-5),
    torch.bfloat16: (8e-3, 1e-5),
    torch.float64: (1e-9, 1e-10),
}


# where the family draws a float argument whose spec gives no range (an eps)
EPS_RANGE = (1e-6, 0.5)


def _budget() -> int:
    # the interpreter runs each program in numpy, and the looped kernels loop over 16-wide chunks
    return 512 if interpreting() else max_numel()


# under the interpreter, the chunked strategies are forced on at most this many rows: they run
# one or two rows a program (a split one, one row per program and kernel), some 10 ms a row each
# in numpy, while a single-tile program takes many short rows at once
CHUNKED_ROWS = 32


def _roles(info: OpInfo) -> dict[str, Any]:
    """Which argument plays which part: the op's launch data (runtime/rowwise.py's Launch)."""
    launch = _launch(info)
    return {"tensor": launch.row_tensor, "dim": launch.dim,
            "normalized_shape": launch.normalized_shape, "along": launch.along,
            "like": launch.like}


def _launch(info: OpInfo):
    return sys.modules[info.function.__module__].OP.description.launch


def _strategies(info: OpInfo) -> tuple[str, ...]:
    return sys.modules[info.function.__module__].STRATEGIES


@st.composite
def rowwise_cases(draw, info: OpInfo) -> Case:
    roles = _roles(info)
    x_name = roles["tensor"]
    by_shape = roles["normalized_shape"] is not None
    dim_arg = roles["dim"] if isinstance(roles["dim"], str) else None
    # a 0-dim tensor has one row of one element; ops with a fixed dim or a normalized_shape
    # need a dim to reduce
    min_rank = 0 if dim_arg else 1
    shape = draw(shapes(min_rank=min_rank, max_rank=4, max_elements=_budget()))
    rank = len(shape)
    if by_shape:
        k = draw(st.integers(1, min(rank, 3)))
        reduced = tuple(range(rank - k, rank))
    elif dim_arg:
        many = next(a for a in info.args if a.name == dim_arg).kind == "shape"
        count = draw(st.integers(1, min(max(rank, 1), 3))) if many else 1
        dims = draw(st.lists(st.integers(-max(rank, 1), max(rank, 1) - 1), min_size=count,
                             max_size=count, unique_by=lambda d: d % max(rank, 1)))
        dim = dims if many else dims[0]
        reduced = () if rank == 0 else tuple(sorted(d % rank for d in dims))
    else:
        reduced = (roles["dim"] % rank,)
    reduced_shape = tuple(shape[d] for d in reduced)

    dtype = draw(st.sampled_from(info.dtypes))
    seed = draw(st.integers(0, 2**31 - 1))
    args: dict[str, Any] = {}
    notes = [f"shape {shape}, reduced dims {reduced}, {dtype}"]
    for i, arg in enumerate(info.args):
        if arg.kind == "tensor":
            if arg.optional and draw(st.booleans()):
                args[arg.name] = None
                continue
            along = arg.name in roles["along"]
            operand = reduced_shape if along else shape
            layout = draw(layouts(len(operand)))
            args[arg.name] = make_tensor(operand, dtype, layout, low=arg.low, high=arg.high,
                                         seed=seed + i)
            notes.append(f"{arg.name}: {operand} {layout}")
        elif arg.name == dim_arg:
            args[arg.name] = dim
        elif arg.kind == "shape":
            args[arg.name] = list(reduced_shape)
        elif arg.kind == "dtype":
            args[arg.name] = dtype_arg(draw, info.dtypes, dtype)
        elif arg.kind == "float":
            # eps-like scalars unless the spec gives a range: positive, from tiny to large
            # enough to matter
            low, high = arg.range or EPS_RANGE
            value = draw(st.floats(low, high))
            if arg.optional:
                value = draw(st.sampled_from([None, value]))
            elif arg.default is not None:
                value = draw(st.sampled_from([arg.default, value]))
            # at full precision: float64 math takes a float whole, as torch's does
            args[arg.name] = value
        else:
            args[arg.name] = scalar_value(draw, arg)

    x = args[x_name]
    # -inf entries, in the max-then-sum-of-exp ops only: torch's result for a norm of a row
    # with an infinite entry depends on its device (CUDA's fused rms_norm gives NaN for the whole
    # row, its CPU one x / inf = 0 for the finite entries, as ours does on both)
    if x.numel() and "online" in _strategies(info) and draw(st.booleans()) and _writable(x):
        # one row all -inf (torch: NaN for softmax, -inf for logsumexp) and some scattered ones
        # (partial rows must match torch too)
        generator = torch.Generator(device="cpu").manual_seed(seed)
        scattered = torch.rand(x.shape, generator=generator, device="cpu") < 0.2
        x.masked_fill_(scattered.to(x.device), -math.inf)
        if reduced and len(reduced) < rank:
            rows_view = x.permute(*[d for d in range(rank) if d not in reduced], *reduced)
            rows_view[(0,) * (rank - len(reduced))].fill_(-math.inf)
        notes.append("with -inf entries")
        if draw(st.booleans()):
            # +inf too: torch gives NaN rows for softmax and log_softmax, inf for logsumexp
            # (exp(inf - inf) is NaN; the max is the answer)
            spikes = torch.rand(x.shape, generator=generator, device="cpu") < 0.05
            x.masked_fill_(spikes.to(x.device), math.inf)
            notes.append("with +inf entries")

    reference_args = None
    none_floats = [a.name for a in info.args if a.kind == "float" and a.optional
                   and args[a.name] is None]
    if none_floats:
        # torch reads None as the eps of its math type, float32 for the 16- and 32-bit dtypes
        # (the float64 reference would take float64's), float64 for float64
        eps = torch.finfo(compute_dtype(dtype)).eps
        reference_args = {**args, **{n: eps for n in none_floats}}
    cast = [a.name for a in info.args if a.kind == "dtype" and args[a.name] is not None]
    if cast:
        notes.append(f"{cast[0]}={args[cast[0]]}")
        reference_args = cast_first(reference_args or args, x_name, cast[0])

    forced = draw(knobs())
    rows = math.prod(size for d, size in enumerate(shape) if d not in reduced)
    strategies = _strategies(info)
    if interpreting() and rows > CHUNKED_ROWS:
        strategies = ("single",)
    if not single_fits(math.prod(shape[d] for d in reduced)):
        # a forced single tile refuses rows this long (a clear error, tested on its own)
        strategies = tuple(s for s in strategies if s != "single")
    strategy = draw(st.sampled_from(("auto",) + strategies))
    if strategy != "auto":
        forced["strategy"] = strategy
    if strategy not in ("auto", "single") and interpreting() and draw(st.booleans()):
        # the interpreter's config (the first) and its 16-wide chunks: the other configs' chunks
        # of 1024 or more hold a CPU-tier row whole, so that the chunk loops ran once and a split
        # had one program a row; here rows take several chunks, and a split several programs
        # whose partials the second stage combines (empty ones too, past the end of short rows)
        forced["config"] = 0
        if strategy == "split":
            forced["split_chunk"] = 16
    # layout: the eager reference's result is torch's rule for each output on CPU and CUDA alike.
    # Outputs that read a reduction follow the spec's [rows] layout: contiguous for softmax,
    # log_softmax and layer_norm (their kernels make the input contiguous), the input's suggested
    # memory format for rms_norm (channels_last kept); logsumexp is a reduction. add_rms_norm's
    # reference composes an add (whose layout rule its `x + residual` output follows) and
    # F.rms_norm of that sum, one torch op per output, so "eager" checks both. A derived backward
    # op lays its gradients out as its forward lays out its results; torch's vector-Jacobian
    # product has the layout of whichever op its graph ends in (add_rms_norm's x: the sum of two
    # gradients, laid out by TensorIterator's rule), which is no contract of torch's
    launch = _launch(info)
    derived = launch.derived_from
    # Gradients cancel by design (layer_norm's over two elements is a difference of nearly equal
    # terms), on the forward's eager path too, which runs the derived op: an element is held to
    # torch's accuracy near the drawn input (Case.nearby). At 8 nearby inputs rather than 3: where
    # one ulp of rstd moves a gradient 4x past the tolerance (rms_norm over rows of one float32
    # element, x**2 near 1600 eps), torch is accurate at a few inputs by the luck of its rounding,
    # and a GPU draw of 527744 such rows found 2 where it was at the drawn one and all 3 nearby
    backward = derived or launch.backward
    return Case(args, (), forced, describe="; ".join(notes), tolerances=TOLERANCES,
                reference_args=reference_args,
                layout_reference=None if derived else "eager", nearby=8 if backward else 0)


def _writable(tensor: torch.Tensor) -> bool:
    """In-place fills need every element at its own address (no stride-0 broadcast dims)."""
    return all(stride != 0 or size <= 1 for size, stride in zip(tensor.shape, tensor.stride()))


def compile_kernels(module, arch: int = 90) -> list[str]:
    """Compiles every kernel of a generated row-wise module to a CUDA binary, without a GPU.

    The interpreter runs kernels as plain Python, so it accepts what the compiler rejects (a
    loop-carried value whose shape changes, a non-constexpr where one is needed). Both index widths
    (with masked tiles, with and without the grid-stride loop of ROW_LOOP; int32 with the constant
    masks of aligned sizes too) and the deepest row and column splits are compiled, with bf16 tensors and float arguments as float64, as
    torch.compile passes them: a kernel must take them to float32 at once, and one
    that computes in float64 raises. Needs Triton's NVIDIA backend (ptxas ships with it) and no
    TRITON_INTERPRET. Returns one line per kernel.
    """
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from specgen.runtime.rowwise import COL_RANK, ROW_RANK

    floats = {arg.name for arg in module.DESCRIPTION.args if arg.kind == "float"}
    done = []
    for name, kernel in sorted(vars(module).items()):
        if not name.endswith("_kernel"):
            continue
        fn = kernel
        while not isinstance(fn, triton.runtime.JITFunction):
            fn = fn.fn
        # (index width, grid-stride loop, alignment): masked tiles with and without the loop
        # in both widths, and the constant masks of aligned sizes
        for index_64, row_loop, align in ((False, False, 1), (True, True, 1), (False, True, 256)):
            constexprs = {"ROW_DIMS": ROW_RANK, "COL_DIMS": COL_RANK, "INDEX_64": index_64,
                          "BLOCK_M": 1 if "_split" in name else 2, "BLOCK_N": 256,
                          "SPLITS_BLOCK": 16, "BLOCK_P": 16, "BLOCK_C": 64,
                          "ROW_LOOP": row_loop, "M_ALIGN": align, "N_ALIGN": align}
            constexprs.update({a: True for a in fn.arg_names if a.startswith("HAS_")})
            signature, constants = {}, {}
            for i, arg in enumerate(fn.arg_names):
                if arg in constexprs:
                    signature[arg] = "constexpr"
                    constants[(i,)] = constexprs[arg]
                elif arg.endswith("_ptr"):
                    # the workspaces (split partials, column partials) are float32
                    signature[arg] = "*fp32" if arg.endswith("ws_ptr") else "*bf16"
                elif arg in floats:
                    signature[arg] = "fp64"
                else:
                    signature[arg] = "i64" if index_64 else "i32"
            binary = triton.compile(ASTSource(fn, signature, constants),
                                    target=GPUTarget("cuda", arch, 32), options={"num_warps": 4})
            # float64 may appear in the parameters and their one truncation to float32, not after
            wide = [line.strip() for line in binary.asm["ttgir"].splitlines()
                    if "f64" in line and "arith.truncf" not in line and "tt.func" not in line]
            if wide:
                raise AssertionError(f"{name}: float64 math under torch.compile: {wide[:3]}")
            done.append(f"{name} int{64 if index_64 else 32}")
    return done


def rowwise_samples(info: OpInfo, make: Make) -> dict[str, list[tuple]]:
    """A transposed 3 x 5 row tensor reduced over its last dim, then a 2 x 3 x 5 one over its two
    last (by normalized shape) or its last (by dim), optional tensors omitted and keepdim on;
    tensors along the rows shaped as the reduced dims, the others as the row tensor."""
    launch = _launch(info)

    def call(shape: tuple[int, ...], full: bool):
        reduced = shape[1:] if launch.normalized_shape and len(shape) == 3 else shape[-1:]
        args = []
        for a in info.args:
            if a.kind == "tensor":
                if a.optional and not full:
                    args.append(None)
                elif a.name == launch.row_tensor:
                    args.append(make.t(*shape, g=True) if len(shape) == 2
                                else make.r(*shape, g=True))
                else:
                    args.append(make.r(*(reduced if a.name in launch.along else shape), g=True))
            elif a.name == launch.normalized_shape:
                args.append(list(reduced))
            elif a.name == launch.dim:
                args.append([-1] if a.kind == "shape" else -1)
            elif a.name == launch.keepdim:
                args.append(not full)
            else:
                args.append(default(a))
        return tuple(args)

    return {info.name: [call((3, 5), True), call((2, 3, 5), False)]}

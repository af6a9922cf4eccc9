"""Host side of the convolution family: torch's geometry arguments, shape checks, the output's
memory format, the strategy and the launches (docs/families.md, "Convolution family").

Strategies (``runtime.override(strategy=...)`` forces one):

- ``gemm``: the implicit-GEMM kernel on the tensors as they are (any strides);
- ``gemm_repack``: the same, after copying an NCHW-contiguous input, and a weight whose input
  channels are not contiguous, to channels-last (one transpose kernel each): the kernel's loads
  then run along contiguous channels. Auto picks it for such inputs with 16 input channels a
  group or more; the copies are part of the op, and of its time;
- ``depthwise``: one input channel a group (depthwise convolutions): each output channel reads
  one input channel, a multiply-add per tap, without tl.dot (whose K would be 15/16 padding).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
from torch._prims_common import suggest_memory_format

from specgen.runtime.checks import as_int, check_interpreted_dot, check_tensors
from specgen.runtime.context import interpreting, note_launch, overrides
from specgen.runtime.launch import (capped_programs, choose_int64, launch, multiprocessors,
                                    plan_cache, shared_memory)
from specgen.runtime.matmul import (MIN_DOT_BLOCK, TMA_ALIGN, accumulator_fits, fit_tiles,
                                   has_tma, input_precision, tile_fits, tma_aligned)
from specgen.runtime.layout import cdiv, next_power_of_2, span
from specgen.runtime.op import FamilyRuntime, Op
from specgen.runtime.replay import empty

STRATEGIES = ("gemm", "gemm_repack", "flat", "tma", "depthwise")
# input channels a group from which auto takes the TMA kernel (where it can)
TMA_CHANNELS = 128
# the TMA kernel's widest channel block: Triton 3.6 computes wrong results with 256 (every
# shape tried on an H100), so the space's 256-wide configs run 128 wide there
TMA_MAX_BLOCK_N = 128
# the transpose kernel's tile (channels x pixels) and warps
REPACK_TILE = {"BLOCK_C": 32, "BLOCK_L": 64, "num_warps": 4}
# the depthwise kernel's tile (pixels x channels) and warps
DEPTHWISE_TILE = {"BLOCK_M": 64, "BLOCK_N": 32, "num_warps": 4}
# the flat (1 x 1) kernel's space: BLOCK_M pixels x BLOCK_N output channels a step of a
# program's walk, and PROGRAMS_PER_SM programs a multiprocessor sharing each channel block (a
# group's channels are one block, not a parameter: C_BLOCK); the first is the heuristic's.
# Measured on an H200 at N32 C64 56x56 K256 (docs/performance.md, 001f): 64 x 256 on 4 warps,
# 2 programs a multiprocessor, best channels-last; 8 warps, 4, over NCHW pixels.
FLAT_CONFIGS = tuple(
    {"BLOCK_M": m, "BLOCK_N": n, "PROGRAMS_PER_SM": programs, "num_warps": warps,
     "num_stages": 3}
    for m, n, programs, warps in ((64, 256, 2, 4), (64, 256, 4, 8), (64, 256, 1, 4),
                                  (64, 256, 2, 8), (128, 256, 1, 8), (64, 128, 2, 4),
                                  (128, 128, 2, 8)))
# the flat kernel's widest block of a group's channels, in bytes (128 half-precision channels, 64
# float32, 32 float64): within it the space's lead, 64 x 256 in 3 stages, takes 112 KiB of shared
# memory; past it, 224 KiB at 128 float32 channels and 448 at float64's (the implicit GEMM
# loops over such channels instead)
FLAT_MAX_BLOCK_BYTES = 256
_PADDINGS = ("same", "valid")


@dataclass(frozen=True)
class Launch:
    """The op's roles and geometry arguments (the generated module's literal)."""

    input: str
    weight: str
    epilogue: tuple[tuple[str, tuple[str, ...]], ...]   # epilogue operands: (name, dims)
    geometry: tuple[str, ...]       # the geometry arguments the op takes
    out_dtype: torch.dtype | None   # [epilogue] dtype, else the inputs'
    promoted: tuple[str, ...] = ()  # epilogue operands that promote with the result
    optional: tuple[str, ...] = ()  # optional epilogue operands (a HAS_<NAME> flag each)
    max_block_k: int = 64           # the config space's largest BLOCK_K (EVEN_C)


# ---- geometry ------------------------------------------------------------------------------------

def _ints(op: str, name: str, value: object, counts: Sequence[int]) -> list:
    """An int or a list of ints (``counts``: the lengths taken) as a list, or TypeError."""
    one = as_int(value, tensors=False)
    if one is not None:
        return [one]
    if isinstance(value, (list, tuple, torch.Size)):
        items = [as_int(v, tensors=False) for v in value]
        if all(i is not None for i in items) and len(items) in counts:
            return items
        if all(i is not None for i in items):
            raise ValueError(f"{op}: argument '{name}' must be one int or "
                             f"{' or '.join(map(str, counts[1:]))} ints, got {list(value)}")
    raise TypeError(f"{op}: argument '{name}' must be an int or a tuple of ints, got "
                    f"{type(value).__name__} {value!r}")


def geometry(op: str, values: dict, weight: torch.Tensor, registered: bool) -> dict:
    """stride, padding, dilation (two ints each, padding four: top, bottom, left, right) and
    groups, checked as torch checks them. ``registered``: the registered operator's forms (ints),
    else torch's too (padding "same" or "valid")."""
    if weight.dim() != 4:
        raise ValueError(f"{op}: argument 'weight' must be 4-D (out_channels, in_channels / "
                         f"groups, kH, kW), got shape {tuple(weight.shape)}")
    stride = _ints(op, "stride", values.get("stride", 1), (1, 2))
    dilation = _ints(op, "dilation", values.get("dilation", 1), (1, 2))
    stride, dilation = stride * (3 - len(stride)), dilation * (3 - len(dilation))
    if any(s <= 0 for s in stride):
        raise ValueError(f"{op}: argument 'stride' must be positive, got {stride}")
    if any(d <= 0 for d in dilation):
        raise ValueError(f"{op}: argument 'dilation' must be positive, got {dilation}")
    padding = values.get("padding", 0)
    if isinstance(padding, str):
        if registered or padding not in _PADDINGS:
            raise ValueError(f"{op}: argument 'padding' must be an int, a pair of ints, 'same' "
                             f"or 'valid', got {padding!r}")
        if padding == "valid":
            pads = [0, 0, 0, 0]
        else:
            if any(s != 1 for s in stride):
                raise ValueError(f"{op}: padding='same' is not supported for strided "
                                 f"convolutions (stride {stride})")
            # torch pads the extra row and column of an even filter at the bottom and right
            pads = []
            for d, size in zip(dilation, weight.shape[2:]):
                total = d * (size - 1)
                pads += [total // 2, total - total // 2]
    else:
        # torch's forms, and the four pads they are spelled out as (which the registered
        # operator takes, and the public function again where autograd calls it with them)
        pads = _ints(op, "padding", padding, (1, 2, 4))
        if len(pads) == 1:
            pads = pads * 4
        elif len(pads) == 2:
            pads = [pads[0], pads[0], pads[1], pads[1]]
        if any(p < 0 for p in pads):
            raise ValueError(f"{op}: argument 'padding' must not be negative, got {padding}")
    groups = values.get("groups", 1)
    taken = as_int(groups, tensors=False)
    if taken is None:
        raise TypeError(f"{op}: argument 'groups' must be an int, got {type(groups).__name__}")
    if taken <= 0:
        raise ValueError(f"{op}: argument 'groups' must be positive, got {taken}")
    return {"stride": stride, "padding": pads, "dilation": dilation, "groups": taken}


# ---- the launch plan -----------------------------------------------------------------------------

@dataclass(frozen=True)
class ConvPlan:
    """Everything a call's launches need that its sizes, strides and geometry decide."""

    shape: tuple[int, ...]          # the output's (N, K, P, Q)
    strides: tuple[int, ...]        # and its strides (torch's memory format)
    m: int                          # output pixels: N * P * Q
    n: int                          # output channels a group
    groups: int
    sizes: tuple[int, ...]          # the kernels' M, N, C, H, W, P, Q
    geometry: tuple[int, ...]       # stride, padding (top, left), dilation: kernel scalars
    strategy: str                   # what the launch notes: the kernel, gemm_repack after copies
    kernel: str                     # gemm, flat, tma or depthwise
    repack_input: bool
    repack_weight: bool
    index_64: bool
    even_c: bool
    channel_block: int              # the flat kernel's C_BLOCK (0 for the others)
    flat_out: bool                  # outputs' pixels one run per image (NCHW)
    pixel_run: int                  # runs of this many pixels a mask and an NCHW output hold
    tile_w: int                     # the TMA kernel's patch width
    sms: int                        # multiprocessors: the TMA kernel's grid

    def grid(self, meta: dict) -> tuple[int]:
        return (cdiv(self.m, meta["BLOCK_M"]) * cdiv(self.n, meta["BLOCK_N"]) * self.groups,)

    def flat_grid(self, meta: dict) -> tuple[int, int]:
        """The 1 x 1 kernel's: its (group, channel block) pairs, by the programs that walk each
        one's pixel blocks: PROGRAMS_PER_SM a multiprocessor in all, at least one a pair, at
        most one a pixel block."""
        _, _, out_h, out_w = self.shape
        pairs = self.groups * cdiv(self.n, meta["BLOCK_N"])
        blocks = self.shape[0] * cdiv(out_h * out_w, meta["BLOCK_M"])
        programs = capped_programs(self.sms * meta["PROGRAMS_PER_SM"])
        return (pairs, max(1, min(blocks, programs // pairs)))

    def tma_grid(self, meta: dict) -> tuple[int]:
        """One program per multiprocessor (or per tile, where fewer)."""
        _, _, out_h, out_w = self.shape
        tile_h = meta["BLOCK_M"] // self.tile_w
        patches = cdiv(out_h, tile_h) * cdiv(out_w, self.tile_w)
        return (min(self.shape[0] * patches * cdiv(self.n, meta["BLOCK_N"]), self.sms),)

    def depthwise_grid(self, meta: dict) -> tuple[int, int]:
        return (cdiv(self.m, meta["BLOCK_M"]), cdiv(self.n * self.groups, meta["BLOCK_N"]))


def _channels_last(shape: Sequence[int], strides: Sequence[int]) -> bool:
    return suggest_memory_format(torch.empty_strided(shape, strides, device="meta")) \
        == torch.channels_last


def _channels_last_pair(x_shape: Sequence[int], x_strides: Sequence[int],
                        w_shape: Sequence[int], w_strides: Sequence[int],
                        weight_copied: bool) -> bool:
    """Whether torch lays a convolution's output out channels-last (before the device rules of
    ``output_channels_last``), as torch decides it twice: from the given input and weight (the
    backend's memory format), then from what the backend takes: the input's copy in that
    format and, where ``weight_copied``, the weight's (the CPU's backends copy both, cuDNN only
    the input). A copy of an ambiguous shape may not read channels-last any more: a (K, 1, 1, 1)
    weight of strides (2, 1, 2, 1) does, its copy, strides (1, 1, 1, 1), does not."""
    if not (_channels_last(x_shape, x_strides) or _channels_last(w_shape, w_strides)):
        return False

    def copied(shape, strides) -> bool:
        copy = torch.empty_strided(shape, strides, device="meta").contiguous(
            memory_format=torch.channels_last)
        return suggest_memory_format(copy) == torch.channels_last
    return copied(x_shape, x_strides) or (copied(w_shape, w_strides) if weight_copied
                                          else _channels_last(w_shape, w_strides))


def _nchw(shape: Sequence[int], strides: Sequence[int]) -> bool:
    """Whether each (batch, channel) plane is contiguous: one run of H * W elements, which the
    transpose kernel reads along."""
    return strides[3] == 1 and (shape[2] == 1 or strides[2] == shape[3])


@plan_cache
def conv_plan(op: str, indexing: str, x_shape: tuple, x_strides: tuple, w_shape: tuple,
              w_strides: tuple, stride: tuple, pads: tuple, dilation: tuple, groups: int,
              spans: tuple, max_block_k: int, forced: str | None, element_size: int,
              device: str, cudnn: bool, knobs: object) -> ConvPlan:
    batch, channels, height, width = x_shape
    out_channels, c_group, kh, kw = w_shape
    if channels != c_group * groups:
        raise ValueError(f"{op}: given groups={groups} and weight of shape {list(w_shape)}, "
                         f"expected 'input' to have {c_group * groups} channels, got {channels}")
    if out_channels % groups:
        raise ValueError(f"{op}: given groups={groups}, expected 'weight' to have a multiple of "
                         f"{groups} output channels, got {out_channels}")
    if out_channels == 0:
        raise ValueError(f"{op}: argument 'weight' has no output channels (shape "
                         f"{list(w_shape)}), which torch refuses too")
    if height == 0 or width == 0:
        raise ValueError(f"{op}: argument 'input' is {height} x {width} per channel; torch takes "
                         f"an empty batch or channel dim, not an empty image")
    padded_h, padded_w = height + pads[0] + pads[1], width + pads[2] + pads[3]
    extent_h, extent_w = dilation[0] * (kh - 1) + 1, dilation[1] * (kw - 1) + 1
    if extent_h > padded_h or extent_w > padded_w:
        raise ValueError(f"{op}: argument 'input' is {padded_h} x {padded_w} per channel with "
                         f"its padding, smaller than the 'weight' filter's {extent_h} x "
                         f"{extent_w} (with its dilation)")
    out_h = (padded_h - extent_h) // stride[0] + 1
    out_w = (padded_w - extent_w) // stride[1] + 1
    shape = (batch, out_channels, out_h, out_w)
    # torch's memory format: channels-last where the input or the weight is (on CUDA, as cuDNN)
    # (the only 8-byte dtype a convolution takes is float64)
    if output_channels_last(device, element_size == 8,
                            _channels_last_pair(x_shape, x_strides, w_shape, w_strides,
                                                weight_copied=not device.startswith("cuda")),
                            cudnn):
        strides = (out_h * out_w * out_channels, 1, out_w * out_channels, out_channels)
    else:
        strides = (out_channels * out_h * out_w, out_h * out_w, out_w, 1)
    n = out_channels // groups
    m = batch * out_h * out_w
    nchw_input = x_strides[1] != 1 and _nchw(x_shape, x_strides)
    # the flat kernel's one block of a group's channels: the power of two at or above them, at
    # least tl.dot's least K
    channel_block = max(MIN_DOT_BLOCK, next_power_of_2(c_group))
    # a 1 x 1 filter at stride 1 without padding over pixels one stride apart (the height's is
    # the width's times the width), a group's channels one block of FLAT_MAX_BLOCK_BYTES at
    # most: a GEMM per image, the flat kernel's
    flat = (kh == kw == 1 and stride == (1, 1) and not any(pads)
            and x_strides[2] == width * x_strides[3]
            and channel_block * element_size <= FLAT_MAX_BLOCK_BYTES)
    if forced is None:
        # measured on an H100 (docs/performance.md, 000v): the TMA kernel wins from 128 input
        # channels a group (a long K loop), loses below (the pointer kernel's 64-channel 3 x 3:
        # 31.8 us against 36.3); the channels-last copy pays for 3 x 3 filters, not for 1 x 1
        # ones, which read each input element once (49 us direct against 59); under 128
        # channels a group the flat kernel where it applies, over channels-last or NCHW pixels:
        # on an H200 at N32 C64 56x56 K256 it took 26.2-28.0 us against the implicit GEMM's
        # 33.7-39.6 (item 001d), 23-24 since it walks pixel blocks with its weight held (001f);
        # from 128 it was not measured
        forced = ("depthwise" if c_group == 1 else "tma" if c_group >= TMA_CHANNELS
                  else "flat" if flat
                  else "gemm_repack" if nchw_input and c_group >= MIN_DOT_BLOCK and kh * kw > 1
                  else "gemm")
    # an NCHW input (and weight) copied to channels-last first, for the GEMM kernels' loads
    # (not for the TMA kernel's 1 x 1 filters: the copy does not pay there)
    repack = forced == "gemm_repack" or (forced == "tma" and c_group >= MIN_DOT_BLOCK
                                         and kh * kw > 1)
    repack_input = repack and nchw_input and batch <= 65535
    repack_weight = repack and _nchw(w_shape, w_strides) and w_strides[1] != 1 \
        and out_channels <= 65535
    # the copies are dense (a stride-0 input's too): their sizes count for the index width
    copies = {"input copy": batch * channels * height * width if repack_input else 0,
              "weight copy": out_channels * c_group * kh * kw if repack_weight else 0}
    x_after = (height * width * channels, 1, width * channels, channels) if repack_input \
        else x_strides
    # the implicit GEMM adds a tap's offset to each pixel's window address, and a window may
    # start up to the filter's extent before the input (its padding): offsets of that reach,
    # however small the input
    reach = (extent_h - 1) * x_after[2] + (extent_w - 1) * x_after[3]
    index_64 = choose_int64(op, indexing, dict(spans, out=m * out_channels, **copies,
                                               **{"filter reach": reach}), 1 << 16)
    w_after = (kh * kw * c_group, 1, kw * c_group, c_group) if repack_weight else w_strides
    kernel = "depthwise" if forced == "depthwise" else "flat" if forced == "flat" and flat \
        else "gemm"
    if forced == "tma" and tma_describable(x_after, w_shape, w_after, stride, groups,
                                           element_size, index_64, device):
        kernel = "tma"
    # each image's pixels one run per channel (an NCHW output, or one of one channel)
    flat_out = strides[3] == 1 and strides[2] == out_w
    tile_w = min((16, 8), key=lambda t: (cdiv(out_w, t) * t, -t))
    if kernel == "tma":
        # runs of a patch row, each starting on a multiple of the run
        run = next((r for r in (16, 8) if tile_w % r == 0 and out_w % r == 0), 1)
    else:
        run = next((r for r in (16, 8) if (out_h * out_w) % r == 0), 1)
    strategy = kernel if kernel != "gemm" else ("gemm_repack" if repack_input or repack_weight
                                                else "gemm")
    # whether every channel block is whole
    even_c = c_group == channel_block if kernel == "flat" else c_group % max_block_k == 0
    return ConvPlan(shape=shape, strides=strides, m=m, n=n, groups=groups,
                    sizes=(m, n, c_group, height, width, out_h, out_w),
                    geometry=(stride[0], stride[1], pads[0], pads[2], dilation[0], dilation[1]),
                    strategy=strategy, kernel=kernel, repack_input=repack_input,
                    repack_weight=repack_weight, index_64=index_64,
                    even_c=even_c, channel_block=channel_block if kernel == "flat" else 0,
                    flat_out=flat_out,
                    pixel_run=run if flat_out or kernel == "flat" else 1, tile_w=tile_w,
                    sms=multiprocessors(torch.device(device)) if kernel in ("tma", "flat")
                    else 0)


def tma_describable(x_strides: tuple, w_shape: tuple, w_strides: tuple, stride: tuple,
                    groups: int, element_size: int, index_64: bool, device: str) -> bool:
    """Whether the TMA kernel can take the call: stride 1 and one group (its input tile is a
    shifted patch), on Hopper or later, int32 offsets, and tensors TMA descriptors describe:
    channels contiguous, the weight's taps one stride apart, other strides positive multiples of
    16 bytes (the base addresses are checked per call: ``tma_aligned``); not float64, which has
    no wgmma form (the pointer kernel's dots are mma.sync m8n8k4 f64)."""
    where = torch.device(device)
    if where.type != "cuda" or interpreting() or not has_tma(where.index or 0) or element_size == 8:
        return False
    if stride != (1, 1) or groups != 1 or index_64 or x_strides[1] != 1 or w_strides[1] != 1:
        return False
    kh, kw = w_shape[2:]
    if kh > 1 and kw > 1 and w_strides[2] != kw * w_strides[3]:
        return False
    # the kernel steps over taps by the weight's column stride, or its row stride for 1-wide
    # filters (for a 1 x 1 filter, which has one tap, by C: any aligned value)
    tap = w_strides[3] if kw > 1 else w_strides[2] if kh > 1 else w_shape[1]
    kept = (x_strides[0], x_strides[2], x_strides[3], w_strides[0], tap)
    return all(v > 0 and v * element_size % TMA_ALIGN == 0 for v in kept)


# ---- configs -------------------------------------------------------------------------------------

def prune_configs(configs, named_args, **kwargs):
    """``early_config_prune``: blocks clamped to the problem (a group of 32 channels takes
    32-channel blocks) and the configs that become equal merged; configs whose pipelined tiles
    exceed the shared memory dropped unless nothing else is left (the matmul family's rules)."""
    return _pruned(configs, named_args)


def prune_flat_configs(configs, named_args, **kwargs):
    """The flat kernel's configs with pixel blocks fitted to one image's pixels (a flat block
    never spans two images: fitted to the batch's, a 7 x 7 image would leave 79 of 128 rows
    idle) and channel blocks to a group's, the configs that become equal merged; those whose
    pipelined input tiles and one weight block exceed the shared memory dropped, as those whose
    accumulator takes more than 128 registers a thread (where none is left, the one of least
    shared memory: the planner's FLAT_MAX_BLOCK_BYTES keeps that within the device's)."""
    x = named_args["input_ptr"]
    pixels = named_args["out_h"] * named_args["out_w"]
    fitted = fit_tiles(configs, {"BLOCK_M": pixels, "BLOCK_N": named_args["N"]})
    channels, size = kwargs["C_BLOCK"], x.element_size()
    limit = shared_memory(x.device)

    def shared(config) -> int:
        meta = config.kwargs
        return (meta["BLOCK_M"] * config.num_stages + meta["BLOCK_N"]) * channels * size

    kept = [c for c in fitted if shared(c) <= limit and accumulator_fits(c, size)]
    return kept or [min(fitted, key=shared)]


def prune_tma_configs(configs, named_args, **kwargs):
    """``prune_configs``, with channel blocks at most TMA_MAX_BLOCK_N."""
    return _pruned(configs, named_args, max_block_n=TMA_MAX_BLOCK_N)


def _pruned(configs, named_args, max_block_n: int | None = None) -> list:
    """The configs' tiles fitted (``fit_tiles``), BLOCK_N at most ``max_block_n``; those whose
    pipelined tiles exceed the shared memory dropped unless nothing else is left."""
    x = next(v for v in named_args.values() if hasattr(v, "element_size"))

    def cap(meta: dict) -> None:
        if max_block_n is not None:
            meta["BLOCK_N"] = min(meta["BLOCK_N"], max_block_n)

    sizes = {"BLOCK_M": named_args["M"], "BLOCK_N": named_args["N"], "BLOCK_K": named_args["C"]}
    fitted = fit_tiles(configs, sizes, cap)
    limit = shared_memory(x.device)
    return [c for c in fitted if tile_fits(c, x.element_size(), limit)] or fitted[:1]


def replay_settings() -> tuple[bool, bool]:
    """The global state conv launches depend on (part of a replay's call signature): cuDNN's
    float32 precision setting, and whether cuDNN is enabled (torch's CUDA output layout)."""
    return torch.backends.cudnn.allow_tf32, torch.backends.cudnn.enabled


def output_channels_last(device: str, float64: bool, channels_last: bool, cudnn: bool) -> bool:
    """Whether torch lays a convolution's output out channels-last: where the input or the weight
    is (``channels_last``, see _channels_last_pair), on the CPU; on CUDA as its cuDNN path does
    (cudnn_conv_suggest_memory_format), which keeps float64 contiguous, and contiguous where
    cuDNN is off (torch's own CUDA kernels)."""
    if not channels_last:
        return False
    return not device.startswith("cuda") or (cudnn and not float64)


# ---- the family runtime --------------------------------------------------------------------------

class Conv(FamilyRuntime):
    """2-D convolutions with fused epilogues. Kernels: ``gemm`` (the implicit GEMM), ``flat`` (a
    GEMM per image for 1 x 1 filters), ``tma`` (the implicit GEMM through TMA copies),
    ``depthwise`` and ``repack`` (a (B, C, L) -> (B, L, C) transpose)."""

    doc_note = "computed by one fused kernel (after a channels-last copy of an NCHW input)."

    def replay_state(self) -> Callable[[], object]:
        return replay_settings

    def spell_out(self, op: Op, args: tuple) -> tuple:
        layout: Launch = op.description.launch
        if not layout.geometry:
            return args
        names = [a.name for a in op.description.args]
        values = dict(zip(names, args))
        spelled = geometry(op.name, values, values[layout.weight], registered=False)
        return tuple(spelled[name] if name in layout.geometry else value
                     for name, value in zip(names, args))

    def run(self, op: Op, args: tuple) -> Any:
        d = op.description
        layout: Launch = d.launch
        values = dict(zip((a.name for a in d.args), args))
        x, w = values[layout.input], values[layout.weight]
        epilogue = {name: values[name] for name, _ in layout.epilogue}
        tensors = {layout.input: x, layout.weight: w,
                   **{n: t for n, t in epilogue.items() if t is not None}}
        device = check_tensors(op.name, tensors, d.dtypes)
        _check_dtypes(op.name, tensors, layout.promoted)
        geo = geometry(op.name, values, w, registered=True)
        if x.dim() not in (3, 4):
            raise ValueError(f"{op.name}: argument '{layout.input}' must be 3-D (C, H, W) or 4-D "
                             f"(N, C, H, W), got shape {tuple(x.shape)}")
        unbatched = x.dim() == 3
        # the kernels index every tensor as 4-D: an unbatched one has one batch element (its
        # stride unused); they take the call's tensors themselves, which replays require
        x_shape, x_strides = _four_d(x)
        # every tensor a kernel reads decides the index width (a bias or residual may be a
        # view reaching far into its storage)
        spans = {name: span(tuple(t.shape), tuple(t.stride())) for name, t in tensors.items()}
        spans[layout.input] = span(x_shape, x_strides)
        knobs = overrides()
        forced = knobs.strategy
        if forced is not None and forced not in STRATEGIES:
            raise ValueError(f"{op.name}: unknown strategy {forced!r}; expected one of "
                             f"{', '.join(STRATEGIES)}")
        if forced == "depthwise" and w.shape[1] != 1:
            forced = None
        plan = conv_plan(op.name, d.indexing, x_shape, x_strides, tuple(w.shape),
                         tuple(w.stride()), tuple(geo["stride"]), tuple(geo["padding"]),
                         tuple(geo["dilation"]), geo["groups"], tuple(sorted(spans.items())),
                         layout.max_block_k, forced, x.element_size(), str(device),
                         torch.backends.cudnn.enabled, (knobs.indexing,))
        if plan.kernel != "depthwise":  # the others multiply tiles with tl.dot
            check_interpreted_dot(op.name, x.dtype, device)
        shape = plan.shape[1:] if unbatched else plan.shape
        strides = plan.strides[1:] if unbatched else plan.strides
        operands = {}
        for name, dims in layout.epilogue:
            t = epilogue[name]
            if t is None:
                operands[name] = None
            elif dims == ("K",):
                if t.dim() != 1 or t.shape[0] != plan.shape[1]:
                    raise ValueError(f"{op.name}: argument '{name}' must have shape "
                                     f"({plan.shape[1]},), one value per output channel, got "
                                     f"{tuple(t.shape)}")
                operands[name] = (t, tuple(t.stride()))
            else:
                operands[name] = (t, _broadcast_strides(op.name, name, t, shape))
        dtype = layout.out_dtype or x.dtype
        for name in layout.promoted:
            if epilogue[name] is not None:
                dtype = torch.promote_types(dtype, epilogue[name].dtype)
        outs = tuple(empty(shape, dtype, device, strides) for _ in d.outputs)
        if 0 not in plan.shape:
            _launch(op, plan, (x, x_strides), w, operands, outs, args)
        return outs[0] if len(outs) == 1 else outs


def _four_d(t: torch.Tensor) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """A 3-D (unbatched) or 4-D tensor's sizes and strides as 4-D ones."""
    if t.dim() == 3:
        return (1, *t.shape), (0, *t.stride())
    return tuple(t.shape), tuple(t.stride())


def _broadcast_strides(op: str, name: str, t: torch.Tensor, shape: tuple) -> tuple[int, ...]:
    """The 4-D strides reading ``t`` broadcast to the output's ``shape`` (stride 0 along a
    broadcast dim), or ValueError."""
    if t.dim() > len(shape) or any(size not in (1, full) for size, full
                                   in zip(reversed(t.shape), reversed(shape))):
        raise ValueError(f"{op}: argument '{name}' of shape {tuple(t.shape)} does not broadcast "
                         f"to the output's {tuple(shape)}")
    lead = len(shape) - t.dim()
    strides = (0,) * lead + tuple(st if size == full else 0 for size, st, full
                                  in zip(t.shape, t.stride(), shape[lead:]))
    return (0,) * (4 - len(strides)) + strides


def _check_dtypes(op: str, tensors: dict, promoted: Sequence[str]) -> None:
    """torch's conv2d takes one dtype for its input, weight and bias."""
    (first_name, first), *rest = [(n, t) for n, t in tensors.items() if n not in promoted]
    for name, t in rest:
        if t.dtype != first.dtype:
            raise TypeError(f"{op}: argument '{name}' has dtype {t.dtype}, but '{first_name}' "
                            f"has {first.dtype}; the convolution's operands must have one dtype")


def _repacked(op: Op, tensor: torch.Tensor, shape: tuple, strides: tuple,
              index_64: bool) -> tuple[torch.Tensor, tuple[int, ...]]:
    """``tensor`` of 4-D ``shape`` and ``strides`` (B, C, H, W) with contiguous planes, copied
    by the transpose kernel to a (B, H, W, C) allocation; with its strides as (B, C, H, W)."""
    b, c, h, w = shape
    out = empty((b, h, w, c), tensor.dtype, tensor.device)
    tile = REPACK_TILE
    launch(op.kernels["repack"], (cdiv(h * w, tile["BLOCK_L"]), cdiv(c, tile["BLOCK_C"]), b),
           tensor, out, c, h * w, strides[0], strides[1], INDEX_64=index_64, **tile)
    return out, (h * w * c, 1, w * c, c)


def _launch(op: Op, plan: ConvPlan, x: tuple, w: torch.Tensor, operands: dict, outs: tuple,
            args: tuple) -> None:
    d = op.description
    layout: Launch = d.launch
    x, x_strides = x
    w_shape, w_strides = tuple(w.shape), tuple(w.stride())
    if plan.repack_input:
        x, x_strides = _repacked(op, x, _four_d(x)[0], x_strides, plan.index_64)
    if plan.repack_weight:
        w, w_strides = _repacked(op, w, w_shape, w_strides, plan.index_64)
    # a TMA descriptor's base must be 16-byte aligned: a call's property (a slice may start
    # anywhere); the pointer kernel takes the others
    kernel, strategy = plan.kernel, plan.strategy
    if kernel == "tma" and not tma_aligned(x, w):
        kernel = "gemm"
        strategy = "gemm_repack" if plan.repack_input or plan.repack_weight else "gemm"
    note_launch(op.name, strategy, plan.index_64, repack_input=plan.repack_input,
                repack_weight=plan.repack_weight)
    tensors, strides = [], []
    for (name, dims) in layout.epilogue:
        entry = operands[name]
        # an omitted optional operand: its flag is off, and the kernel never reads the pointer
        tensors.append(x if entry is None else entry[0])
        strides += [0] * len(dims) if entry is None else list(entry[1])
    for o in outs:
        tensors.append(o)
        strides += list(_four_d(o)[1])
    scalars = [args[i] for i in d.scalar_positions]
    flags = d.choices_of(args)
    # an omitted optional operand: its kernel flag is off
    flags.update({f"HAS_{name.upper()}": operands[name] is not None for name in layout.optional})
    # the filter's size is a constexpr: under torch.compile with dynamic shapes, a guard
    common = dict(R=int(w_shape[2]), S=int(w_shape[3]), INDEX_64=plan.index_64,
                  FLAT_OUT=plan.flat_out, PIXEL_RUN=plan.pixel_run)
    sizes = plan.sizes
    if kernel == "depthwise":
        # the depthwise kernel's N counts every output channel, its C those of a group
        m, n, c, *rest = sizes
        sizes = (m, n * plan.groups, n, *rest)
    arguments = (x, w, *tensors, *sizes, *x_strides, *w_strides, *strides, *plan.geometry,
                 *scalars)
    if kernel == "depthwise":
        launch(op.kernels["depthwise"], plan.depthwise_grid, *arguments, **flags, **common,
               **DEPTHWISE_TILE)
        return
    # float32 follows torch's cuDNN setting (TF32 by default for convolutions, unlike matmuls)
    precision = input_precision(x.dtype, torch.backends.cudnn.allow_tf32)
    if kernel == "tma":
        launch(op.kernels["tma"], plan.tma_grid, *arguments, **flags, **common,
               TILE_W=plan.tile_w, INPUT_PRECISION=precision, tune_key=(plan, x.dtype))
        return
    if kernel == "flat":
        launch(op.kernels["flat"], plan.flat_grid, *arguments, **flags, **common,
               EVEN_C=plan.even_c, C_BLOCK=plan.channel_block, INPUT_PRECISION=precision,
               tune_key=(plan, x.dtype))
        return
    launch(op.kernels["gemm"], plan.grid, *arguments, **flags, **common, EVEN_C=plan.even_c,
           INPUT_PRECISION=precision, tune_key=(plan, x.dtype))


RUNTIME = Conv()

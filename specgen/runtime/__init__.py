"""Runtime support imported by generated modules: checks, layouts, launch decisions."""

from specgen.runtime.autograd import (differentiable_call, differentiate_by_reference,
                                      reference_vjp, sibling)
from specgen.runtime.checks import (broadcast_shape, check_choice, check_dtype_arg, check_no_grad,
                                    check_out, check_outs_disjoint, check_scalar,
                                    check_tensor_types, check_tensors)
from specgen.runtime.launch import (Launch, choose_int64, configs, grid_size, interpreting, launch,
                                    max_programs, note_launch, override, overrides, record_launches,
                                    runs_eagerly, untraced, use_int64)
from specgen.runtime.layout import (Collapsed, broadcast_strides, collapse, dense_strides,
                                    memory_order, next_power_of_2, storage_span)
from specgen.runtime.registry import ArgInfo, OpInfo
from specgen.runtime import replay
from specgen.runtime.replay import Replays, empty, full, zeros

__all__ = [
    "ArgInfo", "Collapsed", "Launch", "OpInfo", "Replays", "empty", "replay", "full", "zeros", "broadcast_shape", "broadcast_strides",
    "check_choice", "check_dtype_arg", "check_no_grad", "check_out", "check_outs_disjoint", "check_scalar", "check_tensor_types", "check_tensors", "collapse",
    "configs", "dense_strides", "differentiable_call", "differentiate_by_reference", "grid_size", "interpreting", "launch", "max_programs", "memory_order",
    "next_power_of_2", "note_launch", "override", "overrides", "record_launches", "reference_vjp", "runs_eagerly",
    "sibling", "storage_span",
    "untraced",
    "use_int64", "choose_int64",
]

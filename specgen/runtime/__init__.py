"""Runtime support imported by generated modules: checks, layouts, launch decisions."""

from specgen.runtime.autograd import (differentiable_call, differentiate_by_reference,
                                      op_function, reference_grads, reference_vjp,
                                      sibling)
from specgen.runtime.checks import (OUT_NOT_DIFFERENTIABLE, as_scalar, broadcast_shape,
                                    check_choice, check_dtype_arg, check_no_grad, check_out,
                                    check_outs_disjoint, check_tensor_types, check_tensors)
from specgen.runtime.context import (interpreting, note_launch, override, record_launches,
                                     runs_eagerly, untraced)
from specgen.runtime.cross_entropy import validating
from specgen.runtime.launch import configs, launch, use_int64
from specgen.runtime.layout import next_power_of_2
from specgen.runtime.op import Op, OpDescription
from specgen.runtime.registry import ArgInfo, OpInfo
from specgen.runtime import autocast, replay
from specgen.runtime.replay import Replays, empty, full, zeros

__all__ = [
    "OUT_NOT_DIFFERENTIABLE", "ArgInfo", "Op", "OpDescription", "OpInfo", "Replays", "as_scalar",
    "autocast", "broadcast_shape", "check_choice", "check_dtype_arg", "check_no_grad", "check_out", "check_outs_disjoint",
    "check_tensor_types", "check_tensors", "configs", "differentiable_call",
    "differentiate_by_reference", "empty", "full", "interpreting", "launch", "next_power_of_2",
    "note_launch", "op_function", "override", "record_launches", "reference_grads",
    "reference_vjp", "replay", "runs_eagerly", "sibling", "untraced", "use_int64", "validating",
    "zeros",
]

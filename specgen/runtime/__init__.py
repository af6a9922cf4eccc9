"""The runtime generated modules build on (``Op``, ``OpDescription``, ``ArgInfo``, ``configs``,
``reference_vjp``, ``autocast``), and what tests, tools and users reach for: the test overrides,
launch logs, replays, the validating mode. Family runtimes are the modules of this package."""

from specgen.runtime.autograd import reference_vjp
from specgen.runtime.context import interpreting, override, record_launches, runs_eagerly
from specgen.runtime.cross_entropy import validating
from specgen.runtime.launch import configs, launch, use_int64
from specgen.runtime.op import Op, OpDescription
from specgen.runtime.registry import ArgInfo, OpInfo
from specgen.runtime import autocast, replay
from specgen.runtime.replay import Replays, empty

__all__ = [
    "ArgInfo", "Op", "OpDescription", "OpInfo", "Replays", "autocast", "configs", "empty",
    "interpreting", "launch", "override", "record_launches", "reference_vjp", "replay",
    "runs_eagerly", "use_int64", "validating",
]

"""Cross-entropy family: ``F.cross_entropy`` over (N, C) logits, forward and backward kernels.

Its own family rather than a reduce spec: two reductions per row (an online logsumexp and the
label-smoothing sum), a gather of the target logit, class weights, a reduction over rows that is
normalized by the gathered weights, and a backward kernel registered through autograd. The spec
fixes the signature (checked here) and picks the config space in ``[tuning]``.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from specgen.families.common import CommonPlan, common_plan, power_of_two_list
from specgen.model import ChoiceArg, OpSpec, ScalarArg, TensorArg
from specgen.table import Table

# (name, kind, what) of the arguments, in order: the signature of F.cross_entropy
SIGNATURE = (("logits", "tensor", "tensor"), ("target", "tensor", "tensor"),
             ("weight", "tensor", "optional tensor"), ("ignore_index", "int", "int, default -100"),
             ("reduction", "choice", "choice of none, mean, sum, default mean"),
             ("label_smoothing", "float", "float, default 0.0"))
REDUCTIONS = ("none", "mean", "sum")


@dataclass(frozen=True)
class CrossEntropyBody:
    blocks: tuple[int, ...]
    num_warps: tuple[int, ...]


def parse_body(top: Table, spec_args: tuple, name: str) -> CrossEntropyBody:
    where = top.where.child("args")
    names = tuple(a.name for a in spec_args)
    if names != tuple(s[0] for s in SIGNATURE):
        raise where.error("a cross_entropy op takes exactly " +
                          ", ".join(f"{n} ({w})" for n, _, w in SIGNATURE) + f"; got {', '.join(names)}")
    logits, target, weight, ignore, reduction, smoothing = spec_args
    ok = (isinstance(logits, TensorArg) and not logits.optional
          and isinstance(target, TensorArg) and not target.optional
          and isinstance(weight, TensorArg) and weight.optional
          and isinstance(ignore, ScalarArg) and ignore.type == "int" and ignore.default == -100
          and isinstance(reduction, ChoiceArg) and reduction.values == REDUCTIONS
          and reduction.default == "mean"
          and isinstance(smoothing, ScalarArg) and smoothing.type == "float"
          and smoothing.default == 0.0)
    if not ok:
        raise where.error("expected " + ", ".join(f"{n} ({w})" for n, _, w in SIGNATURE))
    tuning = top.pop_table("tuning", required=False) or Table({}, top.where.child("tuning"))
    # vocabulary chunk per loop step: a long row is read once, in chunks, with an online max
    blocks = power_of_two_list(tuning, "BLOCK_V", (2048, 4096))
    num_warps = power_of_two_list(tuning, "num_warps", (4, 8))
    tuning.finish()
    return CrossEntropyBody(blocks, num_warps)


@dataclass(frozen=True)
class CrossEntropyPlan(CommonPlan):
    configs: tuple[dict, ...] = ()

    @property
    def max_block(self) -> int:
        return max(c["BLOCK_V"] for c in self.configs)


def plan(spec: OpSpec) -> CrossEntropyPlan:
    body: CrossEntropyBody = spec.body
    configs = tuple({"BLOCK_V": b, "num_warps": w}
                    for b, w in itertools.product(body.blocks, body.num_warps))
    return CrossEntropyPlan(**common_plan(spec, ("loss",)).__dict__, configs=configs)


def scaffold(name: str) -> str:
    return f'''# A cross_entropy op: see README.md, "Cross-entropy".
[op]
name = "{name}"
family = "cross_entropy"
doc = "cross entropy of (N, C) logits against class targets"
reference = "F.cross_entropy(logits, target, weight, ignore_index=ignore_index, reduction=reduction, label_smoothing=label_smoothing)"

[args]
logits = "tensor"
target = "tensor"
weight = {{ kind = "tensor", optional = true }}
ignore_index = {{ kind = "int", default = -100 }}
reduction = {{ kind = "choice", values = ["none", "mean", "sum"], default = "mean" }}
label_smoothing = {{ kind = "float", default = 0.0 }}
'''

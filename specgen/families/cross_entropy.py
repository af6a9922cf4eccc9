"""Cross-entropy family: ``F.cross_entropy`` over (N, C) logits, forward and backward kernels.

Its own family rather than a reduce spec: two reductions per row (an online logsumexp and the
label-smoothing sum), a gather of the target logit, class weights, a reduction over rows that is
normalized by the gathered weights, and a backward kernel registered through autograd. The spec
fixes the signature (checked here) and picks the config space in ``[tuning]``.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from specgen.families.contract import Family
from specgen.families.common import CommonPlan, common_plan, power_of_two_list, warps_list
from specgen.model import ChoiceArg, OpSpec, ScalarArg, TensorArg
from specgen.table import Table

REDUCTIONS = ("none", "mean", "sum")
# the backward's kernels, registered as specgen::<op>_backward
OPERATOR_SUFFIXES = ("_backward",)
# name -> (what it must be, whether a parsed argument is that): the signature of F.cross_entropy
SIGNATURE = {
    "logits": ("a tensor", lambda a: isinstance(a, TensorArg) and not a.optional),
    "target": ("a tensor", lambda a: isinstance(a, TensorArg) and not a.optional),
    "weight": ("an optional tensor", lambda a: isinstance(a, TensorArg) and a.optional),
    "ignore_index": ("an int, default -100",
                     lambda a: isinstance(a, ScalarArg) and a.type == "int" and a.default == -100),
    "reduction": ("a choice of none, mean, sum, default mean",
                  lambda a: isinstance(a, ChoiceArg) and a.values == REDUCTIONS
                  and a.default == "mean"),
    "label_smoothing": ("a float, default 0.0",
                        lambda a: isinstance(a, ScalarArg) and a.type == "float"
                        and a.default == 0.0),
}

# the signature is fixed (SIGNATURE), so no argument of the author's can meet a generated name;
# the op's own name must not be its module's import of the family runtime
GENERATED_NAMES = frozenset({"cross_entropy_rt"})
GENERATED_PREFIXES: tuple[str, ...] = ()


@dataclass(frozen=True)
class CrossEntropyBody:
    blocks: tuple[int, ...]
    num_warps: tuple[int, ...]


def body_names(body: CrossEntropyBody) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """The signature is fixed (SIGNATURE): no names of the author's."""
    return ()


def parse_body(top: Table, spec_args: tuple, name: str) -> CrossEntropyBody:
    where = top.where.child("args")
    names = tuple(a.name for a in spec_args)
    if names != tuple(SIGNATURE):
        raise where.error("a cross_entropy op takes exactly " + ", ".join(SIGNATURE) +
                          f", in this order; got {', '.join(names)}")
    for arg in spec_args:
        what, matches = SIGNATURE[arg.name]
        if not matches(arg):
            raise where.child(arg.name).error(f"expected {what}, as F.cross_entropy takes it")
    tuning = top.pop_table("tuning", required=False) or Table({}, top.where.child("tuning"))
    # vocabulary chunk per loop step: a long row is read once, in chunks, with an online max
    blocks = power_of_two_list(tuning, "BLOCK_V", (2048, 4096))
    num_warps = warps_list(tuning, (4, 8))
    tuning.finish()
    return CrossEntropyBody(blocks, num_warps)


@dataclass(frozen=True)
class CrossEntropyPlan(CommonPlan):
    configs: tuple[dict, ...] = ()

    @property
    def value_ints(self) -> tuple[str, ...]:
        return ()  # ignore_index is compared with the int64 targets

    @property
    def compute_of(self) -> str:
        """The tensor whose dtype sets the math's (float64 for float64, else float32)."""
        return "logits"

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


FAMILY = Family(
    name="cross_entropy", parse_body=parse_body, body_names=body_names, plan=plan,
    scaffold=scaffold, generated_names=GENERATED_NAMES, generated_prefixes=GENERATED_PREFIXES,
    operator_suffixes=OPERATOR_SUFFIXES,
    # its benchmark rows are in the reduce section (bench/reduce.py)
    cases="specgen.testing.cross_entropy:cross_entropy_cases",
    samples="specgen.testing.cross_entropy:cross_entropy_samples")

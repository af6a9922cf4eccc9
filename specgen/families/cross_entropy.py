"""Cross-entropy family: ``F.cross_entropy`` over (N, C) logits, forward and backward kernels.

Its own family rather than a reduce spec: two reductions per row (an online logsumexp and the
label-smoothing sum), a gather of the target logit, class weights, a reduction over rows that is
normalized by the gathered weights, and a backward kernel registered through autograd. The spec
fixes the signature (checked here) and picks the config space in ``[tuning]``.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch

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
    return f'''# A cross_entropy op: see docs/families.md, "Cross-entropy".
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


# --- Its property tests, opcheck samples and benchmark cases -------------------------------------
# The tests and the bench call these (``FAMILY``'s draw_case, samples and bench); they import
# hypothesis, specgen.testing and bench where they run: the generator needs none of them.

# float32 math over C classes (float64 for float64 logits); the loss is rounded once to the
# logits dtype
TOLERANCES = {torch.float32: (1e-4, 1e-5), torch.float16: (1e-3, 1e-4),
              torch.bfloat16: (8e-3, 1e-4), torch.float64: (1e-10, 1e-12)}


def draw_case(draw, info):
    """A property-test call: any logits layout, ignored rows, weights, smoothing."""
    from hypothesis import strategies as st

    from specgen.testing.core import Case, device, knobs, layouts, make_tensor, sizes

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
    return Case(args, (), draw(knobs()), tolerances=TOLERANCES,
                describe=f"logits {tuple(logits.shape)} {dtype} strides {logits.stride()}; "
                         f"weight {weight is not None}; {args['reduction']} "
                         f"smoothing {args['label_smoothing']} ignore {ignore_index}")


def samples(info, make) -> dict[str, list[tuple]]:
    """Opcheck calls (``make``: specgen.testing.samples.Make): mean over 3 rows of 5 classes;
    then per row, transposed logits, class weights, an ignored row and label smoothing; its
    backward operator on what the forward saves."""
    target = torch.tensor([0, 4, 2], device=make.device)
    forward = [(make.r(3, 5, g=True), target, None, -100, "mean", 0.0),
               (make.t(3, 5, g=True), torch.tensor([1, -100, 3], device=make.device),
                make.r(5, lo=0.5), -100, "none", 0.1)]
    logits = make.r(3, 5)
    _, lse, denom = getattr(torch.ops.specgen, info.name)(logits, target, None, -100, "mean", 0.0)
    backward = [(torch.ones((), device=make.device), logits, target, None, lse, denom, -100,
                 "mean", 0.0)]
    return {info.name: forward, f"{info.name}_backward": backward}


def bench_cases(quick: bool) -> list:
    """The benchmark's rows (bench.harness.Case): the loss of bf16 logits over Llama 3's 128256
    classes, its forward and its forward and backward. Eager is ``F.cross_entropy`` on
    float32-upcast logits (what a bf16 training loop without a fused kernel does, the baseline
    of ../shared/DESIGN.md's 3.50 ms), cast back to bfloat16 so the outputs compare;
    torch.compile compiles that same function. --quick divides the rows by 16."""
    import torch.nn.functional as F

    from bench.harness import Case, ours

    def specgen(x, target):
        return ours().cross_entropy(x, target)

    def eager(x, target):
        return F.cross_entropy(x.float(), target).to(x.dtype)

    def gradient(fn):
        # the gradient, so the check compares what the backward wrote; autograd.grad leaves
        # x.grad alone
        return lambda x, target: torch.autograd.grad(fn(x, target), x)[0]

    dtype = torch.bfloat16
    rows, vocab = (256 if quick else 4096), 128256

    def make_inputs():
        x = torch.randn(rows, vocab, device="cuda", dtype=dtype, requires_grad=True)
        return x, torch.randint(0, vocab, (rows,), device="cuda")

    # the forward reads the logits once; with the backward it reads them again and writes the
    # gradient
    return [Case(family="cross_entropy", op=op, shape=f"{rows}x{vocab}", dtype=dtype,
                 make_inputs=make_inputs, specgen=ours_fn, eager=eager_fn,
                 bytes_moved=passes * rows * vocab * dtype.itemsize)
            for op, ours_fn, eager_fn, passes in (
                ("cross_entropy fwd", specgen, eager, 1),
                ("cross_entropy fwd+bwd", gradient(specgen), gradient(eager), 3))]


FAMILY = Family(
    name="cross_entropy", parse_body=parse_body, body_names=body_names, plan=plan,
    scaffold=scaffold, generated_names=GENERATED_NAMES, generated_prefixes=GENERATED_PREFIXES,
    operator_suffixes=OPERATOR_SUFFIXES,
    draw_case=draw_case, samples=samples, bench=bench_cases)

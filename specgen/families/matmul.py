"""Matmul family: C = A @ B with a fused epilogue over the float32 accumulator ``acc``.

Operands are identified by their ``dims``: the A operand has ``M, K``, the B operand ``K, N`` (or
``N, K``, a linear weight), epilogue operands ``N`` (a row vector such as a bias), ``M`` (a column
vector) or ``M, N`` (a residual, broadcast like torch). A leading ``"..."`` adds batch dims that
broadcast as in ``torch.matmul``; a leading ``"B"`` one batch dim that must match (``torch.bmm``).

Spec tables: ``[epilogue]`` (one output per key, over ``acc``, the epilogue operands, scalars and
earlier outputs; ``dtype`` sets the output dtype, default the inputs'; ``promote`` names the
epilogue operands that join by torch's type promotion rather than the matmul's one dtype), ``[schedule]``
(``swizzle``, ``split_k``) and ``[tuning]`` (the config space the autotuner searches: an
explicit ``configs`` list, or lists whose product is the space).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from specgen.errors import Where
from specgen.expr import Symbol, emit, helpers, parse_expr
from specgen.families.contract import Family
from specgen.families.common import (MAX_TILE, MAX_WARPS, CommonPlan, check_name, common_plan,
                                     int_list, symbols_of)
from specgen.model import DEFAULT_DTYPES as DTYPES, OpSpec, Output, TensorArg
from specgen.table import Table, check_type, parse_list

SWIZZLES = ("grouped", "swizzle2d", "none")
SPLIT_K_MODES = ("auto", "atomic", "off")
# batch dims after folding and collapsing that a "..." kernel walks (torch.matmul broadcasting
# leaves at most this many that cannot be merged in practice; more is a clear error at launch)
BROADCAST_BATCH_RANK = 3
# names the generated module binds for itself, in its kernels and host functions: a spec that
# declared one would shadow it or be shadowed (an entry ending in "_" stands for its numbered
# forms; tests/test_spec_errors.py checks the set against what the template binds)
GENERATED_NAMES = frozenset({
    "matmul_rt",  # its imports
    "acc", "batch", "batch_id", "bid", "col", "col0", "first_m", "group", "group_rows", "k",
    "k_start", "programs_in_group", "row", "row0", "slot", "tiles", "work", "ws_ptr", "ws_ptrs",
    "m", "n", "rest", "tile",  # the kernels' names the shipped specs' modules do not show
})
GENERATED_PREFIXES: tuple[str, ...] = ("offs_", "pid_", "mask_", "size_b")

# operand dims (without batch) by role
A_DIMS = ("M", "K")
B_DIMS = (("K", "N"), ("N", "K"))
EPILOGUE_DIMS = (("N",), ("M",), ("M", "N"))
CONFIG_KEYS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "num_warps", "num_stages")


def _config(m: int, n: int, k: int, warps: int, stages: int, group: int = 8) -> dict:
    return {"BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": k, "GROUP_M": group, "num_warps": warps,
            "num_stages": stages}


# The default config space, an explicit list (a product of lists would either miss these or
# explode). The first is what the interpreter runs unless a test forces another. Blocks are
# clamped to the problem at launch (a 16-row problem runs every config with 16 rows), and configs
# under 64 rows only run on problems that small (runtime/matmul.py, prune_configs).
DEFAULT_CONFIGS = (
    # large problems, one program per SM: the Hopper bf16/fp16 tiles closest to cuBLAS; GROUP_M
    # 16 won mm and linear_gelu at 4096^3 and 8192^3 on an H200, 8 won linear at 8192^3
    _config(128, 256, 64, warps=8, stages=3),
    _config(128, 256, 64, warps=8, stages=3, group=16),
    _config(256, 128, 64, warps=8, stages=3),
    _config(128, 128, 64, warps=8, stages=4),
    # 96 KB of shared memory: two programs per SM, so one's epilogue overlaps the other's K loop
    _config(128, 128, 64, warps=4, stages=3),
    # too few 128 x 128 tiles to fill the GPU, or float32 inputs (twice the shared memory);
    # 128 x 64 (the slowest at large sizes) left out
    _config(64, 128, 64, warps=4, stages=4),
    # small M (decode): B streams through, long K blocks keep more of it in flight; 16 x 32
    # tiles give a 4096-column output 128 programs, which may stream B without split-K
    # (16 x 32 x 256 won 16 x 4096 x 4096 on an H200)
    _config(16, 64, 128, warps=4, stages=4),
    _config(16, 128, 128, warps=4, stages=4),
    _config(16, 32, 128, warps=4, stages=4),
    _config(16, 32, 256, warps=4, stages=4),
)
# the product form: what a key left out takes
PRODUCT_DEFAULTS = {"BLOCK_M": (128,), "BLOCK_N": (256, 128), "BLOCK_K": (64,), "GROUP_M": (8,),
                    "num_warps": (8,), "num_stages": (3,)}
DEFAULT_SPLIT_K = (1, 2, 4, 8, 16)
# tl.dot needs every block dimension to be at least 16 (runtime/matmul.py's MIN_DOT_BLOCK, which
# clamps block sizes at launch; tests/test_matmul.py checks that they agree)
MIN_BLOCK = 16


@dataclass(frozen=True)
class Operand:
    """A tensor argument in the role its dims give it."""

    name: str
    dims: tuple[str, ...]
    optional: bool = False

    @property
    def batched(self) -> bool:
        return self.dims[0] in ("...", "B")

    @property
    def letters(self) -> str:
        """Its matrix dims as the kernel indexes them: A "mk", B "kn", epilogue "n", "m", "mn"."""
        dims = [d for d in self.dims if d not in ("...", "B")]
        if dims == ["N", "K"]:
            return "kn"   # a linear weight: the kernel reads it transposed through its strides
        return "".join(d.lower() for d in dims)

    @property
    def ptr(self) -> str:
        return f"{self.name}_ptr"

    @property
    def flag(self) -> str:
        return f"HAS_{self.name.upper()}"


@dataclass(frozen=True)
class MatmulBody:
    a: Operand
    b: Operand
    epilogue_inputs: tuple[Operand, ...]
    outputs: tuple[Output, ...]
    out_dtype: str | None
    promoted: tuple[str, ...]       # epilogue operands of their own dtype (``[epilogue] promote``)
    swizzle: str
    split_k: str
    tuning: dict


def _classify(arg: TensorArg, where: Where) -> Operand:
    dims = arg.dims
    if not dims:
        raise where.error("matmul tensors need dims, as in dims = [\"M\", \"K\"] (A), "
                          "[\"K\", \"N\"] or [\"N\", \"K\"] (B), [\"N\"] (a bias)")
    rest = dims[1:] if dims[0] in ("...", "B") else dims
    known = [A_DIMS, *B_DIMS, *EPILOGUE_DIMS]
    if tuple(rest) not in known:
        shown = ", ".join("[" + ", ".join(f'"{d}"' for d in k) + "]" for k in known)
        raise where.child("dims").error(
            f"expected one of {shown}, optionally after a leading \"...\" (broadcast batch dims) "
            f"or \"B\" (one batch dim), got {list(dims)}")
    operand = Operand(arg.name, tuple(dims), arg.optional)
    if "K" in rest and arg.optional:
        raise where.child("optional").error("the A and B operands cannot be optional")
    return operand


def body_names(body: MatmulBody) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """The names the body declares, with their keys: the outputs."""
    return tuple((o.name, ("epilogue", o.name)) for o in body.outputs)


def parse_body(top: Table, spec_args: tuple, name: str) -> MatmulBody:
    args_where = top.where.child("args")
    a = b = None
    epilogue_inputs = []
    for arg in spec_args:
        if not isinstance(arg, TensorArg):
            continue
        operand = _classify(arg, args_where.child(arg.name))
        if operand.letters in ("mk", "kn"):
            if (a if operand.letters == "mk" else b) is not None:
                role = "A (M, K)" if operand.letters == "mk" else "B (K, N or N, K)"
                raise args_where.child(arg.name).error(f"a second {role} operand; a matmul has one")
            a, b = (operand, b) if operand.letters == "mk" else (a, operand)
        else:
            epilogue_inputs.append(operand)
    if a is None or b is None:
        raise args_where.error("a matmul needs an A operand with dims [\"M\", \"K\"] and a B "
                               "operand with dims [\"K\", \"N\"] or [\"N\", \"K\"]")
    batches = {o.dims[0] for o in (a, b, *epilogue_inputs) if o.batched}
    if len(batches) > 1:
        raise args_where.error("batch dims must be all \"...\" (broadcast) or all \"B\" (exact)")
    if "B" in batches and not (a.batched and b.batched):
        raise args_where.error("with a \"B\" batch dim, both A and B must have it (as torch.bmm)")

    epilogue = top.pop_table("epilogue")
    promoted = _parse_promote(epilogue, a, b, epilogue_inputs)
    outputs, out_dtype = _parse_epilogue(epilogue, spec_args, (a.name, b.name))
    schedule = top.pop_table("schedule", required=False) or Table({}, top.where.child("schedule"))
    swizzle = schedule.pop_choice("swizzle", SWIZZLES, SWIZZLES[0])
    split_k = schedule.pop_choice("split_k", SPLIT_K_MODES, SPLIT_K_MODES[0])
    schedule.finish()
    tuning = _parse_tuning(top.pop_table("tuning", required=False)
                           or Table({}, top.where.child("tuning")), swizzle)
    return MatmulBody(a, b, tuple(epilogue_inputs), outputs, out_dtype, promoted, swizzle, split_k,
                      tuning)


def _parse_promote(table: Table, a: Operand, b: Operand,
                   epilogue_inputs: list[Operand]) -> tuple[str, ...]:
    """``[epilogue] promote``: epilogue operands outside the matmul torch's reference calls, as
    the residual of ``F.linear(x, weight, bias) + residual``. torch's matmuls take one dtype for
    their operands (a bias included); an operand added after them by an element-wise op keeps
    its own, and the result's dtype promotes with it (torch.autocast leaves it as it is too)."""
    if "promote" not in table:
        return ()
    where = table.where.child("promote")
    names = parse_list(table.pop_any("promote"), str, where)
    epilogue_names = [o.name for o in epilogue_inputs]
    for name in names:
        if name in (a.name, b.name):
            raise where.error(f"'{name}' is an operand of the matmul, which takes one dtype for "
                              f"its operands; only epilogue operands ({', '.join(epilogue_names)}) "
                              f"may promote")
        if name not in epilogue_names:
            raise where.error(f"'{name}' is not an epilogue operand; expected some of: "
                              f"{', '.join(epilogue_names) or '(none: the op has no epilogue operands)'}")
    if len(set(names)) != len(names):
        raise where.error("names an operand twice")
    return tuple(names)


def _parse_epilogue(table: Table, spec_args: tuple, matrices: tuple[str, str]):
    """``[epilogue]``: outputs in file order over ``acc``; ``dtype`` is the output dtype."""
    out_dtype = table.pop("dtype", str, None)
    if out_dtype is not None and out_dtype not in DTYPES:
        raise table.where.child("dtype").error(
            f"unknown dtype '{out_dtype}'; expected one of: {', '.join(DTYPES)}")
    # A and B enter only through acc: the epilogue runs once per output tile, after the K loop
    symbols = {n: s for n, s in symbols_of(spec_args).items() if n not in matrices}
    symbols["acc"] = Symbol("acc", "value")
    outputs = []
    while table.keys():
        name, source, where = table.pop_item()
        check_name(name, where, "output")
        if name in symbols or name in matrices:
            raise where.error(f"output '{name}' has the name of an argument")
        check_type(source, str, where)
        outputs.append(Output(name, parse_expr(source, where, symbols, {
            m: "the operands enter the epilogue only through acc, the tile of their product"
            for m in matrices})))
        symbols[name] = Symbol(name, "value")
    if not outputs:
        raise table.where.error("expected at least one output, as in out = \"acc\"")
    return tuple(outputs), out_dtype


def _parse_tuning(table: Table, swizzle: str) -> dict:
    """``[tuning]``: ``configs = [{ BLOCK_M = 128, ... }, ...]``, an explicit list, or lists of
    ``BLOCK_M`` ... ``num_stages`` whose product is the space (neither: DEFAULT_CONFIGS);
    ``SPLIT_K``, the factors auto split-K may pick."""
    _refuse_group_m(table, swizzle)
    raw = table.pop_any("configs")
    lists = [key for key in CONFIG_KEYS if key in table]
    if raw is not None and lists:
        raise table.where.child(lists[0]).error(
            "give either configs = [...] or lists of BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, "
            "num_warps, num_stages (their product), not both")
    if raw is not None:
        configs = _config_list(raw, table.where.child("configs"), swizzle)
    elif lists:
        values = {}
        for key in CONFIG_KEYS:
            values[key] = _config_values(table, key, PRODUCT_DEFAULTS[key])
        configs = tuple(dict(zip(CONFIG_KEYS, point))
                        for point in itertools.product(*(values[key] for key in CONFIG_KEYS)))
        for config in configs:
            _check_tiles(config, table.where)
    else:
        configs = DEFAULT_CONFIGS
    split_k = int_list(table, "SPLIT_K", DEFAULT_SPLIT_K, lambda v: v >= 1, "positive integers")
    table.finish()
    return {"configs": configs, "SPLIT_K": split_k}


def _refuse_group_m(table: Table, swizzle: str) -> None:
    """GROUP_M orders the programs of the grouped and swizzle2d schedules only: under swizzle
    "none", configs that differ in it alone are one kernel, tuned once each."""
    if swizzle == "none" and "GROUP_M" in table:
        raise table.where.child("GROUP_M").error(
            'has no effect with schedule.swizzle = "none"; leave it out')


def _config_values(table: Table, key: str, default: tuple[int, ...]) -> tuple[int, ...]:
    """The product form's list of one config key (or one value)."""
    raw = table.pop_any(key)
    if raw is None:
        return default
    where = table.where.child(key)
    return tuple(_check_value(key, value, where) for value in parse_list(raw, int, where))


def _config_list(raw, where: Where, swizzle: str) -> tuple[dict, ...]:
    """``configs = [{ BLOCK_M = 128, BLOCK_N = 256, BLOCK_K = 64, num_warps = 8, num_stages = 3 },
    ...]``; GROUP_M may be left out (8)."""
    configs: list[dict] = []
    for i, item in enumerate(parse_list(raw, dict, where)):
        entry = Table(item, where.child(str(i)))
        _refuse_group_m(entry, swizzle)
        config = {}
        for key in CONFIG_KEYS:
            value = entry.pop(key, int, 8) if key == "GROUP_M" else entry.pop(key, int)
            config[key] = _check_value(key, value, entry.where.child(key))
        entry.finish()
        _check_tiles(config, entry.where)
        if config in configs:
            raise entry.where.error(f"repeats config {configs.index(config)}")
        configs.append(config)
    return tuple(configs)


def _check_tiles(config: dict, where: Where) -> None:
    """Each tile a config loads or accumulates fits one Triton block."""
    for rows, cols in (("BLOCK_M", "BLOCK_K"), ("BLOCK_K", "BLOCK_N"), ("BLOCK_M", "BLOCK_N")):
        if config[rows] * config[cols] > MAX_TILE:
            raise where.error(f"a {rows} x {cols} tile of {config[rows]} x {config[cols]} "
                              f"elements; a Triton block holds at most {MAX_TILE}")


def _check_value(key: str, value: int, where: Where) -> int:
    if key in ("GROUP_M", "num_stages"):
        if value < 1:
            raise where.error(f"expected positive integers, got {value}")
        return value
    if value <= 0 or value & (value - 1):
        raise where.error(f"expected powers of two, got {value}")
    if key.startswith("BLOCK_") and value < MIN_BLOCK:
        raise where.error(f"tl.dot needs blocks of at least {MIN_BLOCK}, got {value}")
    if key == "num_warps" and value > MAX_WARPS:
        raise where.error(f"expected at most {MAX_WARPS} warps, got {value}")
    return value


@dataclass(frozen=True)
class OutputTensor:
    name: str
    code: str

    @property
    def ptr(self) -> str:
        return f"{self.name}_ptr"

    @property
    def letters(self) -> str:
        return "mn"


@dataclass(frozen=True)
class MatmulPlan(CommonPlan):
    a: Operand = None
    b: Operand = None
    epilogue_inputs: tuple[Operand, ...] = ()
    outputs: tuple[OutputTensor, ...] = ()
    out_dtype: str | None = None
    batch_rank: int = 0
    swizzle: str = "grouped"
    split_k: str = "auto"
    configs: tuple[dict, ...] = ()
    split_factors: tuple[int, ...] = ()

    helpers: tuple[str, ...] = ()       # specgen.kernel_lib functions the epilogue calls

    @property
    def promoted(self) -> tuple[str, ...]:
        """The epilogue operands of their own dtype (``[epilogue] promote``): the ones autocast
        leaves as they are."""
        return self.uncast

    @property
    def dims_code(self) -> str:
        """The inputs in call order with their dims, as a tuple of (name, dims) pairs."""
        return repr(tuple((o.name, o.dims) for o in self.inputs))

    @property
    def tensors(self) -> tuple:
        return (self.a, self.b, *self.epilogue_inputs, *self.outputs)

    def batched(self, tensor) -> bool:
        """Whether ``tensor`` has batch strides (outputs have them whenever the op is batched)."""
        return self.batch_rank > 0 and (isinstance(tensor, OutputTensor) or tensor.batched)

    def stride_names(self, tensor) -> list[str]:
        names = [f"{tensor.name}_stride_b{d}" for d in range(self.batch_rank)] \
            if self.batched(tensor) else []
        return names + [f"{tensor.name}_stride_{letter}" for letter in tensor.letters]

    def strides_param(self, tensor) -> str:
        return ", ".join(self.stride_names(tensor))

    def base_expr(self, tensor) -> str:
        """Where the tile's batch element starts in ``tensor``."""
        terms = [f"i_{d} * {tensor.name}_stride_b{d}" for d in range(self.batch_rank)]
        return " + ".join(terms)

    def base_term(self, tensor) -> str:
        """`` + x_base`` for a batched tensor, nothing for one that is the same in every batch."""
        return f" + {tensor.name}_base" if self.batched(tensor) else ""

    @property
    def batch_sizes(self) -> str:
        """Kernel parameters for the batch: the count, and the inner sizes to split it by."""
        return ", ".join(["batch"] + [f"size_b{d}" for d in range(1, self.batch_rank)])

    @property
    def inputs(self) -> tuple[Operand, ...]:
        return (self.a, self.b, *self.epilogue_inputs)

    @property
    def optional_inputs(self) -> tuple[Operand, ...]:
        return tuple(o for o in self.epilogue_inputs if o.optional)

    @property
    def epilogue_params(self) -> str:
        """The epilogue's pointer parameters: its input tensors', then the outputs'."""
        return ", ".join([o.ptr for o in self.epilogue_inputs] + [o.ptr for o in self.outputs])

    @property
    def block_ks(self) -> tuple[int, ...]:
        return tuple(sorted({c["BLOCK_K"] for c in self.configs}))





def plan(spec: OpSpec) -> MatmulPlan:
    body: MatmulBody = spec.body
    names = {c.name: c.constexpr for c in spec.choices}
    outputs = tuple(OutputTensor(o.name, emit(o.expr, names)) for o in body.outputs)
    t = body.tuning
    operands = (body.a, body.b, *body.epilogue_inputs)
    batches = {o.dims[0] for o in operands if o.batched}
    batch_rank = 0 if not batches else (1 if "B" in batches else BROADCAST_BATCH_RANK)
    common = common_plan(spec, tuple(o.name for o in body.outputs), promoted=body.promoted)
    return MatmulPlan(**common.__dict__, a=body.a, b=body.b, epilogue_inputs=body.epilogue_inputs,
                      outputs=outputs, out_dtype=body.out_dtype, batch_rank=batch_rank,
                      swizzle=body.swizzle, split_k=body.split_k, configs=t["configs"],
                      split_factors=tuple(sorted(set(t["SPLIT_K"]))),
                      helpers=tuple(sorted(set().union(*(helpers(o.expr) for o in body.outputs)))))


def scaffold(name: str) -> str:
    return f'''# A matmul with a fused epilogue: see README.md, "Matmul family".
[op]
name = "{name}"
family = "matmul"
doc = "relu(x @ weight.T + bias)"
reference = "torch.relu(torch.nn.functional.linear(x, weight, bias))"

[args]
x = {{ kind = "tensor", dims = ["...", "M", "K"] }}
weight = {{ kind = "tensor", dims = ["N", "K"] }}
bias = {{ kind = "tensor", dims = ["N"], optional = true }}

[epilogue]
out = "relu(acc + bias)"

[schedule]
swizzle = "grouped"       # grouped | swizzle2d | none
split_k = "auto"          # auto (two-stage, deterministic) | atomic | off
'''


FAMILY = Family(
    name="matmul", parse_body=parse_body, body_names=body_names, plan=plan, scaffold=scaffold,
    generated_names=GENERATED_NAMES, generated_prefixes=GENERATED_PREFIXES,
    cases="specgen.testing.matmul:matmul_cases",
    samples="specgen.testing.matmul:matmul_samples", bench="bench.matmul:cases")

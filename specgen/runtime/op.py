"""One host path for every generated op: its module holds kernels and an ``OpDescription``;
``Op`` builds the public function and the registered operators from them.

A public call goes, in this order, for every family:

1. autocast (the spec's policy, as torch applies its counterpart's; not for ``out=`` calls);
2. the replay lookup: a repeated eager call replays what the recorded one launched
   (runtime/replay.py), with no other host work;
3. argument checks: tensors are tensors, scalars are taken as torch's parser takes them;
4. the eager implementation (recorded for replays), or, for a call that needs a gradient in
   eager code, that implementation inside an ``autograd.Function``, or, for traced calls
   (torch.compile, modes, subclasses), the registered operator ``torch.ops.specgen.<op>``.

The family supplies what differs (``FamilyRuntime``): the implementation (checks of shapes, the
outputs' allocation, the launches), an ``out=`` form, scalars it spells out before the
implementation (a reduction's dims), a derived backward, and state its launches read.

The public function is compiled from the description's signature (``_public_source``), as
dataclasses compiles ``__init__``: a call binds its arguments as Python binds them, and the
replay path of a repeated call costs a lookup and the replay itself.
"""

from __future__ import annotations

import linecache
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Sequence

import torch

from specgen.runtime import autocast as autocast_policy
from specgen.runtime.autograd import (differentiable_call, differentiable_replay,
                                      differentiate_by_reference)
from specgen.runtime.checks import (OUT_NOT_DIFFERENTIABLE, as_scalar, check_choice,
                                    check_dtype_arg, check_no_grad, check_tensor_types)
from specgen.runtime.context import runs_eagerly, untraced
from specgen.runtime.registry import ArgInfo, OpInfo, triton_op
from specgen.runtime.replay import Replays, key_scope, key_source

# torch.library infers an operator's schema from its implementation's annotations
_ANNOTATIONS = {"float": "float", "int": "int", "bool": "bool", "choice": "str",
                "shape": "list[int]", "dtype": "torch.dtype",
                # a reduction's dim (argmax's one int, sum's ints), None for every dim
                "dim": "Optional[int]", "dims": "Optional[list[int]]",
                # a convolution's geometry, as the family spells it out: stride and dilation
                # two ints, padding four, groups one
                "pair": "list[int]", "padding": "list[int]", "groups": "int"}
# kinds whose spelled-out value is a list, which an operator's schema takes no default for
_LIST_KINDS = ("pair", "padding")
_SCALARS = {"float": float, "int": int, "bool": bool}


@dataclass(frozen=True)
class OpDescription:
    """Everything about an op but its kernels: the data literal of its generated module."""

    name: str
    family: str
    doc: str
    reference: str                  # the spec's reference expression (the docstring says it)
    spec_path: str
    spec_sha256: str
    dtypes: tuple[torch.dtype, ...]
    indexing: str                   # "auto", "int32" or "int64"
    autocast: str                   # the spec's policy (runtime/autocast.py)
    args: tuple[ArgInfo, ...]
    outputs: tuple[str, ...]
    launch: object                  # the family's launch data (its runtime module's ``Launch``)
    differentiable: bool = True     # argmax and argmin have no gradient

    # the roles of the arguments, by position: what every family's implementation reads of a
    # call's arguments, computed once an op (implementations run on every call no replay
    # serves). Set here, not cached on first use: a cache filled while dynamo traces a call
    # changes the object under the guards it just wrote ("Guard failed on the same frame")
    tensor_positions: tuple[int, ...] = field(init=False, repr=False, compare=False)
    tensor_names: tuple[str, ...] = field(init=False, repr=False, compare=False)
    optional_tensors: tuple[str, ...] = field(init=False, repr=False, compare=False)
    # the float, int and bool arguments: what kernels take by position, in this order
    scalar_positions: tuple[int, ...] = field(init=False, repr=False, compare=False)
    # each choice argument with its kernels' constexpr name
    choice_positions: tuple[tuple[int, str], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        args = self.args
        tensors = tuple(i for i, a in enumerate(args) if a.kind == "tensor")
        roles = {
            "tensor_positions": tensors,
            "tensor_names": tuple(args[i].name for i in tensors),
            "optional_tensors": tuple(a.name for a in args if a.kind == "tensor" and a.optional),
            "scalar_positions": tuple(i for i, a in enumerate(args)
                                      if a.kind in ("float", "int", "bool")),
            "choice_positions": tuple((i, a.constexpr) for i, a in enumerate(args)
                                      if a.kind == "choice"),
        }
        for name, value in roles.items():
            object.__setattr__(self, name, value)

    def choices_of(self, args: Sequence) -> dict[str, object]:
        """A call's choices as its kernels' constexprs."""
        return {constexpr: args[i] for i, constexpr in self.choice_positions}


class FamilyRuntime:
    """What a family's runtime module supplies to ``Op`` (its ``RUNTIME``)."""

    # whether its ops take ``out=`` (registered as ``specgen::<op>_out``, outputs first)
    takes_out = False
    # what the public function's docstring adds after "Same as ``<reference>``"
    doc_note = ""
    # which of the implementation's outputs the public function returns (None: all of them;
    # cross_entropy's operator returns what its backward reads beside the loss)
    public_output: int | None = None

    def replays_serve(self) -> bool:
        """Whether a recorded replay may serve a call now (cross_entropy: not in validating mode,
        where a call checks its targets too). Only asked where a family overrides it."""
        return True

    def setup(self, op: Op) -> object:
        """Per-op state the family keeps (``op.state``)."""
        return None

    def register(self, op: Op) -> None:
        """Registers the op's operators and their autograd, and sets ``op.operator``."""
        op.register_operators()

    def call(self, op: Op, key: tuple | None, args: tuple, out: object = None) -> Any:
        """A public call that no replay served."""
        return op.call(key, args, out)

    def run(self, op: Op, args: tuple) -> Any:
        """The implementation: checks, allocations and launches; the outputs."""
        raise NotImplementedError

    def run_out(self, op: Op, outs: tuple, args: tuple) -> None:
        """The ``out=`` implementation, where ``takes_out``."""
        raise NotImplementedError

    def spell_out(self, op: Op, args: tuple) -> tuple:
        """The arguments as the registered operator takes them, after the scalar checks (a
        reduction's dims as a list); the checks of anything else it reads too."""
        return args

    def replay_state(self) -> Callable[[], object] | None:
        """Global settings the launches read, part of a replay's signature (matmul: the float32
        precision setting)."""
        return None

    def backward(self, op: Op) -> Callable | None:
        """A derived backward for eager calls (``differentiable_call``: given the arguments and
        the outputs' gradients, each argument's gradient, or None where it does not apply)."""
        return None


class Op:
    """A generated op: its public function, registered operators, replays and description."""

    def __init__(self, description: OpDescription, family: FamilyRuntime,
                 kernels: Mapping[str, Any], reference: Callable, module: str) -> None:
        self.description = d = description
        self.name = d.name
        self.family = family
        self.kernels = dict(kernels)
        self.reference = reference
        self.module = module
        self.replays = Replays(d.name, state=family.replay_state())
        self._checks = tuple((i, a) for i, a in enumerate(d.args)
                             if a.kind in ("float", "int", "bool", "choice", "dtype"))
        self.differentiable = d.differentiable
        self.state = family.setup(self)
        self.function = self._compile_public()
        family.register(self)

    # ---- the public call ---------------------------------------------------------------------

    def call(self, key: tuple | None, args: tuple, out: Any = None) -> Any:
        """A public call that no replay served: checks, then the eager, differentiable or traced
        path. ``out``: the ``out=`` argument (a tensor, or a tuple of one for each output)."""
        d = self.description
        outs = () if out is None else self._outs(out)
        tensors = {d.args[i].name: args[i] for i in d.tensor_positions}
        check_tensor_types(self.name, tensors, optional=d.optional_tensors,
                           differentiable=self.differentiable)
        if outs:
            check_tensor_types(self.name, {f"out[{i}]": t for i, t in enumerate(outs)})
            check_no_grad(self.name, {**tensors, **{f"out[{i}]": t for i, t in enumerate(outs)}},
                          OUT_NOT_DIFFERENTIABLE)
        # scalars are checked here too, so that a traced call raises the eager error (the
        # dispatcher raises its own RuntimeError, and takes an int for a bool)
        args = self.family.spell_out(self, self.check_scalars(args, taken=True))
        values = tensors.values()
        eager = runs_eagerly(*values, *outs)
        if outs:
            (self.run_out if eager else self.out_operator)(*outs, *args)
            return out
        if eager:
            return self.replays.record(key, self.run, tuple(values), *args)
        if self.differentiable and untraced(values):
            # autograd in eager code: the plain call inside an autograd.Function, differentiated
            # by the derived backward where the family has one, else through `reference`,
            # without the dispatcher (runtime/autograd.py); a later call of this signature skips
            # the checks above (its key tells which inputs need a gradient)
            backward = self.family.backward(self)
            if key is not None:
                # its forward replays the plain call directly, where the public function returns
                # what a replay does
                inner = self.replays if self.family.public_output is None else None
                self.replays.keep(key, differentiable_replay(
                    self.function, self.reference, args, d.tensor_positions, backward, inner))
            return differentiable_call(self.function, self.reference, args, d.tensor_positions,
                                       backward)
        return self.operator(*args)

    def _outs(self, out: Any) -> tuple:
        n = len(self.description.outputs)
        if n == 1:
            return (out,)
        if not isinstance(out, (tuple, list)) or len(out) != n:
            raise TypeError(f"{self.name}: out must be a tuple of {n} tensors "
                            f"({', '.join(self.description.outputs)})")
        return tuple(out)

    def check_scalars(self, args: tuple, taken: bool = False) -> tuple:
        """Scalar, choice and dtype arguments checked; ``taken``: each scalar as torch takes it
        (a numpy scalar becomes a Python number, as the dispatcher makes it on the traced path)."""
        if not self._checks:
            return args
        args = list(args)
        for i, arg in self._checks:
            value = args[i]
            if arg.kind == "choice":
                check_choice(self.name, arg.name, value, arg.choices)
            elif arg.kind == "dtype":
                check_dtype_arg(self.name, arg.name, value, self.description.dtypes,
                                arg.optional)
            else:
                value = as_scalar(self.name, arg.name, value, _SCALARS[arg.kind],
                                  optional=arg.optional)
                if taken:
                    args[i] = value
        return tuple(args)

    def run(self, *args: Any) -> Any:
        """The implementation (the registered operator's too), on its arguments."""
        return self.family.run(self, self.check_scalars(args))

    def run_out(self, *outs_and_args: Any) -> None:
        n = len(self.description.outputs)
        self.family.run_out(self, outs_and_args[:n], self.check_scalars(outs_and_args[n:]))

    def info(self) -> OpInfo:
        d = self.description
        return OpInfo(name=d.name, family=d.family, spec_path=d.spec_path,
                      spec_sha256=d.spec_sha256, doc=d.doc, args=d.args, outputs=d.outputs,
                      dtypes=d.dtypes, indexing=d.indexing, autocast=d.autocast,
                      function=self.function, op=self.operator, reference=self.reference,
                      replays=self.replays, launch=d.launch)

    # ---- building ----------------------------------------------------------------------------

    def _compile_public(self) -> Callable:
        d = self.description
        source = _public_source(d, self.family)
        filename = _remember(f"<specgen {d.name}>", source)
        scope = {"_op": self, "_call": self.family.call, "_ready": self.replays.ready,
                 "_replays": self.replays, "_state": self.replays.state,
                 "_autocast": autocast_policy, "_serve": self.family.replays_serve,
                 # a dtype default (int8_linear's out_dtype=torch.bfloat16)
                 "torch": torch, **key_scope()}
        exec(compile(source, filename, "exec"), scope)
        function = scope[d.name]
        function.__module__ = self.module
        function.__qualname__ = d.name
        function.__doc__ = _docstring(d, self.family)
        return function

    def register_operators(self, results: int | None = None, by_reference: bool = True) -> None:
        """``results``: how many tensors the operator returns, where the implementation returns
        more than the outputs (attention's row statistics, which its backward reads);
        ``by_reference``: its autograd differentiates the reference (else the family registers
        its own)."""
        d = self.description
        # a list default is not a schema default torch.library infers: where an argument takes
        # one, the operator takes every argument without defaults (callers pass them all)
        defaults = not any(a.kind in _LIST_KINDS for a in d.args)
        typed = ", ".join(typed_param(a, defaults) for a in d.args)
        results = results or len(d.outputs)
        result = ("torch.Tensor" if results == 1
                  else f"tuple[{', '.join('torch.Tensor' for _ in range(results))}]")
        names = ", ".join(a.name for a in d.args)
        scope = {"torch": torch, "Optional": Optional, "_run": self.run, "_run_out": self.run_out}
        source = f"def _{d.name}({typed}) -> {result}:\n    return _run({names})\n"
        if self.family.takes_out:
            outs = ", ".join(f"{o}: torch.Tensor" for o in d.outputs)
            source += (f"def _{d.name}_out({outs}, {typed}) -> None:\n"
                       f"    _run_out({', '.join(d.outputs)}, {names})\n")
        exec(compile(source, _remember(f"<specgen {d.name} operators>", source), "exec"), scope)
        for suffix, mutates in (("", ()), ("_out", d.outputs)):
            if suffix and not self.family.takes_out:
                continue
            implementation = scope[f"_{d.name}{suffix}"]
            implementation.__module__ = self.module
            triton_op(f"specgen::{d.name}{suffix}", mutates_args=mutates)(implementation)
        self.operator = getattr(torch.ops.specgen, d.name)
        if self.family.takes_out:
            # outputs come first: torch.library does not take keyword-only tensors
            self.out_operator = getattr(torch.ops.specgen, f"{d.name}_out")
        if self.differentiable and by_reference:
            # the backward: the vector-Jacobian product of `reference` at the saved inputs
            differentiate_by_reference(f"specgen::{d.name}", self.reference)


def _remember(filename: str, source: str) -> str:
    """``filename``, with ``source`` kept in linecache under it: tracebacks and ``inspect``
    show the compiled functions' lines (as dataclasses' and attrs' generated methods)."""
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    return filename


def typed_param(arg: ArgInfo, defaults: bool = True) -> str:
    """An argument as an operator's annotated parameter (torch.library reads the schema)."""
    if arg.kind == "tensor":
        if not arg.optional:
            return f"{arg.name}: torch.Tensor"
        return f"{arg.name}: Optional[torch.Tensor]" + (" = None" if defaults else "")
    annotation = _ANNOTATIONS[arg.kind]
    if not defaults:
        return f"{arg.name}: Optional[{annotation}]" if arg.optional \
            else f"{arg.name}: {annotation}"
    if arg.kind in ("dim", "dims"):
        return f"{arg.name}: {annotation}" + (" = None" if arg.optional else "")
    if arg.optional:
        return f"{arg.name}: Optional[{annotation}] = None"
    return f"{arg.name}: {annotation}" + ("" if arg.default is None else f" = {arg.default!r}")


def _param(arg: ArgInfo) -> str:
    if arg.kind == "tensor":
        return f"{arg.name}=None" if arg.optional else arg.name
    if arg.optional or arg.default is not None:
        return f"{arg.name}={arg.default!r}"
    return arg.name


def _tuple(names: Sequence[str]) -> str:
    return f"({names[0]},)" if len(names) == 1 else f"({', '.join(names)})"


# argument kinds keyed as they are (``replay.key_source``); the others (lists) by their elements
_PLAIN_KINDS = ("float", "int", "bool", "choice", "dtype", "dim", "groups")


def _public_source(d: OpDescription, family: FamilyRuntime) -> str:
    """The public function's source: autocast, the signature and its replay (written out, one
    tuple and one dict lookup: runtime/replay.py), then the family's ``call``."""
    takes_out = family.takes_out
    names = [a.name for a in d.args]
    tensors = [a.name for a in d.args if a.kind == "tensor"]
    params = ", ".join(_param(a) for a in d.args) + (", *, out=None" if takes_out else "")
    lines = [f"def {d.name}({params}):"]
    lines += _autocast_lines(d, takes_out)
    condition, key = key_source(tensors, [(a.name, a.kind in _PLAIN_KINDS) for a in d.args
                                          if a.kind != "tensor"],
                                "_state()" if family.replay_state() is not None else "None")
    # the conditions under which a replay may serve the call (the lookup is skipped otherwise:
    # the family's call looks up what it replays, cross_entropy's in validating mode)
    conditions = ["out is None"] if takes_out else []
    if type(family).replays_serve is not FamilyRuntime.replays_serve:
        conditions.append("_serve()")
    picked = "" if family.public_output is None else f"[{family.public_output}]"
    lines += ["    _key = None",
              f"    if ({chr(10).join(_and(conditions + condition))}):",
              f"        _key = {key}",
              "        try:",
              "            _replay = _ready.get(_key)",
              "        except TypeError:  # an unhashable scalar: the call is not keyed",
              "            _key = _replay = None",
              "        if _replay is not None:",
              "            _replays.replayed += 1",
              f"            return _replay({', '.join(tensors)}){picked}",
              f"    return _call(_op, _key, {_tuple(names)}{', out' if takes_out else ''})"]
    return "\n".join(lines) + "\n"


def _and(conditions: Sequence[str]) -> list[str]:
    """Conditions joined by ``and``, a line each (the compiled source reads as written code)."""
    return [conditions[0]] + [f"            and {c}" for c in conditions[1:]]


def _autocast_lines(d: OpDescription, takes_out: bool) -> list[str]:
    """Under torch.autocast, the spec's policy: a float32 policy sets an op's ``dtype=``
    argument where it has one (torch's softmax and sum: a float32 result, the input read as it
    is); otherwise the tensor arguments are cast as torch casts them, but for those that join by
    type promotion, which torch's autocast of an element-wise op leaves as they are."""
    if d.autocast == "none":
        return []
    condition = "_autocast.active()" + (" and out is None" if takes_out else "")
    # a tensor of its own dtypes (a quantized weight, float32 scales) is left as it is
    tensors = [a.name for a in d.args if a.kind == "tensor" and not a.promotes and not a.dtypes]
    dtype_args = [a.name for a in d.args if a.kind == "dtype"]
    if d.autocast == "float32" and dtype_args:
        action = f"{dtype_args[0]} = _autocast.result_dtype({tensors[0]}, {dtype_args[0]})"
    else:
        targets = tensors[0] + "," if len(tensors) == 1 else ", ".join(tensors)
        action = f'{targets} = _autocast.cast("{d.autocast}", {", ".join(tensors)})'
    return [f"    if {condition}:", f"        {action}"]


def _docstring(d: OpDescription, family: FamilyRuntime) -> str:
    text = f"{d.doc}\n\nSame as ``{d.reference}``"
    text += f", {family.doc_note}" if family.doc_note else "."
    if family.takes_out:
        n = len(d.outputs)
        what = f"a tuple of {n} tensors" if n > 1 else "one tensor"
        text += f" Pass ``out=`` to write into an existing tensor ({what})."
    return text
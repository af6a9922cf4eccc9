"""TOML spec files -> ``OpSpec``. Every error names the file, the key path and what was expected."""

from __future__ import annotations

import ast
import codecs
import dataclasses
import hashlib
import importlib
import math
import os
import tomllib
from pathlib import Path

import torch

from specgen.errors import Where, describe
from specgen.families import FAMILIES
from specgen.families.common import check_generated_names, check_name
from specgen.families.contract import resolve
from specgen.model import (AUTOCAST, DEFAULT_DTYPES, DTYPES, INDEXING, INTEGER_DTYPES,
                           INTEGER_FAMILIES, Arg, ChoiceArg, OpSpec, ScalarArg, Source, TensorArg)
from specgen.table import Table, parse_list

ARG_KINDS = ("tensor", "float", "int", "bool", "choice", "shape", "dtype")
_SCALAR_TYPES = {"float": float, "int": int, "bool": bool, "shape": list}
# names a reference expression may use besides the op's arguments
REFERENCE_NAMES = ("torch", "F", "math", "ref")


def relative_path(path: Path, root: Path) -> str:
    """``path`` from ``root``, with ``..`` where it lies outside: a generated header must not
    hold this machine's absolute path (the build would differ by checkout)."""
    return Path(os.path.relpath(path.resolve(), root.resolve())).as_posix()


def load_spec(path: Path, root: Path) -> OpSpec:
    raw = path.read_bytes()
    named = relative_path(path, root)
    # UTF-8, with or without the byte-order mark some editors write first
    mark = len(codecs.BOM_UTF8) if raw.startswith(codecs.BOM_UTF8) else 0
    try:
        text = raw[mark:].decode("utf-8")
    except UnicodeDecodeError as err:
        at = mark + err.start
        line = raw[:at].count(b"\n") + 1
        raise Where(named).error(f"not UTF-8 text: byte 0x{raw[at]:02x} at line {line} "
                                 f"(byte {at}); save the spec as UTF-8") from None
    source = Source(named, hashlib.sha256(text.encode()).hexdigest(), text)
    return parse_spec(text, source)


def parse_spec(text: str, source: Source) -> OpSpec:
    where = Where(source.path)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise where.error(f"not valid TOML: {err}") from None
    except RecursionError:
        raise where.error("not valid TOML here: arrays or tables nested deeper than the TOML "
                          "reader can follow (a spec nests a few levels)") from None
    top = Table(data, where)

    op = top.pop_table("op")
    name = op.pop("name", str)
    check_name(name, op.where.child("name"), "op")
    family_name = op.pop("family", str)
    if family_name not in FAMILIES:
        raise op.where.child("family").error(
            f"unknown family '{family_name}'; expected one of: {', '.join(sorted(FAMILIES))}")
    family = FAMILIES[family_name]
    if name in family.generated_names:
        raise op.where.child("name").error(
            f"op name '{name}' is a name the {family_name} family's generated code uses for "
            f"itself; choose another")
    doc = op.pop("doc", str, "")
    reference_where = op.where.child("reference")
    reference = op.pop("reference", str)
    dtypes = _parse_dtypes(op, family_name)
    indexing = op.pop_choice("indexing", INDEXING, "auto")
    autocast, autocast_follows = _parse_autocast(op)
    op.finish()

    args = _parse_args(top.pop_table("args"))
    for arg in args:
        _check_family_takes(arg, family_name, top.where.child("args").child(arg.name))
    _check_reference(reference, reference_where, args, family.reference_names)
    body = family.parse_body(top, args, name)
    top.finish()
    body_names = family.body_names(body)
    check_generated_names(top.where, name, family,
                          ((a.name, ("args", a.name)) for a in args), body_names,
                          derived_from=[*(a.name for a in args if isinstance(a, TensorArg)),
                                        *(n for n, _ in body_names)])
    _check_reference_uses(reference, reference_where, args)
    # an argument the kernels never read would be taken and ignored, where the reference (which
    # must use it) does not ignore it: the op and its gradients would disagree
    unread = family.unread_args(body, args) if family.unread_args else ()
    if unread:
        arg, readers = unread[0]
        raise top.where.child("args").child(arg).error(
            f"declared, but {readers} reads it: the op would ignore it")
    spec = OpSpec(name=name, family=family_name, doc=doc, reference=reference.strip(), args=args,
                  dtypes=dtypes, indexing=indexing, source=source, body=body,
                  autocast=autocast, autocast_follows=autocast_follows)
    if not family.derive:
        return spec
    # the ops the spec derives (a row-wise backward) are specs too, made here, before planning
    return dataclasses.replace(spec, derived=resolve(family.derive)(spec))


def _parse_autocast(op: Table) -> tuple[str, str]:
    """``autocast = "lower"``, or ``autocast = { policy = "float32", follows = "aten::rms_norm" }``
    for a policy torch's lists took up in some release: the op then applies it only where the
    running torch autocasts that operator (torch 2.13 autocasts rms_norm to float32, 2.11 not)."""
    where = op.where.child("autocast")
    raw = op.pop_any("autocast", "none")
    if not isinstance(raw, dict):
        if raw not in AUTOCAST:
            raise where.error(f"expected one of {', '.join(AUTOCAST)} or a table "
                              f"{{ policy, follows }}, got {describe(raw)}")
        return raw, ""
    table = Table(raw, where)
    policy = table.pop_choice("policy", AUTOCAST[1:])
    follows = table.pop("follows", str)
    table.finish()
    try:
        torch._C._dispatch_has_kernel_for_dispatch_key(follows, "AutocastCUDA")
    except RuntimeError:
        raise table.where.child("follows").error(
            f"'{follows}' is not a torch operator (expected a name such as 'aten::rms_norm')") from None
    return policy, follows


def _parse_dtypes(op: Table, family: str) -> tuple[str, ...]:
    raw = op.pop_any("dtypes")
    if raw is None:
        return DEFAULT_DTYPES
    where = op.where.child("dtypes")
    dtypes = parse_list(raw, str, where)
    known = DTYPES + INTEGER_DTYPES if family in INTEGER_FAMILIES else DTYPES
    for dtype in dtypes:
        if dtype in INTEGER_DTYPES and dtype not in known:
            listed = " and ".join(INTEGER_FAMILIES)
            raise where.error(f"dtype '{dtype}': only the {listed} families take integer and bool "
                              f"tensors; expected one of: {', '.join(known)}")
        if dtype not in known:
            raise where.error(f"unknown dtype '{dtype}'; expected one of: {', '.join(known)}")
    return tuple(dict.fromkeys(dtypes))


def _parse_args(table: Table) -> tuple[Arg, ...]:
    """``[args]``: ``x = "tensor"`` or ``x = { kind = ..., ... }``, in call order."""
    args: list[Arg] = []
    seen_default = False
    while table.keys():
        name, raw, where = table.pop_item()
        check_name(name, where, "argument")
        if name == "out":
            raise where.error("argument name 'out' is reserved for the out= keyword")
        arg = _parse_arg(name, raw, where)
        has_default = not isinstance(arg, TensorArg) and arg.default is not None or \
            getattr(arg, "optional", False)
        if seen_default and not has_default:
            raise where.error(f"argument '{name}' has no default but follows one that has")
        seen_default = seen_default or has_default
        args.append(arg)
    if not args:
        raise table.where.error("expected at least one argument")
    return tuple(args)


def _parse_arg(name: str, raw: object, where: Where) -> Arg:
    if isinstance(raw, str):
        raw = {"kind": raw}
    if not isinstance(raw, dict):
        raise where.error(f"expected a kind string (\"tensor\") or a table, got {describe(raw)}")
    table = Table(raw, where)
    kind = table.pop("kind", str)
    if kind not in ARG_KINDS:
        raise where.child("kind").error(f"unknown kind '{kind}'; expected one of: {', '.join(ARG_KINDS)}")
    if kind == "tensor":
        optional = table.pop("optional", bool, False)
        low, high = _parse_range(table)
        dims_raw = table.pop_any("dims")
        dims = () if dims_raw is None else parse_list(dims_raw, str, where.child("dims"))
        for dim in dims:
            if dim != "..." and not dim.isidentifier():
                # dims = "N, K": one string where an array of names was meant
                raise where.child("dims").error(
                    f"'{dim}' is not a dim name; expected an array of names, such as "
                    f'["N", "K"]')
        dtypes = _parse_tensor_dtypes(table)
        table.finish()
        return TensorArg(name, optional, low, high, dims, dtypes)
    if kind == "choice":
        values = parse_list(table.pop("values", list), str, where.child("values"))
        default = table.pop("default", str, None)
        if default is not None and default not in values:
            raise where.child("default").error(
                f"default '{default}' is not one of the values: {', '.join(values)}")
        table.finish()
        return ChoiceArg(name, values, default)
    if kind == "dtype":
        # torch's dtype=None (the input's dtype: optional), or a dtype that is the default, as
        # torch's _scaled_mm out_dtype (an output dtype of a matmul's epilogue)
        default = table.pop("default", str, None)
        optional = table.pop("optional", bool, False)
        if default is not None and default not in DTYPES:
            raise where.child("default").error(f"unknown dtype '{default}'; expected one of: "
                                               f"{', '.join(DTYPES)}")
        if optional == (default is not None):
            raise where.error('a dtype argument defaults to None (the input\'s dtype), as '
                              'torch\'s: declare it { kind = "dtype", optional = true }, or to a '
                              'dtype: { kind = "dtype", default = "bfloat16" }')
        table.finish()
        return ScalarArg(name, kind, default, optional)
    default = table.pop("default", _SCALAR_TYPES[kind], None)
    if isinstance(default, float) and not math.isfinite(default):
        # the generated signature writes the default as a literal, which inf and nan have not
        raise where.child("default").error(f"expected a finite default, got {default}")
    if kind == "shape" and default is not None:
        # a list of ints, as torch's normalized_shape
        default = parse_list(default, int, where.child("default"))
    optional = table.pop("optional", bool, False)
    if optional and default is not None:
        raise where.child("optional").error("an optional argument defaults to None; drop 'default'")
    # where the property tests draw a float or int scalar (each family has a default range)
    drawn = _parse_range(table, None) if kind in ("float", "int") else None
    if kind == "int" and drawn is not None and not all(v.is_integer() for v in drawn):
        raise where.child("range").error(
            f"an int argument's range takes integers, got [{drawn[0]:g}, {drawn[1]:g}]")
    table.finish()
    return ScalarArg(name, kind, default, optional, drawn)


def _parse_tensor_dtypes(table: Table) -> tuple[str, ...]:
    """A tensor's own ``dtypes`` (a quantized weight's ``["uint8"]``): any of DTYPES and
    INTEGER_DTYPES; whether its family takes them is checked with the family's other forms."""
    raw = table.pop_any("dtypes")
    if raw is None:
        return ()
    where = table.where.child("dtypes")
    dtypes = parse_list(raw, str, where)
    for dtype in dtypes:
        if dtype not in DTYPES + INTEGER_DTYPES:
            raise where.error(f"unknown dtype '{dtype}'; expected one of: "
                              f"{', '.join(DTYPES + INTEGER_DTYPES)}")
    if not dtypes or len(set(dtypes)) != len(dtypes):
        raise where.error("expected a non-empty list of distinct dtypes")
    return tuple(dtypes)


def _parse_range(table: Table, absent: tuple[float, float] | None = (-3.0, 3.0)
                 ) -> tuple[float, float] | None:
    raw = table.pop_any("range")
    if raw is None:
        return absent
    where = table.where.child("range")
    values = parse_list(raw, float, where)
    if len(values) != 2 or not values[0] < values[1] or not all(map(math.isfinite, values)):
        raise where.error(f"expected [low, high], finite, with low < high, got {raw}")
    return values[0], values[1]


def _check_family_takes(arg: Arg, family: str, where: Where) -> None:
    if arg.kind in ("dtype", "shape"):
        form = f"{arg.kind} argument"
    elif isinstance(arg, TensorArg) and arg.dtypes:
        form = "tensor of its own dtypes"
    elif isinstance(arg, ScalarArg) and arg.optional:
        form = "optional scalar"
    else:
        return
    # an argument form a family opts into (Family.takes)
    if form not in FAMILIES[family].takes:
        takers = [name for name, f in FAMILIES.items() if form in f.takes]
        raise where.error(f"the {family} family takes no {form} "
                          f"(the {' and '.join(takers)} famil{'ies' if len(takers) > 1 else 'y'} "
                          f"{'do' if len(takers) > 1 else 'does'})")


def _check_reference(reference: str, where: Where, args: tuple[Arg, ...],
                     family_names: tuple[str, ...] = ()) -> None:
    """The reference is trusted Python, but it must parse and use only known names."""
    try:
        tree = ast.parse(reference.strip(), mode="eval")
    except SyntaxError as err:
        raise where.error(f"not a valid Python expression: {reference!r} ({err.msg})") from None
    # a family may add arguments of its own (reduce adds dim and keepdim)
    known = set(REFERENCE_NAMES) | {a.name for a in args} | set(family_names)
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id not in known:
            raise where.error(f"name '{node.id}' is used but not declared; a reference may use "
                              f"the arguments and {', '.join((*family_names, *REFERENCE_NAMES))}")
    _check_attributes(tree, where, shadowed={a.name for a in args})


def _check_reference_uses(reference: str, where: Where, args: tuple[Arg, ...]) -> None:
    """The property check compares the op with its reference: an argument the reference ignores
    (a ``dtype=`` it never passes on) would never be checked. After the other checks, which
    name a bad argument more precisely."""
    tree = ast.parse(reference.strip(), mode="eval")
    used = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
    for arg in args:
        if arg.name not in used:
            raise where.error(f"argument '{arg.name}' is declared but the reference does not use "
                              f"it, so no test could check what the op does with it")


# the modules a reference's names stand for
_REFERENCE_MODULES = {"torch": "torch", "F": "torch.nn.functional", "math": "math",
                      "ref": "specgen.references"}


def _check_attributes(tree: ast.expr, where: Where, shadowed: set[str]) -> None:
    """Each attribute a reference takes from torch, F, math or ref exists (an argument of the same
    name shadows the module): a misspelled function (``F.gelux``) is a spec error at build time
    rather than an AttributeError at the first backward or test."""
    for node in ast.walk(tree):
        chain, root = [], node
        while isinstance(root, ast.Attribute):
            chain.append(root.attr)
            root = root.value
        if (not chain or not isinstance(root, ast.Name) or root.id not in _REFERENCE_MODULES
                or root.id in shadowed):
            continue
        module = _REFERENCE_MODULES[root.id]
        value, path = importlib.import_module(module), root.id
        for attr in reversed(chain):
            if not hasattr(value, attr):
                # an alias is named with the module it stands for (F is torch.nn.functional)
                alias = f"{path} is {module}; it" if path == root.id != module else path
                raise where.error(f"'{path}.{attr}' does not exist ({alias} has no attribute "
                                  f"'{attr}')")
            value, path = getattr(value, attr), f"{path}.{attr}"


__all__ = ["load_spec", "parse_spec", "relative_path"]

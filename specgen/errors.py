"""Spec errors that name the file, the key path and what was expected.

Parsing code never formats locations itself: it raises inside ``Where`` scopes, the way torchgen
wraps its parsers in ``context(...)``, so every message reads ``specs/x.toml: [compute.out]: ...``.
"""

from __future__ import annotations

from dataclasses import dataclass


class SpecError(Exception):
    """A spec is wrong. ``str(err)`` is the whole user-facing message."""

    def __init__(self, path: str, key: str, message: str):
        self.path = path
        self.key = key
        self.message = message
        location = f"{path}: [{key}]" if key else path
        super().__init__(f"{location}: {message}")


class SpecErrors(SpecError):
    """Several specs are wrong: ``errors``, each one's message a line of ``str(err)``."""

    def __init__(self, errors: list[SpecError]):
        self.errors = errors
        first = errors[0]
        super().__init__(first.path, first.key, first.message)
        self.args = ("\n".join(str(e) for e in errors),)


def raise_found(errors: list[SpecError]) -> None:
    """Raises what a pass over specs found: one error as itself, several together."""
    if len(errors) > 1:
        raise SpecErrors(errors)
    if errors:
        raise errors[0]


@dataclass(frozen=True)
class Where:
    """A position in a spec file: the file and the dotted path of TOML keys."""

    path: str
    keys: tuple[str, ...] = ()

    def child(self, key: str) -> "Where":
        return Where(self.path, self.keys + (key,))

    @property
    def key(self) -> str:
        return ".".join(self.keys)

    def error(self, message: str) -> SpecError:
        return SpecError(self.path, self.key, message)


def describe(value: object) -> str:
    """How a TOML value is named in 'expected X, got Y' messages."""
    kinds = {bool: "a boolean", int: "an integer", float: "a float", str: "a string",
             list: "an array", dict: "a table"}
    kind = kinds.get(type(value), type(value).__name__)
    shown = repr(value)
    return kind if len(shown) > 40 or isinstance(value, dict) else f"{kind} {shown}"

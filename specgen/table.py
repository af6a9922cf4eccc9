"""Consuming a TOML table: known keys are popped, anything left over is an error."""

from __future__ import annotations

import difflib
from typing import Any

from specgen.errors import Where, describe

_MISSING = object()

_TYPE_NAMES = {str: "a string", int: "an integer", float: "a number", bool: "a boolean",
               list: "an array", dict: "a table"}


class Table:
    """A TOML table being parsed. ``pop`` type-checks, ``finish`` rejects unknown keys."""

    def __init__(self, data: dict[str, Any], where: Where):
        self._data = dict(data)
        self._known: list[str] = []
        self.where = where

    def __contains__(self, key: str) -> bool:
        return key in self._data

    def keys(self) -> list[str]:
        """The keys not consumed yet, in file order (TOML tables keep it)."""
        return list(self._data)

    def pop(self, key: str, kind: type, default: Any = _MISSING) -> Any:
        self._known.append(key)
        if key not in self._data:
            if default is _MISSING:
                raise self.where.error(f"missing required key '{key}' ({_TYPE_NAMES[kind]})"
                                       f"{self.misspelling(key)}")
            return default
        value = self._data.pop(key)
        return check_type(value, kind, self.where.child(key))

    def pop_choice(self, key: str, choices, default: Any = _MISSING) -> str:
        """A string that must be one of ``choices`` (a missing key takes ``default``)."""
        value = self.pop(key, str, default)
        if value not in choices:
            raise self.where.child(key).error(
                f"expected one of {', '.join(choices)}, got '{value}'")
        return value

    def pop_any(self, key: str, default: Any = None) -> Any:
        """The raw value, for keys whose shape the caller checks (arrays, value-or-table)."""
        self._known.append(key)
        return self._data.pop(key, default)

    def pop_table(self, key: str, required: bool = True) -> "Table | None":
        self._known.append(key)
        if key not in self._data:
            if required:
                raise self.where.error(f"missing required table [{self._qualified(key)}]"
                                       f"{self.misspelling(key)}")
            return None
        value = self._data.pop(key)
        where = self.where.child(key)
        if not isinstance(value, dict):
            raise where.error(f"expected a table, got {describe(value)}")
        return Table(value, where)

    def pop_item(self) -> tuple[str, Any, Where]:
        """Takes the next key in file order, for tables whose keys are user names."""
        key = next(iter(self._data))
        return key, self._data.pop(key), self.where.child(key)

    def misspelling(self, *keys: str) -> str:
        """For an error about missing ``keys``: a key left in the table that looks like one of
        them (``refrence`` for ``reference``), named, else nothing."""
        for key in keys:
            close = difflib.get_close_matches(key, list(self._data), n=1, cutoff=0.6)
            if close:
                return f"; found '{close[0]}' (a misspelling of '{key}'?)"
        return ""

    def finish(self) -> None:
        if self._data:
            key = next(iter(self._data))
            kind = "table" if isinstance(self._data[key], dict) else "key"
            known = ", ".join(sorted(set(self._known))) or "none"
            raise self.where.child(key).error(f"unknown {kind} '{key}'; expected one of: {known}")

    def _qualified(self, key: str) -> str:
        return ".".join(self.where.keys + (key,))


def check_type(value: Any, kind: type, where: Where) -> Any:
    ok = isinstance(value, kind) and not (kind in (int, float) and isinstance(value, bool))
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not ok:
        raise where.error(f"expected {_TYPE_NAMES[kind]}, got {describe(value)}")
    return value


def parse_list(value: Any, kind: type, where: Where) -> tuple:
    """An array of ``kind``; a lone value is accepted as a one-element array."""
    items = value if isinstance(value, list) else [value]
    if not items:
        # "an integer" -> "integers"
        kinds = _TYPE_NAMES[kind].split(" ", 1)[1] + "s"
        raise where.error(f"expected a non-empty array of {kinds}, got []")
    return tuple(check_type(item, kind, where) for item in items)


__all__ = ["Table", "check_type", "parse_list"]

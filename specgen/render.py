"""Plans -> Python source, through the Jinja templates in ``templates/``."""

from __future__ import annotations

import functools
import hashlib
import shlex
from pathlib import Path

import jinja2

from specgen.families import FAMILIES
from specgen.model import OpSpec

TEMPLATES = Path(__file__).resolve().parent.parent / "templates"
# what a template's first line writes where the hash of the lines after it goes (``_seal``)
TEXT_SHA256 = "<text sha256>"


def pytuple(items) -> str:
    """A tuple literal; one item per line when it does not fit on one."""
    parts = [repr(item) for item in items]
    flat = "(" + ", ".join(parts) + ("," if len(parts) == 1 else "") + ")"
    if len(flat) <= 80:
        return flat
    return "(\n" + "".join(f"    {part},\n" for part in parts) + ")"


@functools.lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        undefined=jinja2.StrictUndefined,   # a name the planner did not provide is an error
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )
    env.filters["pytuple"] = pytuple
    env.filters["pyrepr"] = repr   # a value as a Python literal
    env.filters["docstring"] = docstring_text   # spec text inside a module's docstring
    env.filters["shell"] = shlex.quote   # a path in a command line (a folder name with a space)
    env.filters["wrapped_sum"] = wrapped_sum   # terms joined by +, over lines past 100 columns
    env.globals["TEXT_SHA256"] = TEXT_SHA256
    return env


def render_op(spec: OpSpec, out: str = "generated") -> str:
    """The module of ``spec``, for the package folder ``out`` (its header's rebuild command)."""
    family = FAMILIES[spec.family]
    plan = family.plan(spec)
    return _seal(_tidy(environment().get_template(family.template).render(plan=plan, out=out)))


def docstring_text(text: str) -> str:
    """Spec text (an op's ``doc``, its signature) as it may stand on one line of a triple-quoted
    docstring and read back exactly: backslashes and quotes escaped (``\\N`` or ``\"\"\"``
    would break the module's import), every character Python does not print as itself (line
    breaks of any kind, control and format characters, lone surrogates) as its escape, and
    trailing spaces escaped too (the renderer strips them from each line)."""
    escaped = []
    for c in text:
        if c == "\\":
            escaped.append("\\\\")
        elif c == '"':
            escaped.append('\\"')
        elif c == " " or c.isprintable():
            escaped.append(c)
        else:
            escaped.append(repr(c)[1:-1])   # \n, \t, \x85, \u2028, \ud800
    line = "".join(escaped)
    kept = line.rstrip(" ")
    return kept + "\\x20" * (len(line) - len(kept))


def render_index(modules: list[str], out: str = "generated") -> str:
    return _seal(_tidy(environment().get_template("__init__.py.jinja").render(
        modules=sorted(modules), out=out)))


def text_sha256(body: str) -> str:
    return hashlib.sha256(body.encode()).hexdigest()[:16]


def _seal(text: str) -> str:
    """Writes into the first line the hash of every line after it: a file whose lines no longer
    match it was edited by hand, which a build must not discard unasked (``build.edited_by_hand``)."""
    first, rest = text.split("\n", 1)
    assert TEXT_SHA256 in first, "every template's first line carries TEXT_SHA256"
    return first.replace(TEXT_SHA256, text_sha256(rest)) + "\n" + rest


def wrapped_sum(total: str, head: str, indent: int, width: int = 100) -> str:
    """``head + total`` (terms joined by `` + ``), in parentheses over several lines when it
    would pass ``width``.

    The first line is returned unindented (the template indents it); later lines carry ``indent``.
    """
    terms = total.split(" + ")
    flat = head + total
    if indent + len(flat) <= width:
        return flat
    pad = " " * (indent + len(head) + 1)  # under the opening parenthesis
    lines = [" " * indent + head + "(" + terms[0]]
    for term in terms[1:]:
        if len(lines[-1]) + 3 + len(term) > width:
            lines.append(f"{pad}+ {term}")
        else:
            lines[-1] += f" + {term}"
    return "\n".join(lines)[indent:] + ")"


def _tidy(text: str) -> str:
    """Strips trailing spaces and the blank lines that template control flow leaves behind: a
    line of spaces alone is an indented macro call that emitted nothing, and runs of blank lines
    keep at most two between top-level statements, one inside a block."""
    lines = [line.rstrip() for line in text.splitlines() if not line or line.strip()]
    tidy: list[str] = []
    for i, line in enumerate(lines):
        if not line and tidy and not tidy[-1]:
            following = next((later for later in lines[i + 1:] if later), "")
            if following.startswith(" ") or len(tidy) >= 2 and not tidy[-2]:
                continue
        tidy.append(line)
    while tidy and not tidy[-1]:
        tidy.pop()
    return "\n".join(tidy) + "\n"

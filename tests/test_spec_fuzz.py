"""A spec fuzzer: random mutations of the shipped specs either build a module that compiles, or
stop at a located spec error; never a traceback (issue 38). Bounded: a fixed seed, a few hundred
mutations, parsing and rendering only (no kernel runs), a few seconds on the CPU tier."""

import random
from pathlib import Path

import pytest

from specgen.errors import SpecError, SpecErrors
from specgen.parse import load_spec
from specgen.render import render_op

REPO = Path(__file__).resolve().parents[1]
SPECS = sorted((REPO / "specs").glob("*.toml"))
MUTATIONS = 300

# what a mutation may put somewhere: broken syntax, other types, odd text, long and deep things
PIECES = [
    "", "=", "[", "]", "{", "}", '"', "'''", "\\", "\\N", '"""', "\x00", "\t", "\n", "#",
    "1", "-1", "0", "1e400", "nan", "inf", "true", "[]", "{}", "[1, 2]", '"x"', "x", "y",
    "exp(", "x > 0", "exp(x > 0)", "-(x > 0)", "where(x, 1, 0)", "x ** 0.5", "x ** 100",
    "__import__('os')", "x.y", "x[0]", "lambda: 0", "é", "\ufeff", "relu\n",
    " + ".join(["x"] * 400), "[" * 200 + "]" * 200, "(" * 300 + "x" + ")" * 300,
    '"' + "a" * 5000 + '"', "kind", "tensor", "float", "choice", "dtype", "shape",
]


def _mutated(text: str, rng: random.Random) -> bytes:
    lines = text.split("\n")
    kind = rng.randrange(7)
    i = rng.randrange(len(lines))
    if kind == 0:        # a line dropped
        del lines[i]
    elif kind == 1:      # a line repeated
        lines.insert(i, lines[i])
    elif kind == 2:      # a piece inserted into a line
        at = rng.randrange(len(lines[i]) + 1)
        lines[i] = lines[i][:at] + rng.choice(PIECES) + lines[i][at:]
    elif kind == 3:      # a value replaced
        if "=" in lines[i]:
            lines[i] = lines[i].split("=", 1)[0] + "= " + rng.choice(PIECES)
    elif kind == 4:      # a quoted string's content replaced
        if lines[i].count('"') >= 2:
            head, _, rest = lines[i].partition('"')
            _, _, tail = rest.rpartition('"')
            lines[i] = f'{head}"{rng.choice(PIECES)}"{tail}'
    elif kind == 5:      # the text cut short
        lines = lines[:i]
    data = "\n".join(lines).encode("utf-8", "surrogatepass")
    if kind == 6:        # bytes that are not UTF-8
        at = rng.randrange(len(data) + 1)
        data = data[:at] + bytes([rng.choice([0xE9, 0xFF, 0x80, 0xC3])]) + data[at:]
    return data


def test_mutated_specs_build_or_give_a_located_error(tmp_path):
    rng = random.Random(38)
    (tmp_path / "specs").mkdir()
    outcomes = {"built": 0, "spec error": 0}
    for n in range(MUTATIONS):
        source = rng.choice(SPECS)
        path = tmp_path / "specs" / source.name
        path.write_bytes(_mutated(source.read_text(), rng))
        try:
            spec = load_spec(path, tmp_path)
            for op in (spec, *spec.derived):
                # what builds must import: its module is valid Python (a docstring, a name)
                compile(render_op(op), f"{op.name}.py", "exec")
        except (SpecError, SpecErrors) as err:
            assert str(err).startswith(f"specs/{source.name}"), (n, str(err))
            outcomes["spec error"] += 1
            continue
        except Exception as err:  # a traceback a user would see: the failure this test is for
            pytest.fail(f"mutation {n} of {source.name} raised {type(err).__name__}: {err}\n"
                        f"--- the spec ---\n{path.read_bytes()!r}")
        outcomes["built"] += 1
    # the mutations reach both outcomes (a fuzzer whose specs all fail, or all pass, tests little)
    assert outcomes["built"] > 20 and outcomes["spec error"] > 100, outcomes

"""Every kind of spec error names the file, the key path and what was expected."""

import pytest

from specgen.errors import SpecError
from specgen.model import Source
from specgen.parse import parse_spec

GOOD = """
[op]
name = "scaled_add"
family = "pointwise"
doc = "x + alpha * y"
reference = "x + alpha * y"

[args]
x = "tensor"
y = "tensor"
alpha = { kind = "float", default = 1.0 }

[compute]
out = "x + alpha * y"
"""


def parse(text: str):
    return parse_spec(text, Source("specs/bad.toml", "0" * 64, text))


def test_good_spec_parses():
    spec = parse(GOOD)
    assert spec.name == "scaled_add"
    assert [a.name for a in spec.args] == ["x", "y", "alpha"]


# (what is wrong, text replaced -> replacement, key path, words of the message)
CASES = [
    ("dtype argument outside the row-wise family", 'alpha = { kind = "float", default = 1.0 }',
     'alpha = { kind = "float", default = 1.0 }\ndtype = { kind = "dtype", optional = true }',
     "args.dtype", "the pointwise family takes no dtype argument"),
    ("dtype argument not optional", 'alpha = { kind = "float", default = 1.0 }',
     'alpha = { kind = "float", default = 1.0 }\ndtype = { kind = "dtype" }', "args.dtype",
     "a dtype argument defaults to None"),
    ("unknown key", 'doc = "x + alpha * y"', 'doc = "d"\ndocs = "typo"', "op.docs",
     "unknown key 'docs'; expected one of"),
    ("unknown table", "[compute]", "[extras]\nk = 1\n[compute]", "extras", "unknown table 'extras'"),
    ("wrong type", 'name = "scaled_add"', "name = 3", "op.name", "expected a string, got an integer 3"),
    ("missing field", 'reference = "x + alpha * y"', "", "op", "missing required key 'reference'"),
    # a misspelled required key is named with the key it is missing for
    ("misspelled field", 'reference = "x + alpha * y"', 'refrence = "x + alpha * y"', "op",
     "missing required key 'reference' (a string); found 'refrence' (a misspelling of "
     "'reference'?)"),
    ("misspelled table", '[compute]', '[computes]', "",
     "missing required table [compute]; found 'computes' (a misspelling of 'compute'?)"),
    ("missing table", '[compute]\nout = "x + alpha * y"', "", "",
     "missing required table [compute]"),
    ("block not a power of two", "[compute]", "[tuning]\nBLOCK = [1000]\n[compute]", "tuning.BLOCK",
     "expected powers of two, got 1000"),
    ("tile not a pair", "[compute]", "[tuning]\nTILE = [[32, 32, 1]]\n[compute]", "tuning.TILE",
     "expected [rows, cols] pairs of powers of two"),
    ("unknown dtype", 'family = "pointwise"', 'family = "pointwise"\ndtypes = ["float64"]',
     "op.dtypes", "unknown dtype 'float64'; expected one of: float16, bfloat16, float32"),
    ("unknown family", 'family = "pointwise"', 'family = "stencil"', "op.family",
     "unknown family 'stencil'"),
    ("bad indexing", 'family = "pointwise"', 'family = "pointwise"\nindexing = "int16"',
     "op.indexing", "expected one of auto, int32, int64, got 'int16'"),
    ("bad expression", 'out = "x + alpha * y"', 'out = "x +"', "compute.out",
     "not a valid expression"),
    ("unsafe call", 'out = "x + alpha * y"', "out = \"__import__('os').system('ls')\"",
     "compute.out", "is not allowed as a function"),
    ("unknown function", 'out = "x + alpha * y"', 'out = "cosh(x)"', "compute.out",
     "unknown function 'cosh'"),
    ("attribute access", 'out = "x + alpha * y"', 'out = "x.data"', "compute.out",
     "'x.data' is not allowed in an expression"),
    ("undeclared name", 'out = "x + alpha * y"', 'out = "x + beta * y"', "compute.out",
     "name 'beta' is used but not declared (declared: alpha, x, y)"),
    ("non-integer power", 'out = "x + alpha * y"', 'out = "x ** 0.5"', "compute.out",
     "only integer constant powers"),
    ("unknown torch function in reference", 'reference = "x + alpha * y"',
     'reference = "F.gelux(x + alpha * y)"', "op.reference",
     "'F.gelux' does not exist (F is torch.nn.functional; it has no attribute 'gelux')"),
    ("undeclared in reference", 'reference = "x + alpha * y"', 'reference = "np.add(x, y)"',
     "op.reference", "name 'np' is used but not declared; a reference may use the arguments and "
     "torch, F, math, ref"),
    ("ref function that does not exist", 'reference = "x + alpha * y"',
     'reference = "ref.sum(x, y)"', "op.reference",
     "'ref.sum' does not exist (ref is specgen.references; it has no attribute 'sum')"),
    ("unknown arg kind", 'y = "tensor"', 'y = "matrix"', "args.y.kind", "unknown kind 'matrix'"),
    ("choice default", 'alpha = { kind = "float", default = 1.0 }',
     'alpha = { kind = "choice", values = ["a", "b"], default = "c" }', "args.alpha.default",
     "default 'c' is not one of the values: a, b"),
    ("reserved argument name", 'y = "tensor"', 'mask = "tensor"', "args.mask",
     "argument name 'mask' is reserved"),
    ("default order", 'y = "tensor"\nalpha = { kind = "float", default = 1.0 }',
     'alpha = { kind = "float", default = 1.0 }\ny = "tensor"', "args.y",
     "argument 'y' has no default but follows one that has"),
    ("bad launch", "[compute]", '[schedule]\nlaunch = "wide"\n[compute]', "schedule.launch",
     "expected one of flat, persistent, got 'wide'"),
    ("invalid TOML", "[compute]", "[compute", "", "not valid TOML"),
]


@pytest.mark.parametrize("what, old, new, key, words", CASES, ids=[c[0] for c in CASES])
def test_spec_error_names_file_key_and_expectation(what, old, new, key, words):
    assert old in GOOD, f"test table out of date: {old!r}"
    with pytest.raises(SpecError) as err:
        parse(GOOD.replace(old, new, 1))
    message = str(err.value)
    location = f"specs/bad.toml: [{key}]: " if key else "specs/bad.toml: "
    assert message.startswith(location), message
    assert words in message, message

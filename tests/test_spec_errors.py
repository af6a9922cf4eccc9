"""Every kind of spec error names the file, the key path and what was expected."""

import ast
from pathlib import Path

import pytest

from specgen.errors import SpecError, Where
from specgen.families import FAMILIES
from specgen.families.common import NAME_RE, check_generated_names, check_name
from specgen.model import Source, TensorArg
from specgen.parse import load_spec, parse_spec

REPO = Path(__file__).resolve().parents[1]
SPECS = REPO / "specs"

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
    ("shape argument outside the row-wise family", 'alpha = { kind = "float", default = 1.0 }',
     'alpha = { kind = "shape", default = [1] }', "args.alpha",
     "the pointwise family takes no shape argument (the rowwise family does)"),
    ("optional scalar outside the row-wise family", 'alpha = { kind = "float", default = 1.0 }',
     'alpha = { kind = "float", optional = true }', "args.alpha",
     "the pointwise family takes no optional scalar (the attention and rowwise families do)"),
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
     "expected powers of two up to 1048576, got 1000"),
    ("block past Triton's largest", "[compute]", "[tuning]\nBLOCK = [2097152]\n[compute]",
     "tuning.BLOCK", "expected powers of two up to 1048576, got 2097152"),
    ("too many warps", "[compute]", "[tuning]\nnum_warps = [64]\n[compute]", "tuning.num_warps",
     "expected powers of two up to 32, got 64"),
    ("tile not a pair", "[compute]", "[tuning]\nTILE = [[32, 32, 1]]\n[compute]", "tuning.TILE",
     "expected [rows, cols] pairs of powers of two"),
    ("tile past Triton's largest", "[compute]", "[tuning]\nTILE = [[1024, 2048]]\n[compute]",
     "tuning.TILE", "at most 1048576 elements a tile, got [1024, 2048]"),
    ("unknown dtype", 'family = "pointwise"', 'family = "pointwise"\ndtypes = ["complex64"]',
     "op.dtypes", "unknown dtype 'complex64'; expected one of: float16, bfloat16, float32, "
     "float64, bool, uint8, int8, int16, int32, int64"),
    ("no dtypes", 'family = "pointwise"', 'family = "pointwise"\ndtypes = []',
     "op.dtypes", "expected a non-empty array of strings, got []"),
    ("unknown family", 'family = "pointwise"', 'family = "stencil"', "op.family",
     "unknown family 'stencil'"),
    ("bad indexing", 'family = "pointwise"', 'family = "pointwise"\nindexing = "int16"',
     "op.indexing", "expected one of auto, int32, int64, got 'int16'"),
    ("bad autocast policy", 'family = "pointwise"', 'family = "pointwise"\nautocast = "half"',
     "op.autocast", "expected one of none, lower, float32 or a table { policy, follows }, got a string 'half'"),
    ("autocast following no torch operator", 'family = "pointwise"',
     'family = "pointwise"\nautocast = { policy = "float32", follows = "aten::no_such_op" }',
     "op.autocast.follows", "'aten::no_such_op' is not a torch operator"),
    ("autocast table without a policy", 'family = "pointwise"',
     'family = "pointwise"\nautocast = { follows = "aten::exp" }', "op.autocast",
     "missing required key 'policy'"),
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
    ("argument the reference ignores", 'reference = "x + alpha * y"', 'reference = "x + y"',
     "op.reference", "argument 'alpha' is declared but the reference does not use it, so no "
     "test could check what the op does with it"),
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
    ("name a tensor's names derive from", 'alpha = { kind = "float", default = 1.0 }',
     'alpha = { kind = "float", default = 1.0 }\nx_base = { kind = "float", default = 1.0 }',
     "args.x_base",
     "'x_base' extends 'x', from which generated code derives its names"),
    ("output extending an argument", 'out = "x + alpha * y"',
     'out = "x + alpha * y"\ny_ptr = "x * y"', "compute.y_ptr", "'y_ptr' extends 'y'"),
    ("argument extending an output", 'alpha = { kind = "float", default = 1.0 }',
     'alpha = { kind = "float", default = 1.0 }\nout_stride_0 = { kind = "float", default = 1.0 }',
     "args.out_stride_0", "extends 'out'"),
    ("name the generated code binds", 'alpha = { kind = "float", default = 1.0 }',
     'alpha = { kind = "float", default = 1.0 }\npointwise = { kind = "float", default = 1.0 }',
     "args.pointwise",
     "'pointwise' is a name the pointwise family's generated code uses for itself"),
    ("name of a module the code imports", 'alpha = { kind = "float", default = 1.0 }',
     'alpha = { kind = "float", default = 1.0 }\npointwise = { kind = "float", default = 1.0 }',
     "args.pointwise", "'pointwise' is a name the pointwise family's generated code uses"),
    ("name of a jit helper", 'alpha = { kind = "float", default = 1.0 }',
     'alpha = { kind = "float", default = 1.0 }\ngelu_f32 = { kind = "float", default = 1.0 }',
     "args.gelu_f32", "argument name 'gelu_f32' is reserved"),
    ("op named as its module's import", 'name = "scaled_add"', 'name = "pointwise"', "op.name",
     "op name 'pointwise' is a name the pointwise family's generated code uses for itself"),
    ("the op's own name", 'alpha = { kind = "float", default = 1.0 }',
     'alpha = { kind = "float", default = 1.0 }\nscaled_add = { kind = "float", default = 1.0 }',
     "args.scaled_add", "'scaled_add' is the op's name"),
    ("default order", 'y = "tensor"\nalpha = { kind = "float", default = 1.0 }',
     'alpha = { kind = "float", default = 1.0 }\ny = "tensor"', "args.y",
     "argument 'y' has no default but follows one that has"),
    ("bad launch", "[compute]", '[schedule]\nlaunch = "wide"\n[compute]', "schedule.launch",
     "expected one of flat, persistent, got 'wide'"),
    ("invalid TOML", "[compute]", "[compute", "", "not valid TOML"),
    ("a range on a bool", 'alpha = { kind = "float", default = 1.0 }',
     'alpha = { kind = "bool", default = true, range = [0, 1] }', "args.alpha.range",
     "unknown key 'range'"),
    ("dims written as one string", 'alpha = { kind = "float", default = 1.0 }',
     'alpha = { kind = "tensor", dims = "N, K" }', "args.alpha.dims",
     "'N, K' is not a dim name; expected an array of names, such as [\"N\", \"K\"]"),
    ("an int range of non-integers", 'alpha = { kind = "float", default = 1.0 }',
     'alpha = { kind = "int", default = 1, range = [0.5, 64] }', "args.alpha.range",
     "an int argument's range takes integers, got [0.5, 64]"),
    ("an infinite range", 'alpha = { kind = "float", default = 1.0 }',
     'alpha = { kind = "float", default = 1.0, range = [-inf, inf] }', "args.alpha.range",
     "expected [low, high], finite, with low < high"),
    ("an infinite default", 'alpha = { kind = "float", default = 1.0 }',
     'alpha = { kind = "float", default = inf }', "args.alpha.default",
     "expected a finite default, got inf"),
    ("a bool argument as a value", 'alpha = { kind = "float", default = 1.0 }',
     'alpha = { kind = "bool", default = true }', "compute.out",
     "'alpha' is a condition (a bool), and arithmetic takes a value"),
    # (issue 38: each of these printed a traceback, or built and failed at import or first call)
    ("arrays nested beyond the TOML reader", 'doc = "x + alpha * y"',
     'doc = "x + alpha * y"\ndeep = ' + "[" * 1000 + "]" * 1000, "",
     "nested deeper than the TOML reader can follow"),
    ("an expression 400 terms long", 'out = "x + alpha * y"',
     'out = "' + " + ".join(["x"] * 400) + '"', "compute.out",
     "nests 400 levels deep, more than 100: split it into steps"),
    ("a long expression quoted short", 'out = "x + alpha * y"',
     'out = "' + " + ".join(["x"] * 60) + ' +"', "compute.out",
     "not a valid expression: 'x + x + x"),
    ("an op name ending in a newline", 'name = "scaled_add"', 'name = "scaled_add\\n"',
     "op.name", "must be lower-case letters, digits and '_'"),
    ("a condition as a function's argument", 'out = "x + alpha * y"', 'out = "exp(x > 0)"',
     "compute.out", "'x > 0' is a condition (a bool), and exp takes a value: write "
     "where(x > 0, 1.0, 0.0)"),
    ("a negated condition", 'out = "x + alpha * y"', 'out = "-(x > 0)"', "compute.out",
     "'x > 0' is a condition (a bool), and '-' takes a value"),
    ("conditions subtracted", 'out = "x + alpha * y"', 'out = "(x > 0) - (x < 1)"',
     "compute.out", "'x > 0' is a condition (a bool), and arithmetic takes a value"),
]


# an argument no kernel expression reads would be taken and ignored, the op disagreeing with
# its reference (which must use it); a user's trial built such ops in four families unwarned
# (cross_entropy's arguments each have a fixed role: not checked)
UNREAD = [
    ("pointwise", None, {'out = "x + alpha * y"': 'out = "x + y"'}, "args.alpha",
     "declared, but no [compute] expression reads it"),
    ("matmul", "linear_residual.toml", {'out = "acc + bias + residual"': 'out = "acc + bias"'},
     "args.residual", "no [epilogue] expression reads it"),
    # a choice the reference passes on (torch's approximate=) and the epilogue ignores
    ("matmul_choice", "linear_gelu.toml",
     {"bias), approximate='tanh')\"": "bias), approximate=approximate)\"",
      'bias = { kind = "tensor", dims = ["N"], optional = true }':
      'bias = { kind = "tensor", dims = ["N"], optional = true }\n'
      'approximate = { kind = "choice", values = ["none", "tanh"], default = "tanh" }'},
     "args.approximate", "no [epilogue] expression reads it"),
    ("conv", "conv2d_bias_silu.toml", {'out = "silu(acc + bias)"': 'out = "silu(acc)"'},
     "args.bias", "no [epilogue] expression reads it"),
    ("rowwise", "rms_norm.toml",
     {'out = "x * rsqrt(ms + eps) * weight"': 'out = "x * rsqrt(ms + eps)"'},
     "args.weight", "no [reduce], [compute] or [columns] expression reads it"),
    ("attention", "softcap_attention.toml",
     {'score = "where(softcap == 0.0, s, softcap * tanh(s / softcap))"': 'score = "tanh(s)"'},
     "args.softcap", "neither [attention] score nor mask reads it"),
    # (the reference must use it too: its check comes first)
    ("reduce", "sum.toml",
     {'dtype = { kind = "dtype", optional = true }':
      'dtype = { kind = "dtype", optional = true }\nalpha = { kind = "float", default = 1.0 }',
      "dtype=dtype)": "dtype=dtype) * alpha"},
     "args.alpha", "neither [reduce] map nor finish reads it"),
]


@pytest.mark.parametrize("family, spec, edits, key, words", UNREAD, ids=[c[0] for c in UNREAD])
def test_an_argument_no_expression_reads_is_an_error(family, spec, edits, key, words):
    text = (SPECS / spec).read_text() if spec else GOOD
    for old, new in edits.items():
        assert old in text, f"test table out of date: {old!r}"
        text = text.replace(old, new, 1)
    with pytest.raises(SpecError) as err:
        parse(text)
    message = str(err.value)
    assert message.startswith(f"specs/bad.toml: [{key}]: "), message
    assert words in message, message


@pytest.mark.parametrize("what, old, new, key, words", CASES, ids=[c[0] for c in CASES])
def test_spec_error_names_file_key_and_expectation(what, old, new, key, words):
    assert old in GOOD, f"test table out of date: {old!r}"
    with pytest.raises(SpecError) as err:
        parse(GOOD.replace(old, new, 1))
    message = str(err.value)
    location = f"specs/bad.toml: [{key}]: " if key else "specs/bad.toml: "
    assert message.startswith(location), message
    assert words in message, message


def _bound_names(source: str) -> set[str]:
    """Names a module binds: at its top level (imports, functions, assignments), and in its
    functions (parameters, assignment targets; comprehension variables are scoped to their
    comprehension, so no spec name meets them)."""
    tree = ast.parse(source)
    bound = set()
    for statement in tree.body:
        if isinstance(statement, (ast.Import, ast.ImportFrom)):
            bound.update((a.asname or a.name).split(".")[0] for a in statement.names)
        elif isinstance(statement, ast.FunctionDef):
            bound.add(statement.name)
        elif isinstance(statement, ast.Assign):
            bound.update(n.id for t in statement.targets for n in ast.walk(t)
                         if isinstance(n, ast.Name))
    for function in ast.walk(tree):
        if not isinstance(function, ast.FunctionDef):
            continue
        scoped = {id(n) for c in ast.walk(function) if isinstance(c, ast.comprehension)
                  for n in ast.walk(c.target)}
        bound.update(a.arg for a in function.args.args + function.args.kwonlyargs)
        bound.update(n.id for n in ast.walk(function) if isinstance(n, ast.Name)
                     and isinstance(n.ctx, ast.Store) and id(n) not in scoped)
    return bound


# cross_entropy's signature is fixed (its SIGNATURE): an author declares no names there
@pytest.mark.parametrize("path", sorted(p for p in SPECS.glob("*.toml")
                                         if p.stem != "cross_entropy"), ids=lambda p: p.stem)
def test_generated_names_cover_what_the_template_binds(path):
    # every name a generated module binds that the spec did not declare must be one a spec may
    # not declare (check_generated_names): else a spec naming it would shadow it, or be shadowed
    spec = load_spec(path, REPO)
    family = FAMILIES[spec.family]
    body_names = [name for name, _ in family.body_names(spec.body)]
    declared = {a.name for a in spec.args} | set(body_names)
    bases = [a.name for a in spec.args if isinstance(a, TensorArg)] + body_names
    uncovered = set()
    for name in _bound_names((REPO / "generated" / f"{spec.name}.py").read_text()):
        if not NAME_RE.match(name) or name in declared or name == spec.name or any(
                name.startswith(base + "_") for base in bases):
            continue
        try:
            check_name(name, Where("x"), "argument")
            check_generated_names(Where("x"), spec.name, family, [(name, ())], [],
                                  derived_from=[])
        except SpecError:
            continue
        uncovered.add(name)
    assert not uncovered, (f"{spec.name}: the {spec.family} template binds names a spec may "
                           f"declare; add them to GENERATED_NAMES: {sorted(uncovered)}")


def test_a_spec_file_is_utf8_with_or_without_its_byte_order_mark(tmp_path):
    spec = tmp_path / "specs" / "scaled_add.toml"
    spec.parent.mkdir()
    spec.write_bytes(b"\xef\xbb\xbf" + GOOD.encode())   # a BOM, as some editors write
    assert load_spec(spec, tmp_path).name == "scaled_add"
    lines = GOOD.count("\n") + 1
    for mark in (b"", b"\xef\xbb\xbf"):   # the byte named in the file as it is, a BOM or not
        spec.write_bytes(mark + GOOD.encode() + b"# caf\xe9\n")   # Latin-1, not UTF-8
        with pytest.raises(SpecError) as err:
            load_spec(spec, tmp_path)
        at = len(mark) + len(GOOD.encode()) + 5
        assert str(err.value) == (f"specs/scaled_add.toml: not UTF-8 text: byte 0xe9 at line "
                                  f"{lines} (byte {at}); save the spec as UTF-8")

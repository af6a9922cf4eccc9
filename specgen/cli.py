"""The ``specgen`` command: build, list, show, new, bench, tune."""

from __future__ import annotations

from pathlib import Path

import click

from specgen import build as builder
from specgen.errors import SpecError, Where
from specgen.families import FAMILIES
from specgen.families.common import check_name
from specgen.model import Source
from specgen.parse import parse_spec

DEFAULT_SPECS = Path("specs")
DEFAULT_OUT = Path("generated")


@click.group()
def main() -> None:
    """specgen: declarative kernel specs -> Triton kernels registered as PyTorch ops."""


def _fail_on_spec_error(func):
    """A spec error is the user's to fix: print it, exit 1, no traceback."""
    import functools

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except SpecError as err:
            raise click.ClickException(str(err)) from None
    return wrapper


@main.command()
@click.argument("paths", nargs=-1, type=click.Path(path_type=Path))
@click.option("--out", "out_dir", type=click.Path(path_type=Path), default=DEFAULT_OUT,
              show_default=True, help="Package directory the modules are written to.")
@click.option("--check", is_flag=True,
              help="Write nothing; exit 1 if the output is stale or was edited by hand.")
@click.option("--force", is_flag=True, help="Rewrite or remove files edited by hand too.")
@_fail_on_spec_error
def build(paths: tuple[Path, ...], out_dir: Path, check: bool, force: bool) -> None:
    """Generate a module per spec in PATHS (files or directories; default: specs/)."""
    changes = builder.plan_build(paths or (DEFAULT_SPECS,), out_dir)
    base = Path.cwd()
    if check:
        if changes:
            for change in changes:
                click.echo(f"stale: {builder.describe(change, base).strip()}", err=True)
            flag = " --force" if any(change.by_hand for change in changes) else ""
            # the command that brings it up to date: this one's paths and package, no --check
            given = "".join(f" {p}" for p in paths) + (
                "" if out_dir == DEFAULT_OUT else f" --out {out_dir}")
            raise click.ClickException(
                f"{out_dir}/ is out of date with the specs ({len(changes)} file(s) would change); "
                f"run `specgen build{given}{flag}` and commit the result")
        click.echo(f"{out_dir}/ is up to date")
        return
    if not force:
        builder.refuse_hand_edits(changes)
    builder.apply(changes, out_dir)
    for change in changes:
        click.echo(builder.describe(change, base))
    click.echo(f"{len(changes)} file(s) changed" if changes else "nothing to do: up to date")


@main.command("list")
@click.argument("paths", nargs=-1, type=click.Path(path_type=Path))
@_fail_on_spec_error
def list_ops(paths: tuple[Path, ...]) -> None:
    """List the ops the specs in PATHS define (default: specs/)."""
    specs = builder.load_specs(paths or (DEFAULT_SPECS,), Path.cwd())
    # columns as wide as their longest entry (derived ops have long names)
    widths = [max((len(text) for text in column), default=0)
              for column in zip(*((s.name, s.family, s.source.path) for s in specs))]
    for spec in specs:
        cells = (spec.name, spec.family, spec.source.path)
        click.echo(" ".join(f"{cell:<{width}}" for cell, width in zip(cells, widths))
                   + f" {spec.doc}")


@main.command()
@click.argument("op")
@click.option("--specs", "spec_dir", type=click.Path(path_type=Path), default=DEFAULT_SPECS,
              show_default=True)
@click.option("--out", "out_dir", type=click.Path(path_type=Path), default=DEFAULT_OUT,
              show_default=True)
@_fail_on_spec_error
def show(op: str, spec_dir: Path, out_dir: Path) -> None:
    """Print an op's spec and its generated source."""
    specs = {s.name: s for s in builder.load_specs((spec_dir,), out_dir.resolve().parent)}
    if op not in specs:
        raise click.ClickException(f"no op '{op}' in {spec_dir}/; known: {', '.join(sorted(specs))}")
    spec = specs[op]
    module = out_dir / f"{op}.py"
    click.echo(f"# ---- {spec.source.path}\n{spec.source.text}")
    if module.is_file():
        click.echo(f"# ---- {module}\n{module.read_text(encoding='utf-8')}")
    else:
        click.echo(f"# ---- {module} does not exist yet: run `specgen build`")


@main.command()
@click.argument("name")
@click.option("--family", "family", type=click.Choice(sorted(FAMILIES)), required=True)
@click.option("--specs", "spec_dir", type=click.Path(path_type=Path), default=DEFAULT_SPECS,
              show_default=True)
@_fail_on_spec_error
def new(name: str, family: str, spec_dir: Path) -> None:
    """Write a starting spec specs/NAME.toml of FAMILY that builds as it is."""
    path = spec_dir / f"{name}.toml"
    check_name(name, Where(str(path), ("op", "name")), "op")
    if path.exists():
        raise click.ClickException(f"{path} already exists")
    text = FAMILIES[family].scaffold(name)
    # parsed before it is written: a name a family reserves (a reduce_lib helper's), or an op of
    # a package here (generated/'s relu), is refused here, not at the first build
    spec = parse_spec(text, Source(str(path), "", text))
    builder.refuse_clashes([spec, *spec.derived], None)
    spec_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    build = ("specgen build" if spec_dir == DEFAULT_SPECS
             else f"specgen build {spec_dir} --out YOUR_PACKAGE")
    click.echo(f"wrote {path}; edit it, then run `{build}`")


@main.command("bench")
@click.argument("ops", nargs=-1)
@click.option("--only", multiple=True, metavar="FAMILY",
              help="Run only this family's rows or section (repeatable).")
@click.option("--quick", is_flag=True, help="16x smaller sizes, for smoke tests.")
@click.option("--out", type=click.Path(path_type=Path), default=None,
              help="Markdown report the sections are merged into (the others kept). Default: the "
                   "checkout's bench/RESULTS.md; with OPS (whose rows are part of a section) "
                   "none: the tables are printed.")
def bench_command(ops: tuple[str, ...], only: tuple[str, ...], quick: bool,
                  out: Path | None) -> None:
    """Time OPS (default: every op with a benchmark case) on this GPU against eager PyTorch and
    torch.compile (and a family's peers), with the device copy's bandwidth measured the same
    way: bench/ of a specgen checkout, as `python3 -m bench` runs it."""
    import shlex
    import sys

    command = _bench_module()
    if ops and out is not None:
        # a report's section holds a family's every row: some of them would replace it whole
        raise click.ClickException("--out merges whole families' sections into a report; a run "
                                   "of some ops prints its rows: leave out OPS or --out")
    selection = _selection(command, only, ops, quick)
    _need_gpu("bench")
    if out is None and not ops:
        out = Path(command.__file__).parent / "RESULTS.md"
    click.echo(command.run(selection, out, shlex.join(["specgen", "bench", *sys.argv[2:]])),
               nl=False)


def _selection(command, only: tuple[str, ...], ops: tuple[str, ...], quick: bool):
    """What a bench or tune run takes (bench/command.py's ``select``), a bad name an error."""
    try:
        return command.select(only, ops, quick)
    except ValueError as err:
        raise click.ClickException(str(err)) from None


def _need_gpu(name: str) -> None:
    import torch

    if not torch.cuda.is_available():
        raise click.ClickException(f"specgen {name} needs a CUDA GPU (it times kernels on one)")


def _bench_module():
    """bench/command.py of the checkout this specgen runs from (bench/ is not installed)."""
    import importlib
    import sys

    root = Path(__file__).resolve().parents[1]
    if not (root / "bench" / "command.py").exists():
        raise click.ClickException(f"specgen bench runs bench/ of a specgen checkout; {root} "
                                   f"has none")
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    return importlib.import_module("bench.command")


@main.command("tune")
@click.argument("ops", nargs=-1)
@click.option("--only", multiple=True, metavar="FAMILY", help="Only this family's cases (repeatable).")
@click.option("--shapes", multiple=True, metavar="SHAPES",
              help="Where to tune (repeatable): a benchmark case's shape label as "
                   "bench/RESULTS.md writes it (4096x8192), or, for the OPS named, a call's "
                   "arguments by name (\"x=4096x1024,normalized_shape=1024,weight=1024,bias=1024\"; "
                   "tensors drawn at --dtype, an optional tensor left out stays out of the "
                   "call and of its key, other arguments at their defaults). Default: every benchmark "
                   "shape.")
@click.option("--dtype", type=click.Choice(["bfloat16", "float16", "float32"]),
              default="bfloat16", show_default=True,
              help="The dtype of the tensors --shapes NAME=SHAPE draws (benchmark cases keep "
                   "their own).")
@click.option("--quick", is_flag=True, help="The benchmark's 16x smaller sizes.")
@click.option("--out", type=click.Path(path_type=Path), default=None,
              help="The table to write (and resume). Default: this GPU's in specgen/tuned/.")
def tune_command(ops: tuple[str, ...], only: tuple[str, ...], shapes: tuple[str, ...],
                 dtype: str, quick: bool, out: Path | None) -> None:
    """Search each autotuned kernel's config space for OPS (default: every op with a benchmark
    case) at the benchmark shapes, or the shapes given, on this GPU, check each candidate against
    eager torch before timing it, and freeze the winners in the GPU's table, which later launches
    read instead of autotuning (docs/performance.md, "Frozen configs"). Stopped, it resumes
    where it stopped."""
    import torch

    command = _bench_module()
    labels = tuple(text for text in shapes if "=" not in text)
    calls = tuple(text for text in shapes if "=" in text)
    cases = []
    if labels or not calls:
        selection = _selection(command, only, ops, quick)
        cases = [case for case in command.tune_cases(selection, ops, quick)
                 if not labels or case.shape in labels]
    if calls:
        try:
            cases += command.argument_cases(ops, calls, getattr(torch, dtype))
        except ValueError as err:
            raise click.ClickException(str(err)) from None
    if not cases:
        if labels:
            raise click.ClickException("no benchmark case has the shape " + ", ".join(labels))
        raise click.ClickException(f"no benchmark case times {', '.join(ops)}: give the calls to "
                                   f"tune at as --shapes NAME=SHAPE,... (specgen tune --help)")
    _need_gpu("tune")
    import importlib

    from specgen.runtime import tuned

    tune = importlib.import_module("bench.tune")
    name, capability = tune.device()
    table = out or tuned.TABLE_DIR / tuned.table_name(name, capability)
    found = tune.tune(cases, table, name, capability, echo=click.echo)
    searched = [f for f in found if f.config is not None]
    click.echo(f"{len(searched)} kernel(s) tuned, {len(found) - len(searched)} with no candidate "
               f"passing; table {table}")

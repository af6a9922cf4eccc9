"""``specgen bench`` and ``python3 -m bench`` on a CPU machine: what a run selects, what it refuses
before any GPU work, and how its sections merge into the report, the timing faked (the GPU tier
and the device calls run the real one)."""

from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from bench import command, harness
from specgen.cli import main

FAMILIES = {"add": "pointwise", "softmax": "rowwise", "sum": "reduce", "cross_entropy":
            "cross_entropy", "mm": "matmul", "scaled_dot_product_attention": "attention",
            "amax": "reduce", "decode_attention": "attention",
            "softcap_attention": "attention"}


def test_ops_narrow_the_rows_and_pick_their_families_sections():
    picked = command.select(ops=("softmax", "cross_entropy"), op_families=FAMILIES)
    assert {name: {command.case_op(c) for c in cases} for name, cases in picked.cases.items()} == \
        {"rowwise": {"softmax"}, "cross_entropy": {"cross_entropy"}}
    # a section runs whole, for an op of its family or where --only names it
    assert command.select(ops=("scaled_dot_product_attention",),
                          op_families=FAMILIES).names == ("attention",)
    assert "host" in command.select(("host", "rowwise"), ("softmax",), op_families=FAMILIES).names
    # a section whose ops are another family's: the quantized ops are the matmul family's
    quantized = command.select(ops=("int8_weight_linear",),
                               op_families={**FAMILIES, "int8_weight_linear": "matmul"})
    assert quantized.names == ("quantized",)
    assert {command.case_op(c) for c in command.tune_cases(quantized, ("int8_weight_linear",))} \
        == {"int8_weight_linear"}
    whole = command.select(op_families=FAMILIES)
    assert set(whole.names) == {*command.FAMILIES, *command.SECTIONS}
    assert all(cases for cases in whole.cases.values())


@pytest.mark.parametrize("only, ops, message", [
    ((), ("nosuch",), "unknown op nosuch; the ops are: add, amax"),
    # every family with bench rows, then the sections
    (("nope",), (), "unknown family nope; the families are: "
                    + ", ".join([*command.FAMILIES, *command.SECTIONS])),
    ((), ("amax",), "no benchmark case times amax"),
    (("matmul",), ("softmax",), "no benchmark case times softmax in matmul"),
])
def test_what_no_run_takes_is_refused_by_name(only, ops, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        command.select(only, ops, op_families=FAMILIES)


def test_the_command_refuses_before_any_gpu_work(tmp_path, monkeypatch):
    out = tmp_path / "RESULTS.md"
    runner = CliRunner()
    result = runner.invoke(main, ["bench", "nosuch"])
    assert result.exit_code == 1 and "unknown op nosuch" in result.output
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    result = runner.invoke(main, ["bench", "--only", "rowwise", "--out", str(out)])
    assert result.exit_code == 1 and "needs a CUDA GPU" in result.output
    assert not out.exists()


def _fake_timing(monkeypatch, device="Fake GPU"):
    """A GPU named ``device`` whose rows time specgen 1 ms, eager 2, compile 3, and whose copy
    runs at 1000 GB/s."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: device)
    monkeypatch.setattr(harness, "measure_copy_bandwidth", lambda: 1000.0)
    monkeypatch.setattr(harness, "run_cases", lambda cases: [
        harness.Row(case, ms={"specgen": 1.0, "eager": 2.0, "compile": 3.0}) for case in cases])


def test_a_run_merges_its_sections_and_keeps_the_others(tmp_path, monkeypatch):
    _fake_timing(monkeypatch)
    out = tmp_path / "RESULTS.md"
    out.write_text("# specgen benchmarks\n\n- Device: Older GPU\n\n## rowwise\n\nold rows\n\n"
                   "## reduce\n\nkept rows\n")
    text = command.run(command.select(("rowwise",), quick=True), out, "specgen bench")
    report = out.read_text()
    assert text.startswith("## rowwise") and "Fake GPU (copy 1000 GB/s)" in text
    # a run of some families keeps the report's header and the other sections
    assert "Device: Older GPU" in report and "kept rows" in report and "old rows" not in report
    assert report.index("## rowwise") < report.index("## reduce")
    # each row's columns come from its times: ms as timed, vs compile = 3 / 1
    first_row = next(line for line in text.splitlines() if line.startswith("| `"))
    cells = dict(zip(harness.COLUMNS, (c.strip() for c in first_row.strip("|").split("|"))))
    assert (cells["specgen ms"], cells["compile ms"], cells["vs compile (x)"]) == \
        ("1.000", "3.000", "3.000")


def test_a_run_of_ops_prints_its_rows_and_writes_no_report(tmp_path, monkeypatch):
    _fake_timing(monkeypatch)
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["bench", "softmax", "--quick"])
    assert result.exit_code == 0, result.output
    assert "`softmax" in result.output and not (tmp_path / "bench").exists()
    # their rows are part of a section: --out would replace the section with them
    result = CliRunner().invoke(main, ["bench", "softmax", "--quick", "--out", "r.md"])
    assert result.exit_code == 1 and "leave out OPS or --out" in result.output
    assert not Path("r.md").exists()
    result = CliRunner().invoke(main, ["bench", "--only", "rowwise", "--quick", "--out", "r.md"])
    assert result.exit_code == 0 and "`softmax" in Path("r.md").read_text()


def test_tune_reaches_a_section_familys_kernels_through_its_tuning_cases():
    # attention's benchmark is a section; `specgen tune` searches its tuning cases instead
    selection = command.select(ops=("scaled_dot_product_attention",), op_families=FAMILIES)
    cases = command.tune_cases(selection, ("scaled_dot_product_attention",), quick=True)
    assert {command.case_op(c) for c in cases} == {"scaled_dot_product_attention"}
    assert {c.op for c in cases} == {"scaled_dot_product_attention",
                                     "scaled_dot_product_attention fwd+bwd"}
    decoding = command.tune_cases(command.select(ops=("decode_attention",), op_families=FAMILIES),
                                  ("decode_attention",), quick=True)
    assert [c.shape for c in decoding] == ["B8 Hq32 Hkv8 S2048 E128", "B1 Hq32 Hkv32 S8192 E128"]
    # the authored variants at their cell (the section's rows), against their references
    softcap = command.tune_cases(command.select(ops=("softcap_attention",), op_families=FAMILIES),
                                 ("softcap_attention",), quick=True)
    assert [(c.op, c.shape) for c in softcap] == [("softcap_attention causal", "B4 H32 S256 E128")]
    # and none where the ops asked for are another family's
    rows = command.tune_cases(command.select(ops=("softmax",), op_families=FAMILIES), ("softmax",))
    assert [(c.op, c.shape) for c in rows] == [
        (c.op, c.shape) for c in command.FAMILIES["rowwise"](False) if command.case_op(c) == "softmax"]


def test_the_host_table_reads_each_first_call_against_its_target():
    from bench import host

    def row(key, first_us):
        case = host.HostCase(key, f"{key}(x)", lambda grad, rows=8: (), None, None)
        return host.HostRow(case, inputs="8x1024", first_us=first_us,
                            us={"specgen": [10.0] * host.ROUNDS, "eager": [8.0] * host.ROUNDS})

    lines = host.table([row("add", [310.4, 980.0, 290.0]), row("sum", [1500.0, 900.0]),
                        row("gelu", [])]).splitlines()
    first = [line.rstrip(" |").rpartition("|")[2].strip() for line in lines[2:]]
    # the median against the target (sum: 1200); gelu: every fresh row count compiled something
    assert first == ["310 (290-980) of 3 (pass)", "1200 (900-1500) of 2 (miss)", "-"]


def test_first_calls_pass_over_sizes_that_compile_and_stop_at_the_sample_count(monkeypatch):
    import triton

    from bench import host

    compiling = {24, 56}  # row counts at which the fake op "compiles" (calls Triton's cache hook)
    seen = []

    def specgen(x):
        seen.append(x)
        if x in compiling:
            triton.knobs.runtime.jit_cache_hook()
        return x

    case = host.HostCase("add", "add(x)", lambda grad, rows: (rows,), specgen, None)
    # each call's time: its row count, so the result says which sizes were kept
    monkeypatch.setattr(host, "_timed_once", lambda call: (float(call()), 0.0))
    monkeypatch.setattr(host, "FIRST_SAMPLES", 3)
    hook = triton.knobs.runtime.jit_cache_hook
    assert host.first_calls(case) == [40.0, 72.0, 88.0]
    assert seen == [24, 40, 56, 72, 88]  # no call past the third kept size
    assert triton.knobs.runtime.jit_cache_hook is hook  # restored

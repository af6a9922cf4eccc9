"""Configs frozen per GPU (specgen/runtime/tuned.py) and ``specgen tune`` (bench/tune.py) on a
CPU machine: which table and which entry a launch takes, and the search itself under Triton's
interpreter with a fake timer (candidates forced one by one, checked, timed; the winners
written deterministically; a stopped run resumed). tests/gpu/test_tuned_gpu.py has a launch
reading a table on a GPU."""

import importlib
from pathlib import Path

import pytest
import torch

import generated
from bench import harness, tune
from specgen.runtime import override, record_launches, tuned

launch = importlib.import_module("specgen.runtime.launch")


def test_a_launch_takes_the_nearest_entry_of_its_kind():
    # (rows: a size; E: a constexpr head dim; the tensors' dtype)
    sizes = [True, False, False]
    entries = [{"key": [512, 64, "torch.bfloat16"], "config": {"BLOCK": 1}},
               {"key": [8192, 64, "torch.bfloat16"], "config": {"BLOCK": 2}},
               {"key": [4096, 64, "torch.float32"], "config": {"BLOCK": 3}},
               {"key": [4096, 128, "torch.bfloat16"], "config": {"BLOCK": 4}}]
    # 4096 rows: 1 octave from 8192, 3 from 512; the float32 and E 128 entries are other kinds
    assert tuned.nearest(entries, [4096, 64, "torch.bfloat16"], sizes).kwargs == {"BLOCK": 2}
    assert tuned.nearest(entries, [600, 64, "torch.bfloat16"], sizes).kwargs == {"BLOCK": 1}
    assert tuned.nearest(entries, [4096, 256, "torch.bfloat16"], sizes) is None
    assert tuned.nearest(entries, [4096, 64, "torch.float16"], sizes) is None
    assert tuned.nearest(entries, [4096, "torch.bfloat16"], sizes[1:]) is None


def test_the_sizes_of_a_key_are_its_arguments_that_are_not_constexprs():
    kernel, args, kwargs = _first_launch()
    key, sizes = tuned.key_of(kernel, args, kwargs), tuned.sizes_of(kernel, args, kwargs)
    # mm's key: M, N, K, then LAYOUT, INDEX_64, INPUT_PRECISION (constexprs), then dtypes
    assert key[:3] == [32, 32, 32] and sizes == [True] * 3 + [False] * (len(key) - 3)


def test_a_frozen_config_the_launch_would_prune_is_not_taken(monkeypatch):
    # an older GPU's table, or an entry of another size, may hold tiles that do not fit here
    kernel, args, kwargs = _first_launch()
    space = launch.pruned_configs(kernel, args, kwargs)
    # (what _frozen reads of the launch's tensors: they are on a GPU)
    cuda = [type("Tensor", (), {"device": torch.device("cuda", 0)})()]
    monkeypatch.setattr(tuned, "lookup", lambda *a: space[1])
    assert tuned.entry_config(launch._frozen(kernel, args, kwargs, cuda)) == \
        tuned.entry_config(space[1])
    outside = tuned.config_of({"BLOCK_M": 1024, "BLOCK_N": 1024, "BLOCK_K": 512})
    monkeypatch.setattr(tuned, "lookup", lambda *a: outside)
    assert launch._frozen(kernel, args, kwargs, cuda) is None


def test_a_device_without_a_table_of_its_own_takes_an_older_one_of_its_architecture(tmp_path):
    for name in ("nvidia-h100-80gb-hbm3-sm90.json", "nvidia-a100-sxm4-80gb-sm80.json"):
        (tmp_path / name).write_text("{}")
    assert tuned.table_name("NVIDIA H100 80GB HBM3", (9, 0)) == "nvidia-h100-80gb-hbm3-sm90.json"
    found = tuned.find_table("NVIDIA H200", (9, 0), tmp_path)
    assert found.name == "nvidia-h100-80gb-hbm3-sm90.json"
    assert tuned.find_table("NVIDIA A10", (8, 6), tmp_path).name == \
        "nvidia-a100-sxm4-80gb-sm80.json"
    # tiles of another architecture: none
    assert tuned.find_table("NVIDIA B200", (10, 0), tmp_path) is None
    assert tuned.find_table("Tesla V100", (7, 0), tmp_path) is None


class _Kernel:
    """What a lookup reads of an autotuned kernel."""
    arg_names = ["x_ptr", "N", "BLOCK"]
    keys = ["N"]

    def fn(self):
        pass
    fn.__module__, fn.__name__ = "generated.fake", "_fake_kernel"


def test_autotuning_asked_for_bypasses_the_table(monkeypatch):
    kernel = _Kernel()
    table = {"generated.fake:_fake_kernel": [{"key": [100, "torch.float32"],
                                              "config": {"BLOCK": 64, "num_warps": 2}}]}
    monkeypatch.setattr(tuned, "_table_for", lambda index: table)
    x = torch.empty(3)
    monkeypatch.setattr(tuned, "sizes_of", lambda *a: [True, False])
    config = tuned.lookup(kernel, (x, 100), {}, torch.device("cuda", 0))
    assert config.kwargs == {"BLOCK": 64} and config.num_warps == 2
    monkeypatch.setenv("SPECGEN_AUTOTUNE", "1")
    assert tuned.lookup(kernel, (x, 100), {}, torch.device("cuda", 0)) is None
    monkeypatch.delenv("SPECGEN_AUTOTUNE")
    monkeypatch.setattr(tuned, "_use_tables", False)   # what use_tables(False) sets
    assert tuned.lookup(kernel, (x, 100), {}, torch.device("cuda", 0)) is None


def _mm_case(size=32):
    return harness.Case(family="matmul", op="mm", shape=f"{size}^3", dtype=torch.float32,
                        make_inputs=lambda: (torch.randn(size, size), torch.randn(size, size)),
                        specgen=lambda a, b: generated.mm(a, b), eager=lambda a, b: a @ b,
                        bytes_moved=1)


def _forced() -> int:
    """The candidate the search forces now (its index in the mm kernel's space)."""
    return dict(launch.overrides().kernel_configs)["generated.mm:_mm_kernel"]


def test_the_search_checks_times_and_freezes_the_winner(tmp_path):
    table = tmp_path / "fake-sm90.json"
    # config 1 would be fastest but fails its check; config 3 is the fastest that passes
    times = {0: 5.0, 1: 0.5, 2: 4.0, 3: 1.0}
    timed = []

    def timer(fn):
        fn()
        timed.append(_forced())
        return times.get(_forced(), 9.0)

    def check(specgen, eager, inputs, dtype):
        return "FAIL (wrong)" if _forced() == 1 else harness.check(specgen, eager, inputs, dtype)

    lines = []
    found, = tune.tune([_mm_case()], table, "Fake GPU", (9, 0), timer=timer, check=check,
                       echo=lines.append)
    assert 1 not in timed and found.rejected == 1 and found.candidates >= 4
    with override(config=3):
        space = launch.pruned_configs(*_first_launch())
    assert found.config == tuned.entry_config(space[3])
    assert any("config 1: FAIL (wrong), skipped" in line for line in lines)
    assert tuned.read_table(table)["kernels"]["generated.mm:_mm_kernel"][0]["config"] == \
        found.config
    # the same measurements give the same bytes
    again = tmp_path / "again-sm90.json"
    timed.clear()
    tune.tune([_mm_case()], again, "Fake GPU", (9, 0), timer=timer, check=check,
              echo=lambda _: None)
    assert again.read_bytes() == table.read_bytes()
    # a second run resumes: the kernel at this key is in the table, nothing is timed
    timed.clear()
    assert tune.tune([_mm_case()], table, "Fake GPU", (9, 0), timer=timer, check=check,
                     echo=lines.append) == []
    assert timed == [] and "in the table already" in lines[-1]


def _first_launch():
    a, b = _mm_case().make_inputs()
    with record_launches(), launch.watch_autotuned() as seen:
        generated.mm(a, b)
    kernel, args, kwargs = seen[0]
    return kernel, args, kwargs


def test_the_command_refuses_before_any_gpu_work(monkeypatch):
    from click.testing import CliRunner

    from specgen.cli import main

    def tables():
        return sorted(Path(tuned.TABLE_DIR).glob("*")) if Path(tuned.TABLE_DIR).exists() else []

    before = tables()

    result = CliRunner().invoke(main, ["tune", "mm", "--shapes", "7x7"])
    assert result.exit_code == 1 and "no benchmark case has 7x7" in result.output
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    result = CliRunner().invoke(main, ["tune", "mm"])
    assert result.exit_code == 1 and "needs a CUDA GPU" in result.output
    # nothing written (no table, no half-written one)
    assert tables() == before

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
from bench import command, harness, tune
from specgen import testing
from specgen.runtime import override, record_launches, tuned

launch = importlib.import_module("specgen.runtime.launch")


def test_a_launch_takes_the_nearest_entry_of_its_kind():
    # (rows: a size; E: a constexpr head dim; the tensors' dtype)
    parts = [tuned.SIZE, tuned.EXACT, tuned.DTYPE]
    entries = [{"key": [512, 64, "torch.bfloat16"], "config": {"BLOCK": 1}},
               {"key": [8192, 64, "torch.bfloat16"], "config": {"BLOCK": 2}},
               {"key": [4096, 64, "torch.float32"], "config": {"BLOCK": 3}},
               {"key": [4096, 128, "torch.bfloat16"], "config": {"BLOCK": 4}}]
    # 4096 rows: 1 octave from 8192, 3 from 512; the float32 entry is another dtype's, the E 128
    # one another kind
    assert tuned.nearest(entries, [4096, 64, "torch.bfloat16"], parts).kwargs == {"BLOCK": 2}
    assert tuned.nearest(entries, [600, 64, "torch.bfloat16"], parts).kwargs == {"BLOCK": 1}
    assert tuned.nearest(entries, [4096, 256, "torch.bfloat16"], parts) is None
    assert tuned.nearest(entries, [4096, "torch.bfloat16"], parts[1:]) is None
    # a dtype of its own wins over any size; without one, the nearest of other dtypes
    assert tuned.nearest(entries, [64, 64, "torch.float32"], parts).kwargs == {"BLOCK": 3}
    assert tuned.nearest(entries, [700, 64, "torch.float16"], parts).kwargs == {"BLOCK": 1}
    assert tuned.nearest(entries, [4096, 128, "torch.float16"], parts).kwargs == {"BLOCK": 4}
    # only the configs the launch's prune keeps compete (another autotuner of the same function,
    # tiles that do not fit): the nearest of those
    assert tuned.nearest(entries, [4096, 64, "torch.bfloat16"], parts,
                         allowed=[{"BLOCK": 1}, {"BLOCK": 3}]).kwargs == {"BLOCK": 1}
    assert tuned.nearest(entries, [4096, 64, "torch.bfloat16"], parts, allowed=[]) is None


def test_the_parts_of_a_key_are_sizes_constexprs_and_dtypes():
    kernel, args, kwargs = _first_launch()
    key, parts = tuned.key_and_parts(kernel, args, kwargs)
    # mm's key: M, N, K, then LAYOUT, INDEX_64, INPUT_PRECISION (constexprs), then dtypes
    assert key[:3] == [32, 32, 32] and parts[:6] == [tuned.SIZE] * 3 + [tuned.EXACT] * 3
    assert parts[6:] == [tuned.DTYPE] * (len(key) - 6) and key[-1] == "torch.float32"


@pytest.mark.parametrize("path", sorted(tuned.TABLE_DIR.glob("*.json")), ids=lambda p: p.stem)
def test_every_shipped_entry_is_keyed_as_its_kernel_keys(path):
    # a kernel whose arguments change (split-K's took the epilogue's tensors) keys its launches
    # anew: an entry of the old form would never be found again. Each entry must fit one of its
    # kernel's autotuners: the key= parts, then a dtype for each tensor argument (pointers,
    # less the optional ones a HAS_ flag may leave out), and meta-parameters the kernel takes
    import inspect
    import triton

    misfits = []
    for kernel_id, entries in tuned.read_table(path)["kernels"].items():
        module_name, name = kernel_id.split(":")
        module = importlib.import_module(module_name)
        tuners = [v for v in vars(module).values() if isinstance(v, triton.runtime.Autotuner)
                  and launch._function(v).__name__ == name]
        assert tuners, f"{kernel_id}: no autotuned kernel of that name"
        params = list(inspect.signature(launch._function(tuners[0])).parameters)
        pointers = [p for p in params if p.endswith("_ptr")]
        optional = [p for p in pointers if f"HAS_{p[:-4].upper()}" in params]

        def is_dtype(value):
            return isinstance(value, str) and value.startswith("torch.")

        for entry in entries:
            key = entry["key"]
            fits = any(not any(map(is_dtype, key[:len(t.keys)]))
                       and all(map(is_dtype, key[len(t.keys):]))
                       and len(pointers) - len(optional) <= len(key) - len(t.keys) <= len(pointers)
                       for t in tuners)
            if not fits or not set(entry["config"]) - {"num_warps", "num_stages"} <= set(params):
                misfits.append((kernel_id, key, entry["config"]))
    assert misfits == []


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


def test_a_launch_without_an_entry_takes_the_heuristic(monkeypatch):
    # the family's space leads with its general-purpose config: the first the prune keeps
    kernel, args, kwargs = _first_launch()
    space = launch.pruned_configs(kernel, args, kwargs)
    cuda = [type("Tensor", (), {"device": torch.device("cuda", 0)})()]
    monkeypatch.setattr(tuned, "lookup", lambda *a: None)
    assert tuned.entry_config(launch.untuned_config(kernel, args, kwargs, cuda)) == \
        tuned.entry_config(space[0])
    monkeypatch.setattr(tuned, "lookup", lambda *a: space[-1])
    assert tuned.entry_config(launch.untuned_config(kernel, args, kwargs, cuda)) == \
        tuned.entry_config(space[-1])


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
    config = tuned.lookup(kernel, (x, 100), {}, torch.device("cuda", 0))
    assert config.kwargs == {"BLOCK": 64} and config.num_warps == 2
    monkeypatch.setenv("SPECGEN_AUTOTUNE", "1")
    assert tuned.lookup(kernel, (x, 100), {}, torch.device("cuda", 0)) is None
    monkeypatch.delenv("SPECGEN_AUTOTUNE")
    monkeypatch.setattr(tuned, "_autotune", True)   # what autotune(True) sets
    assert tuned.lookup(kernel, (x, 100), {}, torch.device("cuda", 0)) is None


def _mm(a, b):
    # the tile kernel on every machine (a Hopper GPU would take the TMA one, of another key)
    with override(strategy="direct"):
        return generated.mm(a, b)


def _mm_case(size=32):
    # (on the test's device: the interpreter's CPU, or the GPU tier's GPU)
    return harness.Case(family="matmul", op="mm", shape=f"{size}^3", dtype=torch.float32,
                        make_inputs=lambda: (torch.randn(size, size, device=testing.device()),
                                             torch.randn(size, size, device=testing.device())),
                        specgen=_mm, eager=lambda a, b: a @ b, bytes_moved=1)


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
        _mm(a, b)
    kernel, args, kwargs = seen[0]
    return kernel, args, kwargs


def test_the_command_refuses_before_any_gpu_work(monkeypatch):
    from click.testing import CliRunner

    from specgen.cli import main

    def tables():
        return sorted(Path(tuned.TABLE_DIR).glob("*")) if Path(tuned.TABLE_DIR).exists() else []

    before = tables()

    result = CliRunner().invoke(main, ["tune", "mm", "--shapes", "7x7"])
    assert result.exit_code == 1 and "no benchmark case has the shape 7x7" in result.output
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    result = CliRunner().invoke(main, ["tune", "mm"])
    assert result.exit_code == 1 and "needs a CUDA GPU" in result.output
    # nothing written (no table, no half-written one)
    assert tables() == before


def test_the_search_takes_a_call_given_by_its_arguments(tmp_path):
    # specgen tune mm --shapes "a=32x48,b=48x16": the tensors drawn, the reference the check
    case, = command.argument_cases(("mm",), ("a=32x48, b=48x16",), torch.float32,
                                   device=testing.device())
    assert case.shape == "a=32x48, b=48x16"
    with override(strategy="direct"):
        found, = tune.tune([case], tmp_path / "fake-sm90.json", "Fake GPU", (9, 0),
                           timer=lambda fn: [fn(), 1.0][1], echo=lambda _: None)
    assert found.config is not None and found.rejected == 0 and found.key[:3] == [32, 16, 48]


def test_a_call_takes_each_kind_of_argument():
    amax, = command.argument_cases(("amax",), ("x=4x6x8,dim=0x-1,keepdim=true",), torch.float32,
                                   device=testing.device())
    argmax, = command.argument_cases(("argmax",), ("x=4x6,dim=-1",), torch.float32,
                                     device=testing.device())
    x, = amax.make_inputs()
    assert torch.equal(amax.specgen(x), torch.amax(x, dim=(0, -1), keepdim=True))
    x, = argmax.make_inputs()
    assert torch.equal(argmax.specgen(x), torch.argmax(x, dim=-1))


@pytest.mark.parametrize("ops, shapes, message", [
    (("mm",), ("a=32x48",), "mm: --shapes gives no 'b' (tensor), which has no default"),
    (("mm",), ("a=32x48,b=48x16,c=1",), "mm: no argument c; it takes a, b"),
    (("mm",), ("a=32by48,b=48x16",), "mm: 'a=32by48' is not a tensor's sizes (4096x1024)"),
    (("softmax",), ("x=8x8,dim=last",), "softmax: 'dim=last' is not an int"),
    (("mm",), ("a 32x48",), "mm: 'a 32x48' in --shapes is not NAME=VALUE"),
    (("mm",), ("a=32,48,b=48x16",), "mm: '48' in --shapes is not NAME=VALUE (sizes are written"),
    (("mm",), ("a=32x48,a=32x48",), "mm: --shapes gives 'a' twice"),
    # the op's own checks, before any GPU work
    (("mm",), ("a=32x48,b=47x16",), 'mm at --shapes "a=32x48,b=47x16": '),
    (("nosuch",), ("a=1",), "unknown op nosuch"),
    (("cross_entropy",), ("logits=8x8",), "pick a benchmark shape label for a cross_entropy op"),
    ((), ("a=1",), "needs the ops it is for"),
])
def test_a_call_given_wrong_is_refused_by_name(ops, shapes, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        command.argument_cases(ops, shapes, torch.float32, device=testing.device())

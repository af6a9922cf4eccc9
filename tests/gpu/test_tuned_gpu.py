"""A launch on a GPU reads the frozen table of its device (specgen/runtime/tuned.py), takes the
heuristic config where no entry serves, and autotunes only where asked to."""

import importlib
import sys

import pytest
import torch

import generated
from specgen.runtime import record_launches, tuned

launch = importlib.import_module("specgen.runtime.launch")
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")]


def _fresh(kernel):
    launch._tuned.clear()
    kernel.cache.clear()
    tuned._table_for.cache_clear()


def _taken() -> list[dict]:
    """The configs the process's launches took, as the tables write them."""
    return [tuned.entry_config(config) for config in launch._tuned.values()]


def test_a_tabled_launch_runs_its_frozen_config_without_autotuning(tmp_path, monkeypatch):
    a, b = (torch.randn(256, 256, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    with record_launches(), launch.watch_autotuned() as seen:
        generated.mm(a, b)
    # the kernel the call starts (on a Hopper GPU the TMA one, else the tile one)
    kernel, args, kwargs = seen[0]
    assert kernel in sys.modules["generated.mm"].KERNELS.values()
    space = launch.pruned_configs(kernel, args, kwargs)
    chosen = space[-1]
    name = tuned.table_name(torch.cuda.get_device_name(), torch.cuda.get_device_capability())
    tuned.write_table(tmp_path / name, "test", (0, 0), {tuned.kernel_id(kernel): [
        {"key": tuned.key_of(kernel, args, kwargs), "config": tuned.entry_config(chosen)}]})
    monkeypatch.setattr(tuned, "TABLE_DIR", tmp_path)
    _fresh(kernel)
    try:
        with record_launches():
            out = generated.mm(a, b)
        torch.testing.assert_close(out, a @ b, rtol=2e-2, atol=2e-2)
        assert not kernel.cache     # the autotuner never ran
        assert _taken() == [tuned.entry_config(chosen)]
        # no table: the first config the prune keeps, still without the autotuner
        monkeypatch.setattr(tuned, "TABLE_DIR", tmp_path / "none")
        _fresh(kernel)
        with record_launches():
            generated.mm(a, b)
        assert not kernel.cache and _taken() == [tuned.entry_config(space[0])]
        # asked for, autotuning runs as before
        _fresh(kernel)
        monkeypatch.setenv("SPECGEN_AUTOTUNE", "1")
        with record_launches():
            generated.mm(a, b)
        assert kernel.cache
    finally:
        monkeypatch.undo()
        _fresh(kernel)

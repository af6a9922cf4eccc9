"""The hypothesis profile (specgen.testing.use_profile: SPECGEN_PROFILE, default by tier), the
GPU marker's skip on the CPU tier, one big_memory test at a time under pytest-xdist, each test's
launches finished in its own teardown, and the `authored` fixture (the module of a spec written in a test)."""

import fcntl
import gc
import os
import tempfile

import pytest

from specgen import testing
from specgen.runtime import interpreting

# the hypothesis profiles an author's tests load too (specgen/testing/profiles.py)
testing.use_profile()

# the GPU tier spread over a machine's GPUs (tools/gpu_run.sh with GPUS=n): pytest-xdist's worker
# k takes the (k % n)-th of the GPUs it may see, set before anything initializes CUDA (which
# reads the variable then). Each worker sees one GPU: tests/gpu/test_multi_gpu.py skips there
if os.environ.get("SPECGEN_GPUS") and os.environ.get("PYTEST_XDIST_WORKER"):
    _visible = os.environ.get("CUDA_VISIBLE_DEVICES") or ",".join(
        str(i) for i in range(int(os.environ["SPECGEN_GPUS"])))
    _gpus = _visible.split(",")[:int(os.environ["SPECGEN_GPUS"])]
    os.environ["CUDA_VISIBLE_DEVICES"] = _gpus[
        int(os.environ["PYTEST_XDIST_WORKER"].removeprefix("gw")) % len(_gpus)]


def pytest_collection_modifyitems(config, items):
    """GPU-marked tests need CUDA and real compilation; say so instead of failing."""
    import torch

    if torch.cuda.is_available() and not interpreting():
        return
    reason = "GPU tier: needs a CUDA device without TRITON_INTERPRET (see README, Tests)"
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(autouse=True)
def one_big_test_at_a_time(request):
    """Under pytest-xdist (`tools/gpu_run.sh`), tests marked big_memory hold a lock shared by the
    run's workers on their GPU, so that no two of them fill its memory at once; each gives its
    cached blocks back before the next starts. (A lock rather than xdist's `loadgroup`, which
    pytest 9.2 with pytest-xdist 3.8 ignores.)"""
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if run is None or request.node.get_closest_marker("big_memory") is None:
        yield
        return
    import torch

    # one lock a GPU: workers on other GPUs go on
    gpu = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    path = os.path.join(tempfile.gettempdir(), f"specgen-big-memory-{run}-{gpu}.lock")
    with open(path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            gc.collect()
            torch.cuda.empty_cache()
            fcntl.flock(lock, fcntl.LOCK_UN)


@pytest.fixture(autouse=True)
def launches_finished():
    """On a GPU a test ends once its kernels have: a kernel that faults asynchronously (a
    misaligned or out-of-bounds access) then fails the test that launched it, in its teardown,
    rather than the next test on the same worker, whose CUDA context the fault has poisoned."""
    yield
    import torch

    if torch.cuda.is_initialized():
        torch.cuda.synchronize()


@pytest.fixture
def authored(tmp_path, monkeypatch):
    """Builds the module of a spec's TOML text, as an author's own package would hold it, and
    imports it (a test's op names must differ from the shipped ones: they share specgen::)."""
    import importlib

    from specgen.model import Source
    from specgen.parse import parse_spec
    from specgen.render import render_op

    monkeypatch.syspath_prepend(str(tmp_path))

    def build(text):
        spec = parse_spec(text, Source("specs/authored.toml", "0" * 64, text))
        for op in (spec, *spec.derived):   # a derived backward op beside it, as a build
            (tmp_path / f"{op.name}.py").write_text(render_op(op))
        return importlib.import_module(spec.name)

    return build

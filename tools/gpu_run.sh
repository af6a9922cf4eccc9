#!/usr/bin/env bash
# One device call: the GPU test tier, then the benchmarks. Logs go to $OUT (the device tool's folder)
# or ./gpu-logs. Usage: tools/gpu_run.sh [pytest args...]; BENCH="--only pointwise" to pick families,
# SKIP_TESTS=1 or SKIP_BENCH=1 to do one half.
# The tier's time is mostly Triton and Inductor compiling on the host, one test after another: one
# process ran it in 4 calls of 6-9 minutes each (H200, 2026-11-23: tests/test_ops.py 8.3 min; the
# reduce + matmul GPU files with test_traced_errors and test_generated_kernels 6; the rowwise,
# replay, pointwise and dynamic GPU files about 6; the CPU-tier files that run on CUDA 9).
# pytest-xdist (in the GPU image) spreads the tests over WORKERS processes (default 8 of the 16
# cores; WORKERS=0 runs them in one): 541 tests fit one call (8m17s on 8 workers, H200, 2026-11-23;
# 7m57s on 14, where compiling contends for the cores); the 819 of 2026-11-24 take two calls of
# 6-8 minutes (README, "Testing", names the two groups).
# The benchmarks take about 2 minutes and run after the tests, alone on the GPU; with the whole
# tier they outlast a 10-minute device call: SKIP_BENCH=1 in one call, SKIP_TESTS=1 in the next.
set -uo pipefail
cd "$(dirname "$0")/.."
LOGS=${OUT:-gpu-logs}
mkdir -p "$LOGS"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
python3 -c 'import torch, triton, sys; print("python", sys.version.split()[0], "torch", torch.__version__,
"triton", triton.__version__, torch.cuda.get_device_name())' | tee "$LOGS/versions.txt"
status=0
WORKERS=${WORKERS:-8}
test_env=(SPECGEN_PROFILE="${SPECGEN_PROFILE:-gpu}")
parallel=()
if [ "$WORKERS" != 0 ]; then
    # tests marked big_memory take turns (a lock in tests/conftest.py)
    parallel=(-n "$WORKERS")
    # each worker compiles its graphs in-process rather than starting a pool of 16 compile workers
    test_env+=(TORCHINDUCTOR_COMPILE_THREADS=1)
fi
if [ -z "${SKIP_TESTS:-}" ]; then
    env "${test_env[@]}" python3 -m pytest -q -p no:cacheprovider --durations=15 "${parallel[@]}" \
        "$@" 2>&1 | tee "$LOGS/tests.log"
    status=${PIPESTATUS[0]}
fi
if [ -z "${SKIP_BENCH:-}" ]; then
    # shellcheck disable=SC2086
    python3 -m bench ${BENCH:-} --out "$LOGS/RESULTS.md" 2>&1 | tee "$LOGS/bench.log"
fi
exit $status

#!/usr/bin/env bash
# One device call: the GPU test tier, then the benchmarks. Logs go to $OUT (the device tool's folder)
# or ./gpu-logs. Usage: tools/gpu_run.sh [pytest args...]; BENCH="--only pointwise" to pick families,
# SKIP_TESTS=1 or SKIP_BENCH=1 to do one half.
# A device call stops at 10 minutes, so the tier goes in groups (H200, 2026-11-23): tests/test_ops.py
# 8.3 min; tests/gpu/test_reduce_gpu.py + test_matmul_gpu.py + tests/test_traced_errors.py +
# tests/test_generated_kernels.py 6 min; tests/gpu/test_rowwise_gpu.py + test_replay_gpu.py +
# test_pointwise_gpu.py + test_dynamic_gpu.py about 6; the CPU-tier files that run on CUDA
# (tests/test_reduce.py, test_rowwise_runtime.py, test_replay.py, test_dynamic_shapes.py) a call of
# their own (with the row-wise group they outran one). The benchmarks take about 2 minutes.
set -uo pipefail
cd "$(dirname "$0")/.."
LOGS=${OUT:-gpu-logs}
mkdir -p "$LOGS"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
python3 -c 'import torch, triton, sys; print("python", sys.version.split()[0], "torch", torch.__version__,
"triton", triton.__version__, torch.cuda.get_device_name())' | tee "$LOGS/versions.txt"
status=0
if [ -z "${SKIP_TESTS:-}" ]; then
    SPECGEN_PROFILE=${SPECGEN_PROFILE:-gpu} python3 -m pytest -q -p no:cacheprovider \
        --durations=15 "$@" 2>&1 | tee "$LOGS/tests.log"
    status=${PIPESTATUS[0]}
fi
if [ -z "${SKIP_BENCH:-}" ]; then
    # shellcheck disable=SC2086
    python3 -m bench ${BENCH:-} --out "$LOGS/RESULTS.md" 2>&1 | tee "$LOGS/bench.log"
fi
exit $status

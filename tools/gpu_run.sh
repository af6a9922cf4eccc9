#!/usr/bin/env bash
# One device call: the GPU test tier, then the benchmarks. Logs go to $OUT (the device tool's folder)
# or ./gpu-logs. Usage: tools/gpu_run.sh [pytest args...]; BENCH="--only pointwise" to pick families,
# SKIP_TESTS=1 or SKIP_BENCH=1 to do one half.
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

#!/usr/bin/env bash
# One device call: the GPU test tier, then the benchmarks. Logs go to $OUT (the device tool's folder)
# or ./gpu-logs. Usage: tools/gpu_run.sh [pytest args...]; BENCH="--only pointwise" to pick families,
# SKIP_TESTS=1 or SKIP_BENCH=1 to do one half; GROUP=1..5 runs parts of the tier (below; "3 4 5");
# TUNE="OPS" (or all) runs specgen tune between them and copies the GPU's table to the logs.
# The tier's time is mostly Triton and Inductor compiling on the host: its property and gradient
# suites (tests/test_ops.py, tests/test_autograd.py; 167 tests of 50 drawn cases, most cases a new
# compilation) are nearly all of it. pytest-xdist (in the GPU image) spreads the tests over WORKERS
# processes (default 8 of the 16 cores; WORKERS=0 runs them in one).
# The whole tier outlasts one 10-minute device call: GROUP picks some of its five groups (below),
# and RESUME="logs" leaves out what earlier calls' logs list as passed. H200, 8 workers: groups 1
# and 2 took 8m53s on a machine that started cold; groups 3-5 2m43s, 2m57s and 7m17s warm. On a
# machine of several GPUs, GPUS=n spreads the workers over n of them (worker k on GPU k % n;
# default 12 workers a GPU). On two H200s of 32 cores (2026-11-28, GPUS=2 WORKERS=24): the whole
# tier, 1780 of the 1833 tests the GPU machine collects in one call (7m48s), the rest in two
# resumed ones. The same machine, 2026-11-29 (evening): 1964 in 9m08s; what was left were the
# attention ops' gradient checks, 200-420 s each, since split into four shards apiece
# (tests/test_autograd.py) so that the workers share them.
# Each worker then sees one GPU, so tests/gpu/test_multi_gpu.py skips: run it apart (GPUS=1).
# The benchmarks take about 2 minutes and run after the tests, alone on the GPU; with a group of
# the tier they may outlast a call: SKIP_BENCH=1 with the tests, SKIP_TESTS=1 in the next call.
set -uo pipefail
cd "$(dirname "$0")/.."
LOGS=${OUT:-gpu-logs}
mkdir -p "$LOGS"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
# the tier's five groups: the property suite; the gradient suite; derived ops, traced errors and
# builds; replays, dynamic shapes, row-wise sizes and autocast; then every other file
groups=(
    "tests/test_ops.py"
    "tests/test_autograd.py"
    "tests/test_derive.py tests/gpu/test_autograd_gpu.py tests/test_traced_errors.py tests/test_build.py"
    "tests/gpu/test_dynamic_gpu.py tests/test_replay.py tests/gpu/test_replay_gpu.py
     tests/gpu/test_rowwise_gpu.py tests/gpu/test_autocast_gpu.py tests/test_autocast.py"
)
selected=()
for group in ${GROUP:-}; do
    case "$group" in
        1|2|3|4|5) ;;
        *) echo "GROUP lists groups 1 to 5, got '$GROUP'" >&2; exit 2 ;;
    esac
done
if [[ " ${GROUP:-} " == *" 5 "* ]]; then
    # group 5 is every file the groups 1-4 leave out: ignore those of the groups not asked for
    selected=(tests)
    for group in 1 2 3 4; do
        [[ " $GROUP " == *" $group "* ]] && continue
        for file in ${groups[$((group - 1))]}; do selected+=("--ignore=$file"); done
    done
else
    # shellcheck disable=SC2206 # a group is a list of paths: split on whitespace
    for group in ${GROUP:-}; do selected+=(${groups[$((group - 1))]}); done
fi
python3 -c 'import torch, triton, sys; print("python", sys.version.split()[0], "torch", torch.__version__,
"triton", triton.__version__, torch.cuda.get_device_name())' | tee "$LOGS/versions.txt"
status=0
GPUS=${GPUS:-1}
WORKERS=${WORKERS:-$((GPUS > 1 ? 12 * GPUS : 8))}
test_env=(SPECGEN_PROFILE="${SPECGEN_PROFILE:-gpu}")
if [ "$GPUS" -gt 1 ]; then
    # tests/conftest.py gives each worker its GPU
    test_env+=(SPECGEN_GPUS="$GPUS")
fi
parallel=()
if [ "$WORKERS" != 0 ]; then
    # tests marked big_memory take turns (a lock in tests/conftest.py)
    parallel=(-n "$WORKERS")
    # worksteal (pytest-xdist 3.2 on): an idle worker takes the tests queued on a busy one. Under
    # the default load mode a resumed run of 50 tests on 24 workers hands each worker two at the
    # start, so a short test waits out a 200-second gradient check queued before it
    if python3 -m pytest --help 2>/dev/null | grep -q worksteal; then parallel+=(--dist worksteal); fi
    # each worker compiles its graphs in-process rather than starting a pool of 16 compile workers,
    # and runs torch's CPU work on its share of the cores, not on threads for all of them (56
    # workers of a 64-core host would otherwise start 56 x 64)
    cores=$(nproc)
    threads=$(( cores > WORKERS ? cores / WORKERS : 1 ))
    test_env+=(TORCHINDUCTOR_COMPILE_THREADS=1 OMP_NUM_THREADS=$threads)
fi
resume=()
if [ -n "${RESUME:-}" ]; then
    # RESUME="earlier tests.log files": what they list as passed is left out. By --deselect, which
    # passes over a name this run does not collect, where naming the tests to run stops the run
    # at the first such name (a test parametrized apart on the GPU and on the CPU)
    # shellcheck disable=SC2086 # a list of logs
    grep -h '^PASSED ' $RESUME | sed 's/^PASSED /--deselect=/' > "$LOGS/resume.args"
    echo "resuming: $(wc -l < "$LOGS/resume.args") tests passed before are left out"
    resume=("@$LOGS/resume.args")
fi
if [ -z "${SKIP_TESTS:-}" ]; then
    # tee -i: a run cut short (timeout -s INT) still logs pytest's summary: what failed, and
    # (-rp) what passed, which RESUME reads
    env "${test_env[@]}" python3 -m pytest -q -p no:cacheprovider -rfEsp --durations=15 \
        "${parallel[@]}" "${selected[@]}" "${resume[@]}" "$@" 2>&1 | tee -i "$LOGS/tests.log"
    status=${PIPESTATUS[0]}
fi
if [ -n "${TUNE:-}" ]; then
    # TUNE="mm bmm ..." (or TUNE=all): specgen tune on this GPU, its table copied to the logs
    # (resumable: a table already in specgen/tuned/ for this GPU is carried on)
    # shellcheck disable=SC2086
    python3 -m specgen tune $([ "$TUNE" = all ] || echo $TUNE) 2>&1 | tee "$LOGS/tune.log"
    cp specgen/tuned/*.json "$LOGS/" 2>/dev/null || true
fi
if [ -z "${SKIP_BENCH:-}" ]; then
    # shellcheck disable=SC2086
    CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} python3 -m bench ${BENCH:-} --out "$LOGS/RESULTS.md" 2>&1 | tee "$LOGS/bench.log"
fi
exit $status

#!/usr/bin/env bash
# gdrpy's GPU suite: builds gdrpy in place on a GPU machine, runs the GPU
# tests and the key benchmarks, and prints a short summary table last
# (scripts/summarize.py).
#
#   scripts/gpu_suite.sh [--gdrcopy DIR] [--ucx DIR] [--bench DIR] [STAGE]...
#
# Without a STAGE it runs the default stages, sized to end within one
# 10-minute call of a device tool (SUITE_BUDGET_S, default 560 s: a step
# that would run past it gets the time left, or is skipped and reported):
#   build     pip install -e . and make -C native all (C tests and tools)
#   test      the README's test command (the whole pytest suite, GPU tests
#             included; GDRPY_REQUIRE_GPU=1: none may skip), the C core test
#             on nvrm, the nvrm backend harness
#   bench     bench latency with the C benchmark gdrpy_copylat beside it,
#             libgdrapi's gdrapi_copylat, bench bandwidth (short), all on nvrm
#   examples  bench pingpong (--quick), the trading feed (one run), the MPI
#             eager example (short; under mpiexec when there is one)
#   gdrcopy   GDRCopy's sanity and pplat on libgdrapi.so.2, when a GDRCopy
#             source folder is given (--gdrcopy DIR or $GDRCOPY_SRC; default
#             .ext/gdrcopy if present; see scripts/gdrcopy_tests.sh)
#   ucx       UCX's own gdr_copy pin tests on libgdrapi.so.2 (when the UCX build
#             has bin/ucx_gtest: scripts/ucx_build.sh --gtest, scripts/ucx_gtest.sh)
#             and ucx_perftest with and without gdr_copy, short, when a UCX build
#             is given (--ucx DIR or $UCX_PREFIX; default .ext/ucx, else
#             .ext/ucxbench/ucx, if present; see scripts/ucx_build.sh)
# Stages run only when named (each fits one call on its own):
#   large     large messages by host-memory kind and the size picker: their
#             tests, bench bandwidth, calibration from scratch, bench transfer
#             (pageable and page-locked host memory)
#   kinds     memory kinds x nvrm routes (probe_kinds), libgdrapi compat on
#             the GPU, the memory-kind tests after a busy warm-up
#   feed      the trading feed's capacity sweep and proof points (4-5 min)
#   misuse    the hostile-input sweep on the GPU (tests/misuse) and
#             gdrpy_apilat's open-under-load
#   gdrcopy, ucx   (named) their full runs: every GDRCopy test; every ucx row and
#             UCX's gtest '*gdr_copy*' (147 tests with UCX 1.22)
#   mpi       OSU latency/bw/bibw under Open MPI and MPICH and ucx_perftest, UCX
#             defaults vs UCX_TLS=^gdr_copy vs the section `python -m gdrpy
#             ucx-config` writes on this host (scripts/mpi_bench.py, about 5 min;
#             --bench DIR or $UCX_BENCH, default .ext/ucxbench: docs/ucx.md)
#   beforeafter  scripts/before_after.sh: the tree in $BEFORE_AFTER_OLD (a
#             directory or a git revision; default .baseline) against this
#             one, interleaved rounds (ROUNDS, default 10)
#   asv       records an asv run of asv_bench/ (asv or its wheels in .whl/)
#
# Logs and JSON go to $WORK (default ${TMPDIR:-/tmp}/gdrpy-gpu-run); when $OUT
# is set (a device tool's output folder) they are packed into
# $OUT/results.tgz and the summary is copied to $OUT/summary.txt, also when a
# step fails or the run is cut short.
set -uo pipefail
cd "$(dirname "$0")/.."
GDRCOPY_SRC=${GDRCOPY_SRC:-}
UCX_DIR=${UCX_PREFIX:-}
BENCH_DIR=${UCX_BENCH:-}
STAGES=()
while [ $# -gt 0 ]; do
    case "$1" in
        --gdrcopy) GDRCOPY_SRC=$2; shift 2 ;;
        --ucx) UCX_DIR=$2; shift 2 ;;
        --bench) BENCH_DIR=$2; shift 2 ;;
        -h|--help) sed -n '2,/^set /{/^#/s/^# \{0,1\}//p}' "$0"; exit 0 ;;
        -*) echo "unknown option $1 (see --help)"; exit 2 ;;
        *) STAGES+=("$1"); shift ;;
    esac
done
[ -z "$GDRCOPY_SRC" ] && [ -d .ext/gdrcopy ] && GDRCOPY_SRC=.ext/gdrcopy
[ -z "$BENCH_DIR" ] && [ -d .ext/ucxbench ] && BENCH_DIR=.ext/ucxbench
[ -z "$UCX_DIR" ] && [ -x .ext/ucx/bin/ucx_perftest ] && UCX_DIR=.ext/ucx
[ -z "$UCX_DIR" ] && [ -n "$BENCH_DIR" ] && [ -x "$BENCH_DIR/ucx/bin/ucx_perftest" ] &&
    UCX_DIR=$BENCH_DIR/ucx
DEFAULT=0
[ ${#STAGES[@]} -eq 0 ] && DEFAULT=1 && STAGES=(test bench examples gdrcopy ucx)
KNOWN=" test bench examples gdrcopy ucx mpi large kinds feed misuse beforeafter asv "
for s in "${STAGES[@]}"; do
    [[ "$KNOWN" == *" $s "* ]] || { echo "unknown stage $s (see --help)"; exit 2; }
done
WORK=${WORK:-${TMPDIR:-/tmp}/gdrpy-gpu-run}
mkdir -p "$WORK"
export PYTHONUNBUFFERED=1 GDRPY_REQUIRE_GPU=1 GDRPY_CACHE_DIR="$WORK/cache"
BUDGET=${SUITE_BUDGET_S:-560}
T0=$SECONDS
status=0

pack() {
    if [ -n "${OUT:-}" ]; then
        tar czf "$OUT/results.tgz" -C "$WORK" . 2>/dev/null
        [ -f "$WORK/summary.txt" ] && cp "$WORK/summary.txt" "$OUT/summary.txt"
    fi
}
trap pack EXIT

want() { [[ " ${STAGES[*]} " == *" $1 "* ]]; }
step() {  # step NAME TIMEOUT CMD...: runs CMD, logs to $WORK/NAME.log, records status
    local name=$1 t=$2; shift 2
    local left=$((BUDGET - (SECONDS - T0)))
    if [ "$left" -lt 20 ]; then
        echo "=== $name: skipped: $left s of the suite's $BUDGET s left" | tee -a "$WORK/steps.log"
        status=1
        return 1
    fi
    [ "$t" -gt "$left" ] && t=$left
    echo "=== $name: $*" | tee -a "$WORK/steps.log"
    local t0=$SECONDS
    # its own session, so that what a step leaves behind (a test's subprocess, a
    # persistent kernel's host) is killed with it and cannot skew the next step
    setsid timeout -k 10 "$t" "$@" > "$WORK/$name.log" 2>&1 &
    local pid=$!
    wait "$pid"
    local rc=$?
    kill -KILL -- "-$pid" 2>/dev/null
    echo "=== $name: rc=$rc in $((SECONDS - t0)) s" | tee -a "$WORK/steps.log"
    tail -n 25 "$WORK/$name.log"
    [ $rc -ne 0 ] && status=1
    pack    # keep what we have even if the run is cut short
    return $rc
}

# asv is not installed on the GPU machine: its wheels can be carried in .whl/
# (docs/benchmarks.md); they go beside, not over, the system's packages.
if want asv && ! python3 -c "import asv" 2>/dev/null && ls .whl/asv-*.whl >/dev/null 2>&1; then
    rm -rf "$WORK/asvsite" && python3 -m pip install -q --no-index --no-deps --no-compile \
        --target "$WORK/asvsite" .whl/*.whl \
        && export PYTHONPATH="$WORK/asvsite${PYTHONPATH:+:$PYTHONPATH}"
fi

echo "machine: $(nvidia-smi --query-gpu=name,driver_version,pci.bus_id --format=csv,noheader 2>&1 | head -1)"
echo "stages: ${STAGES[*]}; budget $BUDGET s" | tee "$WORK/steps.log"
step build 300 bash -c "python3 -m pip install -q --no-build-isolation --no-deps -e . \
    && make -C native -j$(nproc) all" || exit 1
step info 60 python3 -m gdrpy info

if want test; then
    # the README's test command (the whole suite: GPU tests in one worker, the
    # rest spread over the CPUs; GDRPY_REQUIRE_GPU=1: no GPU test may skip)
    step pytest 300 python3 -m pytest -q -rs -p no:cacheprovider --durations=15 \
        --junitxml="$WORK/junit.xml"
    step c_core_gpu 120 env GDRPY_BACKEND=nvrm native/build/test_core
    step c_nvrm_backend 180 sh native/tests/gpu/run_backend_test.sh "$WORK"
fi

if want bench; then
    step bench_latency 150 python3 -m gdrpy bench latency --backend nvrm --c \
        --sizes 8,64,4K,64K --iters 500 --max-time 1 --calibrate-budget 1 \
        --json "$WORK/latency.json" --plot "$WORK/latency.png"
    step c_gdrapi_copylat 90 native/build/gdrapi_copylat --max 16777216 --iters 200
    step bench_bandwidth 150 python3 -m gdrpy bench bandwidth --backend nvrm --c \
        --sizes 64K,1M,16M,64M --iters 20 --max-time 1 \
        --json "$WORK/bandwidth.json" --plot "$WORK/bandwidth.png"
fi

if want examples; then
    step bench_pingpong 120 python3 -m gdrpy bench pingpong --backend nvrm --quick \
        --json "$WORK/pingpong.json"
    step trading_feed 120 python3 examples/trading_feed.py --backend nvrm --seconds 1 \
        --json "$WORK/trading_feed.json"
    # MPI mode needs an mpiexec: PyPI's mpich wheel carried in .whl/mpi/ gives
    # one where the image has none (docs/examples.md)
    if ! command -v mpiexec >/dev/null && ls .whl/mpi/mpich-*.whl >/dev/null 2>&1; then
        python3 -m pip install -q --no-index --no-deps --prefix "$WORK/mpi" .whl/mpi/mpich-*.whl \
            && export PATH="$WORK/mpi/bin:$PATH" \
                      LD_LIBRARY_PATH="$WORK/mpi/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    fi
    mpi_args=(--iters 300 --iters-large 30 --json "$WORK/mpi_eager.json")
    if command -v mpiexec >/dev/null; then
        # Open MPI refuses to start as root without these (the GPU machines run as
        # root); MPICH ignores them
        OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
            step mpi_eager 120 mpiexec -n 2 python3 examples/mpi_eager.py --mode mpi "${mpi_args[@]}"
    else
        step mpi_eager 120 python3 examples/mpi_eager.py "${mpi_args[@]}"
    fi
fi

if want gdrcopy; then
    if [ -z "$GDRCOPY_SRC" ]; then
        echo "=== gdrcopy: no GDRCopy source folder (--gdrcopy DIR): not run"
    elif [ "$DEFAULT" = 1 ]; then
        step gdrcopy_tests 150 scripts/gdrcopy_tests.sh "$GDRCOPY_SRC" --only sanity,pplat \
            --work "$WORK/gdrcopy" --timeout 60
    else
        step gdrcopy_tests 560 scripts/gdrcopy_tests.sh "$GDRCOPY_SRC" \
            --work "$WORK/gdrcopy" --timeout 240
    fi
fi
if want ucx; then
    if [ -n "$UCX_DIR" ] && [ -x "$UCX_DIR/bin/ucx_gtest" ] && [ "$DEFAULT" = 1 ]; then
        step ucx_gtest 90 scripts/ucx_gtest.sh --ucx "$UCX_DIR" --work "$WORK/ucx_gtest" \
            --filter '*test_gdr_copy*' --timeout 80
    elif [ -n "$UCX_DIR" ] && [ -x "$UCX_DIR/bin/ucx_gtest" ]; then
        step ucx_gtest 300 scripts/ucx_gtest.sh --ucx "$UCX_DIR" --work "$WORK/ucx_gtest" \
            --timeout 280
    elif [ -n "$UCX_DIR" ]; then
        echo "=== ucx_gtest: $UCX_DIR has no bin/ucx_gtest (scripts/ucx_build.sh --gtest): not run"
    fi
    if [ -z "$UCX_DIR" ]; then
        echo "=== ucx: no UCX build (--ucx DIR): not run"
    elif [ "$DEFAULT" = 1 ]; then
        step ucx_perftest 120 scripts/ucx_perftest.sh --ucx "$UCX_DIR" --work "$WORK/ucx" \
            --sizes 8,65536 --tests tag_lat,ucp_put_lat+am --iters 1000
    else
        step ucx_perftest 400 scripts/ucx_perftest.sh --ucx "$UCX_DIR" --work "$WORK/ucx"
    fi
fi

if want mpi; then
    if [ -z "$BENCH_DIR" ]; then
        echo "=== mpi: no benchmark folder (--bench DIR, docs/ucx.md): not run"
    else
        step mpi_bench 540 python3 scripts/mpi_bench.py --bench "$BENCH_DIR" \
            ${UCX_DIR:+--ucx "$UCX_DIR"} --work "$WORK/mpi" --json "$WORK/mpi_bench.json"
    fi
fi

if want large; then
    step pytest_large 300 python3 -m pytest -q -rs -p no:cacheprovider \
        tests/test_hostmem.py tests/test_staging_schedule.py tests/test_native.py \
        tests/test_staging_kinds.py -k "hostmem or staging or schedule or kind" \
        --junitxml="$WORK/junit_large.xml"
    step bench_bandwidth 300 python3 -m gdrpy bench bandwidth --backend nvrm \
        --json "$WORK/bandwidth.json" --plot "$WORK/bandwidth.png"
    step calibrate 60 python3 -m gdrpy calibrate --backend nvrm
    step bench_transfer 200 python3 -m gdrpy bench transfer --backend nvrm --iters 600 \
        --json "$WORK/transfer.json" --plot "$WORK/transfer.png"
    step bench_transfer_pinned 200 python3 -m gdrpy bench transfer --backend nvrm --iters 600 \
        --host pinned --json "$WORK/transfer_pinned.json" --plot "$WORK/transfer_pinned.png"
fi

if want kinds; then
    step kinds_probe 300 sh native/tests/gpu/run_probe_kinds.sh "$WORK"
    step gdrapi_compat_gpu 120 native/build/test_gdrapi_compat
    step pytest_kinds 300 python3 -m pytest -q -rs -p no:cacheprovider \
        tests/test_gpu_pools_busy.py tests/test_gpu_kinds.py
fi

if want feed; then
    step feed_sweep 420 python3 examples/trading_feed.py --sweep --backend nvrm \
        --json "$WORK/feed_sweep.json" --plot "$WORK/feed_sweep.svg" --markdown "$WORK/feed_sweep.md"
fi

if want misuse; then
    step misuse_sweep 420 python3 -m tests.misuse.sweep --backend auto --jobs 8 \
        --json "$WORK/misuse_sweep.json"
    step misuse_apilat 120 native/build/gdrpy_apilat --lib native/build --backend auto
fi

if want beforeafter; then
    step before_after 540 env WORK="$WORK/before_after" ROUNDS="${ROUNDS:-10}" \
        BUDGET_S=480 scripts/before_after.sh "${BEFORE_AFTER_OLD:-.baseline}" auto
fi

if want asv; then
    rev=$(git rev-parse HEAD 2>/dev/null) || {
        # the device copy of the tree may have no .git: record a snapshot commit
        git init -q . && git add -A >/dev/null && git -c user.name=gpu -c user.email=gpu@local \
            commit -qm "snapshot for asv" && rev=$(git rev-parse HEAD); }
    step asv 400 bash -c "cd asv_bench \
        && python3 -m asv machine --yes && python3 -m asv run --python=same --show-stderr \
           --set-commit-hash $rev && cp -r .asv/results '$WORK/asv_results'"
fi

python3 scripts/summarize.py "$WORK" > "$WORK/summary.txt" 2>&1
echo
cat "$WORK/summary.txt"
exit $status

#!/usr/bin/env bash
# Builds gdrpy in place on a GPU machine, runs the whole GPU test suite and
# the key benchmarks, and prints a short summary table last.
#
#   scripts/gpu_suite.sh [all|test|bench|examples]...   (default: all)
#
#   test      pytest (GDRPY_REQUIRE_GPU=1: nothing GPU-marked may skip), the C
#             core test on nvrm, the nvrm backend harness, the nvrm self-test
#             (cost, routes, corrupted-table switch)
#   bench     C copylat (gdrpy and libgdrapi), bench latency/bandwidth (--c),
#             calibrate, bench transfer
#   examples  bench pingpong, trading feed (one run per handler and path), MPI eager
#   feed      the trading feed's capacity sweep (UDP and shared memory, C and
#             Python handlers, gdrpy and cuMemcpy paths), its 10 s proof
#             points and half-capacity latency: about 4-5 min (issue 21)
#   channel   (only when named) issue 15: channel tests, pingpong SUMMARY, GDRCopy
#             pplat beside it (when .ext/gdrcopy is there) and 12 process pairs of
#             the C 4 B round trip and pplat's flag-only loop (scripts/chan_floor.py),
#             trading feed
#   misuse    issue 17: the hostile-input sweep on the default backend (counts of
#             crashes, hangs, clear errors), gdrpy_apilat (8/64 B validated copies
#             and gdrpy_open latency while 8 threads copy); with MISUSE_OLD_TREE=DIR
#             (a checkout of the old commit) also scripts/misuse_before_after.sh
#   beforeafter (only when named) issues 17 and 20: the old build (BASELINE, default
#             .baseline: an export of c20781b; copied to $WORK and built from clean)
#             against this tree, ROUNDS (16) pinned interleaved rounds within 150 s
#             (scripts/misuse_before_after.sh); the table in before_after_table.txt
#   chanperf  (only when named) issue 15: the channel protocol's variants side by side
#             (python -m gdrpy bench pingpong --variants; table in chanperf.log)
#   large     issue 14 only (named explicitly, not part of all): the host-memory
#             tests, bench bandwidth by host-memory kind, bench transfer for
#             pageable and page-locked memory
#   kinds     memory kinds x nvrm routes (probe_kinds), libgdrapi compat on
#             the GPU (fork after gdr_open, layouts), pytest tests/test_gpu_kinds.py,
#             pool memory after a busy warm-up (scripts/pool_probe.py warm,
#             tests/test_gpu_pools_busy.py then test_gpu_kinds.py in one process)
#   gdrcopy   GDRCopy's own tests on libgdrapi.so.2 (needs .ext/gdrcopy: see
#             scripts/gdrcopy_tests.sh)
#   ucx       ucx_perftest with and without gdr_copy (needs .ext/ucx from
#             scripts/ucx_build.sh, or UCX_PREFIX=<that folder>): about 3 min
#   asv       records an asv run of the benchmarks in asv_bench/ (all only
#             includes it when asv or its wheels in .whl/ are there)
#
# A whole run takes longer than one device-tool call allows (10 min): run the
# stages in separate calls; each prints the summary of what it ran.
#
# Logs and JSON go to $WORK (default /tmp/gdrpy-gpu-run); when $OUT is set
# (the device tool), they are packed into $OUT/results.tgz and the summary is
# copied to $OUT/summary.txt, also when a stage fails or the run is cut short.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
WORK=${WORK:-/tmp/gdrpy-gpu-run}
mkdir -p "$WORK"
STAGES=${*:-all}
export PYTHONUNBUFFERED=1 GDRPY_REQUIRE_GPU=1 GDRPY_CACHE_DIR="$WORK/cache"
status=0

pack() {
    if [ -n "${OUT:-}" ]; then
        tar czf "$OUT/results.tgz" -C "$WORK" . 2>/dev/null
        [ -f "$WORK/summary.txt" ] && cp "$WORK/summary.txt" "$OUT/summary.txt"
    fi
}
trap pack EXIT

want() { [[ " $STAGES " == *" all "* || " $STAGES " == *" $1 "* ]]; }
step() {  # step NAME TIMEOUT CMD...: runs CMD, logs to $WORK/NAME.log, records status
    local name=$1 t=$2; shift 2
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
# (docs/benchmarks.md); they go beside, not over, the system's packages, so
# that the asv tests and the asv stage run there too.
if ! python3 -c "import asv" 2>/dev/null && ls .whl/asv-*.whl >/dev/null 2>&1; then
    rm -rf /tmp/asvsite && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/asvsite .whl/*.whl \
        && export PYTHONPATH="/tmp/asvsite${PYTHONPATH:+:$PYTHONPATH}"
fi

echo "machine: $(nvidia-smi --query-gpu=name,driver_version,pci.bus_id --format=csv,noheader 2>&1 | head -1)"
step build 600 bash -c "python3 -m pip install --no-build-isolation --no-deps -e . && make -C native -j16 all" || exit 1
step info 60 python3 -m gdrpy info

if want test; then
    step pytest 900 python3 -m pytest -q -rs -p no:cacheprovider --junitxml="$WORK/junit.xml"
    step c_core_gpu 120 env GDRPY_BACKEND=nvrm native/build/test_core
    step c_nvrm_backend 300 sh native/tests/gpu/run_backend_test.sh "$WORK"
    step nvrm_selftest 300 python3 scripts/nvrm_selftest.py --json "$WORK/nvrm_selftest.json"
fi

if want kinds; then
    step kinds_probe 300 sh native/tests/gpu/run_probe_kinds.sh "$WORK"
    step gdrapi_compat_gpu 120 native/build/test_gdrapi_compat
    step pytest_kinds 300 python3 -m pytest -q -rs -p no:cacheprovider tests/test_gpu_kinds.py
    # pool memory in a busy process (issue 13): a warm-up of many allocations first
    step pool_probe_warm 120 env GDRPY_LOG_LEVEL=1 python3 scripts/pool_probe.py warm
    step pytest_pools_busy 300 python3 -m pytest -q -rs -p no:cacheprovider \
        tests/test_gpu_pools_busy.py tests/test_gpu_kinds.py
fi
if want gdrcopy && [ -d .ext/gdrcopy ]; then
    step gdrcopy_tests 560 scripts/gdrcopy_tests.sh .ext/gdrcopy --work "$WORK/gdrcopy" --timeout 240
fi
if want ucx && [ -x "${UCX_PREFIX:-.ext/ucx}/bin/ucx_perftest" ]; then
    step ucx_perftest 400 scripts/ucx_perftest.sh --work "$WORK/ucx"
fi

if want bench; then
    step c_copylat 300 native/build/gdrpy_copylat --backend nvrm --json "$WORK/c_copylat.json"
    step c_gdrapi_copylat 300 native/build/gdrapi_copylat --max 16777216
    step bench_latency 300 python3 -m gdrpy bench latency --backend nvrm --c \
        --json "$WORK/latency.json" --plot "$WORK/latency.png"
    # also the host-memory kinds (issue 14): put/get from page-locked, registered and
    # pageable memory next to cuMemcpy/torch pinned and pageable, 4 KiB..256 MiB, and
    # the <= 64 KiB latency table of the same run
    step bench_bandwidth 560 python3 -m gdrpy bench bandwidth --backend nvrm --c \
        --json "$WORK/bandwidth.json" --plot "$WORK/bandwidth.png"
    step calibrate 120 python3 -m gdrpy calibrate --backend nvrm
    step bench_transfer 400 python3 -m gdrpy bench transfer --backend nvrm --iters 1500 \
        --json "$WORK/transfer.json" --plot "$WORK/transfer.png"
fi

# Issue 14 (large messages by host-memory kind) on its own, in one call of a few
# minutes: named explicitly only (`scripts/gpu_suite.sh large`), never part of `all`.
if [[ " $STAGES " == *" large "* ]]; then
    step pytest_large 600 python3 -m pytest -q -rs -p no:cacheprovider \
        tests/test_hostmem.py tests/test_staging_schedule.py tests/test_native.py \
        tests/test_staging_kinds.py \
        -k "hostmem or staging or schedule or kind" --junitxml="$WORK/junit_large.xml"
    step staging_sweep 120 python3 scripts/staging_sweep.py --sizes 4M,16M,64M
    step staging_trace 120 python3 scripts/staging_trace.py --sizes 4M,16M,64M \
        --modes base,wkind=plain,wkind=evict,rkind=wc,rkind=evict
    step bench_bandwidth 560 python3 -m gdrpy bench bandwidth --backend nvrm \
        --json "$WORK/bandwidth.json" --plot "$WORK/bandwidth.png"
    step bench_transfer 400 python3 -m gdrpy bench transfer --backend nvrm --iters 600 \
        --json "$WORK/transfer.json" --plot "$WORK/transfer.png"
fi

# the page-locked picker's regret (issue 14): messages from/to host_alloc memory
if want bench || [[ " $STAGES " == *" large "* ]]; then
    step bench_transfer_pinned 400 python3 -m gdrpy bench transfer --backend nvrm --iters 600 \
        --host pinned --json "$WORK/transfer_pinned.json" --plot "$WORK/transfer_pinned.png"
fi

if want examples; then
    step bench_pingpong 300 python3 -m gdrpy bench pingpong --backend nvrm \
        --json "$WORK/pingpong.json"
    step trading_feed 300 python3 examples/trading_feed.py --backend nvrm --json "$WORK/trading_feed.json"
    # MPI mode needs an mpiexec: the GPU image has mpi4py but no MPI launcher;
    # PyPI's mpich wheel carried in .whl/mpi/ provides one (docs/examples.md).
    if ! command -v mpiexec >/dev/null && ls .whl/mpi/mpich-*.whl >/dev/null 2>&1; then
        python3 -m pip install -q --no-index --no-deps --prefix /tmp/mpi .whl/mpi/mpich-*.whl \
            && export PATH="/tmp/mpi/bin:$PATH" LD_LIBRARY_PATH="/tmp/mpi/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    fi
    if command -v mpiexec >/dev/null; then
        step mpi_eager 300 mpiexec -n 2 python3 examples/mpi_eager.py --mode mpi --json "$WORK/mpi_eager.json"
    else
        step mpi_eager 300 python3 examples/mpi_eager.py --json "$WORK/mpi_eager.json"
    fi
fi

if want feed; then
    step feed_sweep 540 python3 examples/trading_feed.py --sweep --backend nvrm \
        --json "$WORK/feed_sweep.json" --plot "$WORK/feed_sweep.svg" --markdown "$WORK/feed_sweep.md"
fi

# Issue 15 on its own (not part of `all`: test and examples cover it there):
# the channel's tests (sim + GPU), then the pingpong benchmark whose SUMMARY
# lines are the issue's numbers, then the trading feed on the channel.
if [[ " $STAGES " == *" channel "* ]]; then
    step channel_c_tests 120 env GDRPY_BACKEND=sim native/build/test_channel
    step channel_tests 600 python3 -m pytest -q -rs -p no:cacheprovider tests/test_channel.py \
        tests/test_channel_gpu.py tests/test_numa.py
    step channel_pingpong 300 python3 -m gdrpy bench pingpong --backend nvrm \
        --json "$WORK/pingpong.json"
    grep -A6 '^SUMMARY' "$WORK/channel_pingpong.log"
    # GDRCopy's own ping-pong (pplat, through libgdrapi.so.2) in the same
    # run, the issue's yardstick: flag only, and 4 bytes of data + the flag
    if [ -d .ext/gdrcopy ]; then
        step channel_pplat 300 scripts/gdrcopy_tests.sh .ext/gdrcopy --only pplat \
            --work "$WORK/pplat" --timeout 120
        # per process, 12 pairs: the C 4-byte round trip next to pplat's
        # flag-only loop on the same CPU (the machine's floor moves by VM)
        if [ -x "$WORK/pplat/build/gdrcopy_pplat" ]; then
            step channel_floor 300 python3 scripts/chan_floor.py \
                --pplat "$WORK/pplat/build/gdrcopy_pplat" --json "$WORK/chan_floor.json"
        fi
    fi
    step channel_feed 300 python3 examples/trading_feed.py --backend nvrm --json "$WORK/trading_feed.json"
    # the gdrpy path with PLAIN slots (the feed's format before round 10), same VM
    step channel_feed_plain 300 python3 examples/trading_feed.py --backend nvrm --slots plain \
        --paths gdrpy --json "$WORK/trading_feed_plain.json"
fi

if want misuse; then
    step misuse_sweep 600 python3 -m tests.misuse.sweep --backend auto --jobs 8 \
        --json "$WORK/misuse_sweep.json"
    step misuse_apilat 300 native/build/gdrpy_apilat --lib native/build --backend auto
    step misuse_stream_probe 300 python3 scripts/stream_probe.py
    if [ -n "${MISUSE_OLD_TREE:-}" ]; then
        step misuse_before_after 600 scripts/misuse_before_after.sh "$MISUSE_OLD_TREE" auto
    fi
fi

if [[ " $STAGES " == *" beforeafter "* ]]; then
    rm -rf "$WORK/old-tree" && cp -a "${BASELINE:-.baseline}" "$WORK/old-tree"
    step before_after 240 env WORK="$WORK/before_after" BUILD_OLD=clean ROUNDS="${ROUNDS:-16}" \
        BUDGET_S=150 scripts/misuse_before_after.sh "$WORK/old-tree" auto
    sed -n '/^old\/new: /,/^time: /p' "$WORK/before_after.log" | tee "$WORK/before_after_table.txt"
fi

# Issue 15's latency: every protocol variant of the 4-byte round trip
# (gdrpy/tools/chanvar_kernels.cu, native/tools/chanpp/chanvar.c), interleaved,
# each checked; the table says which are correct by the memory model.
if [[ " $STAGES " == *" chanperf "* ]]; then
    step chanperf 240 python3 -m gdrpy bench pingpong --variants --backend nvrm
    sed -n '/^VARIANTS/,/^SUMMARY chanperf/p' "$WORK/chanperf.log" | grep -v '^{' | tee "$WORK/chanperf_table.txt"
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

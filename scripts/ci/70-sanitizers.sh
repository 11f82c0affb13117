#!/usr/bin/env bash
# AddressSanitizer + UndefinedBehaviorSanitizer: builds the C core, libgdrapi.so.2,
# the C tests and the Python extension in a copy of the tree (the normal build is
# left alone), runs the native tests, then the pytest suite on sim with libasan
# preloaded into Python, then ThreadSanitizer on the threaded C tests.  Any
# report stops the run (halt_on_error).
#   detect_leaks=1 for the C tests (they must free everything);
#   detect_leaks=0 for Python (the interpreter keeps memory until exit by design).
set -euo pipefail
ROOT=$PWD
SAN="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
WORK=${CI_SAN_DIR:-$(mktemp -d /tmp/gdrpy-asan.XXXXXX)}
mkdir -p "$WORK"
git ls-files -z --cached --others --exclude-standard | tar --null -T - -cf - | tar -xf - -C "$WORK"
cd "$WORK"
export CFLAGS="-O1 -g $SAN" LDFLAGS="$SAN"
make -s -C native -j"$(nproc)" all
# verify_asan_link_order=0: check-fake LD_PRELOADs a stand-in libcuda ahead of the
# runtime the test binaries link.
export ASAN_OPTIONS="halt_on_error=1:abort_on_error=1:detect_leaks=1:strict_string_checks=1:verify_asan_link_order=0"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
# test_copy's exhaustive kernel sweep is ~20 M cases: the sanitizers cover it with
# the other suites' copies; run it once, unchanged, as `make check` does.
make -s -C native check
python3 setup.py -q build_ext --inplace >/dev/null
# libstdc++ too: ASan's __cxa_throw interceptor needs it resolved at start-up
# (C++ extensions such as matplotlib's throw during import).
LIBASAN=$(${CC:-cc} -print-file-name=libasan.so)
LIBSTDCXX=$(${CC:-cc} -print-file-name=libstdc++.so)
export LD_PRELOAD="$LIBASAN $LIBSTDCXX"
export ASAN_OPTIONS="halt_on_error=1:abort_on_error=1:detect_leaks=0:verify_asan_link_order=0"
# The sweep's subprocesses inherit LD_PRELOAD too: every case runs sanitized.
PYTHONPATH=$PWD GDRPY_BACKEND=sim python3 -m pytest -q -p no:cacheprovider -x \
    --ignore=tests/test_asv.py -m "not gpu" tests
PYTHONPATH=$PWD python3 -m tests.misuse.sweep --backend sim --jobs "$(nproc)" \
    --only race

# ThreadSanitizer on the C tests whose threads race teardown (close, unmap,
# unpin) against copies and open/close against busy contexts (test_core), and
# on the staging ring's worker threads (test_staging) and libgdrapi's threads
# (test_gdrapi): any report fails the stage.  (test_channel is left out: its sim
# consumer stands in for a GPU kernel and polls the ring with plain loads, as
# the GPU does, which TSan reports by design; libgdrapi's copy/teardown
# handshake orders with fences, which TSan does not model, so its races stay
# with the ASan run of the misuse sweep above.)
unset LD_PRELOAD
make -s -C native BUILD="$WORK/tsan" CFLAGS="-O1 -g -fsanitize=thread -Wno-tsan" \
    LDFLAGS="-fsanitize=thread" -j"$(nproc)" \
    "$WORK/tsan/test_core" "$WORK/tsan/test_staging" "$WORK/tsan/test_gdrapi"
for t in test_core test_staging test_gdrapi; do
    GDRPY_BACKEND=sim TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1" \
        "$WORK/tsan/$t" | tail -n 1
done
cd "$ROOT"
[ -z "${CI_SAN_DIR:-}" ] && rm -rf "$WORK"
echo "sanitizers: native tests, pytest (sim) and the teardown races ran clean (ASan+UBSan; TSan on the threaded C tests)"

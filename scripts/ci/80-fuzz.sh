#!/usr/bin/env bash
# Bounded fuzzing and the hostile-input sweep (sim):
#  - Hypothesis drives the Python API and, through ctypes, libgdrapi.so.2's C ABI
#    with random sequences of open/pin/map/copy/unmap/unpin/close from 3 threads
#    (3000 examples each by default, random seed; a failure prints the reproducer);
#  - the sweep runs every hostile-input case in its own subprocess and prints the
#    counts (crashes, hangs, clear errors);
#  - gdrpy_apilat prints gdrpy_open latency while 8 threads copy (a measurement,
#    reported, not asserted here).
set -euo pipefail
export GDRPY_FUZZ_EXAMPLES=${GDRPY_FUZZ_EXAMPLES:-3000} GDRPY_FUZZ_SEED=random
timeout 1200 python3 -m pytest -q -p no:cacheprovider tests/fuzz
timeout 1800 python3 -m tests.misuse.sweep --backend sim --jobs "$(nproc)"
make -s -C native tools >/dev/null
native/build/gdrpy_apilat --lib native/build --backend sim --samples 500 \
    || echo "(open under load above the 10 ms target on this run)"

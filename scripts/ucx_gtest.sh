#!/usr/bin/env bash
# ucx_gtest.sh - UCX's own unit tests of its gdr_copy transport (gtest, filter
# '*gdr_copy*') on gdrpy's libgdrapi.so.2, on a GPU host: every change to the pin
# or copy path can be checked against what UCX itself expects of a GDRCopy library.
#
#   scripts/ucx_gtest.sh [--ucx DIR] [--lib DIR] [--filter PATTERN] [--work DIR]
#                        [--timeout S] [--list] [-- GTEST_ARGS...]
#
#   --ucx      the folder `scripts/ucx_build.sh --gtest` made: bin/ucx_gtest, lib/,
#              lib/ucx/ (default $UCX_PREFIX, else .ext/ucx)
#   --lib      folder of the libgdrapi.so.2 to test (default: python3 -m gdrpy
#              libdir, else native/build)
#   --filter   gtest filter (default '*gdr_copy*': the gdr_copy memory domain's
#              tests and the transport tests instantiated for gdr_copy)
#   --work     logs and temporary files (default ${WORK:-/tmp}/ucx-gtest)
#   --timeout  seconds for the whole run (default 600)
#   --list     list the selected tests, run nothing
#
# Environment of the run (what UCX's `make -C test/gtest test` sets, errors
# reported instead of frozen): UCX_HANDLE_ERRORS=bt, UCX_LOG_LEVEL=warn,
# UCX_LOG_PRINT_ENABLE=y, TMPDIR in the work folder, the user's other UCX_*
# variables removed.  Printed last: "ucx gtest <filter>: P passed, F failed, S
# skipped (UCX's own skips, which gtest counts as passed) of N", then the failing
# tests, one a line.  Exit status 0 when tests ran and none failed.
set -uo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
UCX="${UCX_PREFIX:-$here/.ext/ucx}"
LIB=""
FILTER='*gdr_copy*'
W="${WORK:-/tmp}/ucx-gtest"
TIMEOUT=600
LIST=0
EXTRA=()
while [ $# -gt 0 ]; do
    case "$1" in
        --ucx) UCX=$2; shift 2 ;;
        --lib) LIB=$2; shift 2 ;;
        --filter) FILTER=$2; shift 2 ;;
        --work) W=$2; shift 2 ;;
        --timeout) TIMEOUT=$2; shift 2 ;;
        --list) LIST=1; shift ;;
        --) shift; EXTRA=("$@"); break ;;
        -h|--help) sed -n '2,/^set /{/^#/s/^# \{0,1\}//p}' "$0"; exit 0 ;;
        *) echo "ucx_gtest.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
die() { echo "ucx_gtest.sh: $*" >&2; exit 2; }

GT="$UCX/bin/ucx_gtest"
[ -x "$GT" ] || die "no $GT: build it with scripts/ucx_build.sh --gtest (CPU machine) and carry the folder (--ucx DIR)"
if [ -z "$LIB" ]; then
    LIB=$(python3 -m gdrpy libdir 2>/dev/null) || LIB="$here/native/build"
fi
[ -f "$LIB/libgdrapi.so.2" ] || die "no libgdrapi.so.2 in $LIB (--lib DIR; make -C native lib)"
UCX=$(cd "$UCX" && pwd); LIB=$(cd "$LIB" && pwd)
mkdir -p "$W/tmp"; W=$(cd "$W" && pwd)

# the user's UCX settings would change what the tests exercise
for v in $(env | sed -n 's/^\(UCX_[A-Za-z0-9_]*\)=.*/\1/p'); do unset "$v"; done
# lib/ucx too: the gtest binary links the cuda transport module directly
export LD_LIBRARY_PATH="$LIB:$UCX/lib:$UCX/lib/ucx${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export UCX_HANDLE_ERRORS=bt UCX_LOG_LEVEL=warn UCX_LOG_PRINT_ENABLE=y
export UCX_WARN_UNUSED_ENV_VARS=n UCX_MODULE_DIR="$UCX/lib/ucx" TMPDIR="$W/tmp"
export GTEST_COLOR=no

if [ $LIST = 1 ]; then
    "$GT" --gtest_list_tests --gtest_filter="$FILTER"
    exit $?
fi

echo "== ucx_gtest --gtest_filter='$FILTER' (libgdrapi.so.2 from $LIB; log $W/gtest.log)"
T0=$(date +%s)
timeout -k 10 "$TIMEOUT" "$GT" --gtest_filter="$FILTER" "${EXTRA[@]}" > "$W/gtest.log" 2>&1
rc=$?
[ $rc = 124 ] && echo "(stopped after $TIMEOUT s)" >> "$W/gtest.log"
python3 - "$W/gtest.log" "$FILTER" "$rc" "$(( $(date +%s) - T0 ))" <<'EOF'
import re
import sys

log, filt, rc, secs = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
state, skipped, passed, failed = {}, set(), [], []
current = None
for line in open(log, errors="replace"):
    m = re.match(r"^\[ RUN      \] (\S+)", line)
    if m:
        current = m.group(1)
        state[current] = "crashed"
        continue
    if current and re.match(r"^\[\s*SKIP\s*\]", line):
        skipped.add(current)
        continue
    m = re.match(r"^\[\s+(OK|FAILED)\s+\] (\S+?)(,| \(|$)", line)
    if m and m.group(2) in state:
        state[m.group(2)] = "ok" if m.group(1) == "OK" else "failed"
        current = None
for name, st in state.items():
    if st == "ok" and name not in skipped:
        passed.append(name)
    elif st != "ok":
        failed.append((name, st))
n = len(state)
print(f"ucx gtest {filt}: {len(passed)} passed, {len(failed)} failed, "
      f"{len([s for s in skipped if state.get(s) == 'ok'])} skipped of {n} "
      f"(exit {rc}, {secs} s)")
for name, st in failed:
    print(f"  FAILED {name}" + (" (no result: the run stopped in it)" if st == "crashed" else ""))
sys.exit(0 if n and not failed and rc == 0 else 1)
EOF

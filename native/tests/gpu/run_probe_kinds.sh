#!/bin/sh
# Builds and runs probe_kinds (memory kinds x nvrm routes, pins by GPU page)
# on a GPU machine.  Usage (any folder): native/tests/gpu/run_probe_kinds.sh [outdir]
# Full output (FACT/ROW/UCX/BAD lines) in $OUTDIR/probe_kinds.log, the
# backend's debug log in $OUTDIR/probe_kinds.debug.log; prints the table
# last; exit 1 if a must-hold check failed.
OUTDIR=${1:-${OUT:-/tmp}}
mkdir -p "$OUTDIR"
CUDA=${CUDA_HOME:-/usr/local/cuda}
cd "$(dirname "$0")/../.." || exit 2
make -s lib >/dev/null || exit 2
gcc -O2 -g -std=gnu11 -Wall -Wno-unused-parameter -Iinclude -I"$CUDA/include" \
    tests/gpu/probe_kinds.c build/libgdrpy.a \
    -L"$CUDA/lib64" -L"$CUDA/lib64/stubs" -lcuda -ldl -pthread -o "$OUTDIR/probe_kinds" || exit 2
GDRPY_LOG_LEVEL=1 "$OUTDIR/probe_kinds" >"$OUTDIR/probe_kinds.log" 2>"$OUTDIR/probe_kinds.debug.log"
rc=$?
grep -E '^FACT' "$OUTDIR/probe_kinds.log"
echo "---- routes taken (backend debug log, $OUTDIR/probe_kinds.debug.log)"
grep -E "nvrm: (pinned|route V|pool records learned|pool memory)|could not be learned" "$OUTDIR/probe_kinds.debug.log" | tail -40
echo "route V learning: $(grep -c 'learning: candidate' "$OUTDIR/probe_kinds.debug.log") candidate handles refused by RM_DUP_OBJECT"
echo "---- table ($OUTDIR/probe_kinds.log)"
grep -vE '^FACT' "$OUTDIR/probe_kinds.log"
exit $rc

#!/bin/sh
# Builds and runs probe_pool_rm (how CUDA's pool and VMM memory sit in RM;
# diagnostic, writes only its own allocations).  Usage: run_probe_pool_rm.sh [outdir]
OUTDIR=${1:-${OUT:-/tmp}}
mkdir -p "$OUTDIR"
CUDA=${CUDA_HOME:-/usr/local/cuda}
cd "$(dirname "$0")/../.." || exit 2
make -s lib >/dev/null || exit 2
gcc -O2 -g -std=gnu11 -Wall -Wno-unused-parameter -Iinclude -Isrc/core -Isrc/backends/nvrm -Itests/gpu \
    -I"$CUDA/include" tests/gpu/probe_pool_rm.c tests/gpu/probe_rm_shim.c build/libgdrpy.a \
    -L"$CUDA/lib64" -L"$CUDA/lib64/stubs" -lcuda -ldl -pthread -o "$OUTDIR/probe_pool_rm" || exit 2
exec "$OUTDIR/probe_pool_rm"

#!/bin/sh
# Builds and runs the nvrm backend harness on a GPU machine.
# Usage (from native/): tests/gpu/run_backend_test.sh [outdir]
set -e
OUTDIR=${1:-${OUT:-/tmp}}
CUDA=${CUDA_HOME:-/usr/local/cuda}
cd "$(dirname "$0")/../.."
NVRM_SRCS=$(make -s --no-print-directory nvrm-srcs) # src/backends/nvrm/files.mk
gcc -O2 -g -std=gnu11 -D_GNU_SOURCE -DGDRPY_NVRM_TESTING -Wall -Wextra -Wno-unused-parameter \
    -Iinclude -Isrc/core -Isrc/copy -I"$CUDA/include" \
    tests/gpu/test_nvrm_backend.c src/core/error.c src/core/cudadrv.c $NVRM_SRCS \
    src/backends/gdrdrv.c src/backends/dmabuf.c \
    -L"$CUDA/lib64" -L"$CUDA/lib64/stubs" -lcuda -ldl -pthread \
    -o "$OUTDIR/test_nvrm_backend"
"$OUTDIR/test_nvrm_backend"

#!/usr/bin/env bash
# prepare_ext.sh - fills the ignored folder .ext/ with what the GPU stages
# "gdrcopy" and "ucx" of scripts/gpu_suite.sh need, on the CPU machine:
#   .ext/gdrcopy  GDRCopy's source at a release tag (its tests are built on
#                 the GPU machine by scripts/gdrcopy_tests.sh)     ~0.8 MB
#   .ext/ucx      UCX built with CUDA + gdr_copy (scripts/ucx_build.sh) ~4 MB
# Neither is ever committed.  Carry both with the device tool
# (carry: [".ext/gdrcopy", ".ext/ucx"]).
#
#   scripts/prepare_ext.sh [--gdrcopy-repo DIR] [--gdrcopy-tag v2.6]
#                          [--ucx-from DIR]   (copy an existing build instead of building)
set -euo pipefail
cd "$(dirname "$0")/.."
GREPO=/work/.mirror/NVIDIA+gdrcopy/repo
GTAG=v2.6
UCX_FROM=""
while [ $# -gt 0 ]; do
    case "$1" in
        --gdrcopy-repo) GREPO=$2; shift 2 ;;
        --gdrcopy-tag) GTAG=$2; shift 2 ;;
        --ucx-from) UCX_FROM=$2; shift 2 ;;
        *) echo "prepare_ext.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
mkdir -p .ext
if [ ! -f .ext/gdrcopy/tests/sanity.cpp ]; then
    rm -rf .ext/gdrcopy && mkdir -p .ext/gdrcopy
    git -C "$GREPO" archive "$GTAG" | tar x -C .ext/gdrcopy
fi
if [ ! -x .ext/ucx/bin/ucx_perftest ]; then
    if [ -n "$UCX_FROM" ]; then
        rm -rf .ext/ucx && cp -a "$UCX_FROM" .ext/ucx
    else
        scripts/ucx_build.sh --out "$PWD/.ext/ucx"
    fi
fi
du -sh .ext/gdrcopy .ext/ucx

#!/usr/bin/env bash
# prepare_ext.sh - fills the ignored folder .ext/ with what the GPU stages
# "gdrcopy" and "ucx" of scripts/gpu_suite.sh need, on the CPU machine:
#   .ext/gdrcopy  GDRCopy's source at a release tag (its tests are built on
#                 the GPU machine by scripts/gdrcopy_tests.sh)     ~0.8 MB
#   .ext/ucx      UCX built with CUDA + gdr_copy (scripts/ucx_build.sh) ~4 MB
# Neither is ever committed.  Carry both with the device tool
# (carry: [".ext/gdrcopy", ".ext/ucx"]).
#
#   scripts/prepare_ext.sh [--gdrcopy-src DIR] [--gdrcopy-tag v2.6]
#                          [--ucx-src DIR] [--ucx-from DIR]
#
#   --gdrcopy-src  GDRCopy git repository (bare or not) or source tree (default:
#                  $GDRCOPY_SRC, else a clone of https://github.com/NVIDIA/gdrcopy
#                  in .ext/src)
#   --gdrcopy-tag  the release of a repository that goes to .ext/gdrcopy (default v2.6)
#   --ucx-src      UCX source for scripts/ucx_build.sh (default: $UCX_SRC, else a
#                  clone of https://github.com/openucx/ucx in .ext/src)
#   --ucx-from     copy an existing build of scripts/ucx_build.sh instead of building
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/ext_source.sh
. scripts/ext_source.sh
GREPO=${GDRCOPY_SRC:-}
GTAG=v2.6
UCX_ARGS=()
UCX_FROM=""
while [ $# -gt 0 ]; do
    case "$1" in
        --gdrcopy-src) GREPO=$2; shift 2 ;;
        --gdrcopy-tag) GTAG=$2; shift 2 ;;
        --ucx-src) UCX_ARGS=(--ucx-src "$2"); shift 2 ;;
        --ucx-from) UCX_FROM=$2; shift 2 ;;
        -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
        *) echo "prepare_ext.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
mkdir -p .ext
if [ ! -f .ext/gdrcopy/tests/sanity.cpp ]; then
    GREPO=$(ext_source gdrcopy "$GREPO" --gdrcopy-src GDRCOPY_SRC \
            https://github.com/NVIDIA/gdrcopy) || exit 1
    ext_unpack "$GREPO" "$GTAG" .ext/gdrcopy
fi
if [ ! -x .ext/ucx/bin/ucx_perftest ]; then
    if [ -n "$UCX_FROM" ]; then
        rm -rf .ext/ucx && cp -a "$UCX_FROM" .ext/ucx
    else
        # the header of the tree just unpacked: one GDRCopy source for both
        scripts/ucx_build.sh --out "$PWD/.ext/ucx" --gdrcopy-src "$PWD/.ext/gdrcopy" \
            "${UCX_ARGS[@]}"
    fi
fi
du -sh .ext/gdrcopy .ext/ucx

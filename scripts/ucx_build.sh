#!/usr/bin/env bash
# ucx_build.sh - build UCX with CUDA and gdr_copy support against NVIDIA's
# gdrapi.h and gdrpy's libgdrapi.so.2, on a machine WITHOUT a GPU or a CUDA
# toolkit, into a small relocatable folder that can be carried to a GPU host.
#
#   scripts/ucx_build.sh [--ucx-src DIR] [--tag vX.Y.Z] [--gdrcopy-src DIR]
#                        [--out DIR] [--work DIR] [--wheels DIR] [--jobs N] [--gtest]
#
#   --ucx-src      a UCX git repository (bare or not) or an unpacked source
#                  tree (default: $UCX_SRC, else a clone of
#                  https://github.com/openucx/ucx in .ext/src: scripts/ext_source.sh)
#   --tag          release tag to build (default: newest v1.x.y tag, no -rc)
#   --gdrcopy-src  GDRCopy git repository (tag v2.6 is used) or source tree; only
#                  its include/gdrapi.h is used (default: $GDRCOPY_SRC, else a
#                  clone of https://github.com/NVIDIA/gdrcopy in .ext/src)
#   --out          install folder (default: .ext/ucx in the repository; ignored by git)
#   --work         build folder (default: /tmp/gdrpy-ucx-build)
#   --wheels       folder with (or for) the CUDA wheels: nvidia-cuda-runtime-cu12,
#                  nvidia-cuda-nvcc-cu12 (crt headers), nvidia-nvml-dev-cu12;
#                  downloaded with `pip download` when missing (default: .ext/wheels)
#   --gtest        also build UCX's unit tests (configure --enable-gtest: the same
#                  libraries, plus test/gtest) and add them as bin/ucx_gtest, stripped;
#                  run them with scripts/ucx_gtest.sh.  About twice the build time.
#
# What it does
#  1. A CUDA "sysroot" in the work folder from the wheels: headers (cuda.h,
#     cuda_runtime.h, crt/, nvml.h) and libcudart.so.12.  libcuda.so and
#     libnvidia-ml.so are LINK-TIME STUBS generated here (every cu*/nvml*
#     name of the headers as an empty function, sonames libcuda.so.1 and
#     libnvidia-ml.so.1): they stay in the work folder and are never
#     installed or carried; the driver's own libraries serve at run time.
#  2. A GDRCopy prefix with NVIDIA's include/gdrapi.h and our libgdrapi.so
#     (built with `make -C native lib`), so UCX's configure finds gdrcopy.
#  3. UCX from the tag: autogen, configure --with-cuda --with-gdrcopy (no
#     nvcc: UCX's device-side perftest kernels are optional), make, install.
#  4. Trims the install to what ucx_perftest/ucx_info need (bin, lib, lib/ucx),
#     strips it, and adds libcudart.so.12 (needed by libucx_perftest_cuda.so and
#     libucm_cuda.so); with --gtest, bin/ucx_gtest (its test libraries are linked
#     in; it runs on the same lib/).
#
# Run the result with scripts/ucx_perftest.sh.  Logs: $WORK/*.log.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=scripts/ext_source.sh
. "$here/scripts/ext_source.sh"
# shellcheck source=scripts/cuda_stub.sh
. "$here/scripts/cuda_stub.sh"
UCX_SRC=${UCX_SRC:-}
TAG=""
GDR_SRC=${GDRCOPY_SRC:-}
GDR_TAG=v2.6
OUT="$here/.ext/ucx"
WORK=/tmp/gdrpy-ucx-build
WHEELS="$here/.ext/wheels"
JOBS=$(nproc 2>/dev/null || echo 2)
GTEST=0

while [ $# -gt 0 ]; do
    case "$1" in
        --ucx-src) UCX_SRC=$2; shift 2 ;;
        --tag) TAG=$2; shift 2 ;;
        --gdrcopy-src) GDR_SRC=$2; shift 2 ;;
        --out) OUT=$2; shift 2 ;;
        --work) WORK=$2; shift 2 ;;
        --wheels) WHEELS=$2; shift 2 ;;
        --jobs) JOBS=$2; shift 2 ;;
        --gtest) GTEST=1; shift ;;
        -h|--help) sed -n '2,/^set /{/^#/s/^# \{0,1\}//p}' "$0"; exit 0 ;;
        *) echo "ucx_build.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done

log() { printf '[ucx_build %s] %s\n' "$(date +%H:%M:%S)" "$*"; }
die() { printf 'ucx_build.sh: %s\n' "$*" >&2; exit 1; }

for t in autoconf automake libtoolize make gcc g++ python3; do
    command -v "$t" >/dev/null || die "$t is missing (apt-get install autoconf automake libtool build-essential)"
done

UCX_SRC=$(ext_source ucx "$UCX_SRC" --ucx-src UCX_SRC https://github.com/openucx/ucx) || exit 1
GDR_SRC=$(ext_source gdrcopy "$GDR_SRC" --gdrcopy-src GDRCOPY_SRC \
          https://github.com/NVIDIA/gdrcopy) || exit 1

mkdir -p "$WORK" "$WHEELS"
WORK=$(cd "$WORK" && pwd)

# ---- 0. UCX source -------------------------------------------------------
src="$WORK/ucx-src"
if ext_is_git "$UCX_SRC"; then
    if [ -z "$TAG" ]; then
        TAG=$(git -C "$UCX_SRC" tag -l 'v1.*' | grep -E '^v1\.[0-9]+\.[0-9]+$' | sort -V | tail -1)
    fi
    [ -n "$TAG" ] || die "no release tag v1.x.y in $UCX_SRC"
    if [ ! -f "$src/.tag" ] || [ "$(cat "$src/.tag")" != "$TAG" ]; then
        log "unpacking UCX $TAG from $UCX_SRC"
        ext_unpack "$UCX_SRC" "$TAG" "$src"
        echo "$TAG" > "$src/.tag"
    fi
else
    [ -f "$UCX_SRC/autogen.sh" ] || [ -f "$UCX_SRC/configure" ] || die "$UCX_SRC is neither a git repository nor a UCX source tree"
    TAG=${TAG:-$(basename "$UCX_SRC")}
    ext_unpack "$UCX_SRC" "$TAG" "$src"
fi

# ---- 1. CUDA sysroot from wheels, plus link-time stubs ---------------------
need_wheel() {  # name glob
    ls "$WHEELS"/$2 >/dev/null 2>&1 && return 0
    log "pip download $1"
    pip download --no-deps -q "$1" -d "$WHEELS" >"$WORK/pip-$1.log" 2>&1 ||
        die "pip download $1 failed (see $WORK/pip-$1.log)"
}
need_wheel nvidia-cuda-runtime-cu12 'nvidia_cuda_runtime_cu12-*.whl'
need_wheel nvidia-cuda-nvcc-cu12 'nvidia_cuda_nvcc_cu12-*.whl'
need_wheel nvidia-nvml-dev-cu12 'nvidia_nvml_dev_cu12-*.whl'

cuda="$WORK/cuda"
rm -rf "$cuda"; mkdir -p "$cuda/include" "$cuda/lib64/stubs" "$WORK/whl"
for w in "$WHEELS"/nvidia_cuda_runtime_cu12-*.whl "$WHEELS"/nvidia_cuda_nvcc_cu12-*.whl \
         "$WHEELS"/nvidia_nvml_dev_cu12-*.whl; do
    python3 - "$w" "$WORK/whl" <<'EOF'
import sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
for n in z.namelist():
    if "/include/" in n or n.endswith(".so.12") or "/lib/" in n:
        z.extract(n, sys.argv[2])
EOF
done
cp -a "$WORK"/whl/nvidia/cuda_runtime/include/. "$cuda/include/"
cp -a "$WORK"/whl/nvidia/cuda_nvcc/include/crt "$cuda/include/" 2>/dev/null || true
find "$WORK/whl/nvidia" -name nvml.h -exec cp {} "$cuda/include/" \;
[ -f "$cuda/include/nvml.h" ] || die "nvml.h not found in the nvml-dev wheel"
cudart=$(ls "$WORK"/whl/nvidia/cuda_runtime/lib/libcudart.so.12* | head -1)
cp "$cudart" "$cuda/lib64/libcudart.so.12"
ln -sf libcudart.so.12 "$cuda/lib64/libcudart.so"

cuda_stub libcuda.so.1 "$cuda/lib64/stubs" "$cuda/include/cuda.h"
cuda_stub libnvidia-ml.so.1 "$cuda/lib64/stubs" "$cuda/include/nvml.h"
log "CUDA sysroot ready: $(ls "$cuda/include" | wc -l) headers, stubs in $cuda/lib64/stubs"

# ---- 2. gdrcopy prefix: NVIDIA's header + our library ----------------------
gdr="$WORK/gdrcopy"
rm -rf "$gdr"; mkdir -p "$gdr/include" "$gdr/lib"
if ext_is_git "$GDR_SRC"; then
    git -C "$GDR_SRC" show "$GDR_TAG:include/gdrapi.h" > "$gdr/include/gdrapi.h"
else
    cp "$GDR_SRC/include/gdrapi.h" "$gdr/include/gdrapi.h"
fi
log "building libgdrapi.so.2 (make -C native lib)"
make -C "$here/native" -j"$JOBS" lib >"$WORK/native.log" 2>&1 || die "native build failed (see $WORK/native.log)"
cp "$here/native/build/libgdrapi.so.2" "$gdr/lib/"
ln -sf libgdrapi.so.2 "$gdr/lib/libgdrapi.so"

# ---- 3. UCX ----------------------------------------------------------------
cd "$src"
if [ ! -x configure ]; then
    log "autogen.sh"
    ./autogen.sh >"$WORK/autogen.log" 2>&1 || die "autogen failed (see $WORK/autogen.log)"
fi
bld="$WORK/build"
rm -rf "$bld" "$WORK/install"; mkdir -p "$bld"
cd "$bld"
log "configure (log: $WORK/configure.log)"
gtest_flag=""
[ "$GTEST" = 1 ] && gtest_flag=--enable-gtest
# shellcheck disable=SC2086
NVCC=/bin/false "$src/configure" --prefix="$WORK/install" $gtest_flag \
    --with-cuda="$cuda" --with-gdrcopy="$gdr" \
    --enable-optimizations --disable-debug --disable-assertions --disable-doxygen-doc \
    --without-java --without-go --without-rocm --without-ze --without-verbs \
    --without-rdmacm --without-knem --without-xpmem --without-ugni --without-mlx5 \
    --without-fuse3 --disable-examples \
    >"$WORK/configure.log" 2>&1 || die "configure failed (see $WORK/configure.log)"
grep -E "configure: +(UCS|UCT|CUDA|UCM|Perf) modules" \
    "$WORK/configure.log" || true
grep -qE "CUDA modules:.*gdrcopy" "$WORK/configure.log" ||
    die "configure did not enable the gdr_copy transport (see $WORK/configure.log)"
log "make -j$JOBS (log: $WORK/make.log)"
make -j"$JOBS" >"$WORK/make.log" 2>&1 || die "make failed (see $WORK/make.log)"
make install >"$WORK/install.log" 2>&1 || die "make install failed (see $WORK/install.log)"
if [ "$GTEST" = 1 ]; then
    log "make -C test/gtest gtest (log: $WORK/gtest.log)"
    make -C test/gtest -j"$JOBS" gtest >"$WORK/gtest.log" 2>&1 ||
        die "the gtest build failed (see $WORK/gtest.log)"
fi

# ---- 4. trim, strip, add libcudart -------------------------------------------
inst="$WORK/install"
rm -rf "$OUT"; mkdir -p "$OUT/bin" "$OUT/lib/ucx"
cp -a "$inst"/bin/ucx_perftest "$inst"/bin/ucx_info "$OUT/bin/"
cp -a "$inst"/lib/lib*.so* "$OUT/lib/"
cp -a "$inst"/lib/ucx/lib*.so* "$OUT/lib/ucx/"
cp "$cuda/lib64/libcudart.so.12" "$OUT/lib/"
if [ "$GTEST" = 1 ]; then
    # libtool's -no-install program; a wrapper script would have the real one in .libs
    gt="$bld/test/gtest/gtest"
    [ "$(head -c 4 "$gt" | od -An -c | tr -d ' ')" = "177ELF" ] || gt="$bld/test/gtest/.libs/gtest"
    cp "$gt" "$OUT/bin/ucx_gtest"
    # its rpath names the build tree; where patchelf is at hand, point it at the output
    if command -v patchelf >/dev/null 2>&1; then
        # shellcheck disable=SC2016
        patchelf --set-rpath '$ORIGIN/../lib:$ORIGIN/../lib/ucx' "$OUT/bin/ucx_gtest" ||
            log "patchelf failed: bin/ucx_gtest keeps the build tree's rpath (LD_LIBRARY_PATH serves)"
    fi
fi
# ucx_perftest is built with OpenMP: carry the compiler's libgomp too.
gomp=$(gcc -print-file-name=libgomp.so.1)
[ -f "$gomp" ] && cp -L "$gomp" "$OUT/lib/"
find "$OUT" -type f \( -name '*.so*' -o -path '*/bin/*' \) -exec strip --strip-unneeded {} \; 2>/dev/null || true
# Never carry a stub.
if find "$OUT" -name 'libcuda.so*' -o -name 'libnvidia-ml.so*' | grep -q .; then
    die "a libcuda/libnvidia-ml found its way into $OUT"
fi
{
    echo "UCX $TAG built $(date -u +%Y-%m-%dT%H:%M:%SZ) by scripts/ucx_build.sh"
    echo "cuda headers: $(basename "$(ls "$WHEELS"/nvidia_cuda_runtime_cu12-*.whl)")"
    echo "gdrapi.h: NVIDIA/gdrcopy $GDR_TAG; libgdrapi: gdrpy (use LD_LIBRARY_PATH to pick it)"
    grep -E "configure: +(UCS|UCT|CUDA|UCM|Perf) modules" "$WORK/configure.log" || true
    [ "$GTEST" = 1 ] && echo "bin/ucx_gtest: UCX's unit tests (scripts/ucx_gtest.sh)"
} > "$OUT/BUILD-INFO"
log "done: $OUT ($(du -sh "$OUT" | cut -f1)); modules: $(ls "$OUT/lib/ucx" | tr '\n' ' ')"

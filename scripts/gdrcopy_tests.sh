#!/usr/bin/env bash
# gdrcopy_tests.sh - build GDRCopy's own test programs (tests/*.cpp, pplat.cu)
# from a GDRCopy source tree against NVIDIA's include/gdrapi.h and gdrpy's
# libgdrapi.so.2, run them, and print a summary.  GDRCopy's code is never
# committed: pass the folder you unpacked it into, e.g.
#
#   git clone --bare https://github.com/NVIDIA/gdrcopy gdrcopy.git
#   mkdir -p .ext/gdrcopy && git -C gdrcopy.git archive v2.6 | tar x -C .ext/gdrcopy
#   scripts/gdrcopy_tests.sh .ext/gdrcopy   (scripts/prepare_ext.sh does the first two)
#
# Options (after the source folder):
#   --lib DIR        folder holding our libgdrapi.so.2 (default: native/build,
#                    built with `make -C native lib` when missing)
#   --cuda DIR       CUDA toolkit (default: $CUDA_HOME or /usr/local/cuda)
#   --work DIR       build + log folder (default: ${WORK:-/tmp}/gdrcopy-tests)
#   --build-only     compile only (on a machine without a GPU; pplat needs nvcc)
#   --only LIST      comma list of sanity,copylat,copybw,apiperf,pplat (default all)
#   --timeout S      per-program time limit in seconds (default 300)
#
# Needs g++ and CUDA's headers + libcuda (the driver's at run time); GDRCopy
# 2.6's sanity uses its own test harness (tests/testsuites/), not libcheck,
# so no extra package is needed.  Output: one line per program and
# "gdrcopy_sanity: Total: N, Passed: P, Failed: F, Waived: W"; logs in --work.
# Exit status: 0 when every program asked for built, sanity (when asked
# for) reported 0 failures and pplat (when asked for) exited 0 in each mode;
# copylat, copybw and apiperf are reported, their exit status not judged.
set -uo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
[ $# -ge 1 ] || { sed -n '2,25p' "$0"; exit 2; }
SRC=$1; shift
LIB="$here/native/build"
CUDA=${CUDA_HOME:-/usr/local/cuda}
WORKDIR="${WORK:-/tmp}/gdrcopy-tests"
BUILD_ONLY=0
ONLY="sanity,copylat,copybw,apiperf,pplat"
TMO=300
while [ $# -gt 0 ]; do
    case "$1" in
        --lib) LIB=$2; shift 2 ;;
        --cuda) CUDA=$2; shift 2 ;;
        --work) WORKDIR=$2; shift 2 ;;
        --build-only) BUILD_ONLY=1; shift ;;
        --only) ONLY=$2; shift 2 ;;
        --timeout) TMO=$2; shift 2 ;;
        *) echo "gdrcopy_tests.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done

die() { echo "gdrcopy_tests.sh: $*" >&2; exit 1; }
want() { case ",$ONLY," in *",$1,"*) return 0 ;; esac; return 1; }

[ -f "$SRC/tests/sanity.cpp" ] && [ -f "$SRC/include/gdrapi.h" ] ||
    die "$SRC does not look like a GDRCopy source tree (tests/sanity.cpp, include/gdrapi.h)"
SRC=$(cd "$SRC" && pwd)
CUDA=$(cd "$CUDA" 2>/dev/null && pwd || echo "$CUDA")
[ -f "$CUDA/include/cuda.h" ] || die "no cuda.h under $CUDA/include (use --cuda)"
command -v g++ >/dev/null || die "g++ is missing"
if [ ! -f "$LIB/libgdrapi.so.2" ]; then
    [ "$LIB" = "$here/native/build" ] || die "no libgdrapi.so.2 in $LIB"
    make -C "$here/native" lib >/dev/null || die "make -C native lib failed"
fi
LIB=$(cd "$LIB" && pwd)
mkdir -p "$WORKDIR"
WORKDIR=$(cd "$WORKDIR" && pwd)
B="$WORKDIR/build"
rm -rf "$B"; mkdir -p "$B"
cp -a "$SRC/tests/." "$B/"
# -lgdrapi must find OUR library: a private link folder holding only it.
mkdir -p "$B/lib"
ln -sf "$LIB/libgdrapi.so.2" "$B/lib/libgdrapi.so"

CUDALIB="-L$CUDA/lib64 -L$CUDA/lib64/stubs -L$CUDA/lib -L$CUDA/lib/stubs"
CPPFLAGS="-I$SRC/include -I$SRC/src -I$CUDA/include"
LIBS="-L$B/lib -lgdrapi -Wl,-rpath,$LIB $CUDALIB -lcuda -lpthread -ldl -lrt"
built=()
log() { printf '%s\n' "$*"; }

build_cpp() {  # name sources...
    local name=$1; shift
    if (cd "$B" && g++ -O2 -std=c++17 $CPPFLAGS -o "gdrcopy_$name" "$@" $LIBS) \
        >"$WORKDIR/build_$name.log" 2>&1; then
        built+=("$name"); log "built gdrcopy_$name"
    else
        log "BUILD FAILED gdrcopy_$name (see $WORKDIR/build_$name.log)"; tail -5 "$WORKDIR/build_$name.log"
    fi
}
want sanity && build_cpp sanity sanity.cpp common.cpp testsuites/testsuite.cpp
for t in copylat copybw apiperf; do want $t && build_cpp $t $t.cpp common.cpp; done
if want pplat; then
    NVCC="$CUDA/bin/nvcc"
    if [ -x "$NVCC" ]; then
        arch="-arch=native"
        "$NVCC" --help 2>/dev/null | grep -q native || arch="-arch=sm_90"
        if (cd "$B" && "$NVCC" -O2 -std=c++17 $arch $CPPFLAGS -o gdrcopy_pplat pplat.cu common.cpp \
              -L"$B/lib" -lgdrapi -Xlinker -rpath -Xlinker "$LIB" $CUDALIB -lcuda) \
              >"$WORKDIR/build_pplat.log" 2>&1; then
            built+=("pplat"); log "built gdrcopy_pplat"
        else
            log "BUILD FAILED gdrcopy_pplat (see $WORKDIR/build_pplat.log)"; tail -5 "$WORKDIR/build_pplat.log"
        fi
    else
        log "SKIP build of gdrcopy_pplat: no nvcc at $NVCC"
    fi
fi
[ "$BUILD_ONLY" = 1 ] && { log "build-only: ${built[*]:-nothing} built in $B"; exit 0; }

export LD_LIBRARY_PATH="$LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
has() { local x; for x in "${built[@]}"; do [ "$x" = "$1" ] && return 0; done; return 1; }
run() {  # label timeout cmd...
    local label=$1 t=$2; shift 2
    local out="$WORKDIR/$label.log" rc
    (cd "$B" && timeout "$t" "$@") >"$out" 2>&1; rc=$?
    echo "$rc" > "$WORKDIR/$label.rc"
    return $rc
}
summary=()
rc_all=0
for t in sanity copylat copybw apiperf pplat; do   # asked for, not built
    want $t && ! has $t && rc_all=1
done
if has sanity; then
    run sanity "$TMO" ./gdrcopy_sanity; rc=$?
    line=$(grep -E '^Total: ' "$WORKDIR/sanity.log" | tail -1)
    summary+=("gdrcopy_sanity: ${line:-no summary line (exit $rc)}")
    if grep -q "List of failed tests" "$WORKDIR/sanity.log"; then
        summary+=("  failed: $(sed -n '/List of failed tests/,/^$/p' "$WORKDIR/sanity.log" | grep -E '^ +' | tr -s ' ' | tr '\n' ' ')")
    fi
    if grep -q "List of waived tests" "$WORKDIR/sanity.log"; then
        summary+=("  waived: $(sed -n '/List of waived tests/,/^$/p' "$WORKDIR/sanity.log" | grep -E '^ +' | tr -s ' ' | tr '\n' ' ')")
    fi
    echo "$line" | grep -q 'Failed: 0,' || rc_all=1
elif want sanity; then
    rc_all=1
fi
for t in copylat copybw apiperf; do
    has $t || continue
    run $t "$TMO" ./gdrcopy_$t; rc=$?
    # result lines: copylat/apiperf rows start with the call's name and hold a
    # size and times; copybw prints "write BW: ..." / "read BW: ..."
    summary+=("gdrcopy_$t: exit $rc, $(grep -cE '^(gdr_|cuMemcpy|[[:space:]]*[0-9])|^(write|read) BW:' "$WORKDIR/$t.log") result lines ($WORKDIR/$t.log)")
done
if has pplat; then
    # flag only (pplat runs one block of one thread when there is no data),
    # then 4 bytes of data + the flag in one block: 2.6's data kernel polls
    # one flag word per block while the flag buffer holds one word, so with
    # its default of 8 blocks it waits for flags no one writes (whatever the
    # library: it hangs with the data in host memory as well)
    for a in cuMemAlloc cuMemCreate; do
        for m in flag data4; do
            args=(-a "$a"); [ $m = data4 ] && args+=(-s 4 -B 1)
            run "pplat_${a}_$m" "$TMO" ./gdrcopy_pplat "${args[@]}"; rc=$?
            summary+=("gdrcopy_pplat ${args[*]}: exit $rc: $(grep -iE 'round.?trip|latency|usec|us' "$WORKDIR/pplat_${a}_$m.log" | tail -1)")
            [ $rc = 0 ] || rc_all=1
        done
    done
fi
echo "== GDRCopy $(grep -m1 -oE 'GDR_API_MINOR_VERSION[[:space:]]+[0-9]+' "$SRC/include/gdrapi.h" | awk '{print "2."$2}') tests on libgdrapi.so.2 from $LIB =="
printf '%s\n' "${summary[@]}"
exit $rc_all

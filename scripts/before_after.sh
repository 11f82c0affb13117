#!/usr/bin/env bash
# Before/after of two builds on one machine in one run: an old tree against
# this one, measured by the same programs, in interleaved rounds.
#
#   scripts/before_after.sh OLD [BACKEND]        (BACKEND: auto (default) | nvrm | sim)
#
# OLD: a directory holding the old tree (a checkout or an export of the old
# commit), or a revision of this repository's git history (exported with
# `git archive`).  It is copied to a temporary directory without its build
# outputs and built there from clean (make -C native lib tools, then the
# extension in place), so that both trees are built by this machine's
# compiler and Cython; this tree is built in place (incremental).
#
# Rows (every round runs each measurement once per tree, each in a new
# process pinned to one CPU, the trees' order alternating old,new / new,old):
#   C       native/build/gdrpy_apilat of THIS tree, which dlopens each tree's
#           libgdrpy.so.0 and libgdrapi.so.2 (--lib): gdrpy_write / gdrpy_read
#           of C_SIZES (8 B), gdr_copy_to/from_mapping, pin+map and unmap+unpin
#           of 64 KiB, gdrpy_write / gdrpy_read bandwidth of BW_SIZES
#   Python  scripts/before_after_py.py with each tree on PYTHONPATH:
#           Mapping.write/read and Transfer.put/get of PY_SIZES (8 B), and
#           ctx.pin + pin.map of 64 KiB
# The table (scripts/before_after_table.py): per row the median over rounds of
# each round's median and p99, new/old of the medians, and the median of the
# paired per-round differences (round R's new against round R's old: they
# ran back to back, so slow drift of the machine cancels).
#
# Environment (defaults in brackets):
#   ROUNDS [10]       rounds
#   CPU [a CPU near the GPU, else 0]   every measurement runs pinned there
#   C_SIZES [8]  PY_SIZES [8]  BW_SIZES [64K,1M,16M,64M]  BW_BUDGET_S [0.15]
#   APILAT_SAMPLES [1000]  PINMAP [200] (pin+map samples per process)
#   BUDGET_S [0]      if > 0: start no round that would end the run (builds
#                     included) after BUDGET_S seconds (at least 2 rounds run)
#   WORK [${TMPDIR:-/tmp}/gdrpy-before-after]   the log, the JSON and the old build
# Fixed for both trees: GDRPY_THRESHOLD_H2D/D2H=8192, GDRPY_AUTOCALIBRATE=0
# (put/get of small sizes take the mapping with no calibration), PYTHONHASHSEED=0.
# Time on a GPU machine: the old tree's build (about a minute) plus about 8 s
# per round.
set -uo pipefail
OLD_ARG=${1:?usage: $0 OLD_TREE_OR_REVISION [BACKEND]}
BACKEND=${2:-auto}
NEW=$(cd "$(dirname "$0")/.." && pwd)
WORK=${WORK:-${TMPDIR:-/tmp}/gdrpy-before-after}
ROUNDS=${ROUNDS:-10}
C_SIZES=${C_SIZES:-8}
PY_SIZES=${PY_SIZES:-8}
BW_SIZES=${BW_SIZES:-64K,1M,16M,64M}
BW_BUDGET_S=${BW_BUDGET_S:-0.15}
APILAT_SAMPLES=${APILAT_SAMPLES:-1000}
PINMAP=${PINMAP:-200}
BUDGET_S=${BUDGET_S:-0}
mkdir -p "$WORK"
log=$WORK/before_after.log
: > "$log"
jobs=$(nproc)
t_start=$(date +%s)

# ---- the old tree: copied without build outputs, built from clean ----------
OLD=$WORK/old-tree
rm -rf "$OLD" && mkdir -p "$OLD"
if [ -d "$OLD_ARG" ]; then
    tar -C "$OLD_ARG" --exclude=./.git --exclude=./native/build --exclude='./native/build-*' \
        --exclude=./build --exclude=./.ext --exclude=./.whl --exclude=./gdrpy/lib \
        --exclude=./gdrpy/bin --exclude=./gdrpy/include --exclude=./gdrpy/_core.c \
        --exclude='./gdrpy/_core*.so' --exclude='*/__pycache__' -cf - . | tar -C "$OLD" -xf - \
        || { echo "cannot copy $OLD_ARG"; exit 1; }
    old_what="directory $OLD_ARG"
elif git -C "$NEW" rev-parse -q --verify "$OLD_ARG^{commit}" >/dev/null; then
    git -C "$NEW" archive "$OLD_ARG" | tar -C "$OLD" -xf - || { echo "git archive $OLD_ARG failed"; exit 1; }
    old_what="revision $OLD_ARG ($(git -C "$NEW" rev-parse --short "$OLD_ARG^{commit}"))"
else
    echo "$OLD_ARG: neither a directory nor a revision of this repository"
    exit 2
fi
build() {  # build TREE NAME: native libraries and tools, the extension in place
    (cd "$1" && make -s -C native -j"$jobs" lib tools && python3 setup.py -q build_ext --inplace) \
        > "$WORK/build-$2.log" 2>&1 || {
        echo "build of the $2 tree ($1) failed (log: $WORK/build-$2.log)"
        tail -20 "$WORK/build-$2.log"
        exit 1
    }
}
build "$OLD" old
build "$NEW" new
for t in "$OLD" "$NEW"; do
    for f in libgdrpy.so.0 libgdrapi.so.2; do
        [ -e "$t/native/build/$f" ] || { echo "$t/native/build/$f is missing"; exit 1; }
    done
done
t_built=$(date +%s)

export GDRPY_AUTOCALIBRATE=0 GDRPY_THRESHOLD_H2D=8192 GDRPY_THRESHOLD_D2H=8192 PYTHONHASHSEED=0
# no idle BLAS threads spinning beside the measurement (numpy's OpenBLAS pool)
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
if [ -z "${CPU:-}" ]; then
    CPU=$(cd "$WORK" && PYTHONPATH="$NEW" python3 -c "import gdrpy
from gdrpy.numa import near_cpu
with gdrpy.open(0, '$BACKEND') as ctx:
    print(near_cpu(ctx))" 2>/dev/null | tail -1)
    [[ "$CPU" =~ ^[0-9]+$ ]] || CPU=0
fi
pin() { taskset -c "$CPU" "$@"; }
{
    echo "# META backend=$BACKEND"
    echo "# META rounds=$ROUNDS"
    echo "# META cpu=$CPU"
    echo "# META old=$old_what"
    echo "# META new=$NEW ($(git -C "$NEW" describe --always --dirty 2>/dev/null || echo 'no git'))"
    echo "# META cpu_model=$(grep -m1 '^model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
} >> "$log"

measure() {   # measure ROUND TREE DIR
    local r=$1 which=$2 t=$3
    echo "=== round $r $which py" >> "$log"
    (cd "$WORK" && PYTHONPATH="$t" pin timeout 120 python3 "$NEW/scripts/before_after_py.py" \
        --tree "$which" --backend "$BACKEND" --sizes "$PY_SIZES" --pinmap "$PINMAP") >> "$log" 2>&1
    echo "=== round $r $which apilat" >> "$log"
    pin timeout 120 "$NEW/native/build/gdrpy_apilat" --lib "$t/native/build" --backend "$BACKEND" \
        --sizes "$C_SIZES" --samples "$APILAT_SAMPLES" --no-open --pinmap "$PINMAP" \
        --bw "$BW_SIZES" --bw-budget "$BW_BUDGET_S" >> "$log" 2>&1
}

done_rounds=0
for r in $(seq 1 "$ROUNDS"); do
    if [ "$BUDGET_S" -gt 0 ] && [ "$done_rounds" -ge 2 ]; then
        now=$(date +%s)
        per=$(( (now - t_built) / done_rounds + 1 ))
        if [ $((now - t_start + per)) -gt "$BUDGET_S" ]; then
            echo "# META stopped=after $done_rounds of $ROUNDS rounds (BUDGET_S=$BUDGET_S, ${per} s per round)" >> "$log"
            break
        fi
    fi
    if [ $((r % 2)) = 1 ]; then order="old new"; else order="new old"; fi
    for which in $order; do
        t=$OLD; [ "$which" = new ] && t=$NEW
        measure "$r" "$which" "$t"
    done
    done_rounds=$r
done
t_end=$(date +%s)
echo "# META seconds=build $((t_built - t_start)) rounds $((t_end - t_built))" >> "$log"
echo "--- before/after ($BACKEND): old = $old_what, new = $NEW; $done_rounds rounds on CPU $CPU; log: $log"
errs=$(grep -c -iE 'error|failed|Traceback' "$log")
[ "$errs" -gt 0 ] && { echo "$errs error lines in the log:"; grep -iE 'error|failed|Traceback' "$log" | sort | uniq -c | head -10; }
python3 "$NEW/scripts/before_after_table.py" "$log" --json "$WORK/before_after.json"
rc=$?
echo "time: build $((t_built - t_start)) s, rounds $((t_end - t_built)) s"
exit $rc

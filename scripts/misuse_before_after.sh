#!/usr/bin/env bash
# Before/after on one machine in one run: an old build against this tree, for
# issue 17 (8 B / 64 B put/get within 5% of before) and issue 20 (the x86
# benchmarks unchanged, side by side).
#
#   scripts/misuse_before_after.sh OLD_TREE [BACKEND]     (BACKEND: auto | nvrm | sim)
#
# OLD_TREE: a checkout or export of the old commit (e.g. .baseline, an export of
# c20781b).  Environment (defaults in brackets):
#   ROUNDS [10]      rounds; each round runs every measurement once per tree, in
#                    alternating order (old,new / new,old / ...), each in a new
#                    process (so process-to-process variation is sampled too)
#   CPU [3]          every measurement runs pinned to this CPU (taskset)
#   BUILD_OLD [make] make: build OLD_TREE in place (make + build_ext, incremental);
#                    clean: first delete its build outputs (native/build, build/,
#                    gdrpy/_core.c, gdrpy/_core*.so) so that it is built by this
#                    machine's compiler and Cython, as this tree is; no: use as is
#   PY_SIZES [8,64]  Python rows: Mapping.write/read, Transfer.put/get
#   C_SIZES [8,64]   gdrpy_apilat rows: gdrpy_write/read, gdr_copy_to/from_mapping
#   COPYLAT_SIZES [8,64,4K,64K,1M]  each tree's gdrpy_copylat: to/from_mapping and
#                    the copy-engine rows
#   COPYLAT_ITERS [300]  APILAT_SAMPLES [1000]  PY_BLOCKS [8]
#   OPEN [1]         also once per tree: gdrpy_open while 8 threads copy (the old
#                    build blocks: reported after --open-timeout 2 s)
#   BUDGET_S [0]     if > 0: start no round that would end the run (builds included)
#                    after BUDGET_S seconds (at least 2 rounds run); the table says
#                    how many rounds it has
#   WORK [/tmp/gdrpy-gpu-run]  where the log and the JSON go
#
# Method: the same timing code for both trees (gdrpy_apilat of this tree dlopens
# each build's libgdrpy.so.0 / libgdrapi.so.2; scripts/before_after_py.py is run
# with each tree on PYTHONPATH; gdrpy_copylat is each tree's own, its timing code
# unchanged between them); fixed thresholds (GDRPY_THRESHOLD_H2D/D2H=8192,
# GDRPY_AUTOCALIBRATE=0): put/get of the sizes measured take the mapping in both
# trees with no calibration and no adaptation probes; PYTHONHASHSEED=0.  The
# table (scripts/before_after_table.py) gives per row the median of the
# per-round medians, the range of the round medians, the difference of the
# medians and the median of the paired within-round differences.
# Time on the GPU machine: roughly 5 s per round plus the builds (~15 s) and
# the open-under-load runs (~5 s).
set -uo pipefail
OLD=$(cd "${1:?usage: $0 OLD_TREE [BACKEND]}" && pwd)
BACKEND=${2:-auto}
NEW=$(cd "$(dirname "$0")/.." && pwd)
WORK=${WORK:-/tmp/gdrpy-gpu-run}
ROUNDS=${ROUNDS:-10}
CPU=${CPU:-3}
BUILD_OLD=${BUILD_OLD:-make}
PY_SIZES=${PY_SIZES:-8,64}
C_SIZES=${C_SIZES:-8,64}
COPYLAT_SIZES=${COPYLAT_SIZES:-8,64,4K,64K,1M}
COPYLAT_ITERS=${COPYLAT_ITERS:-300}
APILAT_SAMPLES=${APILAT_SAMPLES:-1000}
PY_BLOCKS=${PY_BLOCKS:-8}
OPEN=${OPEN:-1}
BUDGET_S=${BUDGET_S:-0}
mkdir -p "$WORK"
log=$WORK/before_after.log
: > "$log"
ncpu=$(nproc)
if [ "$CPU" -ge "$ncpu" ]; then CPU=$((ncpu - 1)); fi
pin() { taskset -c "$CPU" "$@"; }
t_start=$(date +%s)

if [ "$BUILD_OLD" = clean ]; then
    rm -rf "$OLD/native/build" "$OLD/build" "$OLD"/gdrpy/_core.c "$OLD"/gdrpy/_core*.so
fi
builds=("$NEW")
[ "$BUILD_OLD" != no ] && builds=("$OLD" "$NEW")
for t in "${builds[@]}"; do
    (cd "$t" && make -s -C native -j"$ncpu" all >"$WORK/build-$(basename "$t").log" 2>&1 && \
        python3 setup.py -q build_ext --inplace >>"$WORK/build-$(basename "$t").log" 2>&1) || {
        echo "build of $t failed (log: $WORK/build-$(basename "$t").log)"; tail -20 "$WORK/build-$(basename "$t").log"; exit 1; }
done
for t in "$OLD" "$NEW"; do
    for f in native/build/gdrpy_copylat native/build/libgdrpy.so.0 native/build/libgdrapi.so.2; do
        [ -e "$t/$f" ] || { echo "$t/$f is missing"; exit 1; }
    done
done
t_built=$(date +%s)

export GDRPY_AUTOCALIBRATE=0 GDRPY_THRESHOLD_H2D=8192 GDRPY_THRESHOLD_D2H=8192 PYTHONHASHSEED=0
# no idle BLAS threads spinning beside the measurement (numpy's OpenBLAS pool)
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
{
    echo "# META backend=$BACKEND"
    echo "# META rounds=$ROUNDS"
    echo "# META cpu=$CPU"
    echo "# META old=$OLD"
    echo "# META new=$NEW"
    echo "# META cpu_model=$(grep -m1 '^model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
} >> "$log"

run_tree() {   # round tree dir
    local r=$1 which=$2 t=$3
    echo "=== round $r $which py" >> "$log"
    (cd "$WORK" && PYTHONPATH="$t" pin timeout 60 python3 "$NEW/scripts/before_after_py.py" --tree "$which" \
        --backend "$BACKEND" --sizes "$PY_SIZES" --blocks "$PY_BLOCKS") >> "$log" 2>&1
    echo "=== round $r $which apilat" >> "$log"
    pin timeout 60 "$NEW/native/build/gdrpy_apilat" --lib "$t/native/build" --backend "$BACKEND" \
        --sizes "$C_SIZES" --samples "$APILAT_SAMPLES" --no-open >> "$log" 2>&1
    echo "=== round $r $which copylat" >> "$log"
    local js="$WORK/copylat-$which-$r.json"
    rm -f "$js"
    timeout 120 "$t/native/build/gdrpy_copylat" --backend "$BACKEND" --sizes "$COPYLAT_SIZES" \
        --iters "$COPYLAT_ITERS" --cpu "$CPU" --json "$js" > "$WORK/copylat-$which-$r.txt" 2>&1
    [ -s "$js" ] && echo "COPYLAT_JSON $(tr -d '\n' < "$js")" >> "$log"
}

done_rounds=0
for r in $(seq 1 "$ROUNDS"); do
    if [ "$BUDGET_S" -gt 0 ] && [ "$done_rounds" -ge 2 ]; then
        now=$(date +%s)
        per=$(( (now - t_built) / done_rounds + 1 ))
        reserve=$(( OPEN == 1 ? 8 : 2 ))
        if [ $((now - t_start + per + reserve)) -gt "$BUDGET_S" ]; then
            echo "# META stopped=after $done_rounds of $ROUNDS rounds (BUDGET_S=$BUDGET_S, ${per} s per round)" >> "$log"
            break
        fi
    fi
    if [ $((r % 2)) = 1 ]; then order="old new"; else order="new old"; fi
    for which in $order; do
        t=$OLD; [ "$which" = new ] && t=$NEW
        run_tree "$r" "$which" "$t"
    done
    done_rounds=$r
done
t_rounds=$(date +%s)
if [ "$OPEN" = 1 ]; then
    for which in old new; do
        t=$OLD; [ "$which" = new ] && t=$NEW
        echo "=== round 0 $which open" >> "$log"
        timeout 60 "$NEW/native/build/gdrpy_apilat" --lib "$t/native/build" --backend "$BACKEND" \
            --no-latency --open-timeout 2 --opens 20 >> "$log" 2>&1
    done
fi
t_end=$(date +%s)
echo "# META seconds=build $((t_built - t_start)) rounds $((t_rounds - t_built)) open $((t_end - t_rounds))" >> "$log"
echo "--- before/after ($BACKEND), $ROUNDS rounds, CPU $CPU; log: $log"
if grep -q '"tree"' "$log"; then
    grep -h '"gdrpy"' "$log" | python3 -c 'import json,sys
seen=set()
for l in sys.stdin:
    d=json.loads(l); k=(d["tree"], d["gdrpy"])
    if k not in seen: seen.add(k); print("python rows of", d["tree"], "import", d["gdrpy"], "backend", d["backend"], "paths", d.get("paths"))'
fi
errs=$(grep -c -iE 'error|failed|Traceback' "$log")
[ "$errs" -gt 0 ] && { echo "$errs error lines in the log:"; grep -iE 'error|failed|Traceback' "$log" | sort | uniq -c | head -10; }
python3 "$NEW/scripts/before_after_table.py" "$log" --json "$WORK/before_after.json"
echo "time: build $((t_built - t_start)) s, rounds $((t_rounds - t_built)) s, open-under-load $((t_end - t_rounds)) s"

#!/usr/bin/env bash
# Before/after of issue 17's locking change, in one run on one machine:
#
#   scripts/misuse_before_after.sh OLD_TREE [BACKEND]     (BACKEND: auto | nvrm | sim)
#
# OLD_TREE is a checkout of the old commit (e.g. `git worktree add /tmp/old c20781b`);
# it is built in place here (make -C native all; the Python extension in place).  Then
# in alternating rounds (old, new, old, new) it runs
#   - gdrpy_apilat (this tree's binary, which dlopens each build's libgdrpy.so.0 and
#     libgdrapi.so.2): 8 B / 64 B gdrpy_write, gdrpy_read, gdr_copy_to/from_mapping,
#     and gdrpy_open latency while 8 threads copy (old build: reported as BLOCKED
#     when an open does not return within 3 s);
#   - python -m gdrpy bench latency --sizes 8,64 with each tree on PYTHONPATH
#     (Mapping.write/read, Transfer.put/get rows);
# and prints the rows side by side at the end.
set -uo pipefail
OLD=$(cd "${1:?usage: $0 OLD_TREE [BACKEND]}" && pwd)
BACKEND=${2:-auto}
NEW=$(cd "$(dirname "$0")/.." && pwd)
WORK=${WORK:-/tmp/gdrpy-gpu-run}
mkdir -p "$WORK"
log=$WORK/misuse_before_after.log
: > "$log"
for t in "$OLD" "$NEW"; do
    (cd "$t" && make -s -C native -j"$(nproc)" all >/dev/null && \
        python3 setup.py -q build_ext --inplace >/dev/null 2>&1) || { echo "build of $t failed"; exit 1; }
done
for round in 1 2; do
    for which in old new; do
        t=$OLD; [ $which = new ] && t=$NEW
        echo "=== round $round $which: apilat" >> "$log"
        "$NEW/native/build/gdrpy_apilat" --lib "$t/native/build" --backend "$BACKEND" \
            --samples 2000 >> "$log" 2>&1
        echo "=== round $round $which: bench latency" >> "$log"
        # fixed thresholds: both trees send 8/64 B through the mapping with no
        # adaptation probes, whatever their calibrations would say
        (cd "$t" && PYTHONPATH="$t" GDRPY_CACHE_DIR="$WORK/cache-$which" \
            GDRPY_THRESHOLD_H2D=8192 GDRPY_THRESHOLD_D2H=8192 \
            python3 -m gdrpy bench latency --backend "$BACKEND" --sizes 8,64 --iters 2000 --max-time 1) \
            >> "$log" 2>&1
    done
done
echo "--- before/after ($BACKEND), full log: $log"
awk '/^=== round/ {tag=$3" "$4; sub(/:$/, "", tag)} /^(gdrpy_write|gdrpy_read|gdr_copy_to_mapping|gdr_copy_from_mapping|copy_to_mapping) / {print tag": "$0} /^open_under_load threads=8/ {print tag": "$0}' "$log"
awk '/^=== round/ {tag=$3" "$4; sub(/:$/, "", tag)} /^(8|64)( B)? +(h2d|d2h) +gdrpy (Mapping.write|Mapping.read|Transfer.put|Transfer.get) / {sub(/ \(auto\)/, ""); sub(/^(8|64) B/, "&_"); sub(/ B_/, ""); print tag": "$1, $2, $4, "median_us", $5, "p99_us", $6}' "$log"

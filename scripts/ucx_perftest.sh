#!/usr/bin/env bash
# ucx_perftest.sh - UCX's gdr_copy transport on gdrpy's libgdrapi.so.2,
# measured against UCX without it (UCX_TLS=^gdr_copy), on a GPU host, in one run.
#
#   scripts/ucx_perftest.sh [--ucx DIR] [--lib DIR] [--work DIR] [--sizes LIST]
#                           [--tests LIST] [--iters N] [--device N] [--mem TYPE]
#
#   --ucx    the folder scripts/ucx_build.sh made (default $UCX_PREFIX, else .ext/ucx)
#   --lib    folder of our libgdrapi.so.2 (default native/build)
#   --work   log folder (default ${WORK:-/tmp}/ucx-perftest)
#   --sizes  message sizes (default 1,8,64,1024,8192,65536)
#   --tests  rows, each a ucx_perftest test with an optional +variant
#            (default tag_lat,ucp_put_lat+am,ucp_put_lat+po,ucp_put_lat):
#              (none)  UCX's defaults
#              +am     UCX_PROTOS=^put/offload/zcopy,get/zcopy: puts and gets
#                      by UCX's active-message emulation (put/am/bcopy,
#                      get/am/bcopy), whose copies to and from GPU memory are
#                      memory-type copies (the only place UCX uses gdr_copy)
#              +po     UCX_PREFER_OFFLOAD=n: UCX picks between that emulation
#                      and zero-copy by its performance model
#              +eager  UCX_RNDV_THRESH=inf: tag messages of every size eager
#            (docs/ucx.md explains why ucp_put_lat needs +am or +po)
#   --iters  iterations per latency run (default 3000; bandwidth runs 1/4)
#   --mem    ucx_perftest -m type (default cuda; host checks the plumbing
#            without a GPU)
#
# Every row and size runs a server and a client ucx_perftest on this host
# (loopback, -m cuda: all buffers in GPU memory) twice, with gdr_copy (UCX's
# default transports, gdr_copy served by our libgdrapi.so.2) and with
# UCX_TLS=^gdr_copy, everything else equal.  The runs at the first size also
# set UCX_PROTO_INFO=y and UCX_PROTO_INFO_DIR (UCX selects protocols for all
# sizes at the first operation, in the warm-up): the protocol tables and, per
# measured size, the selected protocol, its lane and the transport of its
# memory-type copies (gdrpy/tools/ucx_protoinfo.py).  Printed, most important
# last: the perftest Final lines, the protocol tables and lines, one table
# (median latency usec for *_lat tests, overall MB/s otherwise, both settings
# side by side) and a check line per latency row.  Logs stay in the work folder.  Exit status 0 when every
# run with gdr_copy completed.  About 3 minutes with the defaults (H100).
set -uo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
UCX="${UCX_PREFIX:-$here/.ext/ucx}"
LIB="$here/native/build"
W="${WORK:-/tmp}/ucx-perftest"
SIZES="1,8,64,1024,8192,65536"
TESTS="tag_lat,ucp_put_lat+am,ucp_put_lat+po,ucp_put_lat"
ITERS=3000
DEV=${GDRPY_DEVICE:-0}
MEM=cuda
while [ $# -gt 0 ]; do
    case "$1" in
        --ucx) UCX=$2; shift 2 ;;
        --lib) LIB=$2; shift 2 ;;
        --work) W=$2; shift 2 ;;
        --sizes) SIZES=$2; shift 2 ;;
        --tests) TESTS=$2; shift 2 ;;
        --iters) ITERS=$2; shift 2 ;;
        --device) DEV=$2; shift 2 ;;
        --mem) MEM=$2; shift 2 ;;
        -h|--help) sed -n '2,39p' "$0"; exit 0 ;;
        *) echo "ucx_perftest.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
die() { echo "ucx_perftest.sh: $*" >&2; exit 1; }
[ -x "$UCX/bin/ucx_perftest" ] || die "no $UCX/bin/ucx_perftest: run scripts/ucx_build.sh (CPU machine) and carry .ext/ucx (or set UCX_PREFIX)"
[ -f "$LIB/libgdrapi.so.2" ] || die "no libgdrapi.so.2 in $LIB (make -C native lib)"
UCX=$(cd "$UCX" && pwd); LIB=$(cd "$LIB" && pwd)
mkdir -p "$W"; W=$(cd "$W" && pwd); rm -rf "$W"/*.log "$W"/*.txt "$W"/dot; mkdir -p "$W/dot"
export LD_LIBRARY_PATH="$LIB:$UCX/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-$DEV}
export UCX_WARN_UNUSED_ENV_VARS=n
PERF="$UCX/bin/ucx_perftest"
INFO="python3 $here/gdrpy/tools/ucx_protoinfo.py"
T0=$(date +%s)

{
    echo "== ucx_info -v"; "$UCX/bin/ucx_info" -v
    echo "== ucx_info -d (gdr_copy)"; "$UCX/bin/ucx_info" -d | grep -B2 -A12 -i "gdr_copy"
    echo "== which libgdrapi"; LD_DEBUG=libs "$UCX/bin/ucx_info" -d 2>&1 | grep -m3 "libgdrapi"
} > "$W/ucx_info.log" 2>&1
grep -q "Transport: gdr_copy" "$W/ucx_info.log" || echo "WARNING: ucx_info lists no gdr_copy transport (see $W/ucx_info.log)"

variant_env() {  # the environment of a row's +variant
    case "$1" in
        *+am) echo "UCX_PROTOS=^put/offload/zcopy,get/zcopy" ;;
        *+po) echo "UCX_PREFER_OFFLOAD=n" ;;
        *+eager) echo "UCX_RNDV_THRESH=inf" ;;
        *+*) die "unknown variant in $1 (am, po, eager)" ;;
        *) echo "" ;;
    esac
}
mode_env() { [ "$1" = nogdr ] && echo "UCX_TLS=^gdr_copy"; }

port=$((20000 + RANDOM % 20000))
# run_pair LABEL "ENV..." TEST SIZE ITERS WARMUP -> the client's Final line, or FAIL
run_pair() {
    local label=$1 envs=$2 t=$3 s=$4 n=$5 w=$6
    port=$((port + 1))
    local slog="$W/$label.server.log" clog="$W/$label.client.log" ok=1 i hexport
    # shellcheck disable=SC2086
    env $envs "$PERF" -p "$port" >"$slog" 2>&1 &
    local spid=$!
    hexport=$(printf ':%04X ' "$port")
    for i in $(seq 100); do   # wait until the server listens (state 0A = LISTEN)
        cat /proc/net/tcp /proc/net/tcp6 2>/dev/null | awk '$4 == "0A"' | grep -q "$hexport" && break
        sleep 0.05
    done
    # shellcheck disable=SC2086
    timeout 40 env $envs "$PERF" 127.0.0.1 -p "$port" -t "$t" -m "$MEM" -s "$s" -n "$n" \
        -w "$w" >"$clog" 2>&1 || ok=0
    timeout 10 tail --pid=$spid -f /dev/null 2>/dev/null || kill "$spid" 2>/dev/null
    wait "$spid" 2>/dev/null
    local fin
    fin=$(grep -E '^Final:' "$clog" | tail -1)
    [ -n "$fin" ] && [ $ok = 1 ] || { echo "FAIL"; return 1; }
    echo "$fin"
}

IFS=, read -r -a rows <<< "$TESTS"
IFS=, read -r -a sizes <<< "$SIZES"
rc=0
declare -A res
for row in "${rows[@]}"; do
    t=${row%%+*}
    venv=$(variant_env "$row") || exit 2
    for s in "${sizes[@]}"; do
        n=$ITERS
        case "$t" in *bw|ucp_get|ucp_put_bw) n=$((ITERS / 4)) ;; esac
        [ "$s" -ge 65536 ] && n=$((n / 4))
        for mode in gdr nogdr; do
            info=""
            [ "$s" = "${sizes[0]}" ] && info="UCX_PROTO_INFO=y UCX_PROTO_INFO_DIR=$W/dot/${row}_${mode}.%p"
            line=$(run_pair "${row}_${s}_${mode}" "$venv $(mode_env $mode) $info" "$t" "$s" "$n" $((n / 10 + 10)))
            echo "$(date +%T) $row $s $mode: $line" >> "$W/progress.log"
            if [ "$line" = FAIL ]; then
                [ $mode = gdr ] && rc=1
                res[$row,$s,$mode]=FAIL
                continue
            fi
            # Final: iters median avg overall bw_avg bw_overall mr_avg mr_overall
            case "$t" in
                *lat) res[$row,$s,$mode]=$(echo "$line" | awk '{printf "%.2f", $3}') ;;
                *) res[$row,$s,$mode]=$(echo "$line" | awk '{printf "%.0f", $7}') ;;
            esac
        done
    done
done

echo "== raw ucx_perftest Final lines (iterations, latency usec median/avg/overall, MB/s avg/overall, msg/s avg/overall)"
for row in "${rows[@]}"; do
    for s in "${sizes[@]}"; do
        for mode in gdr nogdr; do
            f="$W/${row}_${s}_${mode}.client.log"
            [ -f "$f" ] && printf '%-15s %6s %-5s %s\n' "$row" "$s" "$mode" \
                "$(grep -E '^Final:' "$f" | tail -1 || echo "no Final line (see $f)")"
        done
    done
done

echo "== UCX_PROTO_INFO=y tables for $MEM memory (client, gdr_copy enabled)"
for row in "${rows[@]}"; do
    echo "-- $row"
    $INFO tables "$W/${row}_${sizes[0]}_gdr.client.log" --match "$MEM" 2>&1 | cut -c1-200
done

echo "== protocol per size: selected protocol | lane | memory-type copies and their transport (UCX_PROTO_INFO_DIR graphs, both processes)"
for row in "${rows[@]}"; do
    for mode in gdr nogdr; do
        echo "-- $row $( [ $mode = gdr ] && echo gdr_copy || echo '^gdr_copy')"
        # shellcheck disable=SC2086
        $INFO dot "$W"/dot/"${row}_${mode}".* --sizes "$SIZES" --match "$MEM" 2>&1 | cut -c1-300 \
            | tee "$W/${row}_${mode}.proto.txt"
    done
done
ver=$("$UCX/bin/ucx_info" -v 2>/dev/null | grep -m1 -oE 'version: [0-9.]+' | cut -d' ' -f2)
gpu=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)
echo "== UCX $ver ucx_perftest -m $MEM, server and client on one host (loopback)${gpu:+, $gpu}; libgdrapi.so.2 from $LIB; $(( $(date +%s) - T0 )) s"
echo "   gdr_copy: UCX's default transports; ^gdr_copy: UCX_TLS=^gdr_copy; +am: $(variant_env x+am); +po: $(variant_env x+po); +eager: $(variant_env x+eager)"
printf '%-16s %8s %12s %12s %8s %6s\n' row size gdr_copy "^gdr_copy" "^gdr/gdr" unit
for row in "${rows[@]}"; do
    unit="MB/s"; case "${row%%+*}" in *lat) unit="usec";; esac
    for s in "${sizes[@]}"; do
        a=${res[$row,$s,gdr]:-?} b=${res[$row,$s,nogdr]:-?}
        r=$(awk -v a="$a" -v b="$b" 'BEGIN { if (a+0 > 0 && b+0 > 0) printf "%.1fx", b / a; else print "-" }')
        printf '%-16s %8s %12s %12s %8s %6s\n' "$row" "$s" "$a" "$b" "$r" "$unit"
    done
done

echo "== check: latency with gdr_copy < with ^gdr_copy at every size <= 1 KiB; gdr_copy named in the <= 1 KiB protocol lines"
for row in "${rows[@]}"; do
    case "${row%%+*}" in *lat) ;; *) continue ;; esac
    lower=yes
    for s in "${sizes[@]}"; do
        [ "$s" -le 1024 ] || continue
        a=${res[$row,$s,gdr]:-FAIL} b=${res[$row,$s,nogdr]:-FAIL}
        awk -v a="$a" -v b="$b" 'BEGIN { exit !(a+0 > 0 && b+0 > 0 && a+0 < b+0) }' || lower=no
    done
    named=$(awk -F'[][]' '/gdr_copy/ { n = split($2, f, ","); for (i = 1; i <= n; i++)
            { sub(/^size /, "", f[i]); if (f[i] + 0 <= 1024) { print "yes"; exit } } }' \
            "$W/${row}_gdr.proto.txt" 2>/dev/null)
    echo "$row: lower at every size <= 1 KiB: $lower; gdr_copy in the protocol lines: ${named:-no}"
done
exit $rc

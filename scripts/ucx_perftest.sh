#!/usr/bin/env bash
# ucx_perftest.sh - UCX's gdr_copy transport on gdrpy's libgdrapi.so.2,
# measured against UCX without it, on a GPU host, in one run.
#
#   scripts/ucx_perftest.sh [--ucx DIR] [--lib DIR] [--work DIR] [--sizes LIST]
#                           [--tests LIST] [--iters N] [--device N]
#
#   --ucx    the folder scripts/ucx_build.sh made (default .ext/ucx)
#   --lib    folder of our libgdrapi.so.2 (default native/build)
#   --work   log folder (default ${WORK:-/tmp}/ucx-perftest)
#   --sizes  message sizes (default 1,8,64,1024,8192,65536)
#   --tests  ucx_perftest tests (default tag_lat,ucp_put_lat,tag_bw,ucp_get)
#
# For every test and size it runs a server and a client ucx_perftest on this
# host (loopback, -m cuda: both buffers in GPU memory), once with UCX's
# default transports (gdr_copy included, served by our library) and once
# with UCX_TLS=^gdr_copy, and prints one table: median latency (usec) for
# *_lat tests, bandwidth (MB/s) for the others.  A further run per test with
# UCX_PROTO_INFO=y shows which protocol/transport carries each size (saved
# in the work folder; the lines naming gdr_copy are printed).
# Exit status 0 when every gdr_copy run completed.
set -uo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
UCX="$here/.ext/ucx"
LIB="$here/native/build"
W="${WORK:-/tmp}/ucx-perftest"
SIZES="1,8,64,1024,8192,65536"
TESTS="tag_lat,ucp_put_lat,tag_bw,ucp_get"
ITERS=20000
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
        --mem) MEM=$2; shift 2 ;;   # host: plumbing check without a GPU
        -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
        *) echo "ucx_perftest.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
die() { echo "ucx_perftest.sh: $*" >&2; exit 1; }
[ -x "$UCX/bin/ucx_perftest" ] || die "no $UCX/bin/ucx_perftest: run scripts/ucx_build.sh (CPU machine) and carry .ext/ucx"
[ -f "$LIB/libgdrapi.so.2" ] || die "no libgdrapi.so.2 in $LIB (make -C native lib)"
UCX=$(cd "$UCX" && pwd); LIB=$(cd "$LIB" && pwd)
mkdir -p "$W"; W=$(cd "$W" && pwd); rm -f "$W"/*.log
export LD_LIBRARY_PATH="$LIB:$UCX/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-$DEV}
PERF="$UCX/bin/ucx_perftest"

{
    echo "== ucx_info -v"; "$UCX/bin/ucx_info" -v
    echo "== ucx_info -d (gdr_copy)"; "$UCX/bin/ucx_info" -d | grep -B2 -A12 -i "gdr_copy"
    echo "== which libgdrapi"; LD_DEBUG=libs "$UCX/bin/ucx_info" -d 2>&1 | grep -m3 "libgdrapi"
} > "$W/ucx_info.log" 2>&1
grep -q "gdr_copy" "$W/ucx_info.log" || echo "WARNING: ucx_info lists no gdr_copy transport (see $W/ucx_info.log)"

port=$((20000 + RANDOM % 20000))
# run_pair label env-assignment test size extra... -> prints the client's Final line
run_pair() {
    local label=$1 envs=$2 t=$3 s=$4; shift 4
    port=$((port + 1))
    local slog="$W/$label.server.log" clog="$W/$label.client.log"
    env $envs "$PERF" -p "$port" >"$slog" 2>&1 &
    local spid=$!
    local ok=1 i
    local hexport
    hexport=$(printf ':%04X ' "$port")
    for i in $(seq 100); do   # wait until the server listens (state 0A = LISTEN)
        cat /proc/net/tcp /proc/net/tcp6 2>/dev/null | awk '$4 == "0A"' | grep -q "$hexport" && break
        sleep 0.05
    done
    local n=$ITERS
    case "$t" in *bw|ucp_get|ucp_put_bw) n=$((ITERS / 4)) ;; esac
    [ "$s" -ge 65536 ] && n=$((n / 4))
    timeout 120 env $envs "$PERF" 127.0.0.1 -p "$port" -t "$t" -m "$MEM" -s "$s" -n "$n" \
        -w 1000 "$@" >"$clog" 2>&1 || ok=0
    timeout 10 tail --pid=$spid -f /dev/null 2>/dev/null || kill "$spid" 2>/dev/null
    wait "$spid" 2>/dev/null
    local fin
    fin=$(grep -E '^Final:' "$clog" | tail -1)
    [ -n "$fin" ] && [ $ok = 1 ] || { echo "FAIL"; return 1; }
    echo "$fin"
}

IFS=, read -r -a tests <<< "$TESTS"
IFS=, read -r -a sizes <<< "$SIZES"
rc=0
declare -A res
for t in "${tests[@]}"; do
    for s in "${sizes[@]}"; do
        for mode in gdr nogdr; do
            envs="UCX_WARN_UNUSED_ENV_VARS=n"
            [ $mode = nogdr ] && envs="$envs UCX_TLS=^gdr_copy"
            line=$(run_pair "${t}_${s}_${mode}" "$envs" "$t" "$s")
            [ "$line" = FAIL ] && { [ $mode = gdr ] && rc=1; res[$t,$s,$mode]="FAIL"; continue; }
            # Final: iters pctile avg overall bw_avg bw_overall mr_avg mr_overall
            case "$t" in
                *lat) res[$t,$s,$mode]=$(echo "$line" | awk '{printf "%.2f", $3}') ;;
                *) res[$t,$s,$mode]=$(echo "$line" | awk '{printf "%.0f", $7}') ;;
            esac
        done
    done
    # protocol selection at a small and a large size, gdr_copy enabled
    for s in 8 65536; do
        run_pair "${t}_${s}_protoinfo" "UCX_WARN_UNUSED_ENV_VARS=n UCX_PROTO_INFO=y" "$t" "$s" >/dev/null || true
    done
done

echo "== UCX $("$UCX/bin/ucx_info" -v 2>/dev/null | grep -m1 -oE 'version: [0-9.]+' | cut -d' ' -f2) ucx_perftest -m $MEM, loopback, median latency / overall bandwidth, libgdrapi.so.2 from $LIB"
printf '%-12s %8s %14s %14s %8s\n' test size "gdr_copy" "^gdr_copy" unit
for t in "${tests[@]}"; do
    unit="MB/s"; case "$t" in *lat) unit="usec";; esac
    for s in "${sizes[@]}"; do
        printf '%-12s %8s %14s %14s %8s\n' "$t" "$s" "${res[$t,$s,gdr]:-?}" "${res[$t,$s,nogdr]:-?}" "$unit"
    done
done
echo "== raw ucx_perftest Final lines (iterations, median/avg/overall latency usec, bandwidth MB/s avg/overall, msg/s avg/overall)"
for t in "${tests[@]}"; do
    for s in "${sizes[@]}"; do
        for mode in gdr nogdr; do
            f="$W/${t}_${s}_${mode}.client.log"
            [ -f "$f" ] && printf '%-12s %6s %-6s %s\n' "$t" "$s" "$mode" "$(grep -E '^Final:' "$f" | tail -1)"
        done
    done
done
echo "== protocols with gdr_copy (UCX_PROTO_INFO=y; full tables in $W/*_protoinfo.client.log)"
for f in "$W"/*_protoinfo.client.log; do
    [ -f "$f" ] || continue
    echo "-- $(basename "$f" .client.log)"
    # each table: strip UCX's log prefix; keep the first two tables about
    # the test's buffers (memory type $MEM)
    sed -E 's/^\[[^]]*\] \[[^]]*\] +//' "$f" | awk -v mem="from $MEM memory" '
        /^\+-/ { if (keep && n) print; next }
        /^\|/ { if (index($0, mem)) { tables++; keep = tables <= 2 }
                if (keep) { print; n++ } }'
done
exit $rc

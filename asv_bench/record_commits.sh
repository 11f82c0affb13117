#!/usr/bin/env bash
# Record asv results for one or more commits, offline, without touching the
# installed gdrpy:
#
#   asv_bench/record_commits.sh [-b REGEX] REV [REV...]
#
# For each REV: check it out into a temporary git worktree, build it in place
# (setup.py build_ext --inplace: make -C native lib + the Cython extension),
# put that tree first on PYTHONPATH and run
#   asv run --python=same --set-commit-hash <hash>
# (an "existing" environment accepts no commit range, and saves results only
# with --set-commit-hash).  Extra asv options after `--` are passed through,
# e.g. `record_commits.sh main~3 main -- -b Latency`.
# Then: asv compare <hashA> <hashB>; asv publish; asv preview.
# Needs what an in-place build needs: a C compiler, make, Cython, setuptools.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(git -C "$here" rev-parse --show-toplevel)
revs=()
while [ $# -gt 0 ]; do
    case "$1" in
        --) shift; break ;;
        *) revs+=("$1"); shift ;;
    esac
done
[ ${#revs[@]} -gt 0 ] || { sed -n '2,16p' "$0"; exit 2; }
py=${PYTHON:-python3}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/gdrpy-asv.XXXXXX")
cleanup() {
    for wt in "$tmp"/wt-*; do
        [ -d "$wt" ] && git -C "$repo" worktree remove --force "$wt" >/dev/null 2>&1
    done
    rm -rf "$tmp"
}
trap cleanup EXIT
status=0
for rev in "${revs[@]}"; do
    hash=$(git -C "$repo" rev-parse --verify "$rev^{commit}")
    wt="$tmp/wt-$hash"
    echo "=== $rev ($hash): building in $wt"
    git -C "$repo" worktree add --detach "$wt" "$hash" >/dev/null
    if ! (cd "$wt" && "$py" setup.py build_ext --inplace >"$tmp/build-$hash.log" 2>&1); then
        echo "build of $rev failed:"; tail -n 20 "$tmp/build-$hash.log"; status=1; continue
    fi
    echo "=== $rev ($hash): asv run"
    (cd "$here" && PYTHONPATH="$wt${PYTHONPATH:+:$PYTHONPATH}" \
        asv run --python=same --set-commit-hash "$hash" "$@") || status=1
    git -C "$repo" worktree remove --force "$wt" >/dev/null 2>&1 || true
done
exit $status

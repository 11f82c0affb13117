#!/usr/bin/env bash
# Linters (ruff, mypy, cython-lint, clang-format): scripts/lint.sh.
set -euo pipefail
bash scripts/lint.sh

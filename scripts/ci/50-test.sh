#!/usr/bin/env bash
# Exactly the README's test command.
set -euo pipefail
python3 -m pytest

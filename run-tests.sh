#!/usr/bin/env bash
# Command 2: set up (first run) and run the whole test suite, slow end-to-end tests included.
# Extra arguments go to pytest (e.g. -m "not slow" for a quick pass, -k NAME).
set -euo pipefail
cd "$(dirname "$0")"
source scripts/bootstrap.sh test
scripts/lint.sh  # ruff + mypy (strict on app/backend), pyproject.toml
exec python -m pytest "$@"

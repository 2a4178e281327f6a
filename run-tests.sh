#!/usr/bin/env bash
# Command 2: set up (first run) and run the whole test suite, slow end-to-end tests included.
# Extra arguments go to pytest (e.g. -m "not slow" for a quick pass, -k NAME).
set -euo pipefail
cd "$(dirname "$0")"
source scripts/bootstrap.sh test
scripts/lint.sh  # ruff + mypy (strict on app/backend), pyproject.toml
# Worker processes (pytest-xdist): the tests mostly wait on browsers, containers and servers, so 3 of them
# share two cores well (4 made Docker answer slowly enough to fail waits: README "Tests, CI and benchmarks").
# `--dist loadfile`: each test file runs on one worker, its module-scoped fixtures set up once (tests/conftest.py says why not loadgroup, and why the workers' temp dirs are short).
# A later `-n 0` in the arguments runs everything in this process (for --pdb, or to read -s output live).
exec python -m pytest -n 3 --dist loadfile "$@"

#!/usr/bin/env bash
# Lint and type-check (configured in pyproject.toml): ruff over app/, tests/ and bench/; mypy over app/
# (strict on app/backend). Run by ./run-tests.sh before pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
ruff check --quiet app tests bench
mypy

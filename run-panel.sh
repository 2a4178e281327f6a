#!/usr/bin/env bash
# Command 1: set up (first run) and start the panel. Extra arguments go to `moet-panel serve`.
set -euo pipefail
cd "$(dirname "$0")"
source scripts/bootstrap.sh panel
exec moet-panel serve "$@"

"""One box of the Fleet tab's browser test (tests/fleet/test_fleet_tab_browser.py): `moet-panel ARGS` with the
engine on the process runtime, as a box without Docker runs it (runtime/choice.select_runtime would take this
machine's Docker; the SIMULATED engines are then processes of this run, and two boxes' engines never share a
container name). Everything else is the panel as shipped: its page, its /metrics, its gateway process.

    python -m tests.fleet.panelbox serve --demo --recipe FILE --data-dir DIR --port PORT
"""

from __future__ import annotations

import sys

from app.backend.engine.runtime import choice
from app.backend.engine.runtime.process import ProcessRuntime


def main() -> int:
    choice.select_runtime = lambda settings, allow_process=True: (  # type: ignore[assignment]
        ProcessRuntime(settings.state_dir), "")
    from app.cli.main import main as cli

    return cli(sys.argv[1:])


if __name__ == "__main__":
    raise SystemExit(main())

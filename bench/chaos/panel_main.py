"""`moet-panel` (app/cli/main.py) for the chaos soak's panel process, with the restart cap's window shortened
(and, for the CI form, the restart backoff scaled down with it).

The soak injects a fault every few seconds; the panel's cap (3 restarts in 15 min, docs/engine.md "Keeps
serving") exists for crash loops, and 200 unrelated faults in an hour would trip it on the third kill. The
soak's panel therefore counts restarts over MOET_CHAOS_RESTART_WINDOW_S seconds (the cap itself has its own
tests: tests/engine/test_restartpolicy.py). MOET_CHAOS_RESTART_BACKOFF_S, when set, is the first restart's
delay (the panel's 5 s by default): the short CI form scales it down with the faults' lengths, each fault
still outlasting it (bench/chaos/run.py `short_form`); the long soak leaves it alone. Nothing else changes: the
policy, the doubling, the classes are the panel's. The values are set on every ControllerOptions made in this
process, wherever the class lives.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any


def shorten_restart_window(window_s: float, backoff_s: float | None = None) -> list[str]:
    """Patch ControllerOptions so that every instance gets `restart_window_s = window_s` (and `restart_backoff_s =
    backoff_s` when given); returns the modules patched (empty: not found, the soak says so in its report)."""
    patched = []
    for mod_name in ("app.backend.engine.lifecycle.tickets", "app.backend.engine.options", "app.backend.engine.controller"):
        try:
            mod = importlib.import_module(mod_name)
        except ImportError:
            continue
        cls = getattr(mod, "ControllerOptions", None)
        if cls is None or getattr(cls, "_chaos_patched", False) or not hasattr(cls, "restart_window_s") \
                or (backoff_s is not None and not hasattr(cls, "restart_backoff_s")):
            continue
        original = cls.__init__

        def init(self: Any, *args: Any, _orig: Any = original, **kwargs: Any) -> None:
            _orig(self, *args, **kwargs)
            self.restart_window_s = window_s
            if backoff_s is not None:
                self.restart_backoff_s = backoff_s

        cls.__init__ = init
        cls._chaos_patched = True
        patched.append(mod_name)
    return patched


def main() -> int:
    window = os.environ.get("MOET_CHAOS_RESTART_WINDOW_S")
    backoff = os.environ.get("MOET_CHAOS_RESTART_BACKOFF_S")
    if window:
        done = shorten_restart_window(float(window), float(backoff) if backoff else None)
        print(f"chaos: restart window {window} s, backoff {backoff or 'the panel default'} s "
              f"({', '.join(done) or 'NOT APPLIED: ControllerOptions not found'})", file=sys.stderr, flush=True)
    from app.cli.main import main as panel_main

    return int(panel_main() or 0)


if __name__ == "__main__":
    raise SystemExit(main())

"""The SIMULATED box's GPU count, remembered by its data dir (issue 49: `MOET_PANEL_SIM_GPUS=2 moet-panel serve --demo`
showed two GPUs, but a `moet-panel engine status --demo` in another shell showed one unless the variable was
exported there too). Set: used, and written beside the data dir's state; not set: what the data dir remembers;
never set: one GPU. docs/engine.md "Several GPUs"."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from app.backend import oplog
from app.backend.config import env
from app.backend.files.jsonstore import JsonStore

FILE = "demo-box.json"


@dataclass(frozen=True)
class SimBox:
    gpus: int


def sim_gpu_count(state_dir: Path | None) -> int:
    """MOET_PANEL_SIM_GPUS when set (remembered in `state_dir`), else the remembered count, else 1."""
    given = env.sim_gpus_given()
    store = JsonStore(state_dir / FILE, SimBox, mode=0o644) if state_dir is not None else None
    if given is not None:
        if store is not None and (store.read() or SimBox(0)).gpus != given:
            try:
                store.write(SimBox(given))
            except OSError as exc:  # a read-only data dir: the variable still counts, it is only not remembered
                oplog.caught("config", exc, f"remembering {env.SIM_GPUS}={given} in the data dir")
        return given
    kept = store.read() if store is not None else None
    return kept.gpus if kept is not None and 1 <= kept.gpus <= env.SIM_GPUS_MAX else 1

"""The small primitives are written once (issue 34): a file lock and an atomic write (app/backend/files/atomic.py),
GiB (app/backend/contracts.py), the docker-py image build (app/backend/engine/builds/image.py), demo mode
(`Settings.demo`) and the single-flight job runner with its stop signal (app/backend/jobs.py). A grep, so a
second copy is caught where it is written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from app.backend.recipe import SIMULATED_RECIPE, load_recipe
from app.backend.config.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
APP = ROOT / "app"
BACKEND = APP / "backend"
# The SIMULATED engine runs in its own container with only its own package (simengine/image.py): it cannot
# import the backend's primitives. Extraction lands each streamed file with its own durability threads.
SIMENGINE = BACKEND / "simengine"

ONCE = {
    # a lock, not any fcntl call: the gateway reads a socket's unacknowledged bytes with fcntl.ioctl (delivery.py)
    "file lock (fcntl)": (re.compile(r"\bfcntl\.(flock|lockf)\(|^\s*from fcntl import .*\b(flock|lockf)\b"),
                          {BACKEND / "files" / "atomic.py"}),
    "atomic replace": (re.compile(r"\bos\.replace\("), {BACKEND / "files" / "atomic.py", BACKEND / "download" / "extract.py"}),
    "GiB constant": (re.compile(r"2 ?\*\* ?30\b|1 << 30\b|1024 \*\* 3\b|\b1073741824\b"), {BACKEND / "contracts.py"}),
    "docker-py build": (re.compile(r"\.api\.build\(|\bapi\.build\("), {BACKEND / "engine" / "builds" / "image.py"}),
    "demo switch": (re.compile(r"simulated or [\w.]*demo\b|\bdemo or [\w.]*simulated\b"), set()),
    # the single-flight job runner (jobs.SingleFlight: the self-test, the A/B, the downloads) and its stop
    "stop signal": (re.compile(r"\(threading\.Event\)"), {BACKEND / "jobs.py"}),
    # a thread's liveness as "a job runs" is the runner's; the others watch threads that are not jobs: the
    # gateway's server, the engine's reconciler and observer (reconciler.wait_reply), a decoder thread, the CLI's
    # foreground download, a download run's fetch and verify threads still alive after their join (job.py:
    # reported, their fds left open: docs/downloads.md "File descriptors")
    "single-flight runner": (re.compile(r"\bis_alive\(\)"), {
        BACKEND / "jobs.py", BACKEND / "gateway" / "server.py", BACKEND / "engine" / "control" / "reconciler.py",
        BACKEND / "download" / "extract.py", BACKEND / "download" / "job.py", APP / "cli" / "download.py"}),
}


@pytest.mark.parametrize("what", sorted(ONCE))
def test_written_once(what: str) -> None:
    pattern, allowed = ONCE[what]
    offenders = []
    for path in sorted(APP.rglob("*.py")):
        if path in allowed or SIMENGINE in path.parents:
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if pattern.search(line):
                offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not offenders, f"one {what} only ({', '.join(str(p.relative_to(ROOT)) for p in allowed) or 'none'}):\n" \
        + "\n".join(offenders)


def test_the_simulated_recipe_is_demo_mode_however_settings_are_built(tmp_path: Path) -> None:
    assert Settings(SIMULATED_RECIPE, load_recipe(SIMULATED_RECIPE), tmp_path, demo=False).demo

"""Resume across kill -9 (real CLI subprocess) and a full disk (real tmpfs): nothing verified is
downloaded again, complete files are not rewritten, and the tree ends byte-identical."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from app.backend.download.progress import ProgressBoard
from app.backend.download.runner import run_download
from app.backend.download.types import ArtifactState, SpaceError
from app.backend.recipe.schema import ArtifactSpec
from app.backend.simhub.artifacts import file_digest_tree

from .conftest import KNOWN_TOKEN, PREFIX, fast_config, start_hub

ROOT = Path(__file__).resolve().parents[2]


def journal_of(dest: Path) -> dict | None:
    try:
        return json.loads((dest / ".moet-panel/downloads/planescache.json").read_text())
    except (OSError, ValueError):
        return None


def cli(dest: Path, endpoint: str, env: dict, **popen) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "app.cli.main", "download", "--recipe", "assets/recipes/simulated.toml",
           "--dest", str(dest), "--endpoint", endpoint, "--connections", "2", "--segment-mib", "1"]
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **popen)


@pytest.mark.slow
def test_kill_9_then_rerun(artifact, tmp_path):
    env = {**os.environ, "HF_TOKEN": KNOWN_TOKEN}
    dest = tmp_path / "dest"
    hub = start_hub(artifact, token=KNOWN_TOKEN, rate_cap_bps=200_000)  # slow enough to kill mid-run
    try:
        proc = cli(dest, hub.endpoint, env)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            j = journal_of(dest)
            busy = j and sum(p["status"] != "pending" for p in j["parts"])
            if j and (len(j["files_done"]) >= 1 or busy >= 3) and 2 <= busy < len(j["parts"]):
                break
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.02)
        else:
            pytest.fail("the download never got far enough to be killed mid-run")
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        before = journal_of(dest)
        verified = [p["name"] for p in before["parts"] if p["status"] in ("verified", "consumed")]
        assert verified and len(verified) < len(before["parts"]), "killed mid-run"
        inodes = {n: os.stat(dest / n).st_ino for n in before["files_done"] if (dest / n).is_file()}
        served = {p: hub.stats.cdn_bytes[p] for p in verified}
        hub.rate_cap_bps = None
        rerun = cli(dest, hub.endpoint, env)
        out, errs = rerun.communicate(timeout=60)
        assert rerun.returncode == 0, errs.decode()
        for p in verified:
            assert hub.stats.cdn_bytes[p] == served[p], f"verified part {p} was downloaded again"
        for name, ino in inodes.items():
            assert os.stat(dest / name).st_ino == ino, f"complete file {name} was rewritten"
        assert file_digest_tree(dest) == artifact.reference
        assert not list(dest.rglob("*.moet-partial"))
        text = out.decode() + errs.decode() + (dest / ".moet-panel/downloads/planescache.json").read_text()
        assert KNOWN_TOKEN not in text
        assert "skipped" in errs.decode() or "already complete" in errs.decode()
    finally:
        hub.stop()


@pytest.fixture
def tmpfs(small_tmpfs):
    subprocess.run(["mount", "-o", "remount,size=6m", str(small_tmpfs)], check=True)
    return small_tmpfs


def test_disk_full_pauses_then_resumes_after_space_is_freed(settings, artifact, tmpfs):
    # Recipe sizes would be refused by the preflight; pretend the artifact is tiny to reach a real ENOSPC.
    tiny = [ArtifactSpec(id="planescache", prefix=PREFIX, yields="planescache", extracted_gib=0.0001,
                         contents="test")]
    hub = start_hub(artifact)
    dest = tmpfs / "dest"
    try:
        board = ProgressBoard()
        cfg = fast_config(settings, hub.endpoint, dest)
        with pytest.raises(SpaceError) as err:
            run_download(cfg, tiny, board, threading.Event())
        assert "Resume" in str(err.value)
        [a] = board.snapshot()
        assert a.state == ArtifactState.PAUSED and "Resume" in a.reason
        j = journal_of(dest)
        assert j["state"] == "paused"
        for name, size in j["files_done"].items():  # nothing half-written is marked complete
            assert (dest / name).stat().st_size == size
        subprocess.run(["mount", "-o", "remount,size=64m", str(tmpfs)], check=True)
        board = ProgressBoard()
        run_download(cfg, tiny, board, threading.Event())
        assert board.snapshot()[0].state == ArtifactState.DONE
        assert file_digest_tree(dest) == artifact.reference
    finally:
        hub.stop()

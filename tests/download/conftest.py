"""Download-area fixtures: a small real artifact (GNU tar --sparse | zstd | split), its reference
extraction by the real `tar -x --sparse`, and a fresh SIMULATED hub per test with fault injection."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from app.backend.download.config import make_config
from app.backend.download.progress import ProgressBoard
from app.backend.download.runner import run_download
from app.backend.download.types import DownloadConfig
from app.backend.recipe import SIMULATED_RECIPE
from app.backend.config.settings import Settings, resolve_settings
from app.backend.simhub.artifacts import TreeSpec, build_artifact, file_digest_tree, generate_tree, reference_extract
from app.backend.simhub.server import SimHub

from .fdcheck import FdReport, fd_ownership

PREFIX = "planescache.tar.zst.part."
PART_SIZE = 512 * 1024
KNOWN_TOKEN = "hf_KnownSecretToken1234567890abcdef"


@dataclass(frozen=True)
class Artifact:
    repo_dir: Path
    parts: list[Path]
    reference: dict[str, tuple[str, int]]
    ref_root: Path
    files: dict[str, Path]


@pytest.fixture(scope="session")
def artifact() -> Iterator[Artifact]:
    tmp = Path(tempfile.mkdtemp(prefix="moet-dl-art-"))
    try:
        settings = resolve_settings(SIMULATED_RECIPE, tmp / "unused", demo=True)
        spec = TreeSpec(top="planescache", layers=4, file_size=256 * 1024, sparse_size=32 << 20,
                        ckpt_id=settings.recipe.model.ckpt_id, seed=1)
        generate_tree(tmp / "src", spec)
        parts = build_artifact(tmp / "src", "planescache", tmp / "repo", PREFIX, PART_SIZE)
        reference_extract(parts, tmp / "ref")
        files = {p.name: p for p in parts}
        (tmp / "repo" / "README.md").write_text("SIMULATED\n")
        files["README.md"] = tmp / "repo" / "README.md"
        yield Artifact(tmp / "repo", parts, file_digest_tree(tmp / "ref"), tmp / "ref", files)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return resolve_settings(SIMULATED_RECIPE, tmp_path / "data", demo=True)


def start_hub(artifact: Artifact, **kw) -> SimHub:
    hub = SimHub(**kw)
    hub.add_repo("moet-panel/simulated-cache", artifact.files)
    return hub.start()


@pytest.fixture
def hub(artifact: Artifact) -> Iterator[SimHub]:
    h = start_hub(artifact, page_size=2)
    try:
        yield h
    finally:
        h.stop()


@pytest.fixture
def private_hub(artifact: Artifact) -> Iterator[SimHub]:
    """The artifact's repo behind a token (KNOWN_TOKEN): a private repository."""
    h = start_hub(artifact, token=KNOWN_TOKEN)
    try:
        yield h
    finally:
        h.stop()


def fast_config(settings: Settings, endpoint: str, dest: Path, **kw) -> DownloadConfig:
    """Small segments, a 0.5 s stall watchdog and millisecond backoff: fault tests stay fast."""
    base = make_config(settings, endpoint=endpoint, dest=dest)
    defaults: dict[str, Any] = dict(segment_size=128 * 1024, connections=4, stall_s=0.5, backoff_base_s=0.01,
                                    backoff_max_s=0.05, reserve_bytes=0)
    defaults.update(kw)
    return replace(base, **defaults)


@pytest.fixture(autouse=True)
def _isolated_token_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No real token (env, HF file, panel file) leaks into or out of these tests."""
    from huggingface_hub import constants

    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_ENDPOINT", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("HF_TOKEN_PATH", str(tmp_path / "hf" / "token"))
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "hf" / "token"))  # read at import by the library


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A real 5 MiB tmpfs (a full disk on demand: ENOSPC); tests grow it with `mount -o remount,size=`."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=5m", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def run(settings: Settings, endpoint: str, dest: Path, board: ProgressBoard | None = None, **kw: Any) -> ProgressBoard:
    """Download every artifact of the recipe with fast_config; returns the board (raises what the run raises)."""
    board = board or ProgressBoard()
    run_download(fast_config(settings, endpoint, dest, **kw), list(settings.recipe.artifacts), board,
                 threading.Event())
    return board


@pytest.fixture
def fd_check() -> Iterator[FdReport]:
    """The test runs under the fd-ownership check (fdcheck.py): it fails at teardown on a close by a thread
    that does not own the fd, a use of another thread's fd, any EBADF, or an fd left open."""
    with fd_ownership() as report:
        yield report

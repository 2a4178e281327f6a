"""Build the SIMULATED engine's Docker image without any registry: FROM scratch + a rootfs tarball.

The rootfs holds the host's Debian CPython (`/usr/bin/python3.11`), the shared libraries `ldd` lists for
it and for its stdlib extension modules, the stdlib minus tests/GUI/packaging bits, and this package
under /opt/simengine. Host-side only (docker-py is imported lazily); never imported by the server.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import subprocess
import tarfile
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable

if TYPE_CHECKING:  # docker-py is imported where used (the package itself is stdlib only)
    from docker import DockerClient

from app.backend.engine.builds.image import docker_py_build

# :2 — the engine takes --uds (issue 40): a panel that passes it must never start an older :1 left on the host,
# which would ignore it, listen on TCP and never be reached (the tag, not only the hash label, says so)
IMAGE_TAG = "moet-panel/sim-engine:2"
HASH_LABEL = "moet-panel.sim-hash"
BUILDER_VERSION = "2"  # 2: no MOET_SIM_HOST=0.0.0.0 (loopback by default, issue 31); bump when the rootfs layout changes
PYTHON = Path("/usr/bin/python3.11")
STDLIB = Path("/usr/lib/python3.11")
STDLIB_SKIP = {"test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3", "pydoc_data", "site-packages",
               "dist-packages", "unittest", "venv", "distutils", "config-3.11-x86_64-linux-gnu", "sqlite3", "curses",
               "dbm"}
PACKAGE_DIR = Path(__file__).resolve().parent
HOST_ONLY = {"image.py"}  # never copied into the image

DOCKERFILE = """FROM scratch
ADD rootfs.tar /
ENV PYTHONPATH=/opt/simengine PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 LANG=C.UTF-8
LABEL moet-panel.simulated="1" {hash_label}="{digest}" org.opencontainers.image.title="moet-panel SIMULATED vLLM-Moet engine"
STOPSIGNAL SIGTERM
{variant_env}ENTRYPOINT ["/usr/bin/python3.11", "-m", "simengine"]
CMD ["--port", "8000"]
"""


class ImageBuildError(RuntimeError):
    """The image could not be built; the message says why and what to do."""


def _package_files() -> list[Path]:
    return sorted(p for p in PACKAGE_DIR.glob("*.py") if p.name not in HOST_ONLY)


def source_digest() -> str:
    """Content hash of everything that goes into the image (cache key, stored as a label)."""
    h = hashlib.sha256(f"builder {BUILDER_VERSION}\0".encode())
    for p in _package_files():
        h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    st = PYTHON.stat() if PYTHON.exists() else None
    h.update(f"{st.st_size if st else 0}:{int(st.st_mtime) if st else 0}".encode())
    return h.hexdigest()[:24]


def _ldd(paths: Iterable[Path]) -> set[Path]:
    libs: set[Path] = set()
    for path in paths:
        try:
            out = subprocess.run(["ldd", str(path)], capture_output=True, text=True, timeout=30).stdout
        except (OSError, subprocess.SubprocessError) as exc:
            raise ImageBuildError(f"ldd failed on {path}: {exc}. Is the host's Debian libc-bin installed?") from exc
        for m in re.finditer(r"(/\S+) \(0x", out):
            libs.add(Path(m.group(1)))
    return libs


def _add_file(tar: tarfile.TarFile, src: Path, arcname: str, mode: int | None = None) -> None:
    real = src.resolve()
    if not real.is_file():
        return  # dangling symlink (e.g. Debian's sitecustomize.py -> /etc): skip
    info = tar.gettarinfo(str(real), arcname=arcname.lstrip("/"))
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    if mode is not None:
        info.mode = mode
    with open(real, "rb") as fh:
        tar.addfile(info, fh)


def _add_dir(tar: tarfile.TarFile, arcname: str) -> None:
    info = tarfile.TarInfo(arcname.lstrip("/"))
    info.type, info.mode = tarfile.DIRTYPE, 0o1777 if arcname == "/tmp" else 0o755
    tar.addfile(info)


def _stdlib_files() -> Iterable[Path]:
    for root, dirs, files in os.walk(STDLIB):
        rel = Path(root).relative_to(STDLIB)
        dirs[:] = [d for d in dirs if not (rel == Path(".") and d in STDLIB_SKIP) and d != "tests"]
        for name in files:
            yield Path(root) / name


def build_rootfs(dest: Path) -> None:
    """Write rootfs.tar: python + libs + stdlib + the simengine package."""
    if not PYTHON.exists():
        raise ImageBuildError(f"{PYTHON} not found: the image is built from the host's Debian Python 3.11 "
                              "(apt-get install python3.11)")
    stdlib = list(_stdlib_files())
    extensions = [p for p in stdlib if p.suffix == ".so"]
    libs = _ldd([PYTHON, *extensions])
    with tarfile.open(dest, "w") as tar:
        for d in ("/tmp", "/opt", "/opt/simengine", "/etc"):
            _add_dir(tar, d)
        _add_file(tar, PYTHON, "/usr/bin/python3.11", 0o755)
        link = tarfile.TarInfo("usr/bin/python3")
        link.type, link.linkname = tarfile.SYMTYPE, "python3.11"
        tar.addfile(link)
        for lib in sorted(libs):
            _add_file(tar, lib, str(lib), 0o755)
        for path in stdlib:
            _add_file(tar, path, str(path))
        passwd = b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/sh\n"
        info = tarfile.TarInfo("etc/passwd")
        info.size = len(passwd)
        tar.addfile(info, io.BytesIO(passwd))
        for p in _package_files():
            _add_file(tar, p, f"/opt/simengine/simengine/{p.name}")


def variant_digest(variant: str = "") -> str:
    """The source hash plus the SIMULATED build variant baked into the image (engine/builds/job.py)."""
    return source_digest() + (f"-{variant}" if variant else "")


def image_is_current(client: DockerClient, tag: str = IMAGE_TAG, variant: str = "") -> bool:
    import docker.errors

    try:
        image = client.images.get(tag)
    except docker.errors.ImageNotFound:
        return False
    return (image.labels or {}).get(HASH_LABEL) == variant_digest(variant)


def content_tag() -> str:
    """A tag naming this exact source (`moet-panel/sim-engine:src-<hash>`): tests that need a feature of this
    checkout's simulated engine use it, so a concurrent rebuild of the shared `:1` tag from another checkout
    cannot swap the image under them."""
    return f"{IMAGE_TAG.rsplit(':', 1)[0]}:src-{source_digest()}"


def ensure_image(client: DockerClient | None = None, rebuild: bool = False,
                 progress: Callable[[str], None] | None = None, tag: str = IMAGE_TAG, variant: str = "") -> str:
    """Build `tag` (default `moet-panel/sim-engine:2`) unless it exists with the same source hash. Returns it.
    `variant`: a SIMULATED build variant (MOET_SIM_BUILD baked in; config.BUILD_VARIANTS), built at low priority."""
    import docker

    client = client or docker.from_env()
    if not rebuild and image_is_current(client, tag, variant):
        return tag
    digest = variant_digest(variant)
    env = f"ENV MOET_SIM_BUILD={variant}\nLABEL moet-panel.build=\"{variant}\"\n" if variant else ""
    with tempfile.TemporaryDirectory(prefix="moet-sim-image-") as tmp:
        build_rootfs(Path(tmp) / "rootfs.tar")
        (Path(tmp) / "Dockerfile").write_text(DOCKERFILE.format(hash_label=HASH_LABEL, digest=digest, variant_env=env))
        built = docker_py_build(client.api, Path(tmp), "Dockerfile", tag,
                                lambda ev: progress(ev.line) if progress else None, low_priority=bool(variant))
    if not built.ok:
        raise ImageBuildError(f"{tag}: {built.message}")
    if not image_is_current(client, tag, variant):
        raise ImageBuildError(f"docker build reported success but {tag} is missing or has a stale label")
    return tag

"""The real-vLLM tier's engine image, built without any registry (docs/real-engine.md#pieces, "The image").

`FROM scratch` + a small rootfs: the host's Debian CPython (/usr/bin/python3.11) with its stdlib and the
shared libraries `ldd` lists for it, its stdlib extensions and every extension module in the vLLM
virtualenv (libstdc++, libgomp, …), an /etc/passwd and a writable /tmp. The virtualenv itself (~6 GB,
cached outside the clone) and the model are bind-mounted read-only by the recipe, so the image stays
tens of MB and is rebuilt only when its inputs change. The rootfs helpers are the simulated engine's
(app/backend/simengine/image.py), so both images are made the same way.
"""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
import tempfile
from pathlib import Path
from typing import Any

from app.backend.engine.builds.image import docker_py_build
from app.backend.simengine.image import PYTHON, STDLIB, _add_dir, _add_file, _ldd

TAG = "moet-panel/vllm-cpu-tiny:1"  # = assets/recipes/vllm-cpu-tiny.toml engine.image
HASH_LABEL = "moet-panel.vllm-image-hash"
VENV_TARGET = "/opt/vllm-venv"  # = the recipe's mount target for the virtualenv
DOCKERFILE = """FROM scratch
ADD rootfs.tar /
ENV PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 LANG=C.UTF-8 HOME=/tmp PATH=/opt/vllm-venv/bin:/usr/bin
LABEL {hash_label}="{digest}" org.opencontainers.image.title="upstream vLLM (vllm-cpu) for moet-panel's real-engine tests"
STOPSIGNAL SIGTERM
ENTRYPOINT ["/opt/vllm-venv/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
"""


# Unlike the simulated engine's image, vLLM and torch import much of the stdlib (unittest.mock, sqlite3,
# venv, …): only tests, GUI and the (empty) package dirs are left out.
STDLIB_SKIP = {"test", "idlelib", "tkinter", "turtledemo", "lib2to3", "site-packages", "dist-packages"}


def _stdlib_files() -> list[Path]:
    out: list[Path] = []
    for root, dirs, files in os.walk(STDLIB):
        top = Path(root) == STDLIB
        dirs[:] = [d for d in dirs if not (top and d in STDLIB_SKIP) and d not in ("tests", "__pycache__")]
        out += [Path(root) / n for n in files]
    return out


# vLLM's CPU worker runs `lscpu -J …` through `/bin/sh` (vllm/utils/cpu_resource_utils.py) to find its cores;
# without them the worker dies with "No such file or directory: '/bin/sh'".
TOOLS = (Path("/bin/sh"), Path("/usr/bin/lscpu"))


def _venv_extensions(venv: Path) -> list[Path]:
    return sorted(Path(root) / n for root, _, files in os.walk(venv / "lib")
                  for n in files if n.endswith(".so") or ".so." in n)


def _host_libs(venv: Path) -> set[Path]:
    """Libraries outside the venv that the interpreter and the venv's extensions link against."""
    stdlib_ext = [p for p in _stdlib_files() if p.suffix == ".so"]
    libs = _ldd([PYTHON, *(t.resolve() for t in TOOLS), *stdlib_ext, *_venv_extensions(venv)])
    root = str(venv.resolve())
    return {p for p in libs if not str(p.resolve()).startswith(root)}


def digest(venv: Path) -> str:
    h = hashlib.sha256(DOCKERFILE.encode() + str(PYTHON.stat().st_mtime).encode() + repr(TOOLS).encode())
    h.update(((venv / ".complete").read_bytes() if (venv / ".complete").exists() else b"") + str(venv).encode())
    return h.hexdigest()[:24]


def ensure_image(client: Any, venv: Path) -> str:
    """Build TAG unless an image with the same inputs exists; returns the tag."""
    import docker.errors

    want = digest(venv)
    try:
        if (client.images.get(TAG).labels or {}).get(HASH_LABEL) == want:
            return TAG
    except docker.errors.ImageNotFound:
        pass
    with tempfile.TemporaryDirectory(prefix="moet-vllm-image-") as tmp:
        with tarfile.open(Path(tmp) / "rootfs.tar", "w") as tar:
            for d in ("/tmp", "/opt", VENV_TARGET, "/model", "/etc", "/dev", "/proc", "/sys"):
                _add_dir(tar, d)
            _add_file(tar, PYTHON, str(PYTHON), 0o755)
            link = tarfile.TarInfo("usr/bin/python3")
            link.type, link.linkname = tarfile.SYMTYPE, "python3.11"
            tar.addfile(link)
            for tool in TOOLS:
                _add_file(tar, tool, str(tool), 0o755)
            for lib in sorted(_host_libs(venv)):
                _add_file(tar, lib, str(lib), 0o755)
            for path in _stdlib_files():
                _add_file(tar, path, str(path))
            passwd = b"root:x:0:0:root:/tmp:/bin/sh\n"
            info = tarfile.TarInfo("etc/passwd")
            info.size = len(passwd)
            tar.addfile(info, io.BytesIO(passwd))
        (Path(tmp) / "Dockerfile").write_text(DOCKERFILE.format(hash_label=HASH_LABEL, digest=want))
        built = docker_py_build(client.api, Path(tmp), "Dockerfile", TAG, lambda ev: None)
        if not built.ok:
            raise RuntimeError(f"{TAG}: {built.message}")
    return TAG

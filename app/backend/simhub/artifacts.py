"""Build real chunked artifacts the way the card's publisher did: GNU `tar --sparse` | `zstd` | `split`.

Also builds the engine's planescache layout (meta.json + layer files; docs/simengine.md) and hostile archives
(path traversal, absolute paths, escaping links, device nodes, setuid) for the extractor's tests.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

QUANTIZER_ABI = "tsym4-e8m0-fragmajor-a32-v2"


@dataclass(frozen=True)
class TreeSpec:
    top: str = "planescache"
    layers: int = 3
    file_size: int = 256 * 1024  # per layer part file
    sparse_size: int = 32 << 20  # logical size of the sparse file (0 = none)
    sparse_extents: int = 3  # 64 KiB data extents inside it
    ckpt_id: str | None = "sim-ckpt"  # None: no meta.json (a non-planescache tree)
    seed: int = 0
    weights_like: bool = False  # planes/fp files incompressible, scales compressible (see weight_bytes)


def meta_for(ckpt_id: str) -> dict[str, object]:
    """meta.json content in the engine's key order (docs/simengine.md, Planes cache)."""
    return {"version": 2, "quantizer_abi": QUANTIZER_ABI, "ckpt_id": ckpt_id, "world": 1, "rank": 0,
            "zero_mode": "auto", "fp4_split": False}


def meta_key(meta: dict[str, object]) -> str:
    """First 20 hex of sha256 over the canonical JSON of the meta dict."""
    canon = json.dumps(meta, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(canon).hexdigest()[:20]


def compressible_bytes(rng: np.random.Generator, n: int) -> bytes:
    """~2:1 compressible bytes (4 bits of entropy per byte), generated fast."""
    return rng.integers(0, 16, size=n, dtype=np.uint8).tobytes()


def weight_bytes(rng: np.random.Generator, n: int, kind: str) -> bytes:
    """Bytes shaped like the cache's files: packed 2-bit planes and FP4 packs are near-random
    (zstd stores them almost as they are), e8m0 scales take few values (3 bits of entropy)."""
    if kind.startswith("sc"):
        return rng.integers(118, 126, size=n, dtype=np.uint8).tobytes()
    return rng.bytes(n)


def write_data_file(path: Path, size: int, rng: np.random.Generator, block: int = 8 << 20,
                    kind: str | None = None) -> None:
    """`kind` (planes13, sc2, fp13 ...) selects weight_bytes; None: compressible_bytes."""
    with open(path, "wb") as f:
        left = size
        while left > 0:
            n = min(block, left)
            f.write(compressible_bytes(rng, n) if kind is None else weight_bytes(rng, n, kind))
            left -= n


def write_sparse_file(path: Path, size: int, extents: int, rng: np.random.Generator) -> None:
    with open(path, "wb") as f:
        f.truncate(size)
        for i in range(extents):
            f.seek((size // max(extents, 1)) * i + 4096)
            f.write(compressible_bytes(rng, 64 * 1024))


def generate_tree(root: Path, spec: TreeSpec) -> Path:
    """Create `root/<spec.top>/...`; returns the top directory."""
    rng = np.random.default_rng(spec.seed)
    top = root / spec.top
    if spec.ckpt_id is not None:
        meta = meta_for(spec.ckpt_id)
        leaf = top / "v2" / meta_key(meta) / "tp1-rank0"
        leaf.mkdir(parents=True, exist_ok=True)
        (leaf / "meta.json").write_text(json.dumps(meta))
    else:
        leaf = top / "data"
        leaf.mkdir(parents=True, exist_ok=True)
    for layer in range(spec.layers):
        for part in ("planes13", "sc13", "planes2", "sc2", "fp13", "fp2"):
            write_data_file(leaf / f"layer{layer}.{part}.bin", spec.file_size, rng,
                            kind=part if spec.weights_like else None)
    if spec.sparse_size:
        write_sparse_file(leaf / "sparse.pool.bin", spec.sparse_size, spec.sparse_extents, rng)
    (top / "README.txt").write_text("SIMULATED artifact built by moet-panel's simhub\n")
    return top


def _pipeline(cmds: list[list[str]], cwd: Path | None = None) -> None:
    """Run cmd1 | cmd2 | ...; raise with stderr when any stage fails."""
    procs: list[subprocess.Popen[bytes]] = []
    prev = None
    for cmd in cmds:
        p = subprocess.Popen(cmd, stdin=prev, stdout=subprocess.PIPE if cmd is not cmds[-1] else None,
                             stderr=subprocess.PIPE, cwd=cwd)
        if prev is not None:
            prev.close()  # so the upstream stage sees SIGPIPE if we die
        prev = p.stdout
        procs.append(p)
    errors = []
    for cmd, p in zip(cmds, procs, strict=True):
        _, err = p.communicate()
        if p.returncode != 0:
            errors.append(f"{cmd[0]} exited {p.returncode}: {err.decode(errors='replace').strip()}")
    if errors:
        raise RuntimeError("; ".join(errors))


def build_artifact(src_root: Path, top: str, out_dir: Path, prefix: str, part_size: int,
                   level: int = 3) -> list[Path]:
    """`tar --sparse -c top | zstd | split -b part_size -d -a 3 - out_dir/prefix` -> sorted parts."""
    out_dir.mkdir(parents=True, exist_ok=True)
    _pipeline([
        ["tar", "--sparse", "--format=gnu", "-C", str(src_root), "-cf", "-", top],
        ["zstd", "-q", "-T0", f"-{level}", "-c"],
        ["split", "-b", str(part_size), "-d", "-a", "3", "-", str(out_dir / prefix)],
    ])
    return sorted(out_dir.glob(prefix + "*"))


def reference_extract(parts: list[Path], dest: Path) -> None:
    """The card's own pipeline (`cat parts | zstd -d | tar -x --sparse`), for byte-identity checks."""
    dest.mkdir(parents=True, exist_ok=True)
    _pipeline([["cat", *map(str, parts)], ["zstd", "-d", "-q", "-c"], ["tar", "-x", "--sparse", "-C", str(dest)]])


HOSTILE_KINDS = ("dotdot", "absolute", "symlink_escape", "symlink_write", "hardlink_escape", "device", "setuid")


def hostile_tar_bytes(kind: str) -> bytes:
    """A small tar whose second member is hostile in the given way (the first is harmless)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tf:
        _add_file(tf, "planescache/ok.txt", b"fine\n")
        if kind == "dotdot":
            _add_file(tf, "planescache/../../evil.txt", b"evil\n")
        elif kind == "absolute":
            _add_file(tf, "/tmp/moet-panel-evil.txt", b"evil\n")
        elif kind == "symlink_escape":
            tf.addfile(_info("planescache/link", tarfile.SYMTYPE, linkname="../../../etc"))
        elif kind == "symlink_write":  # harmless-looking link, then a write through it
            tf.addfile(_info("planescache/sub", tarfile.SYMTYPE, linkname="/tmp"))
            _add_file(tf, "planescache/sub/moet-panel-evil.txt", b"evil\n")
        elif kind == "hardlink_escape":
            tf.addfile(_info("planescache/hl", tarfile.LNKTYPE, linkname="../../etc/passwd"))
        elif kind == "device":
            tf.addfile(_info("planescache/dev", tarfile.CHRTYPE))
        elif kind == "setuid":
            _add_file(tf, "planescache/suid", b"#!/bin/sh\n", mode=0o4755)
        else:
            raise ValueError(f"unknown hostile kind {kind!r}; known: {HOSTILE_KINDS}")
    return buf.getvalue()


def build_hostile_artifact(kind: str, out_dir: Path, prefix: str, part_size: int = 4096) -> list[Path]:
    """Hostile tar, compressed by the real `zstd` CLI and cut by `split`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    raw = out_dir / f".{kind}.tar"
    raw.write_bytes(hostile_tar_bytes(kind))
    _pipeline([["zstd", "-q", "-c", str(raw)], ["split", "-b", str(part_size), "-d", "-a", "3", "-",
                                                  str(out_dir / prefix)]])
    raw.unlink()
    return sorted(out_dir.glob(prefix + "*"))


def _info(name: str, typ: bytes, linkname: str = "", mode: int = 0o644, size: int = 0) -> tarfile.TarInfo:
    ti = tarfile.TarInfo(name)
    ti.type, ti.linkname, ti.mode, ti.size = typ, linkname, mode, size
    return ti


def _add_file(tf: tarfile.TarFile, name: str, data: bytes, mode: int = 0o644) -> None:
    tf.addfile(_info(name, tarfile.REGTYPE, mode=mode, size=len(data)), io.BytesIO(data))


def file_digest_tree(root: Path) -> dict[str, tuple[str, int]]:
    """{relative path: (sha256 or link target, mode bits)} for comparing two extracted trees."""
    out = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        if rel.startswith(".moet-panel"):
            continue
        st = os.lstat(path)
        if path.is_symlink():
            out[rel] = ("link:" + os.readlink(path), 0)
        elif path.is_file():
            h = hashlib.sha256()
            with open(path, "rb") as f:
                while chunk := f.read(1 << 22):
                    h.update(chunk)
            out[rel] = (h.hexdigest(), st.st_mode & 0o777)
        else:
            out[rel] = ("dir", 0)
    return out

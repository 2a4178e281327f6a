"""extract_stream on its own: multi-frame input, truncated archives refused, source errors surfaced."""

from __future__ import annotations

import io
import os
import tarfile
import threading
from pathlib import Path

import pytest
import zstandard

from app.backend.download.extract import ExtractHooks, extract_stream
from app.backend.download.types import DownloadError
from app.backend.simhub.artifacts import file_digest_tree


def _hooks() -> ExtractHooks:
    return ExtractHooks(on_bytes=lambda n: None, on_file=lambda *a: None, on_skip=lambda *a: None,
                        stop=threading.Event())


def _tar(files: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.GNU_FORMAT) as tf:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return out.getvalue()


FILES = {"top/a.bin": os.urandom(300_000), "top/b.bin": b"moet" * 200_000, "top/c.bin": os.urandom(5000)}


def _member_end(raw: bytes, name: str) -> int:
    """Offset just after `name`'s data (a member boundary)."""
    with tarfile.open(fileobj=io.BytesIO(raw), mode="r:") as tf:
        m = tf.getmember(name)
        return m.offset_data + -(-m.size // 512) * 512


def test_the_archive_split_over_several_frames_extracts_whole(tmp_path: Path) -> None:
    raw = _tar(FILES)
    cctx = zstandard.ZstdCompressor(write_checksum=True)
    cut = len(raw) // 3
    packed = cctx.compress(raw[:cut]) + cctx.compress(raw[cut:])  # concatenated frames
    extract_stream(io.BytesIO(packed), tmp_path, {}, _hooks())
    for name, data in FILES.items():
        assert (tmp_path / name).read_bytes() == data


@pytest.mark.parametrize("where", ["member boundary", "inside a member"])
def test_a_truncated_archive_is_an_error_not_a_short_tree(tmp_path: Path, where: str) -> None:
    raw = _tar(FILES)
    end = _member_end(raw, "top/b.bin")
    short = raw[:end] if where == "member boundary" else raw[:end - 1000]
    packed = zstandard.ZstdCompressor().compress(short)
    with pytest.raises(DownloadError, match="truncated|unexpected end"):
        extract_stream(io.BytesIO(packed), tmp_path, {}, _hooks())
    assert not (tmp_path / "top/c.bin").exists()
    if where == "inside a member":
        assert not (tmp_path / "top/b.bin").exists(), "a member cut short never gets its final name"


def test_source_errors_reach_the_extractor(tmp_path: Path) -> None:
    class Boom(io.RawIOBase):
        def readable(self) -> bool:
            return True

        def readinto(self, b) -> int:  # type: ignore[override]
            raise RuntimeError("next part never verified")

    with pytest.raises(RuntimeError, match="never verified"):
        extract_stream(Boom(), tmp_path, {}, _hooks())


def test_the_real_artifact_extracts_byte_identical(tmp_path: Path, artifact) -> None:
    source = io.BytesIO(b"".join(p.read_bytes() for p in artifact.parts))
    extract_stream(source, tmp_path, {}, _hooks())
    assert file_digest_tree(tmp_path) == artifact.reference


def test_member_data_takes_the_fast_path_even_when_parts_end_mid_block(tmp_path: Path, artifact, monkeypatch) -> None:
    """Parts end anywhere, so decompressed buffers do too; headers straddling them must not push the
    member data onto tarfile's 512-byte reads (_copy), which cost more CPU than decompression."""
    from app.backend.download import extract as extract_mod

    class OddReads(io.RawIOBase):  # short reads of odd sizes, like the end of each staged part
        def __init__(self, data: bytes) -> None:
            self.data, self.pos, self.step = data, 0, 0

        def readable(self) -> bool:
            return True

        def readinto(self, b) -> int:  # type: ignore[override]
            self.step += 1
            n = min(len(b), 1 + (self.step * 7919) % 300_000, len(self.data) - self.pos)
            b[:n] = self.data[self.pos:self.pos + n]
            self.pos += n
            return n

    def slow_path(*_a, **_k) -> None:
        raise AssertionError("member data went through tarfile's reads")

    monkeypatch.setattr(extract_mod, "_copy", slow_path)
    extract_stream(OddReads(b"".join(p.read_bytes() for p in artifact.parts)), tmp_path, {}, _hooks())
    assert file_digest_tree(tmp_path) == artifact.reference


def test_hard_links_come_from_the_filtered_member(tmp_path: Path, monkeypatch) -> None:
    """The link is made from the member the data filter returned (issue 12), not from the raw header."""
    from app.backend.download import extract as extract_mod

    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.GNU_FORMAT) as tf:
        for name in ("top/a.bin", "top/b.bin"):
            info = tarfile.TarInfo(name)
            info.size = len(FILES[name])
            tf.addfile(info, io.BytesIO(FILES[name]))
        link = tarfile.TarInfo("top/hl")
        link.type, link.linkname = tarfile.LNKTYPE, "top/a.bin"
        tf.addfile(link)
    from app.backend.download.safety import apply_data_filter as real_filter

    def retargeting_filter(m: tarfile.TarInfo, dest_real: str) -> tarfile.TarInfo:
        filtered = real_filter(m, dest_real)
        return filtered.replace(linkname="top/b.bin", deep=False) if m.islnk() else filtered

    monkeypatch.setattr(extract_mod, "apply_data_filter", retargeting_filter)
    extract_stream(io.BytesIO(zstandard.ZstdCompressor().compress(out.getvalue())), tmp_path, {}, _hooks())
    assert os.stat(tmp_path / "top/hl").st_ino == os.stat(tmp_path / "top/b.bin").st_ino
    assert (tmp_path / "top/hl").read_bytes() == FILES["top/b.bin"]

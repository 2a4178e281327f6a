"""The zstd CLI decompressor: same bytes as python-zstandard, and it refuses what stream_reader misses."""

from __future__ import annotations

import io
import os

import pytest
import zstandard

from app.backend.download import extract as extract_mod
from app.backend.download.native_zstd import NativeZstd, zstd_cli

pytestmark = pytest.mark.skipif(zstd_cli() is None, reason="zstd CLI not installed (./run-tests.sh installs it)")


def _two_frames() -> tuple[bytes, bytes]:
    raw = os.urandom(300_000) + b"moet" * 200_000
    cctx = zstandard.ZstdCompressor(write_checksum=True)
    return raw + raw, cctx.compress(raw) + cctx.compress(raw)  # concatenated frames, like split parts


def _drain(reader: NativeZstd) -> bytes:
    out, buf = bytearray(), bytearray(1 << 16)
    while n := reader.readinto(buf):
        out += buf[:n]
    return bytes(out)


def test_native_output_equals_python_zstandard_across_frames() -> None:
    raw, packed = _two_frames()
    with NativeZstd(io.BytesIO(packed), zstd_cli()) as r:
        assert _drain(r) == raw


def test_truncated_input_is_an_error_not_a_short_stream() -> None:
    _, packed = _two_frames()
    cut = packed[:-1000]
    with zstandard.ZstdDecompressor().stream_reader(io.BytesIO(cut), read_across_frames=True) as zr:
        zr.read()  # python-zstandard returns what it could, silently (stack.md §6.1)
    with NativeZstd(io.BytesIO(cut), zstd_cli()) as r, pytest.raises(zstandard.ZstdError, match="zstd -d exited"):
        _drain(r)


def test_feeder_errors_reach_the_reader() -> None:
    class Boom(io.RawIOBase):
        def readable(self) -> bool:
            return True

        def readinto(self, b) -> int:  # type: ignore[override]
            raise RuntimeError("next part never verified")

    with NativeZstd(Boom(), zstd_cli()) as r, pytest.raises(RuntimeError, match="never verified"):
        _drain(r)


def test_python_fallback_still_extracts_without_the_cli(tmp_path, monkeypatch, artifact) -> None:
    import threading

    monkeypatch.setattr(extract_mod, "zstd_cli", lambda: None)
    hooks = extract_mod.ExtractHooks(on_bytes=lambda n: None, on_file=lambda *a: None, on_skip=lambda *a: None,
                                     stop=threading.Event())
    source = io.BytesIO(b"".join(p.read_bytes() for p in artifact.parts))
    extract_mod.extract_stream(source, tmp_path, {}, hooks)
    from app.backend.simhub.artifacts import file_digest_tree

    assert file_digest_tree(tmp_path) == artifact.reference

"""The one JSON state store (app/backend/files/jsonstore.py): typed round trip, the wrong shape reads as None, 0600."""

from __future__ import annotations

import stat
from dataclasses import dataclass
from pathlib import Path

from app.backend.files.jsonstore import JsonStore


@dataclass(frozen=True)
class Wish:
    on: bool = False
    port: int | None = None
    names: tuple[str, ...] = ()


def test_round_trip_keeps_the_type_and_is_private(tmp_path: Path) -> None:
    store = JsonStore(tmp_path / "sub" / "wish.json", Wish)
    assert store.read() is None
    store.write(Wish(True, 8443, ("a", "b")))
    assert store.read() == Wish(True, 8443, ("a", "b"))
    assert stat.S_IMODE(store.path.stat().st_mode) == 0o600


def test_a_file_of_another_shape_or_broken_reads_as_none(tmp_path: Path) -> None:
    store = JsonStore(tmp_path / "wish.json", Wish)
    store.path.write_text('{"on": "true"}')
    assert store.read() is None
    store.path.write_text('{"on": true, "port": 1, "names": ["x"], "extra": 1}')
    assert store.read() == Wish(True, 1, ("x",))
    store.path.write_text("{not json")
    assert store.read() is None

"""Shared by the security tests: a panel with a login (user alice)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.backend.web.auth import add_user, load_users, make_checker
from tests.conftest import close_panel, launch_panel

PASSWORD = "correct horse battery"


@pytest.fixture
def authed(tmp_path: Path) -> Iterator[Any]:
    """A panel with auth on (one user, alice / PASSWORD), closed after the test."""
    path = tmp_path / "auth"
    add_user(path, "alice", PASSWORD)
    p = launch_panel(tmp_path / "data", auth=make_checker(load_users(path)))
    try:
        yield p
    finally:
        close_panel(p)

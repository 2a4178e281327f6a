"""Fixtures for the chat tests: an in-process SIMULATED engine and a ChatService on a temp dir."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from tests.chat.chat_helpers import FakeEngine, start_sim

from app.backend.chat.conversations import ChatService
from app.backend.recipe import SIMULATED_RECIPE, load_recipe
from app.backend.simengine import SimEngineServer

@pytest.fixture
def sim() -> Iterator[SimEngineServer]:
    server = start_sim()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def recipe():
    return load_recipe(SIMULATED_RECIPE)


@pytest.fixture
def engine(sim: SimEngineServer) -> FakeEngine:
    return FakeEngine(sim)


@pytest.fixture
def make_service(tmp_path: Path, recipe) -> Iterator[Callable[..., ChatService]]:
    made: list[ChatService] = []

    def make(engine: FakeEngine | None = None, state_dir: Path | None = None, **kw: object) -> ChatService:
        svc = ChatService(recipe, state_dir or tmp_path / "state", snapshot_fn=engine.snapshot if engine else None,
                          **kw)  # type: ignore[arg-type]
        made.append(svc)
        return svc

    try:
        yield make
    finally:
        for svc in made:
            try:
                svc.close()
            except Exception:
                pass


@pytest.fixture
def service(make_service, engine) -> ChatService:
    return make_service(engine)

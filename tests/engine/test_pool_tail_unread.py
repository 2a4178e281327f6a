"""The pool gate's last look, the container's own log tail (docs/engine.md "Ready"): a tail Docker did not return
is unknown, not "no pool" — under a loaded daemon it once stopped a good engine as "pool not loaded"."""

from __future__ import annotations

from types import SimpleNamespace

import docker
import pytest
import requests

from app.backend.engine.control.boot import _tail_shows_pool
from app.backend.engine.runtime.base import RuntimeUnavailable
from app.backend.engine.runtime.docker import DockerRuntime

POOL = "INFO 11-30 03:37:58 [moe_w2_delta.py:428] moe_w2 delta tier: 469 slots x 12.0 MiB (5.50 GiB pool)"  # a genuine engine line


class Api:
    def __init__(self, fail: BaseException | None, text: str = "") -> None:
        self.fail, self.text = fail, text

    def logs(self, ident: str, **kw: object) -> bytes:
        if self.fail is not None:
            raise self.fail
        return (self.text + "\n").encode() if kw.get("stdout") else b""


def runtime(api: Api) -> DockerRuntime:
    return DockerRuntime(client=SimpleNamespace(api=api))  # type: ignore[arg-type]


def test_a_tail_docker_did_not_return_is_unknown_not_empty() -> None:
    rt = runtime(Api(requests.exceptions.ReadTimeout("read timed out")))
    with pytest.raises(RuntimeUnavailable, match="did not return the engine's stdout"):
        rt.tail_logs("c1", 100)
    assert _tail_shows_pool(rt, "c1") is None


def test_a_run_docker_no_longer_has_shows_no_log_and_a_read_tail_is_judged() -> None:
    assert runtime(Api(docker.errors.NotFound("gone"))).tail_logs("c1", 100) == []
    assert _tail_shows_pool(runtime(Api(None, POOL)), "c1") is True
    assert _tail_shows_pool(runtime(Api(None, "INFO nothing about a pool")), "c1") is False

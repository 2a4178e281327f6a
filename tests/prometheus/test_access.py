"""Who may read /metrics: open on loopback without a login; with a login, only the bearer token of
--metrics-token-file, which opens nothing else, and never the panel's session cookie."""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.backend.config import env
from app.backend.web.auth import AuthError, add_user, load_users, make_checker
from app.backend.prometheus.access import MIN_TOKEN_CHARS, MetricsTokenError, load_token
from app.backend.recipe import SIMULATED_RECIPE
from app.backend.config.settings import resolve_settings
from app.backend.state import build_app_state
from app.backend.web.gate import is_public
from tests.conftest import free_port
from tests.security.test_web import concrete, mounted_routes

from .conftest import poll, samples, scrape

pytestmark = pytest.mark.slow
PASSWORD = "correct horse battery"
TOKEN = "a3f1" * 16  # 64 hex characters, as `openssl rand -hex 32` writes


@dataclass
class Authed:
    url: str
    state: Any
    blocks: Any


def _launch(tmp_path: Path, token: str | None) -> Authed:
    from app.ui.app import build_ui, launch

    path = tmp_path / "auth"
    add_user(path, "alice", PASSWORD)
    settings = resolve_settings(SIMULATED_RECIPE, tmp_path / "data", demo=True)
    settings.ensure_state_dir()
    state = build_app_state(settings)
    try:
        blocks = build_ui(state)
        checker = make_checker(load_users(path), on_failure=state.counters.login_failed)
        url = launch(blocks, "127.0.0.1", free_port(), checker, state=state, metrics_token=token)
    except BaseException:
        state.close()
        raise
    return Authed(url.rstrip("/"), state, blocks)


@pytest.fixture
def authed(tmp_path: Path) -> Iterator[Authed]:
    p = _launch(tmp_path, TOKEN)
    try:
        yield p
    finally:
        try:
            p.blocks.close()
        finally:
            p.state.close()


def login(client: httpx.Client, url: str) -> None:
    """Sign in as the panel's page does: the cookie, and the session key as a header from then on."""
    r = client.post(url + "/login", data={"username": "alice", "password": PASSWORD})
    assert r.status_code == 200, r.text
    client.headers["X-Moet-Session"] = r.headers["x-moet-session-key"]


def test_metrics_needs_the_bearer_token_when_the_panel_has_a_login(authed: Authed) -> None:
    assert scrape(authed.url).status_code == 401
    assert scrape(authed.url).headers["www-authenticate"].startswith("Bearer")
    assert scrape(authed.url, Authorization="Bearer " + "b" * 64).status_code == 401
    assert scrape(authed.url, Authorization="Basic " + TOKEN).status_code == 401
    ok = scrape(authed.url, Authorization=f"Bearer {TOKEN}")
    assert ok.status_code == 200 and "moet_panel_engine_ready{" in ok.text
    denied = {lab["reason"]: v for lab, v in samples(ok.text)["moet_panel_metrics_denied_total"]}
    assert denied == {"no_token": 3.0, "bad_token": 1.0, "no_token_file": 0.0}  # Basic is no bearer token


def test_the_token_opens_nothing_else(authed: Authed) -> None:
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    checked = 0
    for path, methods in mounted_routes(authed.blocks.server_app):
        if is_public(concrete(path)):
            continue  # the gate's public list: the login page and its files
        if "GET" not in methods:
            continue
        r = httpx.get(authed.url + concrete(path), headers=bearer, timeout=10)
        assert r.status_code in (401, 404, 405), (path, r.status_code)  # 405: GET /logout, refused before any session
        checked += 1
    assert checked > 10
    config = httpx.get(authed.url + "/config", headers=bearer)
    assert config.status_code == 401 and "Not authenticated" in config.text


def test_the_session_cookie_does_not_open_metrics(authed: Authed) -> None:
    with httpx.Client() as c:
        login(c, authed.url)
        assert c.get(authed.url + "/config").status_code == 200  # signed in
        assert c.get(authed.url + "/metrics").status_code == 401


def test_failed_sign_ins_are_counted(authed: Authed) -> None:
    with httpx.Client() as c:
        for _ in range(2):
            assert c.post(authed.url + "/login", data={"username": "alice", "password": "wrong-wrong"}).status_code == 400
        assert c.post(authed.url + "/login", data={"username": "mallory", "password": "x" * 10}).status_code == 400
        login(c, authed.url)  # a good one is not a failure
    got = {lab["reason"]: v for lab, v in samples(scrape(authed.url, Authorization=f"Bearer {TOKEN}").text)[
        "moet_panel_login_failures_total"]}
    assert got == {"bad_credentials": 3.0, "locked_out": 0.0}


def test_without_a_token_file_a_panel_with_a_login_refuses_metrics_and_says_how(tmp_path: Path) -> None:
    p = _launch(tmp_path, None)
    try:
        r = scrape(p.url, Authorization=f"Bearer {TOKEN}")
        assert r.status_code == 403
        assert "--metrics-token-file" in r.text and env.METRICS_TOKEN_FILE in r.text and "--scope metrics" in r.text
        # a key of scope metrics from the gateway's key store (`moet-panel keys create NAME --scope metrics`)
        keys = p.state.gateway.keys
        inference = keys.create("client").key
        metrics = keys.create("prometheus", scope="metrics").key
        poll(lambda: scrape(p.url, Authorization=f"Bearer {metrics}").status_code == 200, 10, "the metrics key to open /metrics")
        assert scrape(p.url, Authorization=f"Bearer {inference}").status_code == 401  # an inference key is not one
        assert httpx.get(p.url + "/config", headers={"Authorization": f"Bearer {metrics}"}).status_code == 401
        assert keys.revoke("prometheus")
        poll(lambda: scrape(p.url, Authorization=f"Bearer {metrics}").status_code == 403, 10, "the revoked key to close it")
    finally:
        p.blocks.close()
        p.state.close()


# ---- the token file and the serve flags -------------------------------------------------------------


def _token_file(tmp_path: Path, text: str, mode: int = 0o600) -> Path:
    path = tmp_path / "metrics.token"
    path.write_text(text)
    os.chmod(path, mode)
    return path


def test_token_file_rules(tmp_path: Path) -> None:
    assert load_token(_token_file(tmp_path, TOKEN + "\n")) == TOKEN
    assert load_token(_token_file(tmp_path, TOKEN, 0o640)) == TOKEN  # Prometheus' group may read it
    with pytest.raises(MetricsTokenError, match="readable or writable by other users.*chmod 600"):
        load_token(_token_file(tmp_path, TOKEN, 0o644))
    with pytest.raises(MetricsTokenError, match="readable or writable by other users"):
        load_token(_token_file(tmp_path, TOKEN, 0o620))
    with pytest.raises(MetricsTokenError, match=f"at least {MIN_TOKEN_CHARS}.*openssl rand -hex 32"):
        load_token(_token_file(tmp_path, "short"))
    with pytest.raises(MetricsTokenError, match="at least"):
        load_token(_token_file(tmp_path, TOKEN[:20] + " " + TOKEN[20:]))
    with pytest.raises(MetricsTokenError, match="cannot read.*openssl rand"):
        load_token(tmp_path / "missing")


def _args(**kw: Any) -> argparse.Namespace:
    base = dict(host=None, port=None, demo=True, auth_file=None, allowed_host=[], recipe=None, data_dir=None,
                metrics_token_file=None)
    base.update(kw)
    return argparse.Namespace(**base)


def test_serve_reads_the_token_file_from_the_flag_or_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from app.cli.serve import plan

    auth = tmp_path / "auth"
    add_user(auth, "alice", PASSWORD)
    token = _token_file(tmp_path, TOKEN)
    data = tmp_path / "data"
    assert plan(_args(auth_file=str(auth), metrics_token_file=str(token), data_dir=str(data))).metrics_token == TOKEN
    monkeypatch.setenv(env.METRICS_TOKEN_FILE, str(token))
    assert plan(_args(auth_file=str(auth), data_dir=str(data))).metrics_token == TOKEN
    assert "a3f1" not in repr(plan(_args(auth_file=str(auth), data_dir=str(data))))  # never printed
    with pytest.raises(AuthError, match="for a panel with a login"):
        plan(_args(data_dir=str(data)))  # no login: /metrics is open, a token file is a mistake to say
    monkeypatch.setenv(env.METRICS_TOKEN_FILE, str(tmp_path / "nope"))
    with pytest.raises(MetricsTokenError, match="cannot read"):
        plan(_args(auth_file=str(auth), data_dir=str(data)))

"""The operator's log (app.backend.oplog): one key=value line per decision, caught errors counted, the file
private and rotated, no secret in it."""

from __future__ import annotations

import io
import logging
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.backend import oplog


@pytest.fixture
def configured(tmp_path: Path) -> Iterator[tuple[Path, io.StringIO]]:
    root = logging.getLogger()
    before = list(root.handlers)
    stream = io.StringIO()
    had = getattr(root, oplog._CONFIGURED, False)
    if had:
        delattr(root, oplog._CONFIGURED)
    oplog.configure(tmp_path, stream=stream)
    try:
        yield tmp_path, stream
    finally:
        for h in list(root.handlers):
            if h not in before:
                root.removeHandler(h)
                h.close()
        if had:
            setattr(root, oplog._CONFIGURED, True)
        elif hasattr(root, oplog._CONFIGURED):
            delattr(root, oplog._CONFIGURED)


def test_a_decision_is_one_key_value_line_with_who_asked(configured: tuple[Path, io.StringIO]) -> None:
    state_dir, stream = configured
    oplog.decision("engine", "restart", who=oplog.SUPERVISOR, reason="crashed (exit 137)", profile="quality")
    line = stream.getvalue().strip().splitlines()[-1]
    assert "level=INFO logger=moet_panel.engine component=engine action=restart who=supervisor" in line
    assert 'reason="crashed (exit 137)" profile=quality' in line
    assert oplog.read_lines(state_dir, 1) == [line]
    assert stat.S_IMODE(oplog.log_path(state_dir).stat().st_mode) == 0o600


def test_the_http_clients_request_lines_stay_out_of_the_log(configured: tuple[Path, io.StringIO]) -> None:
    """Issue 49: 54 of 109 lines were `HTTP Request: POST http://engine/... 200 OK` (httpx2: the openai SDK's client)."""
    state_dir, stream = configured
    for name in ("httpx", "httpx2"):
        logging.getLogger(name).info('HTTP Request: POST http://engine/v1/chat/completions "HTTP/1.1 200 OK"')
        logging.getLogger(name).warning("a real problem of %s", name)
    text = stream.getvalue()
    assert "HTTP Request" not in text and "a real problem of httpx2" in text


def test_a_caught_error_is_logged_once_and_counted_by_component(configured: tuple[Path, io.StringIO]) -> None:
    _, stream = configured
    before = oplog.error_counts().get("gateway", 0)
    oplog.caught("gateway", ConnectionResetError("peer gone"), "forwarding a stream", key="k1")
    assert oplog.error_counts()["gateway"] == before + 1
    text = stream.getvalue()
    assert text.count("peer gone") == 1
    assert 'context="forwarding a stream"' in text and "level=WARNING" in text


def test_no_hf_token_reaches_the_log(configured: tuple[Path, io.StringIO]) -> None:
    state_dir, stream = configured
    token = "hf_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7"
    oplog.decision("downloads", "start", who=oplog.user("alice"), url=f"https://x/?t={token}")
    try:
        raise RuntimeError(f"auth failed with {token}")
    except RuntimeError as exc:
        oplog.caught("downloads", exc, "listing the repo", traceback=True)
    assert token not in stream.getvalue()
    assert token not in oplog.log_path(state_dir).read_text()


def test_no_api_key_nor_notify_url_secret_reaches_the_log(configured: tuple[Path, io.StringIO]) -> None:
    """issue 39 item 4: an HF token, a gateway API key and a notify URL's credentials (user, password, tokens
    in the path and the query) through decision(), caught() and a traceback: 0 occurrences in either sink."""
    from app.backend.oplog import redact

    state_dir, stream = configured
    token = "hf_" + "Z9y8X7w6V5u4T3s2R1q0P9o8N7m6L5"
    api_key = "mpk-" + "q1W2e3R4t5Y6u7I8o9P0a1S2d3F4g5H6j7K8l9Z0x1C"
    notify = "json://ops-user:S3cretPassw0rd@hooks.example.org:8443/inbox/Tok3nInPathXYZ?apikey=QueryS3cretABC"
    tg = "tgram://123456789:BotTokenSecretXYZ/987654321"
    redact.register_url(notify)
    oplog.decision("service", "notify_urls_saved", who=oplog.user("alice"), urls=f"{notify} {tg}", key=api_key,
                   hf=token)
    oplog.caught("service", ConnectionError(f"POST {notify} refused; chat Tok3nInPathXYZ"), "sending an alert")
    try:
        raise RuntimeError(f"apprise: {tg} failed with key {api_key} and {token}")
    except RuntimeError as exc:
        oplog.caught("service", exc, "sending an alert", traceback=True)
    logging.getLogger("apprise").warning("Failed to send to %s (password S3cretPassw0rd)", notify)
    secrets = (token, api_key, "S3cretPassw0rd", "ops-user", "Tok3nInPathXYZ", "QueryS3cretABC", "BotTokenSecretXYZ",
               "123456789:")
    for sink, text in (("stderr", stream.getvalue()), ("file", oplog.log_path(state_dir).read_text())):
        assert "traceback=" in text and "hooks.example.org" in text, sink  # the record is there, masked
        for secret in secrets:
            assert text.count(secret) == 0, (sink, secret, text)


def test_mask_url_stars_user_password_path_and_query() -> None:
    from app.backend.oplog.redact import mask_url

    assert mask_url("json://alice:pw1234567@example.org:8080/hook/Secret?token=abc&x=1") == \
        "json://***:***@example.org:8080/***/***?token=***&x=***"
    assert mask_url("tgram://123456789:BotToken/42") == "tgram://***/***"  # a token in the host's place
    assert mask_url("ntfy://ntfy.sh/my-private-topic") == "ntfy://ntfy.sh/***"
    assert mask_url("no url") == "(not a URL)"


def test_a_repeating_error_from_a_loop_is_logged_once(configured: tuple[Path, io.StringIO]) -> None:
    _, stream = configured
    now = [0.0]
    once = oplog.Once("telemetry", every_s=600.0, clock=lambda: now[0])
    before = oplog.error_counts().get("telemetry", 0)
    for _ in range(50):
        once.caught(OSError("docker away"), "reading the engine log tail")
        now[0] += 1.0
    assert stream.getvalue().count("docker away") == 1
    once.caught(OSError("permission denied"), "reading the engine log tail")  # a new error is news
    once.ok("reading the engine log tail")
    once.caught(OSError("docker away"), "reading the engine log tail")  # after it healed, news again
    now[0] += 700.0
    once.caught(OSError("docker away"), "reading the engine log tail")  # a lasting fault, with its count
    assert oplog.error_counts()["telemetry"] == before + 4
    assert "repeated=0" not in stream.getvalue()


def test_a_registered_urls_plain_words_are_not_starred_everywhere() -> None:
    from app.backend.oplog import redact

    redact.register_url("ntfy://ntfy.sh/alerts")
    redact.register_url("json://example.org/webhook/k7Hq2ZpX")
    assert redact.redact("evaluating the alerts; webhook k7Hq2ZpX failed") == "evaluating the alerts; webhook *** failed"

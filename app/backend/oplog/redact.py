"""Keep secrets out of every log record and every page, whoever writes them (docs/engine.md "The operator's log").

Three kinds of secret, one `redact(text)`:
- Hugging Face tokens: `app.backend.config.hf_token.redact` (known tokens + anything shaped like `hf_...`);
- the gateway's API keys: anything shaped like `mpk-` + 20 or more URL-safe characters (app/backend/gateway/keys.py
  makes `mpk-` + 43);
- notify URLs (Apprise): the URLs the panel was given are registered (`register_url`) and their secret parts
  (user, password, a token-like host, path segments, query values) are starred wherever they appear, whole or
  in pieces (an Apprise error may quote the token alone); any other URL in the text is masked as `mask_url`
  shows it when its scheme is not http(s), and has its user info and secret-named query values starred when
  it is.

`mask_url(url)` is the one way a URL is shown (the Service tab, `moet-panel service`, the log).
`install_log_redaction()` wraps the logging record factory (records from any logger, created later or
not) and adds a filter to existing handlers for exception text.
"""

from __future__ import annotations

import logging
import re
import threading
from urllib.parse import parse_qsl, unquote

from app.backend.config.hf_token import redact as redact_hf_tokens

STAR = "***"
API_KEY_SHAPE = re.compile(r"mpk-[A-Za-z0-9_-]{20,}")
API_KEY_REDACTED = "mpk-***"
# scheme://rest-of-a-URL up to white space or a quote/bracket that ends it in prose, a repr or JSON
_URL_IN_TEXT = re.compile(r"\b([A-Za-z][A-Za-z0-9+.-]{1,31})://([^\s'\"<>`]+)")
_HOSTNAME = re.compile(r"(?:[A-Za-z0-9-]+\.)+[A-Za-z0-9-]+|localhost|\[[0-9A-Fa-f:.]+\]")
_SECRET_QUERY = re.compile(r"(?i)(token|key|secret|pass|password|pwd|auth|sig|signature|apikey|api_key|"
                           r"access_token|webhook|code)")
MIN_PART = 6  # shorter pieces of a URL are not starred by themselves (they would star ordinary words)


def _split(url: str) -> tuple[str, str, str, str, str, str] | None:
    """(scheme, user info, host[:port], path, query, fragment) of `scheme://...`, parsed by hand: Apprise URLs
    are not RFC 3986 (a Telegram token `123:ABC` is no host:port), so urllib's parser would refuse some."""
    if "://" not in url:
        return None
    scheme, rest = url.split("://", 1)
    if not scheme or not re.fullmatch(r"[A-Za-z][A-Za-z0-9+.-]*", scheme):
        return None
    rest, _, fragment = rest.partition("#")
    rest, _, query = rest.partition("?")
    netloc, slash, path = rest.partition("/")
    userinfo, at, hostport = netloc.rpartition("@")
    return scheme, userinfo if at else "", hostport, slash + path, query, fragment


def _host_shown(hostport: str) -> str:
    host, _, port = hostport.rpartition(":") if re.search(r":\d+$", hostport) else (hostport, "", "")
    if _HOSTNAME.fullmatch(host):
        return hostport
    return STAR if host else ""  # no dot: a token (tgram://TOKEN, discord://ID/TOKEN, ntfy://topic)


def mask_url(url: str) -> str:
    """The URL as it may be shown: scheme and a real host name kept; user, password, a token in the host's
    place, every path segment and every query value starred. Not a URL: `(not a URL)`."""
    parts = _split(url.strip())
    if parts is None:
        return "(not a URL)"
    scheme, userinfo, hostport, path, query, fragment = parts
    out = f"{scheme}://"
    if userinfo:
        out += STAR + (":" + STAR if ":" in userinfo else "") + "@"
    out += _host_shown(hostport)
    if path:
        out += "/".join(STAR if seg else "" for seg in path.split("/"))
    if query:
        out += "?" + "&".join(f"{k}={STAR}" for k, _ in parse_qsl(query, keep_blank_values=True))
    if fragment:
        out += "#" + STAR
    return out


def _tokenish(part: str) -> bool:
    """A piece that looks like a secret (a token, a topic, an id) rather than a word: starring every "alerts" or
    "webhook" in the log because a URL's path holds one would blind the log, not protect anything."""
    if len(part) >= 20:
        return True
    return len(part) >= MIN_PART and (any(c.isdigit() for c in part) or any(c in "-_.~" for c in part)
                                      or (any(c.isupper() for c in part) and any(c.islower() for c in part)))


def _secret_parts(url: str) -> set[str]:
    """The pieces of a notify URL that are secret, raw and percent-decoded (the whole URL is handled apart)."""
    parts = _split(url.strip())
    if parts is None:
        return set()
    _, userinfo, hostport, path, query, fragment = parts
    user, _, password = userinfo.partition(":")
    found = {user}
    if _host_shown(hostport) == STAR:
        found.add(hostport)
        found.update(hostport.split(":"))
    found.update(path.split("/"))
    found.update(v for _, v in parse_qsl(query, keep_blank_values=True))
    found.add(fragment)
    found |= {unquote(p) for p in found}
    secret = {p for p in found if _tokenish(p)}
    if len(password) >= 4:  # a password is a secret whatever it looks like
        secret |= {password, unquote(password)}
    return secret


class _KnownUrlParts:
    """The secret pieces of the notify URLs this process was given (redaction must work from any thread
    without plumbing; like hf_token.KNOWN it only grows and holds nothing the process does not hold)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._parts: dict[str, str] = {}  # secret piece -> what is shown instead
        self._sorted: tuple[tuple[str, str], ...] = ()

    def add(self, url: str) -> None:
        url = url.strip()
        new = dict.fromkeys(_secret_parts(url) - {url}, STAR)
        if "://" in url:
            new[url] = mask_url(url)  # the whole URL keeps its scheme and host: the reader sees which target
        with self._lock:
            if new.keys() - self._parts.keys():
                self._parts.update(new)
                self._sorted = tuple(sorted(self._parts.items(), key=lambda kv: len(kv[0]), reverse=True))

    def all(self) -> tuple[tuple[str, str], ...]:
        return self._sorted


KNOWN_URL_PARTS = _KnownUrlParts()


def register_url(url: str) -> None:
    """Remember a notify URL's secret parts, so they are starred in any later text (call it where URLs are read)."""
    KNOWN_URL_PARTS.add(url)


def _mask_in_text(m: re.Match[str]) -> str:
    scheme, rest = m.group(1), m.group(2)
    trail = ""
    while rest and rest[-1] in ".,;:)]}":  # prose punctuation after a URL is not part of it
        trail, rest = rest[-1] + trail, rest[:-1]
    if scheme.lower() not in ("http", "https", "ws", "wss", "unix", "file"):
        return mask_url(f"{scheme}://{rest}") + trail
    parts = _split(f"{scheme}://{rest}")
    assert parts is not None
    _, userinfo, hostport, path, query, fragment = parts
    out = f"{scheme}://" + (STAR + (":" + STAR if ":" in userinfo else "") + "@" if userinfo else "") + hostport + path
    if query:
        out += "?" + "&".join(f"{k}={STAR if _SECRET_QUERY.search(k) else v}"
                              for k, v in parse_qsl(query, keep_blank_values=True))
    return out + (f"#{fragment}" if fragment else "") + trail


def redact(text: str) -> str:
    """`text` with every HF token, API key and notify-URL secret replaced."""
    if not text:
        return text
    text = redact_hf_tokens(text)
    text = API_KEY_SHAPE.sub(API_KEY_REDACTED, text)
    for part, shown in KNOWN_URL_PARTS.all():
        if part in text:
            text = text.replace(part, shown)
    if "://" in text:
        text = _URL_IN_TEXT.sub(_mask_in_text, text)
    return text


class RedactingFilter(logging.Filter):
    """Rewrites a record's message and exception text with secrets replaced."""

    def filter(self, record: logging.LogRecord) -> bool:
        _scrub(record)
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        return True


def _scrub(record: logging.LogRecord) -> None:
    try:
        message = record.getMessage()
    except Exception:  # a broken format string: logging here would recurse; logging.Handler.handleError says it
        return
    cleaned = redact(message)
    if cleaned != message or record.args:
        record.msg, record.args = cleaned, ()


_MARK = "_moet_panel_redacting"


def install_log_redaction(extra_loggers: tuple[str, ...] = ("uvicorn", "uvicorn.error", "uvicorn.access", "httpx")) -> None:
    """Idempotent: make every log record pass through `redact()`."""
    factory = logging.getLogRecordFactory()
    if not getattr(factory, _MARK, False):
        def redacting_factory(*args: object, **kwargs: object) -> logging.LogRecord:
            record = factory(*args, **kwargs)
            _scrub(record)
            return record

        setattr(redacting_factory, _MARK, True)
        logging.setLogRecordFactory(redacting_factory)
    for name in ("",) + extra_loggers:
        for handler in logging.getLogger(name).handlers:
            if not any(isinstance(f, RedactingFilter) for f in handler.filters):
                handler.addFilter(RedactingFilter())

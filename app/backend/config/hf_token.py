"""Hugging Face token: where it comes from, where the panel stores it, and how it is kept out of text.

Order: flags beat the environment, the environment beats files (docs/downloads.md "Token"):
an explicit value, a `--token-file`, `HF_TOKEN` (then the legacy `HUGGING_FACE_HUB_TOKEN`), the panel's
own saved token, then whatever `huggingface_hub.get_token()` finds (its token file, `hf auth login`).

`redact()` replaces every token this process has seen (plus anything shaped like `hf_...`) with
`hf_***`; every message that may reach a log, the journal, an error or the UI goes through it.
"""

from __future__ import annotations

import re
import threading
from pathlib import Path

from app.backend.config import env
from app.backend.files.atomic import atomic_write

REDACTED = "hf_***"
# Anything shaped like a Hugging Face user token, even one this process never loaded.
_TOKEN_SHAPE = re.compile(r"hf_[A-Za-z0-9]{6,}")


class _KnownTokens:
    """Tokens seen by this process (so redact() also catches non-hf_-shaped test/mirror tokens)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tokens: set[str] = set()

    def add(self, token: str | None) -> None:
        if token and len(token) >= 4:
            with self._lock:
                self._tokens.add(token)

    def all(self) -> list[str]:
        with self._lock:
            return sorted(self._tokens, key=len, reverse=True)


# The one process-wide registry: redaction must work from any thread without plumbing state through
# every log call. It only grows, holds no secrets beyond what the process already has in memory.
KNOWN = _KnownTokens()


def panel_token_path() -> Path:
    """Where `save_token` writes: under ~/.config/moet-panel/ (never inside the repo or data dir)."""
    base = env.config_home()
    return base / "moet-panel" / "hf_token"


def _read(path: Path) -> str | None:
    try:
        value = path.read_text().strip()
    except OSError:
        return None
    return value or None


def _flag_file(token_file: str | Path | None) -> str | None:
    """A --token-file that is missing or empty is an error, not a silent fall-through to another token."""
    if not token_file:
        return None
    path = Path(token_file).expanduser()
    token = _read(path)
    if token is None:
        raise ValueError(f"--token-file {path}: cannot read a token from it (missing, unreadable or empty); "
                         "write the token from huggingface.co/settings/tokens into it")
    return token


def _library_token() -> str | None:
    """huggingface_hub's own lookup (HF_TOKEN again, then its token file at constants.HF_TOKEN_PATH)."""
    from huggingface_hub import get_token

    return get_token()


def resolve_token(explicit: str | None = None, token_file: str | Path | None = None) -> str | None:
    """Return the token to use, or None for anonymous access. Registers it for redaction."""
    candidates = [
        lambda: (explicit or "").strip() or None,
        lambda: _flag_file(token_file),
        env.hf_token,
        lambda: _read(panel_token_path()),
        _library_token,
    ]
    for get in candidates:
        token = get()
        if token:
            KNOWN.add(token)
            return token
    return None


def save_token(token: str) -> Path:
    """Store a token (from the UI's password field) with mode 0600; returns the file path."""
    token = token.strip()
    if not token or any(c.isspace() for c in token):
        raise ValueError("the token is empty or contains whitespace; paste the token from huggingface.co/settings/tokens")
    KNOWN.add(token)
    path = panel_token_path()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    atomic_write(path, token + "\n", mode=0o600)
    return path


def forget_saved_token() -> bool:
    """Delete the panel's saved token (not HF's own file). Returns True if one was removed."""
    try:
        panel_token_path().unlink()
        return True
    except FileNotFoundError:
        return False


def has_saved_token() -> bool:
    return panel_token_path().is_file()


def redact(text: str) -> str:
    """Replace every known token (and anything hf_-shaped) with `hf_***`."""
    if not text:
        return text
    for token in KNOWN.all():
        text = text.replace(token, REDACTED)
    return _TOKEN_SHAPE.sub(REDACTED, text)

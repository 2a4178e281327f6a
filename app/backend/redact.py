"""Keep secrets (the HF token) out of every log record, whoever logs it.

`install_log_redaction()` wraps the logging record factory (records from any logger, created later or
not) and adds a filter to existing handlers for exception text. Redaction itself is
`app.backend.hf_token.redact` (known tokens + anything shaped like `hf_...`).
"""

from __future__ import annotations

import logging

from app.backend.hf_token import redact


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
    except Exception:  # a broken format string is logging's problem, not ours
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

"""Log records with the session they belong to, and ``streamer serve --log-format json``.

The server sets :data:`SESSION_ID` for the task that serves a session; every record logged from that task (and the
tasks it starts, which copy its context) carries the id. In JSON mode each record is one object per line::

    {"ts": "2025-01-31T12:00:00.123Z", "level": "info", "logger": "streamer.server.session",
     "message": "session=3f9a1c0b2e4d event=open ...", "session_id": "3f9a1c0b2e4d"}

``session_id`` is absent outside a session; ``exception`` holds the traceback when there is one.
"""

from __future__ import annotations

import json
import logging
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any

__all__ = ["LOG_FORMATS", "SESSION_ID", "JsonFormatter", "SessionFilter", "configure"]

LOG_FORMATS = ("text", "json")

# the id of the session the current task serves; None outside one
SESSION_ID: ContextVar[str | None] = ContextVar("streamer_session_id", default=None)


class SessionFilter(logging.Filter):
    """Copies :data:`SESSION_ID` onto each record as ``record.session_id`` (at the time it is logged)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "session_id", None) is None:
            record.session_id = SESSION_ID.get()
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line: ts (UTC, ISO 8601, milliseconds), level, logger, message, and
    session_id and exception when there are."""

    def format(self, record: logging.LogRecord) -> str:
        ts = datetime.fromtimestamp(record.created, tz=UTC)
        out: dict[str, Any] = {
            "ts": ts.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        session_id = getattr(record, "session_id", None) or SESSION_ID.get()
        if session_id is not None:
            out["session_id"] = session_id
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exception"] = record.exc_text
        return json.dumps(out, ensure_ascii=False)


def configure(log_format: str, root: logging.Logger | None = None) -> None:
    """Switch the handlers of ``root`` (the root logger by default, as ``streamer.cli.main.main`` set it up) to
    ``log_format``; ``text`` leaves them as they are. Call once, at the start of a command."""
    if log_format not in LOG_FORMATS:
        raise ValueError(f"log format must be one of {', '.join(LOG_FORMATS)}, not {log_format!r}")
    if log_format == "text":
        return
    root = root if root is not None else logging.getLogger()
    for handler in root.handlers:
        handler.setFormatter(JsonFormatter())
        handler.addFilter(SessionFilter())

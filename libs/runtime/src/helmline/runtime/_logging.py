"""Structured JSON logs: one object per line, with session, tenant and trace ids on each.

The standard library's logging is kept, with a JSON formatter, rather than structlog: the
lines that matter most come from libraries (nats-py reconnecting, uvicorn, asyncpg) that log
through the standard library, and a formatter shapes theirs and ours alike with no wrapper
and no second logging API for services to learn. Which session a line belongs to is set
once per handled event (`log_context`) and read when the line is formatted.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Literal

from helmline.runtime._output_safety import registered_secrets
from helmline.runtime._tracing import current_trace_ids

LogFormat = Literal["json", "text"]

_context: ContextVar[dict[str, str] | None] = ContextVar("helmline_log_context", default=None)


@contextmanager
def log_context(**fields: str) -> Iterator[None]:
    """Add `fields` (tenant, session_id, ...) to every line logged inside the block."""
    token = _context.set({**(_context.get() or {}), **fields})
    try:
        yield
    finally:
        _context.reset(token)


class JsonFormatter(logging.Formatter):
    """A log record as one JSON object; session, tenant and trace ids are always present."""

    def __init__(self, service: str) -> None:
        super().__init__()
        self._service = service

    def format(self, record: logging.LogRecord) -> str:
        trace_id, span_id = current_trace_ids()
        line: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "service": self._service,
            "logger": record.name,
            "message": _redacted(record.getMessage()),
            "tenant": None,
            "session_id": None,
            "trace_id": trace_id,
            "span_id": span_id,
            **(_context.get() or {}),
        }
        if record.exc_info:
            line["exception"] = _redacted(self.formatException(record.exc_info))
        return json.dumps(line, default=str)


class _TextFormatter(logging.Formatter):
    """Lines for people, with the same redaction."""

    def format(self, record: logging.LogRecord) -> str:
        return _redacted(super().format(record))


def _redacted(text: str) -> str:
    # A line may quote what a tool or server said (an error, a notice): a registered
    # secret's value never reaches a log line either.
    return registered_secrets().redact(text, {})


CHATTY_HTTP_CLIENTS = ("httpx", "httpx2")
"""Loggers of HTTP clients (the MCP SDK's, the model providers') that log every request at
INFO."""


def configure_logging(service: str, level: str, log_format: LogFormat) -> None:
    """Send the process's log records to stderr as JSON lines (or text, for people)."""
    handler = logging.StreamHandler()
    if log_format == "json":
        handler.setFormatter(JsonFormatter(service))
    else:
        handler.setFormatter(
            _TextFormatter(f"%(asctime)s %(levelname)s {service} %(name)s: %(message)s")
        )
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
    # The HTTP clients log a line per request at INFO: every MCP call over HTTP, every
    # model call. That drowns the service's own lines, so they show from DEBUG on only.
    quiet = logging.NOTSET if logging.getLogger().level <= logging.DEBUG else logging.WARNING
    for client in CHATTY_HTTP_CLIENTS:
        logging.getLogger(client).setLevel(quiet)

"""Log records as log pipelines read them: one JSON object a line, naming the request.

What lives here: `REQUEST_ID` (the Envoy `x-request-id` of the request the current task
decides: the servicer sets it when a stream's headers arrive, and every record written
while that stream is decided carries it, whichever module writes it), `JsonLines` (the
formatter) and `configure_logs`, which `slogate serve --log-format` calls. A record about a
request decided elsewhere (an access-log entry) can name it with `extra={"request_id": ...}`.
"""

from __future__ import annotations

import contextvars
import datetime as dt
import logging
import sys
from typing import Any

import msgspec

REQUEST_ID: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "slogate_request_id", default=None
)
LOG_FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonLines(logging.Formatter):
    """{"ts", "level", "logger", "message"[, "request_id"][, "exception"]}: one line each,
    a traceback included (escaped, so it cannot split the record)."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        request_id = getattr(record, "request_id", None) or REQUEST_ID.get()
        if request_id:
            line["request_id"] = request_id
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exception"] = record.exc_text
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        return msgspec.json.encode(line).decode()


def configure_logs(log_format: str = "text", level: str = "INFO") -> None:
    """Every record of the process to stderr in `log_format`, from `level` up; in JSON, the
    warnings module's too (they would otherwise print their own lines). DEBUG is slogate's
    own (a line per decision): the libraries' (asyncio, grpc) stay at INFO."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonLines() if log_format == "json" else logging.Formatter(TEXT_FORMAT))
    wanted = logging.getLevelName(level.upper())
    logging.basicConfig(level=max(wanted, logging.INFO), handlers=[handler], force=True)
    logging.getLogger("slogate").setLevel(wanted)
    logging.captureWarnings(log_format == "json")


def json_logs() -> bool:
    """Whether the process writes JSON lines (its announcements then become records too)."""
    return any(isinstance(h.formatter, JsonLines) for h in logging.getLogger().handlers)

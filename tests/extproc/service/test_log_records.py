"""Log records as JSON lines naming their request: the formatter alone.

A real `slogate serve --log-format json`: tests/e2e/extproc/service/test_log_records.py."""

from __future__ import annotations

import json
import logging
import sys

from extproc.service.log_records import REQUEST_ID, JsonLines


def test_json_lines_name_the_request_and_keep_a_traceback_on_one_line() -> None:
    formatter = JsonLines()
    try:
        raise ValueError("broken\nacross lines")
    except ValueError:
        record = logging.LogRecord(
            "slogate.extproc", logging.ERROR, __file__, 1, "failed %s", ("x",), sys.exc_info()
        )
    token = REQUEST_ID.set("req-9")
    try:
        line = formatter.format(record)
    finally:
        REQUEST_ID.reset(token)
    assert "\n" not in line
    parsed = json.loads(line)
    assert parsed["level"] == "ERROR" and parsed["logger"] == "slogate.extproc"
    assert parsed["message"] == "failed x" and parsed["request_id"] == "req-9"
    assert "ValueError: broken" in parsed["exception"] and parsed["ts"].endswith("+00:00")
    assert "request_id" not in json.loads(formatter.format(record))  # outside a request

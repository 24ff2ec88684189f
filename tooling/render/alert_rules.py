"""slogate's shipped Prometheus rules with their time shortened, for a live run that must see
alerts fire and resolve in minutes instead of hours.

What lives here: `scaled_rules` (the rules document of deploy/prometheus/slogate-rules.yaml,
read at call time, with every `for:` / `keep_firing_for:` and every range window, subquery
range and `offset` in an `expr` multiplied by a factor) and `write_scaled_rules`;
`duration_s` and `promql_duration` turn a Prometheus duration into seconds and back. The rules
are generated from the shipped file each time, never copied by hand: a rule added there is
covered here as it is. Expressions, thresholds, labels and annotations are left exactly as
shipped (an annotation still says "5 minutes": it describes the shipped rule).

A range is what PromQL writes in square brackets after a selector or a subquery: `[5m]`,
`[30m:1m]`, `[1h30m]`. A bracket inside a quoted label matcher (`tenant=~"[a-z]+"`) holds
no duration and is left alone.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from extproc.shipped import alert_rules

# deploy/prometheus/slogate-rules.yaml, through the package: an installed slogate has its copy.
SHIPPED_RULES = alert_rules()

_DURATION = r"(?:\d+(?:ms|[smhdwy]))+"
# `[range]` or `[range:resolution]` (the resolution may be empty: `[30m:]`).
_RANGE = re.compile(rf"\[({_DURATION})(?::({_DURATION})?)?\]")
_OFFSET = re.compile(rf"\boffset(\s+-?)({_DURATION})")
# Double-quoted, single-quoted and backtick strings: skipped, their brackets are regexes.
_QUOTED = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')


def promql_duration(seconds: float) -> str:
    """Seconds as a Prometheus duration: whole seconds when they are whole, else ms."""
    millis = round(seconds * 1000)
    return f"{millis // 1000}s" if millis % 1000 == 0 else f"{millis}ms"


def _scaled(text: str, factor: float, floor_s: float) -> str:
    return promql_duration(max(duration_s(text) * factor, floor_s))


def scale_expr(expr: str, factor: float, min_window_s: float) -> str:
    """Every range window (and subquery range) of `expr` times `factor`, none shorter than
    `min_window_s` (a rate needs two scrapes in its window; a few more make it steady).
    A subquery's resolution and an `offset` are scaled too (an offset with no floor: it
    says how far back, not how much to average)."""

    def scale_range(match: re.Match[str]) -> str:
        window = _scaled(match.group(1), factor, min_window_s)
        if match.group(0).endswith(":]"):
            return f"[{window}:]"
        if match.group(2) is None:
            return f"[{window}]"
        return f"[{window}:{_scaled(match.group(2), factor, 0.001)}]"

    def scale_offset(match: re.Match[str]) -> str:
        return f"offset{match.group(1)}{_scaled(match.group(2), factor, 0.001)}"

    def scale_code(code: str) -> str:
        return _OFFSET.sub(scale_offset, _RANGE.sub(scale_range, code))

    parts, last = [], 0
    for quoted in _QUOTED.finditer(expr):  # scale only outside string literals
        parts.append(scale_code(expr[last : quoted.start()]))
        parts.append(quoted.group(0))
        last = quoted.end()
    parts.append(scale_code(expr[last:]))
    return "".join(parts)


def scaled_rules(
    factor: float, min_window_s: float = 0.0, source: Path = SHIPPED_RULES
) -> dict[str, Any]:
    """The rules document of `source` with its time scaled by `factor` (1/60: a `for: 15m`
    becomes 15 s). Recording rules and alerting rules alike."""
    if factor <= 0:
        raise ValueError("factor must be > 0")
    document: dict[str, Any] = yaml.safe_load(source.read_text(encoding="utf-8"))
    for group in document.get("groups", []):
        if "interval" in group:
            group["interval"] = _scaled(str(group["interval"]), factor, 0.001)
        for rule in group.get("rules", []):
            rule["expr"] = scale_expr(str(rule["expr"]), factor, min_window_s)
            for field in ("for", "keep_firing_for"):
                if field in rule:
                    rule[field] = _scaled(str(rule[field]), factor, 0.0)
    return document


def write_scaled_rules(
    out: Path, factor: float, min_window_s: float = 0.0, source: Path = SHIPPED_RULES
) -> Path:
    out.write_text(
        yaml.safe_dump(scaled_rules(factor, min_window_s, source), sort_keys=False),
        encoding="utf-8",
    )
    return out


def duration_s(text: str) -> float:
    """A Prometheus duration ("15s", "1m30s", "2h") in seconds."""
    units = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
    total, number = 0.0, ""
    i = 0
    while i < len(text):
        ch = text[i]
        if ch.isdigit() or ch == ".":
            number += ch
            i += 1
            continue
        unit = "ms" if text.startswith("ms", i) else ch
        if unit not in units or not number:
            raise ValueError(f"not a Prometheus duration: {text!r}")
        total += float(number) * units[unit]
        number = ""
        i += len(unit)
    if number:
        raise ValueError(f"not a Prometheus duration (no unit): {text!r}")
    return total

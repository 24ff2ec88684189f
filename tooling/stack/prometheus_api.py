"""A small client for Prometheus's HTTP API (v1): instant and range queries, targets,
rules and alerts. Used by `slogate preflight` and by the tests that run a real Prometheus
against the stack. Synchronous (urllib): every caller asks a handful of questions."""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any


class PrometheusError(RuntimeError):
    """Prometheus answered with an error, or could not be reached."""


@dataclass(frozen=True)
class Sample:
    labels: dict[str, str]
    value: float


@dataclass(frozen=True)
class Series:
    labels: dict[str, str]
    points: list[tuple[float, float]]  # (unix seconds, value)


class PrometheusApi:
    def __init__(self, url: str, timeout_s: float = 10.0) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s

    def _get(self, path: str, **params: str) -> Any:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        try:
            with urllib.request.urlopen(
                f"{self.url}{path}{query}", timeout=self.timeout_s
            ) as reply:
                document = json.loads(reply.read())
        except urllib.error.HTTPError as error:  # 400/422: a bad query, with its reason
            try:
                document = json.loads(error.read())
            except ValueError:
                raise PrometheusError(f"{path}: HTTP {error.code}") from error
        except (OSError, ValueError) as error:
            raise PrometheusError(f"{self.url}: {error}") from error
        if document.get("status") != "success":
            raise PrometheusError(f"{path}: {document.get('error', document)}")
        return document["data"]

    def query(self, expr: str, at_s: float | None = None) -> list[Sample]:
        """An instant vector (a scalar comes back as one unlabelled sample)."""
        params = {"query": expr} if at_s is None else {"query": expr, "time": f"{at_s:.3f}"}
        data = self._get("/api/v1/query", **params)
        if data["resultType"] == "scalar":
            return [Sample({}, float(data["result"][1]))]
        return [Sample(r["metric"], float(r["value"][1])) for r in data["result"]]

    def query_range(self, expr: str, start_s: float, end_s: float, step_s: float) -> list[Series]:
        data = self._get(
            "/api/v1/query_range",
            query=expr,
            start=f"{start_s:.3f}",
            end=f"{end_s:.3f}",
            step=f"{step_s:g}",
        )
        return [
            Series(r["metric"], [(float(t), float(v)) for t, v in r["values"]])
            for r in data["result"]
        ]

    def targets(self) -> list[dict[str, Any]]:
        """The active scrape targets, each with its labels, scrapeInterval and health."""
        active: list[dict[str, Any]] = self._get("/api/v1/targets")["activeTargets"]
        return active

    def scrape_intervals(self) -> dict[str, str]:
        """Each scrape pool's configured interval ("15s"), from the loaded configuration."""
        active = self.targets()
        return {t["scrapePool"]: t.get("scrapeInterval", "") for t in active}

    def alerting_rules(self) -> list[dict[str, Any]]:
        """Every loaded alerting rule (name, query, duration, state, its alerts)."""
        groups = self._get("/api/v1/rules", type="alert")["groups"]
        return [rule for group in groups for rule in group["rules"]]

    def alerts(self) -> list[dict[str, Any]]:
        """The alerts pending or firing now."""
        alerts: list[dict[str, Any]] = self._get("/api/v1/alerts")["alerts"]
        return alerts

    def runtime_info(self) -> dict[str, Any]:
        """The server's runtime information (storageRetention, ...)."""
        info: dict[str, Any] = self._get("/api/v1/status/runtimeinfo")
        return info

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=self.timeout_s) as r:
                return bool(r.status == 200)
        except OSError:
            return False

"""A real Prometheus server (Debian's `prometheus`, the package that also gives promtool)
scraping a local stack: every sidecar's /metrics and every Envoy's /stats/prometheus,
with slogate's alert rules loaded. For the tests that check alerts and dashboards against
real series, and for `slogate up --prometheus`."""

from __future__ import annotations

import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from extproc.runtime.processes import ManagedProcess
from tooling.stack.processes import free_port
from tooling.stack.prometheus_api import PrometheusApi

HOST = "127.0.0.1"
PROMETHEUS_INSTALL_HINT = "apt-get install prometheus (Debian's package; `make promtool` does it)"


def prometheus_binary() -> str | None:
    return shutil.which("prometheus")


@dataclass(frozen=True)
class ScrapeJob:
    name: str
    targets: Sequence[str]  # host:port
    metrics_path: str = "/metrics"


def stack_jobs(sidecar_metrics: Sequence[int], envoy_admin: Sequence[int]) -> list[ScrapeJob]:
    """The jobs of a stack: its sidecars' metrics ports and its Envoys' admin ports."""
    return [
        ScrapeJob("slogate", [f"{HOST}:{p}" for p in sidecar_metrics]),
        ScrapeJob("envoy", [f"{HOST}:{p}" for p in envoy_admin], "/stats/prometheus"),
    ]


def prometheus_config(
    jobs: Sequence[ScrapeJob], rule_files: Sequence[Path], scrape_interval_s: float
) -> dict[str, object]:
    interval = f"{scrape_interval_s:g}s"
    return {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "rule_files": [str(p.resolve()) for p in rule_files],  # else relative to the config
        "scrape_configs": [
            {
                "job_name": job.name,
                "metrics_path": job.metrics_path,
                "static_configs": [{"targets": list(job.targets)}],
            }
            for job in jobs
        ],
    }


class PrometheusServer:
    """One Prometheus on a free port of 127.0.0.1, its data in `work_dir`; stop() by pid."""

    def __init__(
        self,
        work_dir: Path,
        jobs: Sequence[ScrapeJob],
        rule_files: Sequence[Path] = (),
        scrape_interval_s: float = 15.0,
        port: int = 0,
    ) -> None:
        self.work_dir = work_dir
        self.port = port or free_port(HOST)
        self.config_path = work_dir / "prometheus.yml"
        config = prometheus_config(jobs, rule_files, scrape_interval_s)
        work_dir.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
        binary = prometheus_binary()
        if binary is None:
            raise FileNotFoundError(f"no prometheus on PATH: {PROMETHEUS_INSTALL_HINT}")
        self.process = ManagedProcess(
            "prometheus",
            [
                binary,
                f"--config.file={self.config_path}",
                f"--storage.tsdb.path={work_dir / 'data'}",
                f"--web.listen-address={HOST}:{self.port}",
                "--web.enable-lifecycle",  # POST /-/reload after a rules file changes
                "--log.level=warn",
            ],
            work_dir,
        )

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def api(self) -> PrometheusApi:
        return PrometheusApi(self.url)

    def start(self, timeout_s: float = 60.0) -> PrometheusServer:
        self.process.start()
        self.process.wait_for_http(f"{self.url}/-/ready", timeout_s)
        return self

    def wait_for_targets(self, timeout_s: float = 30.0) -> None:
        """Until every target has been scraped and is up (the scrape manager applies a new
        configuration's targets ~5 s after start)."""
        deadline = time.monotonic() + timeout_s
        api = self.api()
        while time.monotonic() < deadline:
            targets = api.targets()
            if targets and all(t["health"] == "up" for t in targets):
                return
            time.sleep(0.5)
        raise TimeoutError(f"Prometheus targets not all up after {timeout_s} s: {api.targets()}")

    def stop(self) -> None:
        self.process.stop()

    def log_text(self) -> str:
        return self.process.log_text()

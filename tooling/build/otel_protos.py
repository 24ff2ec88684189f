"""Puts OpenTelemetry's own protos back over xds-protos' copy of them.

xds-protos (Envoy's protos, which the sidecar needs) and opentelemetry-proto (the tracing
extra's OTLP exporter needs it) both install `opentelemetry/proto/...`; whichever pip writes
last wins, and xds-protos' copy is older (its common_pb2 has no InstrumentationScope, so
the exporter fails to import). In one `pip install` the order is pip's: a clean clone got
xds-protos' copy, a venv that gained the tracing extra later got OpenTelemetry's. The
project's install steps run this after pip: it reinstalls opentelemetry-proto's files when
they are the older ones (the newer copy is a superset: Envoy's protos that import them load).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import subprocess
import sys


def shadowed() -> bool:
    """True when opentelemetry-proto is installed but its files are xds-protos' copy."""
    try:
        common = importlib.import_module("opentelemetry.proto.common.v1.common_pb2")
    except ImportError:
        return False  # the tracing extra is not installed: nothing to repair
    return not hasattr(common, "InstrumentationScope")


def main() -> int:
    if not shadowed():
        return 0
    version = importlib.metadata.version("opentelemetry-proto")
    print(f"otel_protos: reinstalling opentelemetry-proto {version} over xds-protos' copy")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--force-reinstall", "--no-deps",
         f"opentelemetry-proto=={version}"],
        check=True,
    )  # fmt: skip
    # Asked again in a fresh interpreter: this one holds the old module.
    check = "import sys, tooling.build.otel_protos as o; sys.exit(1 if o.shadowed() else 0)"
    return subprocess.run([sys.executable, "-c", check], check=False).returncode


if __name__ == "__main__":
    sys.exit(main())

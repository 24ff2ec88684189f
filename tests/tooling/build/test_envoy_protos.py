"""extproc/envoypb/ is what tooling/build/envoy_protos.py generates from protos/upstream/, and it
speaks Envoy's services under their own names."""

from __future__ import annotations

from pathlib import Path

from extproc.envoypb.envoy.service.accesslog.v3 import als_pb2
from extproc.envoypb.envoy.service.ext_proc.v3 import external_processor_pb2
from tooling.build import envoy_protos


def test_the_checked_in_modules_are_what_the_protos_generate(tmp_path: Path) -> None:
    fresh = envoy_protos.generate(tmp_path)
    committed = envoy_protos.checked_in()
    assert sorted(fresh) == sorted(committed), "files differ: run `make protos`"
    stale = [name for name, text in fresh.items() if committed[name] != text]
    assert not stale, f"stale: {stale}: run `make protos`"


def test_every_upstream_proto_is_one_the_services_need() -> None:
    """protos/upstream/ holds the services' closure and nothing more."""
    vendored = sorted(
        path.relative_to(envoy_protos.SOURCES).as_posix()
        for path in envoy_protos.SOURCES.rglob("*.proto")
    )
    assert vendored == envoy_protos.closure()


def test_the_services_keep_envoys_names_on_the_wire() -> None:
    """The Python modules moved under extproc.envoypb; the gRPC paths Envoy calls did not."""
    services = {
        external_processor_pb2.DESCRIPTOR.services_by_name["ExternalProcessor"].full_name,
        als_pb2.DESCRIPTOR.services_by_name["AccessLogService"].full_name,
    }
    assert services == {
        "envoy.service.ext_proc.v3.ExternalProcessor",
        "envoy.service.accesslog.v3.AccessLogService",
    }
    assert external_processor_pb2.DESCRIPTOR.name == (
        "envoy/service/ext_proc/v3/external_processor.proto"
    )

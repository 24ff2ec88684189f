"""Generates extproc/envoypb/: the Envoy API messages slogate speaks, and nothing else.

The sources are Envoy's own .proto files, copied unchanged into protos/upstream/ (where
each comes from: protos/README.md). slogate serves two Envoy services — ext_proc and the
gRPC access log — so the roots below are their two files; every file they import, and
only those, is generated with them (20 files, not the 766 of a package of all Envoy's
protos). protoc writes imports from the proto paths (`from envoy.config.core.v3 import
...`); they are rewritten under `extproc.envoypb.` so that the modules belong to slogate
alone and overwrite no other package's files. The proto package names, which are what
goes on the wire (`/envoy.service.ext_proc.v3.ExternalProcessor/Process`), are unchanged.

`make protos` runs `main()`; tests/tooling/build/test_envoy_protos.py regenerates into a temporary
folder and fails when the checked-in modules differ (grpcio-tools is pinned in the test
extra for that).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from importlib import resources
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ROOT / "protos" / "upstream"
PACKAGE = ROOT / "extproc" / "envoypb"
# The services slogate implements; their imports bring the rest.
SERVICES = (
    "envoy/service/ext_proc/v3/external_processor.proto",
    "envoy/service/accesslog/v3/als.proto",
)
# Top-level proto folders whose generated modules live under extproc.envoypb.
_OURS = ("envoy", "udpa", "validate", "xds")
_IMPORT = re.compile(r'^import (?:public |weak )?"([^"]+)";', re.MULTILINE)
_GENERATED_IMPORT = re.compile(rf"^from ({'|'.join(_OURS)})([. ])", re.MULTILINE)
# The package's own opening, which the generator keeps: everything else under it is generated.
_KEPT = ("__init__.py",)


def closure(roots: tuple[str, ...] = SERVICES) -> list[str]:
    """The roots and every non-google file they import, transitively, in a stable order."""
    seen: set[str] = set()
    pending = list(roots)
    while pending:
        name = pending.pop()
        if name in seen or name.startswith("google/protobuf/"):
            continue  # protobuf's own well-known types come with protobuf
        seen.add(name)
        pending.extend(_IMPORT.findall((SOURCES / name).read_text()))
    return sorted(seen)


def generate(out: Path) -> dict[str, str]:
    """Every generated file, by its path under extproc/envoypb/, written under `out`."""
    protos = closure()
    well_known = resources.files("grpc_tools") / "_proto"
    with tempfile.TemporaryDirectory() as raw:
        protoc = [sys.executable, "-m", "grpc_tools.protoc", f"-I{SOURCES}", f"-I{well_known}"]
        subprocess.run([*protoc, f"--python_out={raw}", *protos], check=True, cwd=ROOT)
        # Stubs only where there is a service: the other files would get empty ones.
        subprocess.run([*protoc, f"--grpc_python_out={raw}", *SERVICES], check=True, cwd=ROOT)
        files: dict[str, str] = {}
        for path in sorted(Path(raw).rglob("*.py")):
            text = _GENERATED_IMPORT.sub(r"from extproc.envoypb.\1\2", path.read_text())
            files[path.relative_to(raw).as_posix()] = text
    # Packages, so that setuptools finds them and the modules import as extproc.envoypb.*.
    for name in list(files):
        for parent in Path(name).parents[:-1]:
            files.setdefault((parent / "__init__.py").as_posix(), "")
    for name, text in files.items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_text(text)
    return files


def checked_in() -> dict[str, str]:
    """The generated files in the tree now, by the same paths as generate()'s."""
    return {
        path.relative_to(PACKAGE).as_posix(): path.read_text()
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.relative_to(PACKAGE).as_posix() not in _KEPT
    }


def main() -> int:
    for child in PACKAGE.iterdir():
        if child.is_dir():
            shutil.rmtree(child)  # files that the sources no longer produce go too
    files = generate(PACKAGE)
    print(f"envoy_protos: {len(closure())} protos, {len(files)} files in {PACKAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

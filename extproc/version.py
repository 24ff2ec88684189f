"""slogate's version: the one place it is written. The package metadata (pyproject's dynamic
version), `slogate --version` and the image tag the manifests name all read it."""

VERSION = "0.1.0"

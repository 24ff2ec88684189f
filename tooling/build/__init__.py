"""The build: the container image (image), vLLM's CPU install and its workarounds
(vllm_install), OpenTelemetry's protos restored over xds-protos' copy (otel_protos). Run by
the Makefile as `python -m tooling.build.<name>`; not in the wheel (pyproject's
packages.find excludes it).
"""

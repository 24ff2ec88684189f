"""The build: the container image (image), vLLM's CPU install and its workarounds
(vllm_install), and Envoy's API messages generated from protos/upstream/ into
extproc/envoypb/ (envoy_protos). Run by the Makefile as `python -m tooling.build.<name>`; not
in the wheel (pyproject's packages.find excludes it).
"""

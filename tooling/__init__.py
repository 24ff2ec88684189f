"""The `slogate` command and the tools the sidecar never runs, each family in its own package.

- cli/: the command line, one module per subcommand (`serve` is extproc.runtime.serve_command)
- loadtest/: a workload played against a live stack, its prediction, faults and reports;
  calibration of endpoints' latency model
- preflight/: the field's checklists against a running deployment (checks, drills, probes)
- stack/: the local stack (LocalStack), its engines (simulated, vLLM, the tiny model), Redis,
  Prometheus and the OTLP receiver, free ports and process usage
- render/: what renders configuration: the Envoy bootstrap and fragment (envoy_config/),
  Kubernetes (k8s), Istio (mesh), Envoy Gateway (mesh_gateway), alert rules
- build/: the image, vLLM's install, the OpenTelemetry protos (not in the wheel)
- benchmarks/: offline and live measurements (`slogate bench`)
"""

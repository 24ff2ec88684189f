"""What Envoy and operators talk to: the ext_proc servicer (ext_proc, one_message, streamed_mode)
and the access-log servicer (access_log), the admin API (admin, admin_auth, key_admin,
tenant_admin, and its client, admin_client), the one place that turns decisions and errors into
replies (replies), the request's observers (observers: the decision log, the traffic record,
the tracer), Prometheus metrics (metrics, known_series, tenant_series, tenant_family,
engine_metrics, candidate_metrics, genai_metrics), settled usage fed back into counting
(prompt_feedback) and JSON log records (log_records).
"""

"""The sidecar fuzzed at its door: ext_proc streams and access-log messages, built at random
and mutated from real ones, sent to its gRPC port (`slogate fuzz`, tests/tooling/fuzz/).

What lives here: the real message sequences the mutations start from (`seeds`), the cases
a run sends (`cases`), the hypothesis strategies that build them: ext_proc streams
(`ext_proc_cases`), access-log streams (`access_log_cases`), the JSON values both draw
(`json_values`), the byte-level mutations of the seeds (`mutation`); the properties every
exchange must hold, pure (`properties`), a sidecar in a thread of this process spoken to
over real gRPC (`target`), and the time-bounded run that counts inputs and findings
(`campaign`). The sidecar itself is never changed for it.
"""

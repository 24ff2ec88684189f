"""Offline and live measurements of slogate components (`slogate bench`, or
`python -m tooling.benchmarks.<name>`); results under bench/results/, each as a JSON
report and a Markdown page (tooling.benchmarks.reports).

Nothing here is imported by the request path, nor by `slogate serve`.
"""

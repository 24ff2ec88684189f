"""Signals and (later) the tiered breaker and the quota controller.

What lives here: pure arithmetic over what the response path reports — sliding-window
latency histograms and 5xx counts (`breaker.latency`). No I/O: callers inject the clock.
"""

from breaker.latency import LogHistogram, ResponseWindows

__all__ = ["LogHistogram", "ResponseWindows"]

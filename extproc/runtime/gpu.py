"""GPU memory of this node through NVML: the global breaker's memory signal.

What lives here: `GpuMemory`. Without a GPU, a driver or the library, it reports
"unavailable" (usage None: unknown, never an error), which is what every machine without a
GPU sees.
"""

from __future__ import annotations

import logging

log = logging.getLogger("slogate.gpu")


class GpuMemory:
    """Used / total GPU memory of the busiest device on this node, through NVML."""

    def __init__(self) -> None:
        self.available = False
        self.reason = "not initialised"
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
            self._count = pynvml.nvmlDeviceGetCount()
            self.available = self._count > 0
            self.reason = "ok" if self.available else "no GPU devices"
        except Exception as error:  # no driver, no library, no GPU: all mean "unavailable"
            self.reason = f"unavailable: {type(error).__name__}: {error}"

    def usage(self) -> float | None:
        if not self.available:
            return None
        try:
            worst = 0.0
            for index in range(self._count):
                info = self._nvml.nvmlDeviceGetMemoryInfo(
                    self._nvml.nvmlDeviceGetHandleByIndex(index)
                )
                worst = max(worst, float(info.used) / float(info.total))
            return worst
        except Exception as error:
            log.warning("NVML read failed: %s", error)
            return None

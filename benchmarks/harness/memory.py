"""A process's resident memory, as the CPU suites read it: now, its peak since the last reset (VmHWM),
and a background sampler of the peak while a block runs."""

from __future__ import annotations

import os
import threading


def rss_gb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1024 ** 3


def hwm_gb() -> float:
    """The process's peak resident size (VmHWM) since start or the last `reset_peak`."""
    with open("/proc/self/status") as f:
        return next((int(line.split()[1]) / 1024 ** 2 for line in f if line.startswith("VmHWM:")), float("nan"))


def reset_peak() -> bool:
    """Reset VmHWM and ru_maxrss to the current RSS (Linux >= 4.0: clear_refs 5)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


class PeakRSS:
    """Max of the process RSS, sampled every `interval` s by a background thread while the block runs."""

    def __init__(self, interval: float = 0.02):
        self.interval, self.start, self.peak = interval, 0.0, 0.0
        self._stop = threading.Event()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.peak = max(self.peak, rss_gb())

    def __enter__(self):
        self.start = self.peak = rss_gb()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_gb())

    def to_dict(self) -> dict:
        from rlpr.train.metrics import peak_rss_gb

        return {"rss_at_start_gb": round(self.start, 3), "peak_rss_gb": round(self.peak, 3),
                "ru_maxrss_after_gb": round(peak_rss_gb(), 3)}

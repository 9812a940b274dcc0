"""Memory of a part: the process RSS and a background sampler of its peak (the `memory` entry of
each part; each part runs in its own process, so that its peak is its own)."""

from __future__ import annotations

import os
import threading

from rlpr.train.metrics import peak_rss_gb


def rss_gb() -> float:
    try:
        import psutil

        return psutil.Process().memory_info().rss / 1024 ** 3
    except ImportError:  # Linux fallback
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1024 ** 3


class PeakRSS:
    """Max of the process RSS, sampled by a background thread while the block runs."""

    def __init__(self, interval: float = 0.02):
        self.interval = interval
        self.start = self.peak = 0.0
        self._stop = threading.Event()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_gb())
            self._stop.wait(self.interval)

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
        return {"rss_at_start_gb": round(self.start, 3), "peak_rss_gb": round(self.peak, 3),
                "ru_maxrss_after_gb": round(peak_rss_gb(), 3)}

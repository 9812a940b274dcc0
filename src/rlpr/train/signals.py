"""Stopping a run cleanly: SIGINT/SIGTERM finish the current step, checkpoint and exit 0."""

from __future__ import annotations

import signal
import sys
from contextlib import contextmanager

from rlpr.parallel import distributed as dist


@contextmanager
def finish_step_on_signal(trainer):
    """While inside, SIGINT/SIGTERM set `trainer.stop_requested` (the loop finishes the current
    step, checkpoints and exits 0); a second signal aborts. Off the main thread: no handlers."""
    def handler(signum, frame):
        if trainer.stop_requested:
            raise KeyboardInterrupt
        trainer.stop_requested = True
        if dist.is_main():
            print(f"\n{signal.Signals(signum).name}: finishing step {trainer.step + 1}, then saving a "
                  f"checkpoint (again to abort)", file=sys.stderr)

    try:
        previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    except ValueError:  # not the main thread: no handlers
        previous = {}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)

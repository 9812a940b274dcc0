"""A progress bar that shows on a terminal and stays silent in logs and CI."""

from __future__ import annotations

import sys
from contextlib import contextmanager


@contextmanager
def progress_bar(total: int, description: str, enabled: bool | None = None):
    """Yields `advance(n)`; a rich bar on stderr when it is a terminal."""
    if enabled is None:
        enabled = sys.stderr.isatty()
    if not enabled:
        yield lambda n=1: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeRemainingColumn(), console=Console(stderr=True)) as bar:
        task = bar.add_task(description, total=total)
        yield lambda n=1: bar.advance(task, n)

"""Progress on the console: a bar for batch jobs (score, eval) that shows on a terminal and stays
silent in logs and CI, and the training loop's live step display."""

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


class StepDisplay:
    """A live bar with step, reward, kept fraction and seconds per step (a log line per step when
    stderr is not a terminal)."""

    def __init__(self, total: int, start: int, enabled: bool = True):
        self.total, self.start, self.enabled = total, start, enabled
        self.tty = sys.stderr.isatty()
        self._progress = None

    def __enter__(self):
        if self.enabled and self.tty:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self._progress = Progress(TextColumn("step"), MofNCompleteColumn(), BarColumn(),
                                      TextColumn("{task.fields[info]}"), TimeRemainingColumn(),
                                      console=Console(stderr=True))
            self._progress.__enter__()
            self._task = self._progress.add_task("train", total=self.total, completed=self.start, info="")
        return self

    def update(self, step: int, m: dict) -> None:
        if not self.enabled:
            return
        info = (f"reward {m.get('reward/mean', float('nan')):.3f}  B {m.get('reward/score_b_mean', float('nan')):.3f}"
                f"  kept {m.get('filter/kept_frac', float('nan')):.2f}  {m.get('perf/step_s', 0):.1f}s/step")
        if self._progress is not None:
            self._progress.update(self._task, completed=step, info=info)
        else:
            print(f"step {step}/{self.total}  {info}", file=sys.stderr, flush=True)

    def __exit__(self, *exc):
        if self._progress is not None:
            self._progress.__exit__(*exc)

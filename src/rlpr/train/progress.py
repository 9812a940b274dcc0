"""Progress on the console: a bar for batch jobs (score, eval) that shows on a terminal and stays
silent in logs and CI, and the training loop's live step display."""

from __future__ import annotations

import sys
import time
from contextlib import contextmanager


@contextmanager
def progress_bar(total: int, description: str, enabled: bool | None = None, *, interval: float = 30.0,
                 clock=time.monotonic, stream=None):
    """Yields `advance(n)`; a rich bar on stderr when it is a terminal. Otherwise (a log file, a
    pipe, nohup), unless `enabled` is False: a plain line on stderr at most every `interval`
    seconds with the count done and an ETA ("evaluating: 40/138 (29%), 2:31 elapsed, ETA 6:10"),
    so that long work is never silent (issue 35: a 30-minute evaluation printed nothing)."""
    if enabled is False or not total:
        yield lambda n=1: None
        return
    if not sys.stderr.isatty():
        start = clock()
        state = {"done": 0, "said": start}

        def advance(n=1):
            state["done"] += n
            now = clock()
            if now - state["said"] >= interval and state["done"] < total:
                state["said"] = now
                done, elapsed = state["done"], now - start
                eta = format_eta(elapsed / done * (total - done)) if done else "?"
                print(f"{description}: {done}/{total} ({100 * done // total}%), {format_eta(elapsed)} elapsed, "
                      f"ETA {eta}", file=stream or sys.stderr, flush=True)
        yield advance
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeRemainingColumn(), console=Console(stderr=True)) as bar:
        task = bar.add_task(description, total=total)
        yield lambda n=1: bar.advance(task, n)


def format_eta(seconds: float) -> str:
    """m:ss, or h:mm:ss from an hour up."""
    s = max(int(round(seconds)), 0)
    h, m = divmod(s // 60, 60)
    return f"{h}:{m:02d}:{s % 60:02d}" if h else f"{m}:{s % 60:02d}"


class StepDisplay:
    """A live bar with the step, its phase (rollout / reward / update / eval), reward, kept fraction,
    seconds per step and an ETA; a plain log line per step (with the ETA) when stderr is not a
    terminal, and nothing when disabled.

    The ETA is the mean step time so far, evaluation excluded, times the steps left: the wall time
    since the display started, less the time in the "eval" phase, over the steps done since `start`.
    """

    TRAIN_PHASES = ("rollout", "reward", "update")

    def __init__(self, total: int, start: int, enabled: bool = True, console=None, clock=time.monotonic):
        self.total, self.start, self.enabled = total, start, enabled
        self.console, self.clock = console, clock
        self.tty = enabled and (console.is_terminal if console is not None else sys.stderr.isatty())
        self._progress = None
        self.done = start  # the last finished step
        self.phase_name = ""
        self._in_step = False  # a step's phases have begun (an eval in it is labelled with it)
        self._t0 = clock() if enabled else 0.0
        self._eval_s, self._eval_since = 0.0, None

    def __enter__(self):
        if self.enabled and self.tty:
            from rich.console import Console
            from rich.progress import BarColumn, Progress, TextColumn

            self._progress = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[info]}"),
                                      console=self.console or Console(stderr=True))
            self._progress.__enter__()
            self._task = self._progress.add_task(self.label(), total=self.total, completed=self.start, info="")
        return self

    def _end_eval(self) -> None:
        if self._eval_since is not None:
            self._eval_s += self.clock() - self._eval_since
            self._eval_since = None

    def eta(self) -> float | None:
        """Seconds left: mean step time (evaluation excluded) x steps left; None before a step is done."""
        steps = self.done - self.start
        if steps <= 0:
            return None
        eval_s = self._eval_s + (self.clock() - self._eval_since if self._eval_since is not None else 0.0)
        return (self.clock() - self._t0 - eval_s) / steps * max(self.total - self.done, 0)

    def label(self) -> str:
        """"step 3/16 · reward · ETA 4:10" (the ETA once a step is done)."""
        step = min(self.done + 1, self.total) if self._in_step else self.done
        eta = self.eta()
        return " · ".join([f"step {step}/{self.total}", *([self.phase_name] if self.phase_name else []),
                           *([f"ETA {format_eta(eta)}"] if eta is not None else [])])

    def phase(self, name: str) -> None:
        """The current phase: "rollout", "reward" and "update" belong to the next step, "eval" is
        timed apart (left out of the ETA). Shown on the live bar only; a no-op when disabled."""
        if not self.enabled:
            return
        self._end_eval()
        if name == "eval":
            self._eval_since = self.clock()
        self._in_step = self._in_step or name in self.TRAIN_PHASES
        self.phase_name = name
        if self._progress is not None:
            self._progress.update(self._task, description=self.label())

    def update(self, step: int, m: dict) -> None:
        """Step `step` is done, with metrics `m`."""
        if not self.enabled:
            return
        self._end_eval()
        self.done, self.phase_name, self._in_step = step, "", False
        info = (f"reward {m.get('reward/mean', float('nan')):.3f}  B {m.get('reward/score_b_mean', float('nan')):.3f}"
                f"  kept {m.get('filter/kept_frac', float('nan')):.2f}  {m.get('perf/step_s', 0):.1f}s/step")
        if self._progress is not None:
            self._progress.update(self._task, completed=step, info=info, description=self.label())
        else:
            eta = self.eta()
            print(f"step {step}/{self.total}  {info}" + (f"  ETA {format_eta(eta)}" if eta is not None else ""),
                  file=sys.stderr, flush=True)

    def __exit__(self, *exc):
        if self._progress is not None:
            self._progress.__exit__(*exc)

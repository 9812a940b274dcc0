"""Turn-taking between speed.py and its two children, rlpr's trainer and TRL's, so that their steps
alternate (rlpr's step 1, TRL's step 1, ...) and meet the same load: run one after the other, a change of
load between the halves moved the ratio by more than the target's margin. A child says it is ready for
its next unit of work, waits for its turn, does it and says it is done; only one computes at a time.
Standard library only: a child takes its first turn before it imports torch."""

from __future__ import annotations

import os
import subprocess
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

READY, GO, DONE = b"r", b"g", b"d"


class Baton:
    """A child's end: `turn()` around each unit of work. Without a spec (a run not driven by
    speed.py's alternation) every method does nothing."""

    def __init__(self, spec: str | None = None):
        self.ready, self.go = (int(fd) for fd in spec.split(",")) if spec else (None, None)

    def begin(self) -> None:
        """Wait for this side's turn."""
        if self.ready is None:
            return
        os.write(self.ready, READY)
        if os.read(self.go, 1) != GO:
            raise SystemExit("speed.py ended the run")

    def end(self) -> None:
        """Give the turn back."""
        if self.ready is not None:
            os.write(self.ready, DONE)

    @contextmanager
    def turn(self):
        self.begin()
        try:
            yield
        finally:
            self.end()


@dataclass
class Child:
    """speed.py's end of one child: its process, the pipe it signals on and the one it waits on."""
    name: str
    proc: subprocess.Popen
    ready: int
    go: int
    turns: list = field(default_factory=list)  # seconds of each unit of work


def start(name: str, cmd: list[str]) -> Child:
    """Run `cmd` + `--baton READY,GO` as a child that takes turns."""
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    proc = subprocess.Popen([*cmd, "--baton", f"{ready_w},{go_r}"], pass_fds=(ready_w, go_r))
    os.close(ready_w)
    os.close(go_r)
    return Child(name, proc, ready_r, go_w)


def alternate(children: list[Child]) -> list[int]:
    """Give the children turns in order, one unit each per round, until all have exited (a child
    that exits, done or failed, drops out of the rounds). Returns their exit codes."""
    live = list(children)
    while live:
        for child in list(live):
            try:
                if os.read(child.ready, 1) != READY:  # it exited
                    live.remove(child)
                    continue
                os.write(child.go, GO)
                tick = time.monotonic()
                if os.read(child.ready, 1) != DONE:  # it exited during its turn
                    live.remove(child)
                child.turns.append(time.monotonic() - tick)
            except BrokenPipeError:
                live.remove(child)
    codes = []
    for child in children:
        codes.append(child.proc.wait())
        os.close(child.ready)
        os.close(child.go)
    return codes

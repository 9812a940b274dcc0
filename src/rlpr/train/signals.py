"""Stopping a run cleanly: every stop signal of a user's session (`errors.STOP_SIGNALS`: SIGINT,
SIGTERM, SIGHUP) finishes the current step, checkpoints and exits 0; during the final evaluation
(after the final checkpoint is saved) it stops the evaluation and exits 0."""

from __future__ import annotations

import signal
import sys
from contextlib import contextmanager

from rlpr.errors import command_line, stop_signals
from rlpr.parallel import distributed as dist


class EvaluationStopped(Exception):
    """A signal during the final evaluation (single process): the checkpoint already holds every step."""


@contextmanager
def finish_step_on_signal(trainer):
    """While inside, SIGINT/SIGTERM/SIGHUP set `trainer.stop_requested` (the loop finishes the current
    step, checkpoints and exits 0); a second signal aborts. During the final evaluation
    (`end_of_run`) a signal stops it at once in a single process; under torchrun the ranks finish
    it (their collectives must meet). Off the main thread: no handlers."""
    def handler(signum, frame):
        if trainer.stop_requested:
            raise KeyboardInterrupt
        trainer.stop_requested = True
        name = signal.Signals(signum).name
        if getattr(trainer, "in_final_evaluation", False):
            if dist.world_size() == 1:
                raise EvaluationStopped(name)
            if dist.is_main():
                print(f"\n{name} during the final evaluation: the final checkpoint is saved; finishing the "
                      f"evaluation (again to abort)", file=sys.stderr)
            return
        if dist.is_main():
            print(f"\n{name}: finishing step {trainer.step + 1}, then saving a "
                  f"checkpoint (again to abort)", file=sys.stderr)

    try:
        previous = {s: signal.signal(s, handler) for s in stop_signals()}
    except ValueError:  # not the main thread: no handlers
        previous = {}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def end_of_run(trainer) -> dict:
    """After the final checkpoint is saved (inside `finish_step_on_signal`): the message of a run
    stopped by a signal, or the final held-out evaluation, logged. Returns what goes into the
    summary: {"interrupted": True}, {"after": ...} or {}."""
    run_dir, step, steps = trainer.run_dir, trainer.step, trainer.cfg.trainer.max_steps
    if trainer.stop_requested and step < steps:
        _say(f"\nstopped at step {step}; checkpoint saved. Resume with:\n  "
             f"{command_line('rlpr', 'train', '--resume', run_dir)}")
        return {"interrupted": True}
    if trainer.stop_requested:  # during the last step or the final save: no evaluation
        _say(f"\nstopped after the last step ({step}); the final checkpoint is saved. Evaluate it with:\n"
             f"  {command_line('rlpr', 'eval', '--checkpoint', run_dir)} --data ...")
        return {"interrupted": True}
    try:
        trainer.in_final_evaluation = True
        after = trainer.evaluate()
    except EvaluationStopped as e:
        _say(f"\n{e} during the final evaluation: stopped it; the final checkpoint (step {step}) is saved. "
             f"Evaluate it with:\n  {command_line('rlpr', 'eval', '--checkpoint', run_dir)} --data ...")
        return {"interrupted": True}
    finally:
        trainer.in_final_evaluation = False
    if not after:
        return {}
    trainer.tracker.log(step, after)
    return {"after": after}


def _say(message: str) -> None:
    if dist.is_main():
        print(message, file=sys.stderr)

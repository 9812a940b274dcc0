"""Non-finite values stop a run (issue 43, item 1).

A model with a NaN or infinite weight (or logits that overflow) used to train to the end with exit
status 0: its score B was NaN, its loss and gradient norm NaN, the metrics null and the AdamW step
spread the NaN into every weight, which the next checkpoint then saved. After each step (before it
is logged or saved) the step's own values are checked, earliest phase first: the rewards (score B,
score A, the reward), then the update (the logits through their entropy, the loss terms, the
gradient norm). The first that is not finite stops the run with one line naming the step, the
phase, the value and the last good checkpoint, which the stop leaves as it was (the step's update
is never saved). The metrics come summed over every process, so all of them stop together.

The step's values can all be finite while its update is not: a learning rate of 1e308 turns every
trained weight into NaN in `optimizer.step()` itself (issue 60, S1). So the trainable weights and
the optimizer's state are checked too after each step (`stop_on_nonfinite_weights`), and
`save_checkpoint` refuses to write them non-finite whatever the caller checked.
"""

from __future__ import annotations

import math
from pathlib import Path

from rlpr.errors import TrainingError, command_line
from rlpr.model.checkpoint_files import list_checkpoints, nonfinite_tensors
from rlpr.parallel import distributed as dist

# (metric, what it measures, the phase of the step that produced it), in the order they are made
WATCHED = (
    ("reward/score_b_mean", "score B (the policy's probability of the reference)", "reward"),
    ("reward/score_a_mean", "score A (the reference's probability without the response)", "reward"),
    ("reward/mean", "the reward", "reward"),
    ("policy/entropy", "the policy's logits (their entropy)", "update"),
    ("policy/pg_loss", "the policy loss", "update"),
    ("policy/kl", "the KL term", "update"),
    ("policy/ref_sft_logp", "the reference-SFT log-probability", "update"),
    ("policy/grad_norm", "the gradient norm", "update"),
)


class NonFiniteValue(TrainingError):
    """A NaN or infinity in a step's rewards, logits, loss or gradient norm."""


def first_nonfinite(metrics: dict) -> tuple[str, str, str, float] | None:
    """(metric, what, phase, value) of the first watched value that is not finite, or None. The
    update's values count only when the step updated on some tokens (a step whose groups were all
    filtered out reports NaN for them by design)."""
    updated = bool(metrics.get("policy/updates")) and bool(metrics.get("policy/tokens"))
    for key, what, phase in WATCHED:
        value = metrics.get(key)
        if value is None or (phase == "update" and not updated):
            continue
        if isinstance(value, (int, float)) and not math.isfinite(value):
            return key, what, phase, float(value)
    return None


def last_good(run_dir: Path) -> str:
    saved = list_checkpoints(run_dir)
    return (f"the last good checkpoint, {saved[-1].name}, is kept (after fixing the cause: "
            f"{command_line('rlpr', 'train', '--resume', str(run_dir))})" if saved else "no checkpoint was saved")


def stop_on_nonfinite(step: int, metrics: dict, run_dir: Path, policy=None, optimizer=None) -> None:
    """Raise NonFiniteValue (one line) when a watched value of step `step` is not finite, or (given the
    policy and its optimizer) a trainable weight or the optimizer's state (`stop_on_nonfinite_weights`)."""
    found = first_nonfinite(metrics)
    if found is None:
        if policy is not None:
            stop_on_nonfinite_weights(step, policy, optimizer, run_dir)
        return
    key, what, phase, value = found
    raise NonFiniteValue(f"step {step}, {phase} phase: {what} is {value} ({key}); training stopped without saving "
                         f"this step; {last_good(run_dir)}. Check the base model's weights for NaN or infinity, or lower "
                         f"trainer.lr")


def stop_on_nonfinite_weights(step: int, policy, optimizer, run_dir: Path) -> None:
    """Raise NonFiniteValue (one line) when step `step`'s update left a trainable weight or the
    optimizer's state non-finite (every process checks its own part; all stop together)."""
    weights = {n: p.detach() for n, p in policy.named_parameters() if p.requires_grad}
    state = getattr(optimizer, "state", None)
    moments = list(state.values()) if isinstance(state, dict) else []
    bad = nonfinite_tensors(weights) or [f"optimizer state {b}" for b in nonfinite_tensors(moments)]
    if not dist.max_value(float(bool(bad))):
        return
    where = f" ({bad[0]}{f' and {len(bad) - 1} more' if len(bad) > 1 else ''})" if bad else " (on another process)"
    raise NonFiniteValue(f"step {step}, update phase: the optimizer step made the trainable weights or its own state "
                         f"NaN or infinite{where}; training stopped without saving this step; {last_good(run_dir)}. "
                         f"Lower trainer.lr or trainer.grad_clip")

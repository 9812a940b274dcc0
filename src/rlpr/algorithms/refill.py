"""Dynamic sampling's batch filling (algorithm.refill): how many prompts each extra rollout round
draws when the std filter kept fewer than prompts_per_step groups. Pure arithmetic on global counts.

Every round costs whole groups of rollouts, so the modes trade rounds against wasted rollouts:
- estimate: the missing groups divided by the step's keep rate so far (taken as at least 0.25),
  at most prompts_per_step; one round usually fills the batch, and the surplus kept groups' prompts
  go back to the stream's cache (rolled out again, by a newer policy, at a later step);
- missing: exactly the missing groups; no surplus is ever kept, so no rollout is wasted on a group
  that is kept and not trained on, but a round fills only its keep rate of the gap;
- full: prompts_per_step every round (DAPO's over-sampling in whole batches).
"""

from __future__ import annotations

import math
from typing import Callable


def _estimate(want: int, kept: int, generated: int) -> int:
    rate = kept / generated if generated else 1.0
    return min(want, math.ceil((want - kept) / max(rate, 0.25)))


REFILL: dict[str, Callable[[int, int, int], int]] = {
    "estimate": _estimate,
    "missing": lambda want, kept, generated: want - kept,
    "full": lambda want, kept, generated: want,
}


def round_prompts(mode: str, want: int, kept: int, generated: int, round_index: int) -> int:
    """Prompts to roll out in round `round_index` (0-based) of a step that wants `want` groups and
    has kept `kept` of the `generated` groups of its earlier rounds (counts over every rank). The
    first round always draws `want`."""
    if round_index == 0:
        return want
    return max(0, REFILL[mode](want, kept, generated))

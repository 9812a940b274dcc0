"""The adaptive standard-deviation filter with an EMA threshold (spec section 4).

Schedule (defaults): steps 1..10 keep everything; the mean group std of steps 6..10 is recorded;
step 11 starts with ema = mean of those 5 means; from step 12, at the start of step t,
ema = 0.99 * ema + 0.01 * m_{t-1}, m_{t-1} being the mean std over ALL groups generated in step
t-1 before filtering. A group is kept iff std >= beta * ema; NaN/inf std groups are dropped.

Usage per step t: `begin_step(t)`, then `keep(stds)` for each rollout round, then
`end_step(t, mean_std)` with the mean std of all groups generated in step t.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass
class EMAStdFilter:
    beta: float = 0.5
    warmup_steps: int = 10
    init_steps: int = 5
    decay: float = 0.99
    enabled: bool = True
    ema: float | None = None
    history: list[float] = field(default_factory=list)  # warm-up means recorded for the initial EMA
    last_mean: float | None = None  # m_{t-1}

    def begin_step(self, step: int) -> None:
        """Set the EMA used by step `step` (1-based)."""
        if step == self.warmup_steps + 1 and self.ema is None and self.history:
            self.ema = sum(self.history) / len(self.history)
        elif step > self.warmup_steps + 1 and self.ema is not None and self.last_mean is not None:
            self.ema = self.decay * self.ema + (1.0 - self.decay) * self.last_mean

    def active(self, step: int) -> bool:
        return self.enabled and step > self.warmup_steps and self.ema is not None

    def threshold(self, step: int) -> float | None:
        return self.beta * self.ema if self.active(step) else None

    def keep(self, step: int, stds: list[float]) -> list[bool]:
        """Which groups to keep in step `step`; non-finite std is always dropped."""
        limit = self.threshold(step)
        return [math.isfinite(s) and (limit is None or s >= limit) for s in stds]

    def end_step(self, step: int, mean_std: float) -> None:
        """Record the pre-filter mean group std of step `step` (a non-finite mean, when every group
        was NaN/inf, leaves the EMA unchanged at the next step)."""
        if not math.isfinite(mean_std):
            self.last_mean = None
            return
        if self.warmup_steps - self.init_steps < step <= self.warmup_steps:
            self.history.append(mean_std)
        self.last_mean = mean_std

    def state_dict(self) -> dict:
        return {"ema": self.ema, "history": list(self.history), "last_mean": self.last_mean}

    def load_state_dict(self, state: dict) -> None:
        self.ema = state["ema"]
        self.history = list(state["history"])
        self.last_mean = state["last_mean"]

"""The EMA-lagged scorer (`reward.scorer=ema`, `reward.score_a=ema`): an exponential moving average
of the policy's trainable weights, scored with in place of the policy.

NOVER (arXiv 2505.16022) names three proxy models for its reasoning perplexity: the policy, the
frozen initial model, and the policy "with lag". Its reference code (thinkwee/NOVER, trainer.py
`SyncRefLoraModelCallback`, config.py `SYNC_REF_MODEL = True`, `REF_MODEL_MIXUP_ALPHA = 0.9`) keeps a
copy of the LoRA adapter, starts it at the initial adapter and, at every checkpoint save
(`SAVE_STEPS = 100` optimizer steps), mixes

    lagged <- alpha * lagged + (1 - alpha) * policy,   alpha = 0.9.

rlpr does the same with `d = reward.scorer_ema` after every `reward.scorer_ema_every`-th optimizer
step (defaults 0.99 and 1; the reference code's schedule is 0.9 and 100):

    w_0 = theta_0,   w_k = d * w_{k-1} + (1 - d) * theta_k   (at the update steps k),

over the policy's trainable weights: the LoRA adapter (the base model is frozen and shared), or
every weight under full fine-tuning (one more fp32 copy of the model in memory and in each
checkpoint's trainer_state.pt). To score with it, the lagged tensors are swapped into the policy's
parameters (`swapped`: a swap of tensor references, no copy) and swapped back afterwards, so no
second model is built. d = 1 keeps the initial weights, d = 0 follows the policy.

`ema_step` is the pure arithmetic; `LaggedWeights` owns the tensors, the step count and their
state for checkpoints (plain tensors and numbers: loadable with `torch.load(weights_only=True)`).
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

from rlpr.errors import ConfigError

# the trainer strategies under which the swap is safe: every process holds whole, unsharded weights
LAGGED_STRATEGIES = ("ddp",)


@torch.no_grad()
def ema_step(lagged: torch.Tensor, current: torch.Tensor, decay: float) -> None:
    """lagged <- decay * lagged + (1 - decay) * current, in place."""
    lagged.mul_(decay).add_(current.detach(), alpha=1.0 - decay)


def wants_lagged(reward_cfg) -> bool:
    """Whether a reward config scores with the lagged copy (B, A, or both)."""
    return "ema" in (reward_cfg.scorer, reward_cfg.score_a)


class LaggedWeights:
    """An EMA of a model's trainable parameters, updated after optimizer steps and swapped in to score."""

    def __init__(self, model, decay: float, every: int = 1):
        self.params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        if not self.params:
            raise ConfigError("reward.scorer=ema: the policy has no trainable weights to average")
        self.weights = {n: p.detach().clone() for n, p in self.params}
        self.decay, self.every = float(decay), int(every)
        self.steps = 0  # optimizer steps seen

    def update(self) -> None:
        """After an optimizer step: fold the policy's weights in on every `every`-th step."""
        self.steps += 1
        if self.steps % self.every == 0:
            for n, p in self.params:
                ema_step(self.weights[n], p, self.decay)

    def _swap(self) -> None:
        for n, p in self.params:
            p.data, self.weights[n] = self.weights[n], p.data

    @contextmanager
    def swapped(self):
        """The policy carries the lagged weights inside the block (no gradients), its own after."""
        self._swap()
        try:
            with torch.no_grad():
                yield
        finally:
            self._swap()

    def state_dict(self) -> dict:
        return {"steps": self.steps, "weights": dict(self.weights)}

    def load_state_dict(self, state: dict) -> None:
        saved = state["weights"]
        if set(saved) != set(self.weights):
            raise ConfigError("the checkpoint's lagged scorer weights do not match this policy's trainable weights")
        with torch.no_grad():
            for n, w in saved.items():
                self.weights[n].copy_(w)
        self.steps = int(state["steps"])


class NoLagged:
    """A run without the lagged scorer: updates and checkpoints do nothing; it is false."""

    def __bool__(self) -> bool:
        return False

    def update(self) -> None:
        pass

    def state_dict(self) -> None:
        return None

    def load_state_dict(self, state) -> None:
        pass


def lagged_weights(cfg, policy) -> LaggedWeights | NoLagged:
    """The lagged copy a training run needs (`reward.scorer` or `reward.score_a` is `ema`), else a
    `NoLagged`."""
    if not wants_lagged(cfg.reward):
        return NoLagged()
    return LaggedWeights(policy, cfg.reward.scorer_ema, cfg.reward.scorer_ema_every)

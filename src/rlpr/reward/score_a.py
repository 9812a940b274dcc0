"""Score A, the reward's "no reasoning" baseline: log P(y* | prompt) with no response (spec section 2).

One `ScoreA` per reward owns everything about A:

- which model computes it: the model the reward is called with (`reward.score_a=current`, or a
  reward not bound to a policy), the initial policy (`initial`): the adapter-off base of a LoRA
  policy, else a frozen reference copy, else (full fine-tuning without KL) the policy itself,
  for every prompt before the first step (`precompute`), or the EMA-lagged copy of the policy's
  weights (`ema`, rlpr/reward/lagged.py);
- the cache per (prompt text, reference, cue), never recomputed under `initial` and emptied for
  every batch under `current` and `ema`; its `state_dict` is what checkpoints save as `score_a_cache`;
- the dataset's precomputed column (used for format-valid responses, whose A has no cue).

The reward builds A's text and scores it (`reward.score_a_text`, `reward.score_texts`); this
module imports no reward code.
"""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from typing import Callable

from rlpr.errors import TrainingError

log = logging.getLogger("rlpr.train")

# reward.score_a: which policy computes A
SCORE_A_MODELS = ("initial", "current", "ema")
# reward.scorer: which policy scores y* after the reasoning (B; NOVER's P), through the same
# paths as A: the policy, the initial model, or the EMA-lagged copy (NOVER's three proxy models)
SCORERS = ("current", "initial", "ema")
# the choices whose values change as the policy trains: A is recomputed for every batch
MOVING = ("current", "ema")


class ScoreACache:
    """Score A per (prompt text, reference, cue): computed once, never recomputed by default."""

    def __init__(self):
        self._values: dict[tuple[str, str, str], float] = {}

    def __len__(self) -> int:
        return len(self._values)

    def get(self, key):
        return self._values.get(key)

    def put(self, key, value: float) -> None:
        self._values[key] = float(value)

    def state_dict(self) -> list:
        return [[p, r, c, v] for (p, r, c), v in self._values.items()]

    def load_state_dict(self, state: list) -> None:
        self._values = {(p, r, c): float(v) for p, r, c, v in state}


@contextmanager
def initial_policy(policy, lora: bool, reference=None):
    """The initial policy: the adapter-off base of a LoRA policy, else the frozen reference copy."""
    if lora:
        with policy.disable_adapter():
            yield policy
    elif reference is not None:
        yield reference
    else:
        raise ValueError("no initial policy: neither a LoRA adapter to switch off nor a reference copy")


class ScoreA:
    """Score A for one reward: the model that computes it, its cache and state, the precomputed column.

    Unbound (`policy=None`, how a reward starts), A comes from the model the reward is called
    with. Bound to a training policy (`bind`), A comes from the policy as it is now
    (`reward.score_a=current`), from the initial policy (`initial`) or from the policy carrying
    its EMA-lagged weights (`ema`).
    """

    def __init__(self, reward):
        self.reward = reward  # builds A's text and scores it
        self.cache = ScoreACache()
        self.policy = None
        self.lora = False
        self.reference = None
        self.lagged = None

    def bind(self, policy, *, lora: bool = False, reference=None, lagged=None) -> "ScoreA":
        """Compute A from this training policy: the adapter-off base under LoRA, the frozen
        `reference` copy when there is one, else only upfront (`precompute`); `lagged`: the
        policy's EMA-lagged weights (`rlpr.reward.lagged.LaggedWeights`) for `ema`."""
        self.policy, self.lora, self.reference, self.lagged = policy, lora, reference, lagged
        return self

    @property
    def when(self) -> str:
        return self.reward.cfg.score_a

    @property
    def needs_upfront(self) -> bool:
        """Full fine-tuning without a reference copy: A for every prompt before the first step."""
        return (self.policy is not None and self.reward.cfg.debias and self.reward.kind.needs_score_b
                and self.when == "initial"
                and not self.lora and self.reference is None)

    # -- which model ------------------------------------------------------------------------
    @contextmanager
    def initial_policy(self):
        """The initial policy of the bound training policy (adapter off, or the reference copy)."""
        if not self.lora and self.reference is None:
            raise TrainingError("score A for a prompt that was not precomputed before training")
        with initial_policy(self.policy, self.lora, self.reference) as model:
            yield model

    @contextmanager
    def lagged_policy(self):
        """The bound policy carrying its EMA-lagged weights (rlpr/reward/lagged.py) inside the block."""
        if not self.lagged:
            raise TrainingError("the EMA-lagged scorer was asked for, but no lagged weights are bound")
        with self.lagged.swapped():
            yield self.policy

    @contextmanager
    def _model(self, given=None):
        """The model that computes A now: `given` (unbound), the policy (`current`) or the initial one."""
        if self.policy is None:
            if given is None:
                raise ValueError("score A: no model to compute it with (pass one, or bind a policy)")
            yield given
        elif self.when == "current":
            yield self.policy
        elif self.when == "ema":
            with self.lagged_policy() as model:
                yield model
        else:
            with self.initial_policy() as model:
                yield model

    # -- the cache ----------------------------------------------------------------------------
    def key(self, prompt_text: str, reference: str, fallback: bool) -> tuple[str, str, str]:
        return (prompt_text, reference, self.reward.a_cue(fallback) or "")

    def get(self, prompt_text: str, reference: str, fallback: bool) -> float:
        value = self.cache.get(self.key(prompt_text, reference, fallback))
        if value is None:
            raise KeyError("score A not computed for this prompt/reference; call fill first")
        return value

    def fill(self, pairs: list[tuple[str, str, bool]], model=None) -> None:
        """Compute and cache A for (prompt text, reference, fallback-cue?) pairs not yet cached,
        with `model` when unbound, else with the bound policy's model for A."""
        todo = self._uncached(pairs)
        if todo:
            with self._model(model) as scorer:
                self._compute(scorer, todo)

    def _uncached(self, pairs) -> list[tuple[str, str, bool]]:
        todo: dict = {}
        for pair in pairs:
            key = self.key(*pair)
            if self.cache.get(key) is None:
                todo.setdefault(key, pair)
        return list(todo.values())

    def _compute(self, model, todo) -> None:
        tick = time.perf_counter()
        values = self.reward.score_texts(model, [self.reward.score_a_text(*t) for t in todo])
        self.reward.seconds["score_a"] += time.perf_counter() - tick
        for t, v in zip(todo, values):
            self.cache.put(self.key(*t), v)

    def reset(self) -> None:
        """Forget every cached A (they are recomputed when next asked for)."""
        self.cache = ScoreACache()

    def state_dict(self) -> list:
        return self.cache.state_dict()

    def load_state_dict(self, state: list) -> None:
        self.cache.load_state_dict(state)

    # -- what the reward asks for -------------------------------------------------------------
    def values(self, prompt_texts: list[str], references: list[str], fallbacks: list[bool],
               precomputed: list[float | None] | None = None, *, model=None,
               fill: Callable[[list], None] | None = None) -> list[float]:
        """A per response: the precomputed column where given (format-valid responses only: their
        A has no cue), else the cache; the missing pairs are computed in one batch, by `fill(pairs)`
        when given, else by `self.fill` (with `model` when unbound). Bound under `current`, the cache
        is emptied first: A comes from the policy (or its lagged copy) as it is for this batch."""
        if self.policy is not None and self.when in MOVING:
            self.reset()
        precomputed = precomputed or [None] * len(prompt_texts)
        given = [a if not f else None for a, f in zip(precomputed, fallbacks)]
        missing = [(p, y, f) for p, y, f, a in zip(prompt_texts, references, fallbacks, given)
                   if a is None and self.cache.get(self.key(p, y, f)) is None]
        if missing:
            (fill or (lambda pairs: self.fill(pairs, model)))(missing)
        return [float(a) if a is not None else self.get(p, y, f)
                for p, y, f, a in zip(prompt_texts, references, fallbacks, given)]

    def precompute(self, prompts) -> None:
        """A with the policy as it is now (before training: the initial policy) for every prompt
        (objects with `.text` and `.example`), and for its fallback-cue form under
        reward.invalid_fallback=free; prompts whose dataset gives A skip the plain form."""
        self.precompute_texts([(p.text, p.example.reference, p.example.score_a) for p in prompts])

    def precompute_texts(self, rows: list[tuple[str, str, float | None]]) -> None:
        """`precompute` for (prompt text, reference, the dataset's A or None) rows: A with the
        policy as it is now, for the plain form where the dataset gives none and for the
        fallback-cue form under reward.invalid_fallback=free."""
        variants = [False, True] if self.reward.cfg.invalid_fallback == "free" else [False]
        pairs = [(text, reference, f) for text, reference, given in rows
                 for f in variants if f or given is None]
        log.info("computing score A for %d prompt/reference pairs with the initial policy", len(pairs))
        todo = self._uncached(pairs)
        if todo:
            self._compute(self.policy, todo)

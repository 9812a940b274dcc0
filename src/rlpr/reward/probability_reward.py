"""The probability reward end to end: parse, build o', score B and A, debias, shape, combine.

reward = (1 - alpha) * shaping(B - A) + alpha * format  (+ repetition penalty), spec sections 1-3.
B comes from the model passed in (the current policy); A from a cache filled once with the
initial policy (or a precomputed dataset column). `reward.kind` (rlpr/reward/kinds.py) may instead
reward a grader's verdict (`verifier`) or both (`hybrid`); the verifier kind skips B and A.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Callable

from rlpr.config import RewardConfig
from rlpr.errors import ConfigError
from rlpr.reward.kinds import REWARD_KINDS, Scores
from rlpr.reward.parsing import format_reward, has_repetition
from rlpr.reward.scoring import reference_logprobs, aggregate
from rlpr.reward.sequence import ScoredText, build_score_a_text, build_score_b_text, tokenize_scored, turn_cue
from rlpr.reward.shaping import get_shaping


@dataclass
class RewardOutput:
    """Everything computed for one response (all fields are plain values, JSON-ready)."""

    valid: bool
    format: float
    fallback: bool
    score_b: float
    score_a: float
    delta: float
    penalty: float
    reward: float
    correct: float | None = None  # the grader's verdict (1/0) when a grader applies, else None

    def to_dict(self) -> dict:
        return asdict(self)


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


class ProbabilityReward:
    """Computes RLPR rewards for batches of (prompt text, response, reference)."""

    def __init__(self, cfg: RewardConfig, tokenizer, temperature: float = 1.0,
                 max_length: int | None = None):
        self.cfg = cfg
        self.tokenizer = tokenizer
        self.temperature = temperature
        self.max_length = max_length
        self.shaping = get_shaping(cfg.shaping)
        self.kind = REWARD_KINDS[cfg.kind]
        self.eos = tokenizer.eos_token or ""
        self.cache = ScoreACache()
        # the fallback's answer cue: a follow-up user turn (reward.answer_turn) or a literal string
        try:
            self.cue = turn_cue(tokenizer, cfg.answer_turn) if cfg.answer_turn else cfg.answer_cue
        except ValueError as e:
            raise ConfigError(str(e)) from None
        # wall seconds spent in the model forwards of score B and score A (accumulated; reset freely)
        self.seconds = {"score_b": 0.0, "score_a": 0.0}

    # -- the scored texts -------------------------------------------------------------------
    def score_b_text(self, prompt_text: str, response: str, reference: str) -> ScoredText | None:
        return build_score_b_text(prompt_text, response, reference, self.eos, mode=self.cfg.format_mode,
                                  fallback=self.cfg.invalid_fallback, cue=self.cue)

    def _a_cue(self, fallback: bool) -> str | None:
        """The cue before y* in A: the fallback's answer cue (reward.score_a_form=cue), or none
        (the paper's prompt-only A, reward.score_a_form=prompt)."""
        return self.cue if fallback and self.cfg.score_a_form == "cue" else None

    def score_a_text(self, prompt_text: str, reference: str, fallback: bool) -> ScoredText:
        return build_score_a_text(prompt_text, reference, self.eos, cue=self._a_cue(fallback))

    def _scores(self, model, items: list[ScoredText | None]) -> list[float]:
        logps = reference_logprobs(model, self.tokenizer, items, temperature=self.temperature,
                                   max_length=self.max_length, max_batch_tokens=self.cfg.max_batch_tokens)
        return [0.0 if lp is None else aggregate(lp, self.cfg.aggregation) for lp in logps]

    def reference_tokens(self, item: ScoredText | None) -> str:
        """The decoded span of the tokens that were scored ('' when none)."""
        if item is None:
            return ""
        enc = tokenize_scored(self.tokenizer, [item])
        ids = [t for t, m in zip(enc.input_ids[0], enc.ref_mask[0]) if m]
        return self.tokenizer.decode(ids)

    # -- score A ----------------------------------------------------------------------------
    def fill_score_a(self, model, pairs: list[tuple[str, str, bool]]) -> None:
        """Compute and cache A for (prompt text, reference, fallback-cue?) pairs not yet cached."""
        todo: dict = {}
        for pair in pairs:
            key = self._key(*pair)
            if self.cache.get(key) is None:
                todo.setdefault(key, pair)
        todo = list(todo.values())
        if not todo:
            return
        tick = time.perf_counter()
        values = self._scores(model, [self.score_a_text(*t) for t in todo])
        self.seconds["score_a"] += time.perf_counter() - tick
        for t, v in zip(todo, values):
            self.cache.put(self._key(*t), v)

    def _key(self, prompt_text: str, reference: str, fallback: bool):
        return (prompt_text, reference, self._a_cue(fallback) or "")

    def score_a(self, prompt_text: str, reference: str, fallback: bool) -> float:
        value = self.cache.get(self._key(prompt_text, reference, fallback))
        if value is None:
            raise KeyError("score A not computed for this prompt/reference; call fill_score_a first")
        return value

    # -- the reward -------------------------------------------------------------------------
    def __call__(self, model, prompt_texts: list[str], responses: list[str], references: list[str], *,
                 score_a_model=None, fill_a: Callable[[list], None] | None = None,
                 precomputed_a: list[float | None] | None = None,
                 correct: list[bool | None] | None = None) -> list[RewardOutput]:
        """Rewards for parallel lists. B uses `model` (the current policy). A comes from
        `precomputed_a` (a dataset column; used for format-valid responses, whose A has no cue),
        else from the cache; missing entries are filled by `fill_a(pairs)`, by default computed
        with `score_a_model` (default: `model`). `correct` holds the grader's verdicts (None where
        no grader applies); the verifier and hybrid kinds need it."""
        n = len(responses)
        precomputed_a = precomputed_a or [None] * n
        correct = correct or [None] * n
        if self.kind.needs_grader and n and all(c is None for c in correct):
            raise ValueError(f"reward.kind={self.cfg.kind} needs the grader's verdicts (correct=[...])")
        items = [self.score_b_text(p, r, y) for p, r, y in zip(prompt_texts, responses, references)]
        if not self.kind.needs_score_b:  # verifier: no forward pass; B and A reported as 0
            return [self.combine(r, it is not None and not it.fallback, it is not None and it.fallback, 0.0, 0.0, c)
                    for r, it, c in zip(responses, items, correct)]
        tick = time.perf_counter()
        scores_b = self._scores(model, items)
        self.seconds["score_b"] += time.perf_counter() - tick
        fallbacks = [it is not None and it.fallback for it in items]
        given = [a if not f else None for a, f in zip(precomputed_a, fallbacks)]
        if self.cfg.debias:
            missing = [(p, y, f) for p, y, f, a in zip(prompt_texts, references, fallbacks, given)
                       if a is None and self.cache.get(self._key(p, y, f)) is None]
            if fill_a is None:
                a_model = score_a_model if score_a_model is not None else model
                fill_a = lambda pairs: self.fill_score_a(a_model, pairs)  # noqa: E731
            if missing:
                fill_a(missing)
        outputs = []
        for i in range(n):
            if not self.cfg.debias:
                a = 0.0
            elif given[i] is not None:
                a = float(given[i])
            else:
                a = self.score_a(prompt_texts[i], references[i], fallbacks[i])
            outputs.append(self.combine(responses[i], items[i] is not None and not fallbacks[i],
                                        fallbacks[i], scores_b[i], a, correct[i]))
        return outputs

    def combine(self, response: str, valid: bool, fallback: bool, b: float, a: float,
                correct: bool | None = None) -> RewardOutput:
        """Final reward of one response from its scores (pure arithmetic, spec section 3; the
        reward kind decides what counts, rlpr/reward/kinds.py)."""
        cfg = self.cfg
        fmt = format_reward(response, cfg.format_mode)
        delta = self.shaping(b - a) if self.kind.needs_score_b else 0.0  # an invalid response has b = 0
        verdict = None if correct is None else float(bool(correct))
        reward = self.kind.combine(Scores(delta, verdict or 0.0, fmt), cfg.alpha, cfg.pr_weight, cfg.vr_weight)
        penalty = 0.0
        if cfg.repetition_penalty and (reward != 0.0 or not cfg.repetition_only_nonzero):
            if has_repetition(response, cfg.repetition_window, cfg.repetition_count):
                penalty = -1.0
        return RewardOutput(valid=valid, format=fmt, fallback=fallback, score_b=b, score_a=a,
                            delta=delta, penalty=penalty, reward=reward + penalty, correct=verdict)

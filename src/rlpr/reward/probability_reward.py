"""The probability reward end to end: parse, build o', score B and A, debias, shape, combine.

reward = (1 - alpha) * shaping(B - A) + alpha * format  (+ repetition penalty), spec sections 1-3.
B comes from the model passed in (the current policy); A from the reward's `ScoreA`
(rlpr/reward/score_a.py: the initial or current policy, its cache, a precomputed dataset column).
`reward.kind` (rlpr/reward/kinds.py) may instead reward a verifier's verdict (`verifier`) or both
(`hybrid`); the verifier kind skips B and A. `reward.verifier` (rlpr/reward/verifiers.py) picks that
verdict: the eval grader's (`oracle`) or a normalized exact match (`exact`). `nover` ranks the group's responses by reasoning
perplexity (rlpr/reward/nover.py) from the same reference log-probs. `reward.scorer` picks the
model that scores y* after the reasoning: the policy (`current`), the initial one (`initial`) or
the policy's EMA-lagged weights (`ema`, rlpr/reward/lagged.py). A group-level aggregation
(`reward.aggregation=r3`, rlpr/reward/r3.py) scores B from the whole group's reference log-probs at once.
"""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Callable

from rlpr.config import RewardConfig
from rlpr.errors import ConfigError
from rlpr.model.forward import causal_lm
from rlpr.reward.kinds import REWARD_KINDS, Scores
from rlpr.reward.label_free import LabelFreeBatch, response_keys
from rlpr.reward.nover import (consecutive_groups, group_efficiency_rewards, reasoning_perplexity,
                               reasoning_text)
from rlpr.reward.parsing import format_reward, has_repetition
from rlpr.reward.score_a import ScoreA
from rlpr.reward.scoring import (GROUP_AGGREGATIONS, aggregate, group_scores, reference_logprobs,
                                 response_distribution_stats)
from rlpr.reward.sequence import ScoredText, build_score_a_text, build_score_b_text, tokenize_scored, turn_cue
from rlpr.reward.shaping import get_shaping
from rlpr.reward.verifiers import VERIFIERS

log = logging.getLogger(__name__)


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
    correct: float | None = None  # the eval grader's verdict (1/0) when a grader applies, else None
    # the verdict the reward used (reward.verifier, 1/0) for kind=verifier and hybrid, else None
    verified: float | None = None
    perplexity: float | None = None  # NOVER's reasoning perplexity (reward.kind=nover; None: gated out)
    efficiency: float | None = None  # NOVER's efficiency term R_e (reward.efficiency_weight > 0)
    # score B's text (prompt, response, reference) was longer than the model's context: B is 0
    # because it could not be scored, not because the model gave y* no probability
    too_long: bool = False
    # the reference this response was scored against: its own, or under reward.shuffle_references
    # another prompt's (the samples files record it beside the true one; issue 43)
    scored_reference: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)


class ProbabilityReward:
    """Computes RLPR rewards for batches of (prompt text, response, reference)."""

    def __init__(self, cfg: RewardConfig, tokenizer, temperature: float = 1.0,
                 max_length: int | None = None, pack: bool = False):
        self.cfg = cfg
        self.tokenizer = tokenizer
        self.temperature = temperature
        self.max_length = max_length
        self.shaping = get_shaping(cfg.shaping)
        self.kind = REWARD_KINDS[cfg.kind]
        self.verifier = VERIFIERS[cfg.verifier]
        self.eos = tokenizer.eos_token or ""
        self.score_a = ScoreA(self)  # A's model, cache and state (rlpr/reward/score_a.py)
        # the fallback's answer cue: a follow-up user turn (reward.answer_turn) or a literal string
        try:
            self.cue = turn_cue(tokenizer, cfg.answer_turn) if cfg.answer_turn else cfg.answer_cue
        except ValueError as e:
            raise ConfigError(str(e)) from None
        # wall seconds spent in the model forwards of score B and score A (accumulated; reset freely)
        self.seconds = {"score_b": 0.0, "score_a": 0.0}
        self.warned_too_long = False  # one warning per reward; reward/too_long_frac counts every step
        self.seed = 0  # the run's seed (the trainer sets trainer.seed): what kind=random draws with
        self.pack = pack  # trainer.pack_responses as the trainer resolved it: the scoring forwards' rows

    # -- the scored texts -------------------------------------------------------------------
    def score_b_text(self, prompt_text: str, response: str, reference: str) -> ScoredText | None:
        return build_score_b_text(prompt_text, response, reference, self.eos, mode=self.cfg.format_mode,
                                  fallback=self.cfg.invalid_fallback, cue=self.cue, span=self.cfg.score_span)

    @property
    def cache(self):
        """The score A cache (owned by `self.score_a`)."""
        return self.score_a.cache

    def a_cue(self, fallback: bool) -> str | None:
        """The cue before y* in A: the fallback's answer cue (reward.score_a_form=cue), or none
        (the paper's prompt-only A, reward.score_a_form=prompt)."""
        return self.cue if fallback and self.cfg.score_a_form == "cue" else None

    def score_a_text(self, prompt_text: str, reference: str, fallback: bool) -> ScoredText:
        return build_score_a_text(prompt_text, reference, self.eos, cue=self.a_cue(fallback))

    def reference_logprobs(self, model, items: list[ScoredText | None], too_long: list[int] | None = None,
                           caches: list | None = None) -> list:
        """Per item, the log-probs of its reference tokens under `model` (None: unscored); the
        indices of items longer than the model's context are appended to `too_long`. `caches`: per
        item, its rollout's kept KV cache computed with `model`'s weights, or None (`scoring.reference_logprobs`)."""
        return reference_logprobs(model, self.tokenizer, items, temperature=self.temperature,
                                  max_length=self.max_length, max_batch_tokens=self.cfg.max_batch_tokens,
                                  splice=self.cfg.splice, too_long=too_long, caches=caches, pack=self.pack,
                                  on_copy=self.cfg.score_b_on_copy)

    def score_texts(self, model, items: list[ScoredText | None], too_long: list[int] | None = None,
                    caches: list | None = None) -> list[float]:
        """A per-sequence aggregation of each item's reference log-probs (0.0 where unscored)."""
        logps = self.reference_logprobs(model, items, too_long, caches)
        return [0.0 if lp is None else aggregate(lp, self.cfg.aggregation) for lp in logps]

    def score_b(self, model, items: list[ScoredText | None], groups: list | None,
                too_long: list[int] | None = None, caches: list | None = None) -> list[float]:
        """Score B per item: `score_texts`, or with a group-level aggregation (r3) the scores of
        each group's items weighed together (items of one group with identical reference tokens)."""
        if self.cfg.aggregation not in GROUP_AGGREGATIONS:
            return self.score_texts(model, items, too_long, caches)
        return group_scores(self.reference_logprobs(model, items, too_long, caches), self.reference_keys(items),
                            groups, self.cfg.aggregation)

    def scorer_caches(self, caches: list | None) -> list | None:
        """The rollouts' kept caches that B's scorer may continue: all of them when B is scored by the
        model passed in (reward.scorer=current, or a reward bound to no policy), else none (the
        initial or lagged weights did not compute them); None when reward.score_b_from_cache=never."""
        if caches is None or self.cfg.score_b_from_cache == "never" or not any(c is not None for c in caches):
            return None
        return caches if self.cfg.scorer == "current" or self.score_a.policy is None else None

    def flag_too_long(self, outputs: list[RewardOutput], too_long: list[int]) -> list[RewardOutput]:
        """Mark the outputs whose score B text did not fit the model's context (`too_long`), with one
        warning per reward the first time (issue 29: they scored B = 0 in silence)."""
        for i in too_long:
            outputs[i].too_long = True
        if too_long and not self.warned_too_long:
            self.warned_too_long = True
            log.warning("%d of %d responses are longer with their prompt and reference than the model's context "
                        "(%d tokens): their score B is 0 because they cannot be scored (reward/too_long_frac counts "
                        "them each step; shorten data.max_prompt_tokens, rollout.max_new_tokens or the references)",
                        len(set(too_long)), len(outputs), self.max_length)
        return outputs

    def reference_keys(self, items: list[ScoredText | None]) -> list[tuple[int, ...] | None]:
        """The reference token ids of each item as score B tokenizes it (None for no item): the
        alignment key of a group-level aggregation, which compares only items whose keys are equal."""
        todo = [i for i, it in enumerate(items) if it is not None]
        keys: list[tuple[int, ...] | None] = [None] * len(items)
        if todo:
            enc = tokenize_scored(self.tokenizer, [items[i] for i in todo], self.cfg.splice)
            for i, ids, mask in zip(todo, enc.input_ids, enc.ref_mask):
                keys[i] = tuple(t for t, m in zip(ids, mask) if m)
        return keys

    def reference_tokens(self, item: ScoredText | None) -> str:
        """The decoded span of the tokens that were scored ('' when none)."""
        if item is None:
            return ""
        enc = tokenize_scored(self.tokenizer, [item], self.cfg.splice)
        ids = [t for t, m in zip(enc.input_ids[0], enc.ref_mask[0]) if m]
        return self.tokenizer.decode(ids)

    def scored_sequence(self, prompt_text: str, response: str, reference: str) -> tuple[list[int], list[bool]] | None:
        """o' as score B tokenizes it (`reward.splice`): (token ids, reference mask), or None when the
        response has no o' (invalid, no fallback), no reference token, or is longer than the model's
        budget (the texts that score B = 0). The reference-SFT term of the update trains on these."""
        item = self.score_b_text(prompt_text, response, reference)
        if item is None:
            return None
        enc = tokenize_scored(self.tokenizer, [item], self.cfg.splice)
        ids, mask = enc.input_ids[0], enc.ref_mask[0]
        if not any(mask) or mask[0] or (self.max_length is not None and len(ids) > self.max_length):
            return None
        return ids, mask

    @contextmanager
    def scorer(self, model):
        """The model that scores y* after the reasoning (B; NOVER's P): `model` (reward.scorer=current,
        or a reward not bound to a training policy), the bound policy carrying its EMA-lagged
        weights (`ema`), else the bound policy's initial model (the adapter-off base under LoRA,
        or the frozen reference copy), as for score A."""
        if self.cfg.scorer == "current" or self.score_a.policy is None:
            yield model
        elif self.cfg.scorer == "ema":
            with self.score_a.lagged_policy() as lagged:
                yield lagged
        else:
            with self.score_a.initial_policy() as initial:
                yield initial

    def fill_score_a(self, model, pairs: list[tuple[str, str, bool]]) -> None:
        """Compute and cache A with `model` for (prompt text, reference, fallback-cue?) pairs not yet cached."""
        self.score_a.fill(pairs, model)

    # -- the reward -------------------------------------------------------------------------
    def __call__(self, model, prompt_texts: list[str], responses: list[str], references: list[str],
                 **kwargs) -> list[RewardOutput]:
        """`rewards`, each output recording the reference it was scored against (`scored_reference`)."""
        outputs = self.rewards(model, prompt_texts, responses, references, **kwargs)
        for o, y in zip(outputs, references):
            o.scored_reference = y
        return outputs

    def rewards(self, model, prompt_texts: list[str], responses: list[str], references: list[str], *,
                 score_a_model=None, fill_a: Callable[[list], None] | None = None,
                 precomputed_a: list[float | None] | None = None,
                 correct: list[bool | None] | None = None,
                 acceptable: list[list[str]] | None = None,
                 groups: list | None = None, keys: list | None = None,
                 caches: list | None = None) -> list[RewardOutput]:
        """Rewards for parallel lists. B uses `model` (the current policy). A comes from
        `precomputed_a` (a dataset column; used for format-valid responses, whose A has no cue),
        else from `self.score_a`'s cache; missing entries are filled by `fill_a(pairs)`, by default
        computed by the policy `self.score_a` is bound to, else with `score_a_model` (default:
        `model`). `correct` holds the eval grader's verdicts (None where no grader applies), which
        the outputs record; the verifier and hybrid kinds reward the verdicts of `reward.verifier`
        (`verify`: the oracle verifier rewards `correct`, the exact one reads the response against
        the reference and its `acceptable` forms, a list per response). `groups`: a group id per response (a kind that ranks
        within groups, nover, majority, and a group-level aggregation, r3, need them; default: runs of
        consecutive equal prompt and reference). `keys`: (prompt id, response index) per response, what
        kind=random seeds each draw with (default: (group id, position in the group)). `caches`: per
        response, the KV cache its rollout kept (rollout/kept_cache.py), computed with `model`'s weights,
        or None: score B continues it (reward.score_b_from_cache) instead of recomputing o'."""
        n = len(responses)
        precomputed_a = precomputed_a or [None] * n
        correct = correct or [None] * n
        if self.kind.needs_grader and self.verifier.needs_grade and n and all(c is None for c in correct):
            raise ValueError(f"reward.kind={self.cfg.kind} with reward.verifier={self.cfg.verifier} needs the "
                             "grader's verdicts (correct=[...])")
        verified = self.verify(responses, references, acceptable, correct)
        items = [self.score_b_text(p, r, y) for p, r, y in zip(prompt_texts, responses, references)]
        if not self.kind.needs_score_b and self.kind.label_free is None:  # verifier: no forward; B, A reported as 0
            return [self.combine(r, it is not None and not it.fallback, it is not None and it.fallback, 0.0, 0.0, c,
                                 verified=v)
                    for r, it, c, v in zip(responses, items, correct, verified)]
        if groups is None and (self.kind.group_transform is not None or self.kind.label_free is not None
                               or self.cfg.aggregation in GROUP_AGGREGATIONS):
            groups = consecutive_groups(list(zip(prompt_texts, references)))
        if self.kind.label_free is not None:
            return self.label_free(model, prompt_texts, responses, items, groups, keys, correct)
        if self.kind.group_transform is not None:
            return self.ranked(model, responses, items, groups, correct, caches)
        tick = time.perf_counter()
        too_long: list[int] = []
        with self.scorer(model) as scorer:
            scores_b = self.score_b(scorer, items, groups, too_long, self.scorer_caches(caches))
        self.seconds["score_b"] += time.perf_counter() - tick
        fallbacks = [it is not None and it.fallback for it in items]
        a_values = [0.0] * n
        if self.cfg.debias:
            a_model = score_a_model if score_a_model is not None else model
            a_values = self.score_a.values(prompt_texts, references, fallbacks, precomputed_a, model=a_model,
                                           fill=fill_a)
        outputs = [self.combine(responses[i], items[i] is not None and not fallbacks[i], fallbacks[i], scores_b[i],
                                a_values[i], correct[i], verified=verified[i]) for i in range(n)]
        return self.flag_too_long(outputs, too_long)

    def verify(self, responses: list[str], references: list[str], acceptable: list[list[str]] | None,
               correct: list[bool | None]) -> list[bool | None]:
        """The verdict per response that kind=verifier and hybrid reward (`reward.verifier`, over the
        reference and its `acceptable` forms, and the eval grader's verdict `correct`); None for
        every response when the kind reads no verdict."""
        if not self.kind.needs_grader:
            return [None] * len(responses)
        acceptable = acceptable or [[] for _ in responses]
        return [self.verifier.verdict(r, [y, *(acc or [])], c)
                for r, y, acc, c in zip(responses, references, acceptable, correct)]

    def label_free(self, model, prompt_texts: list[str], responses: list[str], items: list[ScoredText | None],
                   groups: list, keys: list | None, correct: list[bool | None]) -> list[RewardOutput]:
        """A reward that reads no reference (kind.label_free, rlpr/reward/label_free.py): r per response,
        the policy run over prompt + response where the kind reads its distributions; B and A are 0."""
        stats: list = []

        def distribution_stats() -> list:
            if not stats:
                tick = time.perf_counter()
                stats.extend(response_distribution_stats(model, self.tokenizer, prompt_texts, responses,
                                                         max_length=self.max_length,
                                                         max_batch_tokens=self.cfg.max_batch_tokens,
                                                         pack=self.pack))
                self.seconds["score_b"] += time.perf_counter() - tick
            return stats

        head = causal_lm(model).get_output_embeddings() if self.kind.reads_policy else None
        batch = LabelFreeBatch(responses=list(responses), groups=list(groups),
                               keys=list(keys) if keys is not None else response_keys(groups), seed=self.seed,
                               random_p=self.cfg.random_p, entropy_last_k=self.cfg.entropy_last_k,
                               vocab_size=head.out_features if head is not None else 0, stats=distribution_stats)
        values = self.kind.label_free(batch)
        return [self.combine(r, it is not None and not it.fallback, it is not None and it.fallback, 0.0, 0.0, c,
                             delta=v) for r, it, c, v in zip(responses, items, correct, values)]

    def ranked(self, model, responses: list[str], items: list[ScoredText | None], groups: list,
               correct: list[bool | None], caches: list | None = None) -> list[RewardOutput]:
        """NOVER (reward.kind=nover): P per response from the scorer's reference log-probs and its
        reasoning length in tokens, gated by the strict format; the reward is the rank within the
        group (`kind.group_transform`). B is reported as the mean log-prob per reference token."""
        tick = time.perf_counter()
        too_long: list[int] = []
        with self.scorer(model) as scorer:
            logps = self.reference_logprobs(scorer, items, too_long, self.scorer_caches(caches))
        self.seconds["score_b"] += time.perf_counter() - tick
        return self.flag_too_long(self.rank_outputs(responses, items, logps, groups, correct), too_long)

    def rank_outputs(self, responses: list[str], items: list[ScoredText | None], logps: list,
                     groups: list, correct: list[bool | None]) -> list[RewardOutput]:
        """`ranked` from the reference log-probs already computed (None: unscored): the gate, P,
        the rank and, with reward.efficiency_weight > 0, NOVER's efficiency term R_e, so that
        delta = R_r + efficiency_weight * R_e."""
        mode, strict = self.cfg.format_mode, self.cfg.nover_gate == "format"
        means = [0.0 if lp is None else lp.float().mean().item() for lp in logps]
        perplexities, lengths = [], []
        for response, item, lp, mean in zip(responses, items, logps, means):
            gated = lp is None or item is None or (strict and (item.fallback or format_reward(response, mode) != 1.0))
            think = reasoning_text(response, mode, whole_if_invalid=not strict)
            length = len(self.tokenizer(think, add_special_tokens=False)["input_ids"]) if think else 0
            perplexities.append(None if gated else reasoning_perplexity(mean, length))
            lengths.append(length)
        ranks = self.kind.group_transform(perplexities, groups)
        weight = self.cfg.efficiency_weight
        efficiency = group_efficiency_rewards(perplexities, lengths, groups) if weight else [None] * len(ranks)
        deltas = [r + weight * e if e is not None else r for r, e in zip(ranks, efficiency)]
        return [self.combine(r, it is not None and not it.fallback, it is not None and it.fallback, b, 0.0, c,
                             delta=d, perplexity=p, efficiency=e)
                for r, it, b, c, d, p, e in zip(responses, items, means, correct, deltas, perplexities, efficiency)]

    def combine(self, response: str, valid: bool, fallback: bool, b: float, a: float,
                correct: bool | None = None, *, verified: bool | None = None, delta: float | None = None,
                perplexity: float | None = None, efficiency: float | None = None) -> RewardOutput:
        """Final reward of one response from its scores (pure arithmetic, spec section 3; the
        reward kind decides what counts, rlpr/reward/kinds.py). `correct` is the eval grader's
        verdict (recorded), `verified` the verifier's (`verify`; what the verifier kinds reward,
        `correct` when not given)."""
        cfg = self.cfg
        fmt = format_reward(response, cfg.format_mode)
        if delta is None:  # given: a group-level kind's value (nover's rank)
            delta = self.shaping(b - a) if self.kind.needs_score_b else 0.0  # an invalid response has b = 0
        verdict = None if correct is None else float(bool(correct))
        used = verdict if verified is None else float(bool(verified))
        reward = self.kind.combine(Scores(delta, used or 0.0, fmt), cfg.alpha, cfg.pr_weight, cfg.vr_weight)
        penalty = 0.0
        if cfg.repetition_penalty and self.kind.sequence_reward and (reward != 0.0 or not cfg.repetition_only_nonzero):
            if has_repetition(response, cfg.repetition_window, cfg.repetition_count):
                penalty = -1.0
        return RewardOutput(valid=valid, format=fmt, fallback=fallback, score_b=b, score_a=a,
                            delta=delta, penalty=penalty, reward=reward + penalty, correct=verdict,
                            verified=used if self.kind.needs_grader else None,
                            perplexity=perplexity, efficiency=efficiency)

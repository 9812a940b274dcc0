"""The registry of rollout engines: its keys are the allowed values of rollout.engine.

Every engine follows `rlpr.rollout.hf.RolloutEngine` (`sync(policy)`, then `generate(...)`
returning `Rollout`s with token ids). `hf` (rlpr's loop over a Hugging Face copy of the policy) is
the default and needs nothing beyond rlpr's dependencies; `vllm` imports vLLM only when built
(`rlpr.rollout.vllm`; docs/vllm.md).
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import replace
from typing import TYPE_CHECKING, Callable

import torch

if TYPE_CHECKING:
    from rlpr.rollout.hf import Rollout


def build_hf(policy, tokenizer, rollout, dtype: torch.dtype):
    from rlpr.rollout.hf import HFRollout

    return HFRollout(policy, tokenizer, dtype, rollout.batch_sequences, rollout.share_prefill, rollout.decode_loop,
                     rollout.min_new_tokens, rollout.stop, rollout.prepacked_weights)


def build_vllm(policy, tokenizer, rollout, dtype: torch.dtype):
    from rlpr.rollout.vllm import VLLMRollout  # vLLM is optional: imported only for this engine

    return VLLMRollout(policy, tokenizer, dtype, rollout)


ENGINES: dict[str, Callable] = {"hf": build_hf, "vllm": build_vllm}


class StopAt:
    """An engine whose responses end at the first of `stops` (rollout.stop), as at EOS: the tokens up
    to the one that completes the stop string (kept, as EOS is), the text before the stop string,
    finished. The engine still decodes up to max_new_tokens; the cut is applied to what it returns."""

    def __init__(self, engine, tokenizer, stops: list[str]):
        self.engine, self.tokenizer, self.stops = engine, tokenizer, [s for s in stops if s]

    def __getattr__(self, name):  # sync, sleep and the rest: the engine's own
        return getattr(self.engine, name)

    def generate(self, prompts, n, **kwargs) -> list[Rollout]:
        return [self.cut(r) for r in self.engine.generate(prompts, n, **kwargs)]

    def cut(self, r: Rollout) -> Rollout:
        at = [i for i in (r.text.find(s) for s in self.stops) if i >= 0]
        if not at:
            return r
        chars = min(at)

        def reaches(k: int) -> bool:  # the first k tokens' text already holds a stop string
            text = self.tokenizer.decode(r.token_ids[:k], skip_special_tokens=True)
            return any(s in text for s in self.stops)

        low, high = 0, len(r.token_ids)  # the smallest k with reaches(k): reaches(high) holds
        while high - low > 1:
            mid = (low + high) // 2
            low, high = (low, mid) if reaches(mid) else (mid, high)
        logprobs = r.logprobs[:high] if r.logprobs is not None else None
        return replace(r, token_ids=r.token_ids[:high], text=r.text[:chars], finished=True, logprobs=logprobs)


def keeping_caches(engine, on: bool = True):
    """A block in which `engine.generate` keeps each response's KV cache for score B (`HFRollout.keeping`;
    vllm: each response's place in the engine's prefix cache, `VLLMRollout.keeping`); a no-op when not
    `on` or for an engine without `keeping`."""
    keeping = getattr(engine, "keeping", None)
    return keeping(on) if on and keeping is not None else nullcontext()


def reusing_prompts(engine):
    """A block in which `engine.generate` computes each prompt's prefill once across calls
    (`HFRollout.reusing_prompts`: the held-out evaluation's greedy, then sampled, pass); a no-op for
    an engine without it (vllm's prefix cache does this by itself)."""
    reusing = getattr(engine, "reusing_prompts", None)
    return reusing() if reusing is not None else nullcontext()


def build_engine(policy, tokenizer, rollout, dtype: torch.dtype):
    """The rollout engine named by `rollout.engine` (a `RolloutConfig`), synced to `policy`.

    `rollout.min_new_tokens` becomes the engine's default for `generate(min_new_tokens=None)`: the
    trainer's rollouts get it without passing it; evaluation and serving pass min_new_tokens=0."""
    try:
        build = ENGINES[rollout.engine]
    except KeyError:
        raise ValueError(f"unknown rollout.engine {rollout.engine!r}; choose one of {', '.join(ENGINES)}") from None
    engine = build(policy, tokenizer, rollout, dtype)
    return StopAt(engine, tokenizer, rollout.stop) if rollout.stop else engine

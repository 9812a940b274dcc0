"""The registry of rollout engines: its keys are the allowed values of rollout.engine.

Every engine follows `rlpr.rollout.hf.RolloutEngine` (`sync(policy)`, then `generate(...)`
returning `Rollout`s with token ids). `hf` (rlpr's loop over a Hugging Face copy of the policy) is
the default and needs nothing beyond rlpr's dependencies; `vllm` imports vLLM only when built
(`rlpr.rollout.vllm`; docs/vllm.md).
"""

from __future__ import annotations

from typing import Callable

import torch

from rlpr.rollout.hf import HFRollout


def build_hf(policy, tokenizer, rollout, dtype: torch.dtype):
    return HFRollout(policy, tokenizer, dtype, rollout.batch_sequences, rollout.share_prefill, rollout.decode_loop,
                     rollout.min_new_tokens)


def build_vllm(policy, tokenizer, rollout, dtype: torch.dtype):
    from rlpr.rollout.vllm import VLLMRollout  # vLLM is optional: imported only for this engine

    return VLLMRollout(policy, tokenizer, dtype, rollout)


ENGINES: dict[str, Callable] = {"hf": build_hf, "vllm": build_vllm}


def build_engine(policy, tokenizer, rollout, dtype: torch.dtype):
    """The rollout engine named by `rollout.engine` (a `RolloutConfig`), synced to `policy`.

    `rollout.min_new_tokens` becomes the engine's default for `generate(min_new_tokens=None)`: the
    trainer's rollouts get it without passing it; evaluation and serving pass min_new_tokens=0."""
    try:
        build = ENGINES[rollout.engine]
    except KeyError:
        raise ValueError(f"unknown rollout.engine {rollout.engine!r}; choose one of {', '.join(ENGINES)}") from None
    return build(policy, tokenizer, rollout, dtype)

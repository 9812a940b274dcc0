"""algorithm.entropy_tokens: the entropy bonus on every token (the spec) or only on responses with a
nonzero advantage, so that a batch without reward signal changes nothing."""

from __future__ import annotations

import pytest
import torch

from rlpr.algorithms.losses import ENTROPY_TOKENS
from rlpr.config import AlgorithmConfig, load_config
from rlpr.errors import ConfigError

pytestmark = pytest.mark.unit


def flat_grads(model):
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


def samples_with(tokenizer, advantages):
    from rlpr.train.update import Sample

    prompt = tokenizer("Q: capital of France?\n", add_special_tokens=False)["input_ids"]
    texts = ("it is Paris", "maybe Rome or Lyon", "Paris.")
    return [Sample(prompt + tokenizer(t, add_special_tokens=False)["input_ids"], len(prompt), a)
            for t, a in zip(texts, advantages)]


def gradient(model, tokenizer, samples, **algorithm):
    from rlpr.train.update import accumulate_gradients

    model.zero_grad(set_to_none=True)
    accumulate_gradients(model, samples, AlgorithmConfig(**algorithm), 2, tokenizer.pad_token_id, 1.0)
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    return torch.cat([g.flatten() for g in grads]) if grads else torch.zeros(1)


def test_no_reward_signal_means_no_update_with_nonzero_advantage(tokenizer):
    from rlpr.model.loading import tiny_llama

    model = tiny_llama(tokenizer, seed=3).train()
    flat = samples_with(tokenizer, [0.0, 0.0, 0.0])  # every group rewarded alike: advantages all 0
    spec = gradient(model, tokenizer, flat, entropy_coef=1e-3)
    assert spec.abs().max() > 0  # the spec's bonus alone still moves the policy (Adam scales it up)
    assert gradient(model, tokenizer, flat, entropy_coef=1e-3, entropy_tokens="nonzero_advantage").abs().max() == 0


def test_nonzero_advantage_keeps_the_bonus_of_responses_with_signal(tokenizer):
    """The gradient equals the policy-gradient term plus the entropy term of the responses with a
    nonzero advantage alone, normalised over all tokens as before."""
    from rlpr.model.loading import tiny_llama

    model = tiny_llama(tokenizer, seed=3).train()
    mixed = samples_with(tokenizer, [0.7, 0.0, -0.7])
    got = gradient(model, tokenizer, mixed, entropy_coef=0.05, entropy_tokens="nonzero_advantage")
    pg_only = gradient(model, tokenizer, mixed, entropy_coef=0.0)
    # the entropy term of samples 0 and 2, over the tokens of all three (token_mean's normaliser)
    tokens = sum(s.response_len for s in mixed)
    model.zero_grad(set_to_none=True)
    hand = 0.0
    for s in (mixed[0], mixed[2]):
        logits = model(torch.tensor([s.input_ids])).logits[0, s.prompt_len - 1:-1].float()
        logp = torch.log_softmax(logits, -1)
        hand = hand - 0.05 * (-(logp.exp() * logp).sum(-1)).sum()
    (hand / tokens).backward()
    entropy_part = flat_grads(model)
    assert torch.allclose(got, pg_only + entropy_part, atol=1e-6, rtol=1e-4)
    spec = gradient(model, tokenizer, mixed, entropy_coef=0.05)
    assert not torch.allclose(got, spec, atol=1e-6, rtol=1e-4)  # the spec's covers sample 1 too


def test_choices_and_default():
    assert tuple(ENTROPY_TOKENS) == ("all", "nonzero_advantage")
    assert load_config("demo").algorithm.entropy_tokens == "all"  # the spec's default
    assert load_config("demo", ["algorithm.entropy_tokens=nonzero_advantage"]).algorithm.entropy_tokens == \
        "nonzero_advantage"
    with pytest.raises(ConfigError, match="algorithm.entropy_tokens: 'x' is not one of all, nonzero_advantage"):
        load_config("demo", ["algorithm.entropy_tokens=x"])

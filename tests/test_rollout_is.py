"""algorithm.rollout_is (issue 18): the importance-sampling correction for a rollout engine whose
log-probs differ from the trainer's, against hand computations: the weights of every mode, the
corrected policy gradient, its metrics and its configuration checks."""

from __future__ import annotations

import math

import pytest
import torch

from rlpr.algorithms.losses import ROLLOUT_IS, rollout_is_weights
from rlpr.config import AlgorithmConfig, load_config
from rlpr.errors import ConfigError

pytestmark = pytest.mark.unit

TRAINER = torch.tensor([-1.0, -2.0, -0.5, -3.0, -1.0])
ENGINE = torch.tensor([-1.5, -1.0, -0.5, -1.0, -1.2])  # differences 0.5, -1, 0 | -2, 0.2
SEQ = torch.tensor([0, 0, 0, 1, 1])


def test_token_modes_by_hand():
    rho = [math.exp(d) for d in (0.5, -1.0, 0.0, -2.0, 0.2)]  # 1.649, 0.368, 1, 0.135, 1.221
    w, out = rollout_is_weights(TRAINER, ENGINE, SEQ, 2, "token_truncate", 0.2, 1.5)
    assert w.tolist() == pytest.approx([1.5, rho[1], 1.0, 0.2, rho[4]])
    assert out.tolist() == [True, False, False, True, False]
    w, out = rollout_is_weights(TRAINER, ENGINE, SEQ, 2, "token_mask", 0.2, 1.5)
    assert w.tolist() == pytest.approx([0.0, rho[1], 1.0, 0.0, rho[4]])
    w, _ = rollout_is_weights(TRAINER, ENGINE, SEQ, 2, "token_truncate", 0.0, math.inf)
    assert w.tolist() == pytest.approx(rho)  # no bounds: the plain ratio


def test_sequence_modes_by_hand():
    # one rho per response from its summed difference: exp(-0.5) = 0.607 and exp(-1.8) = 0.165
    w, out = rollout_is_weights(TRAINER, ENGINE, SEQ, 2, "sequence_truncate", 0.2, 3.0)
    assert w.tolist() == pytest.approx([math.exp(-0.5)] * 3 + [0.2] * 2)
    assert out.tolist() == [False] * 3 + [True] * 2
    w, _ = rollout_is_weights(TRAINER, ENGINE, SEQ, 2, "sequence_mask", 0.2, 3.0)
    assert w.tolist() == pytest.approx([math.exp(-0.5)] * 3 + [0.0] * 2)
    with pytest.raises(ValueError, match="unknown rollout_is mode"):
        rollout_is_weights(TRAINER, ENGINE, SEQ, 2, "none", 0.0, 3.0)
    assert ROLLOUT_IS[0] == "none"


def flat_grads(model):
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


@pytest.mark.parametrize("mode", ["token_truncate", "sequence_mask"])
def test_corrected_gradient_by_hand(tokenizer, mode):
    """One on-policy update (ratio 1): the gradient of -sum_t rho_t A_t log p_t / tokens, with
    rho from the engine's log-probs of the sampled tokens."""
    from rlpr.model.loading import tiny_llama
    from rlpr.train.update import Sample, accumulate_gradients, fill_logprobs

    model = tiny_llama(tokenizer, seed=11).train()
    prompt = tokenizer("Q: capital of France?\n", add_special_tokens=False)["input_ids"]
    samples = [Sample(prompt + tokenizer(r, add_special_tokens=False)["input_ids"], len(prompt), a)
               for r, a in (("it is Paris", 0.8), ("maybe Rome or Lyon", -0.5))]
    fill_logprobs(model, samples, "rollout_logp", 2, tokenizer.pad_token_id, 1.0)
    gen = torch.Generator().manual_seed(0)
    for s in samples:  # an engine that disagrees by up to +-1.2 nats per token
        s.rollout_logp = s.rollout_logp + 1.2 * (2 * torch.rand(s.response_len, generator=gen) - 1)
    cfg = AlgorithmConfig(entropy_coef=0.0, rollout_is=mode, rollout_is_min=0.5, rollout_is_max=1.5)
    model.zero_grad(set_to_none=True)
    stats = accumulate_gradients(model, samples, cfg, 2, tokenizer.pad_token_id, 1.0)
    got = flat_grads(model)

    model.zero_grad(set_to_none=True)
    hand, weights = 0.0, []
    for k, s in enumerate(samples):
        logits = model(torch.tensor([s.input_ids])).logits[0, :-1].float()
        logp = torch.log_softmax(logits, -1).gather(-1, torch.tensor(s.input_ids[1:])[:, None])[:, 0]
        logp = logp[s.prompt_len - 1:]
        diff = logp.detach() - s.rollout_logp
        if mode == "sequence_mask":
            rho = torch.exp(diff.sum()).expand_as(diff)
            rho = torch.where((rho < 0.5) | (rho > 1.5), 0.0, rho)
        else:
            rho = torch.exp(diff).clamp(0.5, 1.5)
        weights.append(rho)
        hand = hand - s.advantage * (rho * logp).sum()
    tokens = sum(s.response_len for s in samples)
    (hand / tokens).backward()
    assert torch.allclose(got, flat_grads(model), atol=1e-6, rtol=1e-4)
    assert stats["is_weight"] == pytest.approx(torch.cat(weights).sum().item(), rel=1e-5)
    assert 0 < stats["is_outside"] < tokens  # the bounds bit on some tokens, not all
    assert stats["logprob_gap"] > 0

    model.zero_grad(set_to_none=True)  # without the correction: a different gradient
    accumulate_gradients(model, samples, AlgorithmConfig(entropy_coef=0.0), 2, tokenizer.pad_token_id, 1.0)
    assert not torch.allclose(got, flat_grads(model), atol=1e-6, rtol=1e-4)


def test_metrics_and_config_checks():
    from rlpr.train.update import UPDATE_SUMS, update_metrics

    totals = dict.fromkeys(UPDATE_SUMS, 0.0) | {"tokens": 10.0, "gap_tokens": 10.0, "logprob_gap": 0.3,
                                                  "is_weight": 9.0, "is_outside": 2.0}
    m = update_metrics(totals, [1.0], 1e-4, AlgorithmConfig(rollout_is="token_truncate"))
    assert m["rollout/is_weight_mean"] == pytest.approx(0.9) and m["rollout/is_outside_frac"] == pytest.approx(0.2)
    assert m["rollout/logprob_gap"] == pytest.approx(0.03)
    assert "rollout/is_weight_mean" not in update_metrics(totals, [1.0], 1e-4, AlgorithmConfig())
    with pytest.raises(ConfigError, match="algorithm.rollout_is corrects for the sampling engine's own log-probs"):
        load_config("demo", ["algorithm.rollout_is=token_truncate"])
    cfg = load_config("demo", ["rollout.engine=vllm", "algorithm.rollout_is=sequence_mask"])
    assert (cfg.algorithm.rollout_is, cfg.algorithm.rollout_is_max) == ("sequence_mask", 3.0)
    with pytest.raises(ConfigError, match="algorithm.rollout_is_min"):
        load_config("demo", ["rollout.engine=vllm", "algorithm.rollout_is=token_mask", "algorithm.rollout_is_min=3"])
    with pytest.raises(ConfigError, match="algorithm.rollout_is"):
        load_config("demo", ["rollout.engine=vllm", "algorithm.rollout_is=tis"])

"""ScoreA on its own: which model computes A, the cache and its checkpoint state, the precomputed
column, upfront precompute and the per-batch reset (rlpr/reward/score_a.py)."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch

from rlpr.config import RewardConfig
from rlpr.errors import TrainingError
from rlpr.model.loading import tiny_llama
from rlpr.reward.probability_reward import ProbabilityReward
from rlpr.reward.score_a import ScoreA, ScoreACache
from rlpr.reward.scoring import score_texts
from rlpr.reward.sequence import build_score_a_text

pytestmark = pytest.mark.unit


def chat(tokenizer, q):
    return tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)


def direct_a(model, tokenizer, prompt, reference, cue=None):
    """A computed by hand: the mean probability of the reference after the prompt (and cue)."""
    return score_texts(model, tokenizer, [build_score_a_text(prompt, reference, tokenizer.eos_token, cue=cue)])[0]


def reward(tokenizer, **kw):
    return ProbabilityReward(RewardConfig(**kw), tokenizer)


def perturbed(model, seed=1):
    """`model` with every weight moved: a policy that has trained."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model


@pytest.fixture
def policy(tokenizer):
    return tiny_llama(tokenizer, seed=0)


def test_unbound_a_is_the_given_models_and_is_cached(tiny_model, tokenizer):
    score_a = reward(tokenizer, invalid_fallback="free").score_a
    q = chat(tokenizer, "Capital of France?")
    values = score_a.values([q, q, q], ["Paris"] * 3, [False, True, False], model=tiny_model)
    plain, cue = direct_a(tiny_model, tokenizer, q, "Paris"), direct_a(tiny_model, tokenizer, q, "Paris", "\n<answer> ")
    assert values == pytest.approx([plain, cue, plain], abs=1e-7)
    assert len(score_a.cache) == 2  # one plain and one cue A
    # cached: another model is not asked again
    again = score_a.values([q], ["Paris"], [False], model=tiny_llama(tokenizer, seed=3))
    assert again == [values[0]]
    assert score_a.get(q, "Paris", True) == values[1]
    with pytest.raises(KeyError, match="not computed"):
        score_a.get(q, "Berlin", False)


def test_precomputed_column_is_used_for_format_valid_responses_only(tiny_model, tokenizer):
    score_a = reward(tokenizer, invalid_fallback="free").score_a
    q = chat(tokenizer, "Q")
    values = score_a.values([q, q], ["Paris", "Paris"], [False, True], [0.25, 0.25], model=tiny_model)
    assert values[0] == 0.25
    assert values[1] == pytest.approx(direct_a(tiny_model, tokenizer, q, "Paris", "\n<answer> "), abs=1e-7)
    assert len(score_a.cache) == 1  # the given A is not cached


def test_state_round_trips_in_the_checkpoint_format(tiny_model, tokenizer):
    score_a = reward(tokenizer).score_a
    q = chat(tokenizer, "Q")
    [a] = score_a.values([q], ["Paris"], [False], model=tiny_model)
    state = score_a.state_dict()
    assert state == [[q, "Paris", "", a]]  # what checkpoints store as score_a_cache
    fresh = reward(tokenizer).score_a
    fresh.load_state_dict(state)
    assert fresh.get(q, "Paris", False) == a and fresh.state_dict() == state
    old = ScoreACache()  # a cache saved before ScoreA existed loads the same way
    old.load_state_dict(state)
    assert old.state_dict() == fresh.state_dict()


def test_initial_a_comes_from_the_reference_copy_after_the_policy_changes(policy, tokenizer):
    reference = copy.deepcopy(policy).eval().requires_grad_(False)
    q = chat(tokenizer, "Capital of France?")
    before = direct_a(policy, tokenizer, q, "Paris")
    perturbed(policy)
    after = direct_a(policy, tokenizer, q, "Paris")
    assert after != pytest.approx(before, abs=1e-6)
    initial = reward(tokenizer, score_a="initial").score_a.bind(policy, reference=reference)
    assert not initial.needs_upfront
    assert initial.values([q], ["Paris"], [False], model=policy) == pytest.approx([before], abs=1e-7)
    current = reward(tokenizer, score_a="current").score_a.bind(policy, reference=reference)
    assert current.values([q], ["Paris"], [False], model=policy) == pytest.approx([after], abs=1e-7)


def test_current_a_is_recomputed_for_every_batch(policy, tokenizer):
    score_a = reward(tokenizer, score_a="current").score_a.bind(policy, reference=copy.deepcopy(policy))
    q = chat(tokenizer, "Q")
    [first] = score_a.values([q], ["Paris"], [False])
    perturbed(policy)
    [second] = score_a.values([q], ["Paris"], [False])
    assert first != pytest.approx(second, abs=1e-6)
    assert second == pytest.approx(direct_a(policy, tokenizer, q, "Paris"), abs=1e-7)
    assert len(score_a.cache) == 1
    score_a.reset()
    assert len(score_a.cache) == 0


def test_initial_a_under_lora_is_the_adapter_off_base(policy, tokenizer):
    from peft import LoraConfig, get_peft_model

    q = chat(tokenizer, "Capital of France?")
    base = direct_a(policy, tokenizer, q, "Paris")
    peft = get_peft_model(policy, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                             init_lora_weights=False))  # a non-zero adapter
    assert direct_a(peft, tokenizer, q, "Paris") != pytest.approx(base, abs=1e-6)
    score_a = reward(tokenizer).score_a.bind(peft, lora=True)
    assert not score_a.needs_upfront
    assert score_a.values([q], ["Paris"], [False]) == pytest.approx([base], abs=1e-7)


def test_full_fine_tuning_without_a_reference_precomputes_upfront(policy, tokenizer):
    score_a = reward(tokenizer, invalid_fallback="free").score_a.bind(policy)
    assert score_a.needs_upfront
    q, given = chat(tokenizer, "Q1"), chat(tokenizer, "Q2")
    prompts = [SimpleNamespace(text=q, example=SimpleNamespace(reference="Paris", score_a=None)),
               SimpleNamespace(text=given, example=SimpleNamespace(reference="Rome", score_a=0.5))]
    score_a.precompute(prompts)
    # plain and cue A for Q1; only the cue A for Q2 (its dataset gives the plain one)
    assert len(score_a.cache) == 3
    before = direct_a(policy, tokenizer, q, "Paris")
    perturbed(policy)
    values = score_a.values([q, given], ["Paris", "Rome"], [False, False], [None, 0.5])
    assert values == pytest.approx([before, 0.5], abs=1e-7)
    with pytest.raises(TrainingError, match="not precomputed before training"):
        score_a.values([chat(tokenizer, "new")], ["Paris"], [False])
    assert not reward(tokenizer, debias=False).score_a.bind(policy).needs_upfront
    assert not reward(tokenizer, score_a="current").score_a.bind(policy).needs_upfront


def test_an_unbound_score_a_needs_a_model(tokenizer):
    score_a = ScoreA(reward(tokenizer))
    with pytest.raises(ValueError, match="no model"):
        score_a.values([chat(tokenizer, "Q")], ["Paris"], [False])

"""NOVER (issue 19, arXiv 2505.16022): the reasoning perplexity against a hand computation, the
group rank with ties, the format gate, reward.scorer=initial, the preset and a training step."""

from __future__ import annotations

import copy
import math

import pytest

from rlpr.config import RewardConfig, load_config
from rlpr.errors import ConfigError
from rlpr.model.loading import tiny_llama
from rlpr.reward.nover import (consecutive_groups, efficiency_rewards, group_efficiency_rewards, group_rank_rewards,
                               length_norm, rank_rewards, reasoning_perplexity, reasoning_text)
from rlpr.reward.probability_reward import ProbabilityReward
from rlpr.reward.scoring import reference_logprobs
from rlpr.reward.sequence import build_score_b_text

pytestmark = pytest.mark.integration  # its trainer runs; the module takes its heaviest tier (docs/testing.md)


def chat(tokenizer, q):
    return tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)


def nover(tokenizer, **kw):
    return ProbabilityReward(RewardConfig(kind="nover", debias=False, repetition_penalty=False, **kw), tokenizer)


def hand_p(model, tokenizer, prompt, response, reference):
    """P by hand: the mean log-prob of y*'s tokens in o', and the think text's token count."""
    item = build_score_b_text(prompt, response, reference, tokenizer.eos_token)
    [lp] = reference_logprobs(model, tokenizer, [item])
    think = response.split("<think>")[1].split("</think>")[0]
    n = len(tokenizer(think, add_special_tokens=False)["input_ids"])
    return math.exp(-(lp.sum().item() / lp.numel()) / max(1.0, 1.0 + math.log10(n)))


def test_length_norm_and_perplexity_by_hand():
    assert length_norm(0) == 1.0 and length_norm(1) == 1.0  # 1 + log10(1) = 1
    assert length_norm(10) == pytest.approx(2.0) and length_norm(1000) == pytest.approx(4.0)
    assert length_norm(5) == pytest.approx(1 + math.log10(5))
    assert reasoning_perplexity(-2.0, 100) == pytest.approx(math.exp(2.0 / 3.0))
    assert reasoning_perplexity(-2.0, 0) == pytest.approx(math.exp(2.0))  # max(1, ...) for no reasoning
    assert reasoning_perplexity(-2.0, 1) == pytest.approx(math.exp(2.0))
    assert reasoning_perplexity(0.0, 50) == 1.0


def test_reasoning_text():
    assert reasoning_text("<think> a b </think>\n<answer> x </answer>") == " a b "
    assert reasoning_text("no tags") == ""
    assert reasoning_text("r <answer> x </answer>", "r1_nothink") == "r "


def test_ranks_with_ties_and_the_gate():
    # r = (m - rank + 1) / m, rank 1..m from the lowest P: the reference code's (m - rank0) / m
    assert rank_rewards([3.0, 1.0, 2.0]) == pytest.approx([1 / 3, 1.0, 2 / 3])
    # ranks ascending: 1.0 -> 1; the two 2.0 share (2 + 3) / 2 = 2.5; 5.0 -> 4; r = (5 - rank) / 4
    assert rank_rewards([2.0, 1.0, 5.0, 2.0]) == pytest.approx([0.625, 1.0, 0.25, 0.625])
    assert rank_rewards([1.0, 1.0, 1.0]) == pytest.approx([2 / 3, 2 / 3, 2 / 3])
    assert rank_rewards([None, 4.0, None, 2.0]) == [0.0, 0.5, 0.0, 1.0]  # gated out: 0
    assert rank_rewards([None, 7.0]) == [0.0, 1.0]  # one gated-in response: 1
    assert rank_rewards([None, None]) == [0.0, 0.0] and rank_rewards([]) == []


def test_ranks_are_per_group():
    assert consecutive_groups(["a", "a", "b", "b", "a"]) == [0, 0, 1, 1, 2]
    assert group_rank_rewards([1.0, 2.0, 9.0, 3.0, 5.0], [7, 7, 8, 8, 7]) == pytest.approx([1.0, 2 / 3, 0.5, 1.0, 1 / 3])


R1 = ["<think> The capital of France is Paris. </think>\n<answer> Paris </answer>",
      "<think> hmm </think>\n<answer> Lyon </answer>",
      "no tags at all",
      "<think> I think it is Paris, the largest city. </think>\n<answer> Paris </answer>"]


def test_efficiency_term_by_hand():
    # R_e(i) = #{j != i: |t_i| < |t_j| and P_i < P_j} / (m - 1) over the gated-in responses
    ps, lengths = [1.0, 2.0, 3.0, 1.5], [10, 20, 5, 30]
    # 0: beats 1 (10<20, 1<2) and 3 (10<30, 1<1.5); not 2 (10>5) -> 2/3
    # 1: beats none (20<30 but 2>1.5) -> 0;  2: beats 1 (5<20, 3>2? no) none -> 0;  3: none -> 0
    assert efficiency_rewards(ps, lengths) == pytest.approx([2 / 3, 0.0, 0.0, 0.0])
    assert efficiency_rewards([1.0, 2.0, 2.0], [5, 6, 6]) == pytest.approx([1.0, 0.0, 0.0])  # ties: strict
    assert efficiency_rewards([None, 2.0, 1.0], [1, 9, 3]) == pytest.approx([0.0, 0.0, 1.0])  # gated: 0, m = 2
    assert efficiency_rewards([None, 1.0], [1, 3]) == [0.0, 0.0]  # fewer than 2 gated in: all 0
    assert group_efficiency_rewards([1.0, 2.0, 1.0, 2.0], [1, 2, 3, 2], ["a", "a", "b", "b"]) == \
        pytest.approx([1.0, 0.0, 0.0, 0.0])


# Reasoning of 0 or 1 tokens has N = 1, so P compares content alone (a long reasoning's larger N
# would otherwise decide every comparison on the random tiny model)
SHORT = ["<think>%s</think>\n<answer> Paris </answer>" % t for t in ("", "Paris", "the", "Rome")] + ["no tags"]


def test_reward_with_the_efficiency_term_against_hand_computation(tiny_model, tokenizer):
    q = chat(tokenizer, "Capital of France?")
    out = nover(tokenizer, alpha=0.5, efficiency_weight=1.0)(tiny_model, [q] * 5, SHORT, ["Paris"] * 5)
    ps, lengths = [], []
    for r in SHORT[:4]:
        [lp] = reference_logprobs(tiny_model, tokenizer, [build_score_b_text(q, r, "Paris", tokenizer.eos_token)])
        n = len(tokenizer(r.split("<think>")[1].split("</think>")[0], add_special_tokens=False)["input_ids"])
        ps.append(math.exp(-(lp.sum().item() / lp.numel()) / (1.0 if n == 0 else max(1.0, 1.0 + math.log10(n)))))
        lengths.append(n)
    assert lengths == [0, 1, 1, 1]
    eff = [sum(1 for j in range(4) if j != i and lengths[i] < lengths[j] and ps[i] < ps[j]) / 3 for i in range(4)]
    eff.append(0.0)  # gated out
    assert 0 < eff[0] < 1 and eff[1:] == [0.0] * 4  # the empty reasoning beats some, not all, length-1 ones
    ranks = rank_rewards(ps + [None])
    assert [o.efficiency for o in out] == pytest.approx(eff)
    assert [o.delta for o in out] == pytest.approx([r + e for r, e in zip(ranks, eff)])
    # (1 - alpha) * (R_r + R_e) + alpha * format: half the reference code's R_f + R_r + R_e
    assert [o.reward for o in out] == pytest.approx([0.5 * (r + e) + (0.5 if i < 4 else 0.0)
                                                     for i, (r, e) in enumerate(zip(ranks, eff))])
    assert nover(tokenizer)(tiny_model, [q] * 5, SHORT, ["Paris"] * 5)[0].efficiency is None  # off by default


def test_reward_against_hand_computation(tiny_model, tokenizer):
    q = chat(tokenizer, "Capital of France?")
    out = nover(tokenizer, alpha=0.1)(tiny_model, [q] * 4, R1, ["Paris"] * 4)
    ps = [hand_p(tiny_model, tokenizer, q, r, "Paris") if i != 2 else None for i, r in enumerate(R1)]
    assert [o.perplexity for o in out[:2]] + [out[3].perplexity] == pytest.approx([ps[0], ps[1], ps[3]], rel=1e-5)
    assert out[2].perplexity is None and out[2].reward == 0.0 and out[2].delta == 0.0  # the format gate
    ranks = rank_rewards(ps)
    assert [o.delta for o in out] == pytest.approx(ranks)
    assert [o.reward for o in out] == pytest.approx([0.9 * r + (0.1 if p is not None else 0.0)
                                                     for r, p in zip(ranks, ps)])
    assert sorted(o.delta for o in out) == pytest.approx([0.0, 1 / 3, 2 / 3, 1.0])


def test_gate_scored_ranks_fallback_responses_with_the_whole_text_as_reasoning(tiny_model, tokenizer):
    # reward.nover_gate=scored: a tagless response scored through the spec-1b fallback enters the
    # rank, its whole text the reasoning t (for models that do not write the tags)
    q = chat(tokenizer, "Capital of France?")
    plain = ["Paris", "It is Paris, the largest city of France.", "Rome", "<think> x </think>\n<answer> Paris </answer>"]
    out = nover(tokenizer, alpha=0.0, invalid_fallback="free", nover_gate="scored")(tiny_model, [q] * 4, plain,
                                                                                     ["Paris"] * 4)
    ps = []
    for r in plain:
        item = build_score_b_text(q, r, "Paris", tokenizer.eos_token, fallback="free")
        [lp] = reference_logprobs(tiny_model, tokenizer, [item])
        think = " x " if "<think>" in r else r
        n = len(tokenizer(think, add_special_tokens=False)["input_ids"])
        ps.append(math.exp(-(lp.sum().item() / lp.numel()) / (1.0 if n == 0 else max(1.0, 1.0 + math.log10(n)))))
    assert [o.perplexity for o in out] == pytest.approx(ps, rel=1e-5)
    assert [o.delta for o in out] == pytest.approx(rank_rewards(ps)) and [o.reward for o in out] == \
        pytest.approx(rank_rewards(ps))
    # the default gate (NOVER's strict format) keeps only the tagged response: reward 1, the others 0
    strict = nover(tokenizer, alpha=0.0, invalid_fallback="free")(tiny_model, [q] * 4, plain, ["Paris"] * 4)
    assert [o.reward for o in strict] == [0.0, 0.0, 0.0, 1.0]
    assert reasoning_text("no tags", whole_if_invalid=True) == "no tags"
    with pytest.raises(ConfigError, match="reward.nover_gate chooses which responses NOVER ranks"):
        load_config("demo", ["reward.nover_gate=scored"])
    with pytest.raises(ConfigError, match="reward.nover_gate"):
        load_config("nover", ["reward.nover_gate=all"])


def test_groups_are_ranked_apart(tiny_model, tokenizer):
    q = chat(tokenizer, "Capital of France?")
    pr = nover(tokenizer)
    both = pr(tiny_model, [q] * 4, R1[:2] * 2, ["Paris"] * 4, groups=[0, 0, 1, 1])
    alone = pr(tiny_model, [q] * 2, R1[:2], ["Paris"] * 2)
    assert [o.delta for o in both] == pytest.approx([o.delta for o in alone] * 2)
    assert sorted(o.delta for o in alone) == [0.5, 1.0]


def test_scorer_initial_keeps_the_initial_models_values(tokenizer):
    policy = tiny_llama(tokenizer, seed=0)
    reference = copy.deepcopy(policy).eval().requires_grad_(False)
    q = chat(tokenizer, "Capital of France?")
    before = [hand_p(policy, tokenizer, q, r, "Paris") for r in (R1[0], R1[1])]
    import torch

    torch.manual_seed(1)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.05 * torch.randn_like(p))
    after = [hand_p(policy, tokenizer, q, r, "Paris") for r in (R1[0], R1[1])]
    assert after != pytest.approx(before, rel=1e-4)
    initial = nover(tokenizer, scorer="initial")
    initial.score_a.bind(policy, reference=reference)
    got = initial(policy, [q] * 2, R1[:2], ["Paris"] * 2)
    assert [o.perplexity for o in got] == pytest.approx(before, rel=1e-5)
    current = nover(tokenizer, scorer="current")
    current.score_a.bind(policy, reference=reference)
    assert [o.perplexity for o in current(policy, [q] * 2, R1[:2], ["Paris"] * 2)] == pytest.approx(after, rel=1e-5)


def test_scorer_initial_under_lora_is_the_adapter_off_base(tokenizer):
    from peft import LoraConfig, get_peft_model

    policy = tiny_llama(tokenizer, seed=0)
    q = chat(tokenizer, "Capital of France?")
    base = hand_p(policy, tokenizer, q, R1[0], "Paris")
    peft = get_peft_model(policy, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                             init_lora_weights=False))
    assert hand_p(peft, tokenizer, q, R1[0], "Paris") != pytest.approx(base, rel=1e-4)
    pr = nover(tokenizer, scorer="initial")
    pr.score_a.bind(peft, lora=True)
    assert pr(peft, [q] * 2, R1[:2], ["Paris"] * 2)[0].perplexity == pytest.approx(base, rel=1e-5)


def test_config_choices_and_checks():
    cfg = load_config("nover")
    r, a = cfg.reward, cfg.algorithm
    assert (r.kind, r.format_mode, r.invalid_fallback, r.debias, r.scorer) == ("nover", "r1", "none", False, "current")
    assert (a.advantage, cfg.data.template) == ("grpo", "r1")
    with pytest.raises(ConfigError, match="reward.debias=false"):
        load_config("demo", ["reward.kind=nover"])
    with pytest.raises(ConfigError, match="reward.scorer"):
        load_config("nover", ["reward.scorer=lagged"])
    assert load_config("nover", ["reward.scorer=initial"]).reward.scorer == "initial"
    assert load_config("nover", ["reward.scorer=ema"]).reward.scorer == "ema"  # tests/test_lagged_scorer.py
    assert load_config("nover", ["reward.efficiency_weight=1"]).reward.efficiency_weight == 1.0
    with pytest.raises(ConfigError, match="reward.efficiency_weight is NOVER's efficiency term: it needs "
                                          "reward.kind=nover"):
        load_config("demo", ["reward.efficiency_weight=1"])


def test_one_step_through_the_command_line(tiny_dir, tmp_path):
    from rlpr.cli.main import main
    from rlpr.train.tracking import read_metrics

    from helpers import common

    assert main(["train", "--preset", "nover", *common(tiny_dir, tmp_path, "nv", 1),
                 "trainer.progress=false", "trainer.eval_before=false", "reward.scorer=initial"]) == 0
    steps = [m for m in read_metrics(tmp_path / "nv") if "policy/tokens" in m]
    assert len(steps) == 1 and math.isfinite(steps[0]["reward/mean"])


def test_step_with_scripted_r1_responses(tiny_dir, tmp_path):
    """Three valid responses ranked 1, 2/3, 1/3 and an invalid one at 0 in every group."""
    from rlpr.train.trainer import Trainer

    from helpers import ScriptedEngine, common

    cfg = load_config("nover", [*common(tiny_dir, tmp_path, "nv2", 1), "trainer.progress=false",
                                "reward.alpha=0"])
    trainer = Trainer(cfg, tmp_path / "nv2")
    trainer.engine = ScriptedEngine(trainer.tokenizer, [R1[0], R1[1], R1[3], R1[2]])
    groups, _ = trainer.collect(1)
    for g in groups:
        assert sorted(o.reward for o in g.rewards) == pytest.approx([0.0, 1 / 3, 2 / 3, 1.0])
        assert g.rewards[3].reward == 0.0 and g.rewards[3].perplexity is None
    metrics = trainer.update(groups)
    assert math.isfinite(metrics["policy/tokens"])

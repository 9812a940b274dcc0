"""R3 token weighting (DRO, arXiv 2506.13351; issue 19): reward.aggregation=r3 against a hand
computation (per-token log-probs from plain forwards -> std across the group -> weights -> reward),
the alignment of reference tokens, the config checks and a training step on the tiny model."""

from __future__ import annotations

import math

import pytest
import torch

from rlpr.config import RewardConfig, choices, load_config
from rlpr.errors import ConfigError
from rlpr.reward.probability_reward import ProbabilityReward
from rlpr.reward.r3 import r3_scores, token_weights
from rlpr.reward.scoring import LOG_DOMAIN, aggregate
from rlpr.reward.sequence import build_score_b_text, tokenize_scored

from helpers import ScriptedEngine, common

pytestmark = pytest.mark.unit


def chat(tokenizer, q):
    return tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=False,
                                         add_generation_prompt=True)


def pstd(xs):
    """Population standard deviation, by hand."""
    m = sum(xs) / len(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / len(xs))


def hand_r3(rows):
    """R3 of each row of a [m][n] list of log-probs: w_j = std_j / sum_k std_k, R3_i = sum_j w_j x_ij."""
    n = len(rows[0])
    sigma = [pstd([r[j] for r in rows]) for j in range(n)]
    w = [s / sum(sigma) for s in sigma] if sum(sigma) > 0 else [1.0 / n] * n
    return [sum(wj * x for wj, x in zip(w, r)) for r in rows]


# -- the arithmetic --------------------------------------------------------------------------------

def test_weights_and_scores_by_hand():
    rows = [[-1.0, -2.0, -3.0], [-1.0, -4.0, -3.0], [-1.0, -3.0, -6.0]]
    w = token_weights(torch.tensor(rows))
    # token 0 never varies (weight 0); std(-2,-4,-3) = sqrt(2/3), std(-3,-3,-6) = sqrt(2)
    s1, s2 = math.sqrt(2 / 3), math.sqrt(2)
    assert w.tolist() == pytest.approx([0.0, s1 / (s1 + s2), s2 / (s1 + s2)])
    got = r3_scores([torch.tensor(r) for r in rows], ["k"] * 3, [0] * 3)
    assert got == pytest.approx(hand_r3(rows))
    # the reasoning that made the varying tokens likely ranks first, whatever the constant token does
    assert got[0] > got[2] and got[1] > got[2]


def test_no_variation_gives_the_mean_log_probability():
    rows = [[-1.0, -3.0], [-1.0, -3.0]]
    assert token_weights(torch.tensor(rows)).tolist() == [0.5, 0.5]
    assert r3_scores([torch.tensor(r) for r in rows], [1, 1], [0, 0]) == [-2.0, -2.0]
    assert r3_scores([torch.tensor([-1.0, -5.0])], [1], [0]) == [-3.0]  # alone: sigma = 0


def test_groups_keys_and_unscored_responses_are_kept_apart():
    a, b, c = [-1.0, -2.0], [-3.0, -2.0], [-0.5, -9.0]
    logps = [torch.tensor(a), None, torch.tensor(b), torch.tensor(c), torch.tensor(c)]
    # responses 0 and 2 share a group and key; 3 is in another group; 4 in group 0 under another key
    got = r3_scores(logps, ["k", "k", "k", "k", "other"], [0, 0, 0, 1, 0])
    assert got[1] is None
    assert got[0] == pytest.approx(hand_r3([a, b])[0]) and got[2] == pytest.approx(hand_r3([a, b])[1])
    assert got[3] == pytest.approx(sum(c) / 2) and got[4] == pytest.approx(sum(c) / 2)


def test_r3_is_a_group_level_aggregation():
    assert "r3" in choices()["reward.aggregation"] and "r3" in LOG_DOMAIN
    with pytest.raises(ValueError, match="whole group"):
        aggregate(torch.tensor([-1.0]), "r3")


# -- on the tiny model -----------------------------------------------------------------------------

R1 = ["<think> The capital of France is Paris. </think>\n<answer> Lyon </answer>",
      "<think> hmm </think>\n<answer> Paris </answer>",
      "<think> It is a city on the Seine, so Paris. </think>\n<answer> x </answer>",
      "<think> no idea at all </think>\n<answer> Paris </answer>"]


def hand_reference_logp(model, ids, mask):
    """log p of each masked token given all tokens before it, from one plain forward."""
    with torch.no_grad():
        rows = torch.log_softmax(model(torch.tensor([ids])).logits[0, :-1].double(), -1)
    return [rows[t - 1, ids[t]].item() for t in range(1, len(ids)) if mask[t]]


def r3_reward(tokenizer, **kw):
    cfg = dict(aggregation="r3", debias=False, shaping="identity", alpha=0.0, invalid_fallback="free",
               repetition_penalty=False, splice="ids")
    return ProbabilityReward(RewardConfig(**{**cfg, **kw}), tokenizer)


def test_reward_against_hand_computation(tiny_model, tokenizer):
    q, ref = chat(tokenizer, "Capital of France?"), "Paris, the capital of France"
    out = r3_reward(tokenizer)(tiny_model, [q] * 4, R1, [ref] * 4, groups=[5] * 4)
    rows = []
    for response in R1:
        item = build_score_b_text(q, response, ref, tokenizer.eos_token)
        enc = tokenize_scored(tokenizer, [item], "ids")
        rows.append(hand_reference_logp(tiny_model, enc.input_ids[0], enc.ref_mask[0]))
    assert len({len(r) for r in rows}) == 1 and len(rows[0]) == 6
    want = hand_r3(rows)
    means = [sum(r) / len(r) for r in rows]
    assert max(abs(w - m) for w, m in zip(want, means)) > 1e-3  # the weights are not uniform here
    assert [o.score_b for o in out] == pytest.approx(want, abs=1e-5)
    assert [o.reward for o in out] == pytest.approx(want, abs=1e-5)  # identity shaping, alpha 0, no A
    # callers that pass no groups: runs of equal prompt and reference form the group
    default = r3_reward(tokenizer)(tiny_model, [q] * 4, R1, [ref] * 4)
    assert [o.score_b for o in default] == pytest.approx(want, abs=1e-5)


def test_two_groups_are_weighed_apart(tiny_model, tokenizer):
    q1, q2 = chat(tokenizer, "Capital of France?"), chat(tokenizer, "Name a river.")
    pr = r3_reward(tokenizer)
    both = pr(tiny_model, [q1, q1, q2, q2], [R1[0], R1[1], R1[2], R1[3]], ["Paris", "Paris", "Seine", "Seine"],
              groups=[0, 0, 1, 1])
    first = pr(tiny_model, [q1, q1], R1[:2], ["Paris"] * 2, groups=[0, 0])
    second = pr(tiny_model, [q2, q2], R1[2:], ["Seine"] * 2, groups=[1, 1])
    assert [o.score_b for o in both] == pytest.approx([o.score_b for o in first + second], abs=1e-6)


def test_a_differently_tokenized_reference_gets_its_own_weights(tiny_model, tokenizer):
    """'<answer>\\nParis': y* follows a newline, so its tokens differ from ' Paris' after '<answer> ';
    that response is weighed alone (its plain mean log-prob) and leaves the others' weights alone."""
    q = chat(tokenizer, "Capital of France?")
    odd = "<think> hmm </think>\n<answer>\nParis </answer>"
    pr = r3_reward(tokenizer)
    keys = pr.reference_keys([pr.score_b_text(q, r, "Paris") for r in (R1[0], odd)])
    assert keys[0] != keys[1]
    out = pr(tiny_model, [q] * 3, [R1[0], odd, R1[1]], ["Paris"] * 3, groups=[0] * 3)
    pair = pr(tiny_model, [q] * 2, [R1[0], R1[1]], ["Paris"] * 2, groups=[0] * 2)
    item = build_score_b_text(q, odd, "Paris", tokenizer.eos_token)
    enc = tokenize_scored(tokenizer, [item], "ids")
    alone = hand_reference_logp(tiny_model, enc.input_ids[0], enc.ref_mask[0])
    assert out[1].score_b == pytest.approx(sum(alone) / len(alone), abs=1e-5)
    assert (out[0].score_b, out[2].score_b) == pytest.approx((pair[0].score_b, pair[1].score_b), abs=1e-6)


def test_config_checks():
    cfg = load_config("demo", ["reward.aggregation=r3", "reward.debias=false", "reward.invalid_fallback=free"])
    assert cfg.reward.aggregation == "r3"
    with pytest.raises(ConfigError, match="reward.debias=false"):
        load_config("demo", ["reward.aggregation=r3", "reward.invalid_fallback=free"])
    with pytest.raises(ConfigError, match="invalid_fallback=free"):
        load_config("demo", ["reward.aggregation=r3", "reward.debias=false", "reward.invalid_fallback=none"])


def test_training_step_scores_each_group_on_its_own(tiny_dir, tmp_path):
    """The trainer passes each response's prompt index as its group: the rewards of a step are
    the reward of each group scored alone."""
    from rlpr.train.trainer import Trainer

    cfg = load_config("demo", [*common(tiny_dir, tmp_path, "r3", 1), "trainer.progress=false",
                               "reward.aggregation=r3", "reward.debias=false", "reward.invalid_fallback=free",
                               "reward.shaping=identity", "reward.splice=ids", "algorithm.std_filter=false"])
    trainer = Trainer(cfg, tmp_path / "r3")
    trainer.engine = ScriptedEngine(trainer.tokenizer, R1)
    groups = trainer.rollout_groups([0, 1], seed=0)
    for g in groups:
        alone = trainer.reward(trainer.policy, [g.prompt.text] * 4, [g.prompt.response_text(r.text) for r in g.rollouts],
                               [g.prompt.example.reference] * 4)
        assert [o.reward for o in g.rewards] == pytest.approx([o.reward for o in alone], abs=1e-6)
        assert len({o.score_b for o in g.rewards}) > 1 and all(o.score_b <= 0 for o in g.rewards)
    metrics = trainer.train_step(1)
    assert math.isfinite(metrics["policy/tokens"]) and metrics["policy/tokens"] > 0

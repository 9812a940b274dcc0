"""The controls and label-free rewards (issue 33, spec section 9) against hand-computed values: random
(seeded Bernoulli), the shuffled-reference derangement, entropy (EM-RL / RENT), self-certainty
(INTUITOR), majority vote (TTRL); through the reward, the trainer (a step of each on the tiny model),
and the collapse monitors."""

from __future__ import annotations

import logging
import math

import pytest
import torch

from rlpr.config import RewardConfig, load_config
from rlpr.errors import ConfigError
from rlpr.model.forward import distribution_stats
from rlpr.reward.label_free import (derangement, entropy_reward, extracted_answer, majority_rewards, random_rewards,
                                    response_keys, self_certainty_reward)
from rlpr.reward.probability_reward import ProbabilityReward
from rlpr.reward.scoring import response_distribution_stats
from rlpr.train.metrics import CollapseMonitor

from helpers import tiny_cfg

pytestmark = pytest.mark.integration  # one training step per kind; the module takes its heaviest tier


# -- pure arithmetic ---------------------------------------------------------------------------------

def test_random_rewards_are_seeded_bernoulli():
    keys = [(p, j) for p in range(50) for j in range(8)]
    a = random_rewards(keys, seed=3, p=0.5)
    assert a == random_rewards(keys, seed=3, p=0.5)  # a rerun draws the same
    assert random_rewards(keys[::-1], seed=3)[::-1] == a  # each draw depends on its own key only
    assert set(a) == {0.0, 1.0} and 0.4 < sum(a) / len(a) < 0.6
    assert random_rewards(keys, seed=4) != a  # another run's seed, other draws
    assert sum(random_rewards(keys, seed=3, p=0.1)) / len(keys) < 0.2
    assert random_rewards(keys, seed=3, p=0.0) == [0.0] * len(keys)
    assert random_rewards(keys, seed=3, p=1.0) == [1.0] * len(keys)


def test_entropy_reward_by_hand():
    h = torch.tensor([0.5, 1.0, 2.5])
    assert entropy_reward(h) == pytest.approx(-(0.5 + 1.0 + 2.5) / 3)
    assert entropy_reward(h, last_k=2) == pytest.approx(-(1.0 + 2.5) / 2)  # RENT: the last k tokens
    assert entropy_reward(h, last_k=10) == pytest.approx(-4.0 / 3)


def test_self_certainty_by_hand():
    """KL(U || p) = sum_v (1/V) log((1/V) / p(v)) = -log V - mean_v log p(v)."""
    p = torch.tensor([[0.7, 0.1, 0.1, 0.1], [0.25, 0.25, 0.25, 0.25]])
    mean_logp = p.log().mean(-1)
    kl = [sum(0.25 * math.log(0.25 / q) for q in row.tolist()) for row in p]
    assert self_certainty_reward(mean_logp, 4) == pytest.approx(sum(kl) / 2)
    assert self_certainty_reward(mean_logp[1:], 4) == pytest.approx(0.0, abs=1e-7)  # uniform: no certainty


def test_majority_vote_by_hand():
    groups = [0, 0, 0, 0, 1, 1, 1, 1]
    answers = ["paris", "lyon", "paris", None, "b", "a", "a", "b"]
    # group 0: paris 2, lyon 1 (None neither votes nor scores); group 1: a tie 2-2, the earliest (b) wins
    assert majority_rewards(answers, groups) == [1, 0, 1, 0, 1, 0, 0, 1]
    assert majority_rewards([None, None], [0, 0]) == [0.0, 0.0]


def test_extracted_answer_is_the_rule_verifiers_normalized():
    assert extracted_answer("The answer is Paris.") == "paris"
    assert extracted_answer("<answer> 4.0 </answer>") == "4"
    assert extracted_answer("Paris. It is in France.") == "paris"
    assert extracted_answer("   ") is None


def test_derangement():
    refs = [f"r{i}" for i in range(30)]
    pi = derangement(refs, seed=1)
    assert sorted(pi) == list(range(30)) and all(pi[i] != i for i in range(30))
    assert pi == derangement(refs, seed=1) and pi != derangement(refs, seed=2)
    # many prompts share a reference: no prompt is given its own reference's text where a swap avoids it
    shared = ["Paris"] * 5 + ["Rome"] * 5 + [f"x{i}" for i in range(10)]
    pi = derangement(shared, seed=0)
    assert all(shared[pi[i]] != shared[i] for i in range(len(shared)))
    assert derangement(["a"], 0) == [0]
    assert derangement(["a", "b"], 0) == [1, 0]


def test_response_keys():
    assert response_keys([5, 5, 7, 7, 5]) == [(5, 0), (5, 1), (7, 0), (7, 1), (5, 2)]


# -- the policy's distributions ------------------------------------------------------------------------

def test_distribution_stats_match_full_softmax(tiny_model, tokenizer):
    ids = torch.tensor([tokenizer("The capital of France is Paris", add_special_tokens=False)["input_ids"]])
    attn = torch.ones_like(ids)
    target = torch.zeros_like(ids, dtype=torch.bool)
    target[0, 3:] = True
    with torch.no_grad():
        logp = torch.log_softmax(tiny_model(input_ids=ids, attention_mask=attn).logits.float(), -1)[0, 2:-1]
    from rlpr.model.forward import hidden_states

    with torch.no_grad():
        hidden = hidden_states(tiny_model, ids, attn)[:, :-1][target[:, 1:]]
    h, m = distribution_stats(tiny_model, hidden, rows=2)  # several pieces
    assert torch.allclose(h, -(logp.exp() * logp).sum(-1), atol=1e-5)
    assert torch.allclose(m, logp.mean(-1), atol=1e-5)


def test_response_distribution_stats_cover_the_response_tokens(tiny_model, tokenizer):
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "Capital of France?"}], tokenize=False,
                                           add_generation_prompt=True)
    [stats, empty] = response_distribution_stats(tiny_model, tokenizer, [prompt, prompt],
                                                 ["It is Paris." + tokenizer.eos_token, ""])
    assert empty is None
    n = len(tokenizer(prompt + "It is Paris.", add_special_tokens=False)["input_ids"]) - \
        len(tokenizer(prompt, add_special_tokens=False)["input_ids"])
    assert stats[0].shape == (n,) and stats[1].shape == (n,)
    assert bool((stats[0] >= 0).all())
    # a group's responses share their prompt's forward: the same numbers as one at a time
    responses = ["It is Paris.", "Paris", "I think it is Lyon, or maybe Paris."]
    shared = response_distribution_stats(tiny_model, tokenizer, [prompt] * 3, responses)
    packed = response_distribution_stats(tiny_model, tokenizer, [prompt] * 3, responses, pack=True)
    for response, (h, m), (h2, m2) in zip(responses, shared, packed):
        [(h1, m1)] = response_distribution_stats(tiny_model, tokenizer, [prompt], [response])
        assert torch.allclose(h, h1, atol=1e-5) and torch.allclose(m, m1, atol=1e-5)
        assert torch.allclose(h2, h1, atol=1e-5) and torch.allclose(m2, m1, atol=1e-5)  # packed into one row


def _reward(tokenizer, **kw):
    return ProbabilityReward(RewardConfig(repetition_penalty=False, alpha=0.0, **kw), tokenizer)


def test_reward_kinds_through_the_reward(tiny_model, tokenizer):
    prompt = "Q: capital of France?\nA:"
    responses = [" Paris.", " It is Paris.", " Lyon.", ""]
    refs = ["Paris"] * 4
    groups = [0, 0, 0, 0]
    stats = response_distribution_stats(tiny_model, tokenizer, [prompt] * 4, responses)
    vocab = tiny_model.get_output_embeddings().out_features
    out = _reward(tokenizer, kind="entropy")(tiny_model, [prompt] * 4, responses, refs, groups=groups)
    assert [o.reward for o in out[:3]] == pytest.approx([entropy_reward(s[0]) for s in stats[:3]])
    assert out[3].reward == pytest.approx(-math.log(vocab))  # an empty response: the uniform distribution's
    assert all(o.score_b == 0.0 and o.score_a == 0.0 for o in out)  # no reference is read
    out = _reward(tokenizer, kind="self_certainty")(tiny_model, [prompt] * 4, responses, refs, groups=groups)
    assert [o.reward for o in out[:3]] == pytest.approx([self_certainty_reward(s[1], vocab) for s in stats[:3]])
    assert out[3].reward == 0.0
    out = _reward(tokenizer, kind="majority")(tiny_model, [prompt] * 4, responses, refs, groups=groups)
    # "paris", "it is paris", "lyon", None: a three-way tie, the earliest wins
    assert [o.reward for o in out] == [1.0, 0.0, 0.0, 0.0]
    r = _reward(tokenizer, kind="random", random_p=0.5)
    r.seed = 9
    out = r(tiny_model, [prompt] * 4, responses, refs, groups=groups, keys=[(11, j) for j in range(4)])
    assert [o.reward for o in out] == random_rewards([(11, j) for j in range(4)], 9, 0.5)
    # the reference changes nothing for a label-free kind
    other = r(tiny_model, [prompt] * 4, responses, ["Lyon"] * 4, groups=groups, keys=[(11, j) for j in range(4)])
    assert [o.reward for o in out] == [o.reward for o in other]


def test_config_refuses_shuffling_what_reads_no_reference():
    with pytest.raises(ConfigError, match="reads no reference"):
        load_config("small", ["reward.kind=entropy", "reward.shuffle_references=true"])
    with pytest.raises(ConfigError, match="oracle verifier"):
        load_config("small", ["reward.kind=verifier", "reward.shuffle_references=true"])
    load_config("small", ["reward.kind=verifier", "reward.verifier=exact", "reward.shuffle_references=true"])
    with pytest.raises(ConfigError, match="reward.random_p"):
        load_config("small", ["reward.kind=random", "reward.random_p=1.5"])


# -- in the trainer ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["random", "entropy", "self_certainty", "majority"])
def test_one_training_step_per_kind(tmp_path, tiny_dir, kind):
    from rlpr.train.trainer import Trainer

    cfg = tiny_cfg(tiny_dir, tmp_path, kind, f"reward.kind={kind}", "trainer.max_steps=1", "data.val=",
                   "trainer.sample_every=0")
    trainer = Trainer(cfg, tmp_path / kind)
    m = trainer.train_step(1)
    assert math.isfinite(m["reward/mean"]) and m["reward/score_b_mean"] == 0.0
    assert m["rollout/distinct_answers"] >= 1.0 and 0.0 < m["rollout/identical_frac"] <= 1.0
    if kind == "random":
        assert m["reward/mean"] in {k / 16 for k in range(17)}


def test_shuffled_references_score_against_another_prompt(tmp_path, tiny_dir):
    from rlpr.rollout.hf import Rollout
    from rlpr.train.trainer import Trainer

    cfg = tiny_cfg(tiny_dir, tmp_path, "shuf", "reward.shuffle_references=true", "trainer.max_steps=1")
    trainer = Trainer(cfg, tmp_path / "shuf")
    prompts = trainer.train_prompts
    pi = derangement([p.example.reference for p in prompts], cfg.trainer.seed)
    assert [e.reference for e in trainer.scored_against] == [prompts[j].example.reference for j in pi]
    seen = {}

    def spy(model, texts, responses, refs, **kw):
        seen["refs"], seen["a"] = refs, kw["precomputed_a"]
        return [None] * len(responses)

    trainer.reward = spy
    rollouts = [Rollout(0, [1], "x", True), Rollout(1, [1], "y", True)]
    trainer.score(prompts[:2], rollouts, spy, training=True)
    assert seen["refs"] == [prompts[pi[0]].example.reference, prompts[pi[1]].example.reference]
    assert seen["a"] == [None, None]  # a precomputed A belongs to the true reference
    trainer.score(prompts[:2], rollouts, spy)  # held-out evaluation: the true references
    assert seen["refs"] == [prompts[0].example.reference, prompts[1].example.reference]


def test_collapse_monitor_warns_once_per_monitor(caplog):
    monitor = CollapseMonitor()
    with caplog.at_level(logging.WARNING, logger="rlpr.train"):
        monitor(1, {"policy/entropy": 1.2, "rollout/distinct_answers": 3.0, "rollout/identical_frac": 0.3})
        assert not caplog.records
        monitor(2, {"policy/entropy": 0.01, "rollout/distinct_answers": 1.0, "rollout/identical_frac": 0.95})
        monitor(3, {"policy/entropy": 0.01, "rollout/distinct_answers": 1.0, "rollout/identical_frac": 0.95})
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3 and all(line.startswith("step 2: collapse?") for line in lines)
    assert any("policy/entropy" in line for line in lines)


@pytest.mark.parametrize("kind", ["random", "entropy", "self_certainty", "majority"])
def test_rlpr_score_with_a_label_free_kind(tiny_dir, tmp_path, kind):
    """`rlpr score reward.kind=...`: the label-free rewards on a file of responses, no training."""
    import json
    from pathlib import Path

    from rlpr.cli.main import main

    example = Path(__file__).resolve().parents[1] / "examples" / "score_example.jsonl"
    out = tmp_path / "scored.jsonl"
    assert main(["score", "--input", str(example), "--output", str(out), "--model", str(tiny_dir),
                 f"reward.kind={kind}"]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows and all(r["score_b"] == 0.0 and math.isfinite(r["reward"]) for r in rows)
    if kind in ("random", "majority"):
        assert {r["delta"] for r in rows} <= {0.0, 1.0}
    if kind == "entropy":
        assert all(r["delta"] < 0 for r in rows)

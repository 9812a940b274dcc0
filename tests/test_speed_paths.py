"""The timing hooks benchmarks/speed.py reads: seconds spent in score B and score A forwards."""

from __future__ import annotations

from dataclasses import replace

import pytest

from rlpr.config import RewardConfig
from rlpr.reward.probability_reward import ProbabilityReward

pytestmark = pytest.mark.unit

VALID = "<think> it is the capital </think> <answer> Paris </answer>"


def test_score_seconds_accumulate_per_forward(tiny_model, tokenizer):
    pr = ProbabilityReward(replace(RewardConfig(), invalid_fallback="free"), tokenizer)
    assert pr.seconds == {"score_b": 0.0, "score_a": 0.0}
    q = tokenizer.apply_chat_template([{"role": "user", "content": "Capital of France?"}], tokenize=False,
                                      add_generation_prompt=True)
    pr(tiny_model, [q, q], [VALID, "It is Paris."], ["Paris", "Paris"])
    b, a = pr.seconds["score_b"], pr.seconds["score_a"]
    assert b > 0.0 and a > 0.0
    pr(tiny_model, [q], [VALID], ["Paris"])  # A is cached now: only B runs a forward
    assert pr.seconds["score_b"] > b and pr.seconds["score_a"] == a
    pr.fill_score_a(tiny_model, [(q, "Berlin", False)])  # a new pair: A runs
    assert pr.seconds["score_a"] > a

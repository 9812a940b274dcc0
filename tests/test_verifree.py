"""The verifier-free family (issue 19): log-probability aggregations, VeriFree's boundary-safe
splicing (reward.splice), reasoning-only policy loss (algorithm.pg_tokens) and reference-SFT term
(algorithm.ref_sft_coef), each against a hand computation on the tiny model."""

import math

import pytest
import torch

from rlpr.config import RewardConfig
from rlpr.reward.probability_reward import ProbabilityReward
from rlpr.reward.scoring import AGGREGATIONS, aggregate
from rlpr.reward.sequence import build_score_b_text, tokenize_scored

pytestmark = pytest.mark.unit


def chat(tokenizer, q):
    return tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=False,
                                         add_generation_prompt=True)


def log_softmax_rows(model, ids, temperature=1.0):
    """[T, V] fp64 log-softmax of the logits predicting ids[1:], one plain forward."""
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, :-1].double() / temperature
    return torch.log_softmax(logits, -1)


def hand_reference_logp(model, ids, mask, temperature=1.0):
    """log p of each masked token given all before it, from a plain forward (no rlpr code)."""
    rows = log_softmax_rows(model, ids, temperature)
    return torch.tensor([rows[t - 1, ids[t]].item() for t in range(1, len(ids)) if mask[t]], dtype=torch.float64)


# -- log-probability aggregations ----------------------------------------------------------------

def test_every_aggregation_by_hand():
    logp = torch.log(torch.tensor([0.5, 0.25]))
    want = {"mean_prob": 0.375, "mean_logprob": (math.log(0.5) + math.log(0.25)) / 2,
            "sum_logprob": math.log(0.125), "seq_likelihood": 0.125, "geo_mean_prob": math.sqrt(0.125)}
    assert set(AGGREGATIONS) == set(want)
    for name, value in want.items():
        assert aggregate(logp, name) == pytest.approx(value, rel=1e-6), name


def test_sum_logprob_reward_on_tiny_model(tiny_model, tokenizer):
    q = chat(tokenizer, "Capital of France?")
    response = "<think> it is Paris </think>\n<answer> Paris </answer>"
    pr = ProbabilityReward(RewardConfig(aggregation="sum_logprob", debias=False, alpha=0.0, shaping="identity"),
                           tokenizer)
    out = pr(tiny_model, [q], [response], ["Paris"])[0]
    enc = tokenize_scored(tokenizer, [build_score_b_text(q, response, "Paris", tokenizer.eos_token)])
    want = hand_reference_logp(tiny_model, enc.input_ids[0], enc.ref_mask[0]).sum().item()
    assert out.score_b == pytest.approx(want, abs=1e-4) and out.reward == pytest.approx(want, abs=1e-4)


# -- reward.splice: text | ids -------------------------------------------------------------------

def scored(tokenizer, item, splice):
    enc = tokenize_scored(tokenizer, [item], splice)
    ids, mask = enc.input_ids[0], enc.ref_mask[0]
    return ids, mask, tokenizer.decode([t for t, m in zip(ids, mask) if m])


def test_splice_ids_equals_text_where_nothing_merges(tokenizer):
    q = chat(tokenizer, "Capital of France?")
    item = build_score_b_text(q, "<think> it is Paris </think>\n<answer> Paris </answer>", "Paris",
                              tokenizer.eos_token)
    assert item.text[item.block_start:].startswith("<answer>")
    text_ids, text_mask, text_ref = scored(tokenizer, item, "text")
    ids, mask, ref = scored(tokenizer, item, "ids")
    assert (ids, mask) == (text_ids, text_mask) and ref == text_ref == " Paris"


def test_splice_ids_keeps_the_block_apart_where_the_boundary_merges(tokenizer):
    """"</think><answer>": SmolLM2 merges '><' across the boundary when o' is tokenized whole."""
    q = chat(tokenizer, "Capital of France?")
    item = build_score_b_text(q, "<think> it is Paris </think><answer> Paris </answer>", "Paris",
                              tokenizer.eos_token)
    text_ids, text_mask, text_ref = scored(tokenizer, item, "text")
    ids, mask, ref = scored(tokenizer, item, "ids")
    head = tokenizer(item.text[:item.block_start], add_special_tokens=False)["input_ids"]
    block = tokenizer(item.text[item.block_start:], add_special_tokens=False)["input_ids"]
    assert ids == head + block and ids != text_ids  # the '><' token is gone: '>' ends z, '<' opens the block
    assert tokenizer.convert_ids_to_tokens(block[:3]) == ["<", "answer", ">"]
    assert ref == text_ref == " Paris"  # the reference tokens themselves do not move here
    assert mask[len(head):] == [t in tokenizer(" Paris", add_special_tokens=False)["input_ids"] for t in block]


def test_splice_ids_gives_the_right_mask_where_text_shifts_it(tokenizer):
    """The fallback with an empty cue puts y* = "-3" right after "The answer:"; tokenized whole,
    ':-' is one token, so the text mask's first scored token starts inside the reasoning (it
    scores ':-' given 'The answer' instead of '-' given 'The answer:'). ids splits at the cue."""
    q = chat(tokenizer, "What is 2 - 5?")
    item = build_score_b_text(q, "The answer:", "-3", tokenizer.eos_token, mode="r1", fallback="free", cue="")
    _, _, text_ref = scored(tokenizer, item, "text")
    ids, mask, ref = scored(tokenizer, item, "ids")
    assert text_ref == ":-3" and ref == "-3"
    head = tokenizer(item.text[:item.block_start], add_special_tokens=False)["input_ids"]
    assert ids[:len(head)] == head and not any(mask[:len(head)])


def test_splice_ids_score_b_is_the_hand_computed_probability(tiny_model, tokenizer):
    q = chat(tokenizer, "What is 2 - 5?")
    cfg = dict(invalid_fallback="free", answer_cue="", debias=False, alpha=0.0, shaping="identity")
    out = ProbabilityReward(RewardConfig(splice="ids", **cfg), tokenizer)(tiny_model, [q], ["The answer:"], ["-3"])[0]
    head = tokenizer(q + "The answer:", add_special_tokens=False)["input_ids"]
    block = tokenizer("-3 </answer>" + tokenizer.eos_token, add_special_tokens=False)["input_ids"]
    n_ref = len(tokenizer("-3", add_special_tokens=False)["input_ids"])
    mask = [False] * len(head) + [True] * n_ref + [False] * (len(block) - n_ref)
    want = hand_reference_logp(tiny_model, head + block, mask).exp().mean().item()
    assert out.score_b == pytest.approx(want, rel=1e-4)
    text = ProbabilityReward(RewardConfig(**cfg), tokenizer)(tiny_model, [q], ["The answer:"], ["-3"])[0]
    assert text.score_b != pytest.approx(want, rel=1e-2)  # text mode scores ':-' instead

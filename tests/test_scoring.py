"""Score B exactness: the batched, padded, hidden-state-projection path against an independent
unbatched path (plain forward with full logits, manual softmax over the masked positions)."""

import math

import pytest
import torch

from rlpr.reward.scoring import AGGREGATIONS, aggregate, reference_logprobs, score_texts
from rlpr.reward.sequence import build_score_a_text, build_score_b_text

pytestmark = pytest.mark.unit

EOS = "<|im_end|>"
RESPONSES = [
    ("<think> short </think> <answer> x", "Paris"),
    ("<think> a much longer chain of reasoning with many more tokens in it, about cities, rivers "
     "and the history of Europe over several centuries </think>\n<answer>\nBerlin", "Paris"),
    ("<think> 4 x 2 = 8 </think> <answer>", "8"),
    ("<think> fractions </think> <answer> 0.5", r"\frac{1}{2}"),
    ("<think> unicode </think> <answer>", "Zürich 東京"),
]


def prompt(tokenizer, q="What is the capital of France?"):
    return tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=False,
                                         add_generation_prompt=True)


def independent_probs(model, tokenizer, item, temperature):
    """Unbatched: full logits of one sequence, manual softmax, pick the reference tokens."""
    enc = tokenizer(item.text, add_special_tokens=False, return_offsets_mapping=True)
    ids = torch.tensor([enc["input_ids"]])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].double() / temperature
    probs = []
    for t, (s, e) in enumerate(enc["offset_mapping"]):
        if s < item.ref_end and e > item.ref_start and e > s:
            row = logits[t - 1]
            weights = torch.exp(row - row.max())
            probs.append((weights[ids[0, t]] / weights.sum()).item())
    return probs


@pytest.mark.parametrize("temperature", [1.0, 0.6])
@pytest.mark.parametrize("padding_side,share_prefix,pack", [("right", False, False), ("left", False, False),
                                                            ("right", True, False), ("right", True, True)])
def test_batched_matches_unbatched(tiny_model, tokenizer, temperature, padding_side, share_prefix, pack):
    """Padded batches (left or right) and the shared-prompt path, its texts padded or packed into rows
    (trainer.pack_responses), against single sequences."""
    items = [build_score_b_text(prompt(tokenizer), r, ref, EOS) for r, ref in RESPONSES]
    items.append(build_score_a_text(prompt(tokenizer), "Paris", EOS))
    items.append(build_score_b_text(prompt(tokenizer, "Another question?"), *RESPONSES[2], EOS))
    batched = reference_logprobs(tiny_model, tokenizer, items, temperature=temperature,
                                 padding_side=padding_side, max_batch_tokens=10_000, share_prefix=share_prefix,
                                 pack=pack)
    lengths = {len(tokenizer(it.text, add_special_tokens=False)["input_ids"]) for it in items}
    assert len(lengths) > 3  # mixed lengths really are padded together
    for item, logp in zip(items, batched):
        expected = independent_probs(tiny_model, tokenizer, item, temperature)
        assert len(expected) == logp.numel() >= 1
        assert torch.allclose(logp.exp().double(), torch.tensor(expected, dtype=torch.float64), atol=1e-5)
        exp_logp = torch.log(torch.tensor(expected, dtype=torch.float64))
        for name in AGGREGATIONS:
            want = {"mean_prob": exp_logp.exp().mean(), "mean_logprob": exp_logp.mean(),
                    "sum_logprob": exp_logp.sum(), "seq_likelihood": exp_logp.sum().exp(), "geo_mean_prob": exp_logp.mean().exp()}[name]
            assert aggregate(logp, name) == pytest.approx(want.item(), abs=1e-5)


@pytest.mark.parametrize("share_prefix", [False, True])
def test_micro_batching_does_not_change_scores(tiny_model, tokenizer, share_prefix):
    items = [build_score_b_text(prompt(tokenizer), r, ref, EOS) for r, ref in RESPONSES]
    one = reference_logprobs(tiny_model, tokenizer, items, max_batch_tokens=100_000, share_prefix=share_prefix)
    many = reference_logprobs(tiny_model, tokenizer, items, max_batch_tokens=64, share_prefix=share_prefix)
    for a, b in zip(one, many):
        assert torch.allclose(a, b, atol=1e-6)


def test_prompt_tokens_that_merge_with_the_response_fall_back(tiny_model, tokenizer):
    """If o' does not start with the prompt's own tokens, the item takes the padded path."""
    from rlpr.reward.scoring import _shared_prefix_groups
    from rlpr.reward.sequence import tokenize_scored

    q = prompt(tokenizer)
    items = [build_score_b_text(q, "<think> a </think> <answer>", "8", EOS),
             build_score_b_text(q, "\n\n<think> a </think> <answer>", "8", EOS)]
    enc = tokenize_scored(tokenizer, items)
    groups, rest = _shared_prefix_groups(tokenizer, items, enc, [0, 1])
    assert groups and groups[0][1] == [0]
    assert rest == [1]  # "\n" + "\n\n" merge into one token across the prompt boundary
    shared = reference_logprobs(tiny_model, tokenizer, items)
    plain = reference_logprobs(tiny_model, tokenizer, items, share_prefix=False)
    for a, b in zip(shared, plain):
        assert torch.allclose(a, b, atol=1e-5)


def test_temperature_changes_scores(tiny_model, tokenizer):
    items = [build_score_b_text(prompt(tokenizer), *RESPONSES[0], EOS)]
    s1 = score_texts(tiny_model, tokenizer, items, temperature=1.0)[0]
    s2 = score_texts(tiny_model, tokenizer, items, temperature=0.6)[0]
    assert s1 != s2


def test_none_empty_and_overlong_score_zero(tiny_model, tokenizer):
    ok = build_score_b_text(prompt(tokenizer), *RESPONSES[0], EOS)
    long_item = build_score_b_text(prompt(tokenizer), *RESPONSES[1], EOS)
    n_long = len(tokenizer(long_item.text, add_special_tokens=False)["input_ids"])
    empty = build_score_b_text(prompt(tokenizer), "<think> a </think> <answer>", "\x16", EOS)
    scores = score_texts(tiny_model, tokenizer, [None, ok, long_item, empty], max_length=n_long - 1)
    assert scores[0] == 0.0 and scores[2] == 0.0 and scores[3] == 0.0
    assert 0.0 < scores[1] <= 1.0 and math.isfinite(scores[1])


def test_unknown_aggregation():
    with pytest.raises(ValueError, match="unknown aggregation"):
        aggregate(torch.zeros(2), "median")


def test_a_prompt_with_one_text_takes_the_padded_batches(tokenizer):
    """Score A and greedy held-out responses have one text per prompt: sharing that prompt saves
    nothing and cost one forward pass per prompt; they go to the padded batches instead."""
    from rlpr.reward.scoring import _shared_prefix_groups
    from rlpr.reward.sequence import tokenize_scored

    q1, q2 = prompt(tokenizer), prompt(tokenizer, "Another question?")
    items = [build_score_b_text(q1, r, ref, EOS) for r, ref in RESPONSES[:3]]
    items += [build_score_a_text(q2, "Paris", EOS)]
    enc = tokenize_scored(tokenizer, items)
    groups, rest = _shared_prefix_groups(tokenizer, items, enc, [0, 1, 2, 3])
    assert [ks for _, ks in groups] == [[0, 1, 2]]
    assert rest == [3]

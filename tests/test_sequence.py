"""Building o' and score-A texts, and the reference-token mask (spec sections 1.2-1.3, 1b, 2)."""

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from rlpr.reward.sequence import (build_score_a_text, build_score_b_text, reference_mask,
                                  tokenize_scored)

pytestmark = pytest.mark.unit

Q = "<|im_start|>user\nQ?<|im_end|>\n<|im_start|>assistant\n"
EOS = "<|im_end|>"


def ref_of(item):
    return item.text[item.ref_start:item.ref_end]


@pytest.mark.parametrize("response,expected", [
    ("<think> r </think> <answer> Berlin </answer>", "<think> r </think> <answer> Paris </answer>"),
    ("<think> r </think> <answer>Berlin</answer>", "<think> r </think> <answer> Paris </answer>"),
    ("<think> r </think> <answer>\n  Berlin\n</answer> bye", "<think> r </think> <answer>\n  Paris </answer>"),
    ("<think> r </think> <answer>", "<think> r </think> <answer> Paris </answer>"),
    ("<think> r </think> <answer>\t", "<think> r </think> <answer>\tParis </answer>"),
])
def test_score_b_text_keeps_model_whitespace_and_discards_answer(response, expected):
    item = build_score_b_text(Q, response, "Paris", EOS)
    assert item.text == Q + expected + EOS
    assert ref_of(item) == "Paris" and not item.fallback


def test_invalid_response_has_no_text_unless_fallback():
    assert build_score_b_text(Q, "Paris is the capital.", "Paris", EOS) is None
    item = build_score_b_text(Q, "It is Paris.  \n" + EOS, "Paris", EOS, fallback="free")
    assert item.text == Q + "It is Paris.\n<answer> Paris </answer>" + EOS
    assert item.fallback and ref_of(item) == "Paris"
    custom = build_score_b_text(Q, "x", "Paris", EOS, fallback="free", cue=" Answer: ")
    assert custom.text == Q + "x Answer: Paris </answer>" + EOS


def test_valid_response_is_not_fallback_even_when_fallback_on():
    item = build_score_b_text(Q, "<think> r </think> <answer> P", "Paris", EOS, fallback="free")
    assert not item.fallback and item.text == Q + "<think> r </think> <answer> Paris </answer>" + EOS


def test_score_a_text():
    item = build_score_a_text(Q, "Paris", EOS)
    assert item.text == Q + " Paris " + EOS and ref_of(item) == "Paris"
    cue = build_score_a_text(Q, "Paris", EOS, cue="\n<answer> ")
    assert cue.text == Q + "\n<answer> Paris </answer>" + EOS and cue.fallback


def test_mask_overlap_rule():
    offsets = [(0, 3), (3, 9), (9, 10), (10, 10)]
    assert reference_mask(offsets, 4, 9) == [False, True, False, False]  # " Paris" covers 3..9
    assert reference_mask(offsets, 9, 10) == [False, False, True, False]
    assert reference_mask(offsets, 3, 3) == [False] * 4  # empty span scores nothing


def masked_text(tokenizer, item):
    enc = tokenize_scored(tokenizer, [item])
    ids = [t for t, m in zip(enc.input_ids[0], enc.ref_mask[0]) if m]
    return tokenizer.decode(ids), enc


@pytest.mark.parametrize("reference", [
    "Paris", "8", "1234567", "3.14159", r"\frac{1}{2}", r"$x^2 + \sqrt{3}$", "<answer>", "a </answer> b",
    "Zürich", "東京", "🙂 ok", "New York City", "-42", "(B)", "x=3, y=4",
])
def test_masked_tokens_cover_reference(tokenizer, reference):
    item = build_score_b_text(Q, "<think> r </think> <answer>", reference, EOS)
    decoded, enc = masked_text(tokenizer, item)
    assert decoded.strip() == reference.strip()
    assert sum(enc.ref_mask[0]) >= 1


def test_first_reference_token_merges_with_leading_space(tokenizer):
    item = build_score_b_text(Q, "<think> r </think> <answer>", "Paris", EOS)
    decoded, enc = masked_text(tokenizer, item)
    assert decoded == " Paris"  # the merged " Paris" token is scored
    assert sum(enc.ref_mask[0]) == 1


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(response=st.text(max_size=80) | st.sampled_from(["<think> a </think> <answer>", "<answer> x"]),
       # printable references: this tokenizer drops control characters and unassigned code points
       reference=st.text(st.characters(exclude_categories=("Cc", "Cs", "Cn", "Co")), min_size=1,
                         max_size=20).map(str.strip).filter(bool),
       fallback=st.sampled_from(["none", "free"]))
def test_property_masked_tokens_cover_reference(tokenizer, response, reference, fallback):
    """Whenever the mask is non-empty, the masked tokens' text is the reference, possibly with the
    whitespace before it merged into the first token."""
    item = build_score_b_text(Q, response, reference, EOS, mode="r1", fallback=fallback)
    if item is None:
        return
    enc = tokenizer(item.text, add_special_tokens=False, return_offsets_mapping=True)
    mask = reference_mask(enc["offset_mapping"], item.ref_start, item.ref_end)
    ids = [t for t, m in zip(enc["input_ids"], mask) if m]
    if not ids:
        return
    decoded = tokenizer.decode(ids)
    assert decoded.endswith(reference)
    assert decoded[: len(decoded) - len(reference)].strip(" \t\n\r") == ""

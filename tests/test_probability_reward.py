"""Shaping, the final reward arithmetic, the score-A cache and the fallback (spec sections 1b-3)."""

import math

import pytest

from rlpr.config import RewardConfig
from rlpr.reward.probability_reward import ProbabilityReward
from rlpr.reward.scoring import score_texts
from rlpr.reward.sequence import build_score_a_text, build_score_b_text
from rlpr.reward.shaping import get_shaping

pytestmark = pytest.mark.unit

VALID = "<think> r </think> <answer> x </answer>"


@pytest.mark.parametrize("name,x,expected", [
    ("threshold_0", 0.3, 0.3), ("threshold_0", -0.2, 0.0), ("threshold_0", 0.0, 0.0),
    ("threshold_0.1", 0.05, 0.0), ("threshold_0.1", 0.15, 0.15),
    ("identity", -0.4, -0.4), ("leaky_0", -0.5, -0.005), ("leaky_0", 0.5, 0.5),
    ("sigmoid_5", 0.5, 0.5), ("sigmoid_5", 1.0, 1 / (1 + math.exp(-5))),
    ("bin_10", 0.34, 0.3), ("bin_4", 0.9, 1.0),
])
def test_shaping(name, x, expected):
    assert get_shaping(name)(x) == pytest.approx(expected)


@pytest.mark.parametrize("name", ["threshold", "tanh_3", "bin_x", "sigmoid"])
def test_bad_shaping(name):
    with pytest.raises(ValueError, match="unknown shaping"):
        get_shaping(name)


def make(tokenizer, **kw):
    return ProbabilityReward(RewardConfig(**kw), tokenizer)


def test_combine_arithmetic(tokenizer):
    pr = make(tokenizer, alpha=0.1)
    out = pr.combine(VALID, True, False, b=0.7, a=0.2)
    assert out.delta == pytest.approx(0.5) and out.format == 1.0
    assert out.reward == pytest.approx(0.9 * 0.5 + 0.1 * 1.0)
    assert pr.combine("<think> r </think> <answer> x", True, False, 0.1, 0.3).reward == 0.0  # clipped, no format
    assert make(tokenizer, shaping="identity").combine("no tags", False, False, 0.0, 0.3).delta == pytest.approx(-0.3)


def test_repetition_penalty_only_when_nonzero(tokenizer):
    loop = VALID + " " + " ".join(["again and again"] * 40)
    pr = make(tokenizer)
    assert pr.combine(loop, True, False, 0.5, 0.0).penalty == -1.0
    assert pr.combine("no tags " + " ".join(["x"] * 30), False, False, 0.0, 0.5).penalty == 0.0  # reward 0
    always = make(tokenizer, repetition_only_nonzero=False)
    assert always.combine("no tags " + " ".join(["x"] * 30), False, False, 0.0, 0.5).reward == -1.0
    off = make(tokenizer, repetition_penalty=False)
    assert off.combine(loop, True, False, 0.5, 0.0).penalty == 0.0


def chat(tokenizer, q):
    return tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=False,
                                         add_generation_prompt=True)


def test_rewards_match_independent_scores(tiny_model, tokenizer):
    pr = make(tokenizer, invalid_fallback="free")
    q = chat(tokenizer, "Capital of France?")
    responses = [VALID, "It is Paris.", "<think> a </think> <answer>\nLyon"]
    outs = pr(tiny_model, [q] * 3, responses, ["Paris"] * 3)
    eos = tokenizer.eos_token
    b = score_texts(tiny_model, tokenizer, [build_score_b_text(q, r, "Paris", eos, fallback="free")
                                            for r in responses])
    a_plain, a_cue = score_texts(tiny_model, tokenizer, [build_score_a_text(q, "Paris", eos),
                                                         build_score_a_text(q, "Paris", eos, cue="\n<answer> ")])
    assert [o.fallback for o in outs] == [False, True, False]
    assert [o.valid for o in outs] == [True, False, True]
    for o, b_i, a_i in zip(outs, b, [a_plain, a_cue, a_plain]):
        assert o.score_b == pytest.approx(b_i, abs=1e-7) and o.score_a == pytest.approx(a_i, abs=1e-7)
        assert o.reward == pytest.approx(0.9 * max(0.0, b_i - a_i) + 0.1 * o.format, abs=1e-7)
    assert len(pr.cache) == 2  # one plain A and one cue A for the same (prompt, reference)


def test_invalid_without_fallback_scores_zero(tiny_model, tokenizer):
    pr = make(tokenizer)
    out = pr(tiny_model, [chat(tokenizer, "Q")], ["no tags at all"], ["Paris"])[0]
    assert out.score_b == 0.0 and out.reward == 0.0 and not out.valid and not out.fallback


def test_score_a_cache_and_precomputed(tiny_model, tokenizer):
    pr = make(tokenizer)
    q = chat(tokenizer, "Q")
    first = pr(tiny_model, [q], [VALID], ["Paris"])[0]
    state = pr.cache.state_dict()
    fresh = make(tokenizer)
    fresh.cache.load_state_dict(state)
    # a cached A is never recomputed: another policy changes B but not A
    from rlpr.model.loading import tiny_llama

    later = fresh(tiny_llama(tokenizer, seed=1), [q], [VALID], ["Paris"])[0]
    assert later.score_a == first.score_a and later.score_b != first.score_b
    # fill_a is asked only for uncached pairs (full fine-tuning has no initial policy left to ask)
    asked = []
    again = pr(tiny_model, [q], [VALID], ["Paris"], fill_a=asked.extend)[0]
    assert asked == [] and again.score_a == first.score_a
    given = pr(tiny_model, [q], [VALID], ["Paris"], precomputed_a=[0.25])[0]
    assert given.score_a == 0.25
    no_debias = make(tokenizer, debias=False)(tiny_model, [q], [VALID], ["Paris"])[0]
    assert no_debias.score_a == 0.0 and no_debias.delta == pytest.approx(no_debias.score_b)


# --------------------------------------------------------------------------- reward kinds (issue 14)

def test_verifier_kind_hand_computed(tiny_model, tokenizer):
    """reward = (1 - alpha) * correct + alpha * format; no forward pass (B and A reported as 0)."""
    pr = make(tokenizer, kind="verifier", alpha=0.1)
    q = chat(tokenizer, "Capital of France?")
    outs = pr(tiny_model, [q] * 3, [VALID, VALID, "It is Paris."], ["Paris"] * 3, correct=[True, False, True])
    assert [o.reward for o in outs] == pytest.approx([0.9 + 0.1, 0.1, 0.9])
    assert [o.correct for o in outs] == [1.0, 0.0, 1.0]
    assert all(o.score_b == 0.0 and o.score_a == 0.0 for o in outs)
    assert pr.seconds["score_b"] == 0.0
    with pytest.raises(ValueError, match="verdicts"):
        pr(tiny_model, [q], [VALID], ["Paris"])


def test_hybrid_kind_is_the_official_soft_mix(tiny_model, tokenizer):
    """hybrid = vr_weight * (0.9 correct + 0.1 format) + pr_weight * (0.9 delta + 0.1 format)."""
    q = chat(tokenizer, "Capital of France?")
    prob = make(tokenizer)(tiny_model, [q], [VALID], ["Paris"])[0]
    hyb = make(tokenizer, kind="hybrid", pr_weight=0.5, vr_weight=1.0)(tiny_model, [q], [VALID], ["Paris"],
                                                                     correct=[True])[0]
    assert hyb.score_b == pytest.approx(prob.score_b) and hyb.correct == 1.0
    assert hyb.reward == pytest.approx(1.0 * (0.9 + 0.1) + 0.5 * (0.9 * prob.delta + 0.1))


def test_probability_kind_records_the_verdict_without_using_it(tiny_model, tokenizer):
    q = chat(tokenizer, "Q")
    pr = make(tokenizer)
    right, wrong = pr(tiny_model, [q] * 2, [VALID] * 2, ["Paris"] * 2, correct=[True, False])
    assert right.reward == wrong.reward and (right.correct, wrong.correct) == (1.0, 0.0)


def test_score_a_prompt_form_for_fallback_responses(tiny_model, tokenizer):
    """score_a_form=prompt: a fallback response's A is the paper's prompt-only A, not the cue form."""
    q = chat(tokenizer, "Capital of France?")
    eos = tokenizer.eos_token
    a_plain, a_cue = score_texts(tiny_model, tokenizer, [build_score_a_text(q, "Paris", eos),
                                                         build_score_a_text(q, "Paris", eos, cue="\n<answer> ")])
    cue = make(tokenizer, invalid_fallback="free")(tiny_model, [q], ["It is Paris."], ["Paris"])[0]
    prompt = make(tokenizer, invalid_fallback="free", score_a_form="prompt")(tiny_model, [q], ["It is Paris."],
                                                                            ["Paris"])[0]
    assert cue.fallback and prompt.fallback and cue.score_b == pytest.approx(prompt.score_b)
    assert cue.score_a == pytest.approx(a_cue, abs=1e-7) and prompt.score_a == pytest.approx(a_plain, abs=1e-7)


def test_answer_turn_is_the_chat_templates_follow_up_turn(tiny_model, tokenizer):
    """reward.answer_turn: B = Q + response + <end of turn, user asks, assistant starts> + y*, and the
    cue-form A is the same turn after an empty response; both written by SmolLM2's ChatML template."""
    from rlpr.reward.sequence import turn_cue

    ask = "Repeat your answer in as few words as possible."
    cue = turn_cue(tokenizer, ask)
    assert cue == f"<|im_end|>\n<|im_start|>user\n{ask}<|im_end|>\n<|im_start|>assistant\n"
    q = chat(tokenizer, "Capital of France?")
    eos = tokenizer.eos_token
    b_expected, a_expected = score_texts(tiny_model, tokenizer, [
        build_score_b_text(q, "It is Paris.", "Paris", eos, fallback="free", cue=cue),
        build_score_a_text(q, "Paris", eos, cue=cue)])
    out = make(tokenizer, invalid_fallback="free", answer_turn=ask)(tiny_model, [q], ["It is Paris.<|im_end|>"],
                                                                     ["Paris"])[0]
    assert out.fallback
    assert out.score_b == pytest.approx(b_expected, abs=1e-7) and out.score_a == pytest.approx(a_expected, abs=1e-7)
    # the chat template's special tokens are tokens, not text: the scored span is the reference alone
    reward = make(tokenizer, invalid_fallback="free", answer_turn=ask)
    item = reward.score_b_text(q, "It is Paris.", "Paris")
    assert item.text.endswith(f"It is Paris.{cue}Paris </answer>{eos}")
    assert reward.reference_tokens(item).strip() == "Paris"
    ids = tokenizer(item.text, add_special_tokens=False)["input_ids"]
    assert ids.count(tokenizer.convert_tokens_to_ids("<|im_start|>")) == 5  # system, user, assistant, user, assistant


def test_answer_turn_without_a_chat_template_is_a_config_error(tokenizer):
    from copy import deepcopy

    from rlpr.errors import ConfigError

    plain = deepcopy(tokenizer)
    plain.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    with pytest.raises(ConfigError, match="answer_turn"):
        make(plain, invalid_fallback="free", answer_turn="Answer again.")

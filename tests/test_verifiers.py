"""reward.verifier (issue 28): the oracle (the eval grader's verdict) and the exact verifier
(normalized exact match of the extracted answer), alone, in the reward, and in a training step."""

import json

import pytest

from rlpr.config import RewardConfig, load_config
from rlpr.data.records import Example
from rlpr.errors import ConfigError
from rlpr.grading import grade_example
from rlpr.reward.probability_reward import ProbabilityReward
from rlpr.reward.verifiers import VERIFIERS, exact_answer, exact_match

pytestmark = pytest.mark.integration

QUESTION = "What is the capital of France?"
# a correct answer in a sentence: the eval grader reads it, a rule-based verifier does not
SENTENCE = "The capital of France is Paris, which is a city on the Seine."


def oracle_accepts(response, reference="Paris", acceptable=()):
    example = Example(prompt=[{"role": "user", "content": QUESTION}], reference=reference,
                      acceptable=list(acceptable))
    return grade_example(example, response).correct


@pytest.mark.parametrize("response", ["Paris", "Paris.", "paris", "**Paris**", "The answer is Paris.",
                                      "Answer: Paris", "I think so.\nThe final answer is: Paris. It is big.",
                                      "<think> hmm </think> <answer> Paris </answer>", "\\boxed{Paris}",
                                      "Paris.\nIt is the capital."])
def test_exact_accepts_the_answer_alone_or_after_a_cue(response):
    assert exact_match(response, ["Paris"])
    assert VERIFIERS["exact"].verdict(response, ["Paris"], False) is True  # the grader's verdict is not read


@pytest.mark.parametrize("response", [SENTENCE, "Paris is the capital of France.", "Berlin.", "Berlin or Paris",
                                      "The answer is Berlin. Paris.", "<answer>Berlin</answer> Paris", "",
                                      "Sure! Paris.", "..."])
def test_exact_rejects_everything_else(response):
    assert not exact_match(response, ["Paris"])


def test_a_correct_sentence_is_accepted_by_the_oracle_only():
    assert oracle_accepts(SENTENCE)  # the eval grader cuts ", which ..." and reads "Paris"
    assert not exact_match(SENTENCE, ["Paris"])
    assert exact_answer(SENTENCE) == SENTENCE  # no cue: the first sentence, compared whole
    assert VERIFIERS["oracle"].verdict(SENTENCE, ["Paris"], True) is True
    assert VERIFIERS["oracle"].verdict(SENTENCE, ["Paris"], None) is None  # not graded: no verdict


def test_exact_compares_with_every_alias_after_normalization():
    answers = ["Bern", "Berne"]
    assert exact_match("Berne.", answers) and exact_match("The answer is bern", answers)
    assert not exact_match("Bern (Berne)", answers)  # both names at once is not an exact match
    assert exact_match("The Nile", ["Nile"]) and exact_match("four", ["4"])  # articles, number words
    assert not exact_match("!", ["!"])  # an answer that normalizes to nothing never matches


def make(tokenizer, **kw):
    return ProbabilityReward(RewardConfig(**kw), tokenizer)


def test_the_reward_uses_the_verifier_and_records_the_grader(tiny_model, tokenizer):
    """kind=verifier: (1 - alpha) * the verifier's verdict + alpha * format; `correct` stays the
    eval grader's verdict (reward/accuracy, held-out accuracy), `verified` is the reward's."""
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": QUESTION}], tokenize=False,
                                           add_generation_prompt=True)
    responses = ["Paris.", "The answer is Lutetia.", SENTENCE, "Berlin."]
    correct = [oracle_accepts(r, acceptable=["Lutetia"]) for r in responses]
    assert correct == [True, True, True, False]
    kw = dict(correct=correct, acceptable=[["Lutetia"]] * 4)
    for verifier, want in (("oracle", [1, 1, 1, 0]), ("exact", [1, 1, 0, 0])):
        outs = make(tokenizer, kind="verifier", alpha=0.0, verifier=verifier)(
            tiny_model, [prompt] * 4, responses, ["Paris"] * 4, **kw)
        assert [o.reward for o in outs] == want and [o.verified for o in outs] == want
        assert [o.correct for o in outs] == [1, 1, 1, 0]
    # hybrid: the verifier part reads the exact verdict, the probability part is unchanged
    hybrid = make(tokenizer, kind="hybrid", alpha=0.0, verifier="exact", vr_weight=1.0, pr_weight=0.5)(
        tiny_model, [prompt] * 4, responses, ["Paris"] * 4, **kw)
    assert [o.reward - 0.5 * o.delta for o in hybrid] == pytest.approx([1, 1, 0, 0])
    # exact needs no grader's verdicts; the oracle does
    assert make(tokenizer, kind="verifier", verifier="exact")(tiny_model, [prompt], ["Paris"], ["Paris"])[0].verified
    with pytest.raises(ValueError, match="verdicts"):
        make(tokenizer, kind="verifier")(tiny_model, [prompt], ["Paris"], ["Paris"])
    # kinds that read no verdict record none
    assert make(tokenizer)(tiny_model, [prompt], ["Paris"], ["Paris"], **{k: v[:1] for k, v in kw.items()})[0] \
        .verified is None


def test_config_key():
    assert RewardConfig().verifier == "oracle"
    assert load_config("small", ["reward.kind=verifier", "reward.verifier=exact"]).reward.verifier == "exact"
    with pytest.raises(ConfigError, match="reward.verifier: 'judge' is not one of oracle, exact"):
        load_config("small", ["reward.verifier=judge"])


@pytest.mark.integration
def test_one_training_step_with_the_exact_verifier(tiny_dir, tmp_path):
    """reward.kind=verifier reward.verifier=exact on the tiny model: scripted responses, so the
    verdicts are known; the oracle accepts three of four, the exact verifier two, and the step
    trains on the exact verifier's rewards while reward/accuracy stays the grader's."""
    from rlpr.train.trainer import Trainer

    from helpers import ScriptedEngine, common

    data = tmp_path / "france.jsonl"
    data.write_text("".join(json.dumps({"question": f"{QUESTION} ({i})", "answer": ["Paris", "Lutetia"]}) + "\n"
                            for i in range(8)))
    cfg = load_config("demo", [*common(tiny_dir, tmp_path, "exact", 1), f"data.train={data}", "trainer.progress=false",
                               "reward.alpha=0", "reward.kind=verifier", "reward.verifier=exact",
                               "algorithm.std_filter=false"])
    trainer = Trainer(cfg, tmp_path / "exact")
    trainer.engine = ScriptedEngine(trainer.tokenizer, ["Paris.", "The answer is Lutetia.", SENTENCE, "Berlin."])
    groups, _ = trainer.collect(1)
    for g in groups:
        assert [o.reward for o in g.rewards] == [1, 1, 0, 0] and [o.correct for o in g.rewards] == [1, 1, 1, 0]
    trainer.engine.i = 0
    m = trainer.train_step(1)
    assert m["reward/mean"] == pytest.approx(0.5) and m["reward/accuracy"] == pytest.approx(0.75)
    assert m["policy/tokens"] > 0

"""OPSD's arithmetic (rlpr/algorithms/opsd.py) against hand values and direct computations, its teacher
template, its configuration and the solution column (issue 41)."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F

from rlpr.algorithms.opsd import (generalized_jsd, identity_stats, jsd_from_logits, no_teacher_advantages, pearson,
                                  sampled_token_advantage, spearman, student_rows, top_k_rows)
from rlpr.config import load_config
from rlpr.data.templates import teacher_messages
from rlpr.errors import ConfigError, DataError

pytestmark = pytest.mark.unit


def kl(p, q):
    return sum(a * math.log(a / b) for a, b in zip(p, q))


def logs(p):
    return torch.tensor([[math.log(v) for v in p]], dtype=torch.float64)


@pytest.mark.parametrize("beta", [0.0, 0.25, 0.5, 1.0])
def test_jsd_matches_a_hand_computation(beta):
    u, s = [0.5, 0.5], [0.25, 0.75]
    if beta == 0.0:
        want = kl(u, s)  # the forward KL(u || s) at beta = 0 (the reference code's end)
    elif beta == 1.0:
        want = kl(s, u)  # the reverse KL(s || u) at beta = 1
    else:
        m = [beta * a + (1 - beta) * b for a, b in zip(u, s)]
        want = beta * kl(u, m) + (1 - beta) * kl(s, m)
    assert generalized_jsd(logs(u), logs(s), beta).item() == pytest.approx(want, abs=1e-12)
    assert generalized_jsd(logs(u), logs(u), beta).item() == pytest.approx(0.0, abs=1e-12)


def test_jsd_hand_values_at_a_half():
    # m = (0.375, 0.625): 0.5 KL(u||m) + 0.5 KL(s||m) = 0.5 * 0.0322695 + 0.5 * 0.0353754
    got = generalized_jsd(logs([0.5, 0.5]), logs([0.25, 0.75]), 0.5).item()
    assert got == pytest.approx(0.0338224, abs=1e-6)


def reference_code_jsd(student_logits, teacher_logits, beta, top_k=None):
    """siyan-zhao/OPSD opsd_trainer.py `generalized_jsd_loss` (temperature 1, reduction none): F.kl_div,
    the teacher's top-k with both sides renormalised."""
    if top_k:
        _, idx = torch.topk(teacher_logits, k=top_k, dim=-1)
        student_logits, teacher_logits = student_logits.gather(-1, idx), teacher_logits.gather(-1, idx)
    s, t = F.log_softmax(student_logits, -1), F.log_softmax(teacher_logits, -1)
    if beta == 0:
        return F.kl_div(s, t, reduction="none", log_target=True).sum(-1)
    if beta == 1:
        return F.kl_div(t, s, reduction="none", log_target=True).sum(-1)
    b = torch.tensor(beta, dtype=s.dtype)
    m = torch.logsumexp(torch.stack([s + torch.log1p(-b), t + torch.log(b)]), dim=0)
    return (b * F.kl_div(m, t, reduction="none", log_target=True)
            + (1 - b) * F.kl_div(m, s, reduction="none", log_target=True)).sum(-1)


@pytest.mark.parametrize("beta", [0.0, 0.1, 0.5, 0.9, 1.0])
@pytest.mark.parametrize("top_k", [0, 5])
def test_jsd_equals_the_reference_code_over_the_vocabulary_and_the_top_k(beta, top_k):
    g = torch.Generator().manual_seed(3)
    student, teacher = torch.randn(6, 40, generator=g, dtype=torch.float64) * 3, torch.randn(6, 40, generator=g,
                                                                                              dtype=torch.float64) * 3
    if top_k:
        indices, rows = top_k_rows(teacher, top_k)
    else:
        indices, rows = None, torch.log_softmax(teacher, -1)
    ours = jsd_from_logits(student, rows.double(), indices, beta=beta)
    assert torch.allclose(ours.double(), reference_code_jsd(student, teacher, beta, top_k or None), atol=1e-5)


def test_top_k_rows_keep_the_teachers_most_likely_tokens_renormalised():
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.0]])
    indices, rows = top_k_rows(logits, 2)
    assert indices.tolist() == [[1, 3]]
    assert rows.exp().tolist()[0] == pytest.approx([math.e / (math.e + 1), 1 / (math.e + 1)])
    assert top_k_rows(logits, 10)[0].shape == (1, 4)  # k beyond V: every token
    student = torch.tensor([[5.0, 1.0, 0.0, 1.0]])
    assert student_rows(student, indices).exp().tolist()[0] == pytest.approx([0.5, 0.5])


def test_jsd_gradient_reaches_the_student_only():
    student = torch.randn(3, 7, requires_grad=True)
    teacher = torch.log_softmax(torch.randn(3, 7), -1)
    jsd_from_logits(student, teacher, beta=0.5).sum().backward()
    assert student.grad.abs().sum() > 0 and torch.isfinite(student.grad).all()


def test_sampled_token_advantage_is_the_clipped_log_ratio():
    u = torch.tensor([-0.5, -2.0, -9.0, -1.0])
    s = torch.tensor([-1.0, -1.0, -1.0, -8.0])
    assert sampled_token_advantage(u, s, 5.0).tolist() == [0.5, -1.0, -5.0, 5.0]
    assert sampled_token_advantage(u, s, math.inf).tolist() == [0.5, -1.0, -8.0, 7.0]  # the reference: no clip
    assert not sampled_token_advantage(u.requires_grad_(), s, 1.0).requires_grad


def test_no_teacher_marks_the_lowest_fraction_of_the_whole_step():
    step = [torch.tensor([-0.1, -3.0, -0.2]), torch.tensor([-5.0, -0.3]), torch.tensor([-3.0, -0.4, -0.5])]
    # 8 tokens, rho 0.25: the 2 lowest over all responses (-5.0, then the first -3.0: ties go to the earlier)
    got = no_teacher_advantages(step, 0.25, 2.0)
    assert [t.tolist() for t in got] == [[0.0, -2.0, 0.0], [-2.0, 0.0], [0.0, 0.0, 0.0]]
    # ceil(rho * N): 0.3 of 8 tokens marks 3
    assert sum(int((t != 0).sum()) for t in no_teacher_advantages(step, 0.3, 1.0)) == 3
    assert sum(int((t != 0).sum()) for t in no_teacher_advantages(step, 1.0, 1.0)) == 8
    assert no_teacher_advantages([], 0.5, 1.0) == []


def test_correlations_against_hand_values():
    x, y = [1.0, 2.0, 3.0, 4.0], [2.0, 4.0, 5.0, 4.0]
    # means 2.5 and 3.75: sum dx dy = 3.5, sum dx^2 = 5, sum dy^2 = 4.75
    assert pearson(x, y) == pytest.approx(3.5 / math.sqrt(5 * 4.75))
    # ranks of y with the tie 4, 4 at 2.5: (1, 2.5, 4, 2.5)
    assert spearman(x, y) == pytest.approx(pearson([1, 2, 3, 4], [1, 2.5, 4, 2.5]))
    assert spearman([1, 5, 9], [10, 20, 1000]) == pytest.approx(1.0)
    assert math.isnan(pearson([1.0], [2.0])) and math.isnan(pearson([1.0, 1.0], [2.0, 3.0]))


def test_identity_stats_use_the_finite_pairs():
    stats = identity_stats([1.0, 2.0, 3.0, 9.0], [1.5, 2.5, 3.0, float("nan")])
    assert stats.count == 3 and stats.pearson == pytest.approx(pearson([1, 2, 3], [1.5, 2.5, 3.0]))
    assert stats.mean_gap == pytest.approx((-0.5 - 0.5 + 0.0) / 3)
    assert set(stats.metrics()) == {"opsd/identity_pearson", "opsd/identity_spearman", "opsd/identity_mean_gap",
                                    "opsd/identity_n"}


# -- the teacher's context --------------------------------------------------------------------------------

def test_teacher_template_puts_the_reference_before_the_question():
    cfg = load_config("demo", ["reward.kind=opsd"])
    assert cfg.opsd.template == "matched"
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Capital of France?"}]
    out = teacher_messages(messages, cfg.opsd.template, "Paris")
    assert out[0] == messages[0] and messages[1]["content"] == "Capital of France?"  # the input is not changed
    assert out[1]["content"] == "Here is a reference answer to the question below:\nParis\n\nCapital of France?"
    # one pass: a reference holding a placeholder stays as written
    assert "{question}" in teacher_messages(messages, "{reference} | {question}", "{question}")[1]["content"]
    none = teacher_messages(messages, cfg.opsd.template, "")[1]["content"]  # the context-only control
    assert none == "Here is a reference answer to the question below:\n\n\nCapital of France?"
    # the reference code's fixed wording, as rlpr's default was before issue 58
    old = teacher_messages(messages, "reference_code", "Paris")[1]["content"]
    assert old == ("Here is a reference solution to the problem below:\nParis\n\nAfter understanding the reference "
                   "solution and the rationale behind each step, now articulate your own step-by-step reasoning that "
                   "derives the same final answer to the problem below:\n\nCapital of France?")


@pytest.mark.parametrize("template", ["plain", "r1", "r1_nothink", "r1_user", "steps"])
@pytest.mark.parametrize("family", ["smollm2", "qa"])
@pytest.mark.parametrize("context", ["reference", "solution", "none"])
def test_the_teacher_prompt_is_the_student_prompt_plus_exactly_the_block(tokenizer, template, family, context):
    """Issue 58: the same chat, instructions and pre-fill as the student's; the reference (or worked
    solution) block before the question; the transition sentence only where the student is asked to
    reason. Both families' chat templates: SmolLM2's own, and the Question/Answer text of base models."""
    import copy

    from rlpr.data.prompts import chat_text
    from rlpr.data.templates import (REFERENCE_BLOCK, SOLUTION_BLOCK, TRANSITION, asks_to_reason, build_messages,
                                     teacher_block)
    from rlpr.model.loading import QA_CHAT_TEMPLATE

    tok = copy.copy(tokenizer)
    if family == "qa":
        tok.chat_template = QA_CHAT_TEMPLATE
    student = build_messages("What is 47 + 38?", template)
    shown = {"reference": "85", "solution": "40 + 30 = 70. 7 + 8 = 15. 70 + 15 = 85.\nAnswer: 85", "none": ""}[context]
    cfg = load_config("demo", ["reward.kind=opsd", f"data.template={template}", f"opsd.context={context}"])
    block = teacher_block(student, shown, context, cfg.opsd.transition)
    reasons = template != "plain"  # every r1 form and steps ask for reasoning; plain asks a plain question
    assert asks_to_reason(student) is reasons
    assert block == (SOLUTION_BLOCK if context == "solution" else REFERENCE_BLOCK).replace("{reference}", shown) + (
        TRANSITION if reasons else "")
    prefill = "<think>" if template == "r1" else ""
    s_text = chat_text(tok, student) + prefill
    t_text = chat_text(tok, teacher_messages(student, cfg.opsd.template, shown, context=context,
                                             transition=cfg.opsd.transition)) + prefill
    at = t_text.index(block)
    assert t_text[:at] + t_text[at + len(block):] == s_text  # the student's text, plus exactly the block
    assert at == s_text.index(student[-1]["content"])  # ... right before the student's last user turn
    for transition, expected in (("always", True), ("never", False)):
        assert teacher_block(student, shown, context, transition).endswith(TRANSITION) is expected


def test_a_recipe_that_is_no_name_is_one_line(tmp_path):
    """A preset file's opsd.recipe that is a list or a mapping, or a name of any length, is one line."""
    from rlpr.errors import ConfigError

    for value in ("[a, b]", "{x: 1}", "'" + "r" * 5000 + "'"):
        path = tmp_path / "p.yaml"
        path.write_text(f"opsd:\n  recipe: {value}\n")
        with pytest.raises(ConfigError, match="^opsd.recipe: .* is not one of authors_current$") as e:
            load_config(str(path))
        assert len(str(e.value)) < 400 and "\n" not in str(e.value)


def test_clip_token_divergence_by_hand():
    """min(JSD_t, c) per token; c = 0 leaves the divergence as it is; a clipped token has no gradient."""
    from rlpr.algorithms.opsd import clip_token_divergence

    jsd = torch.tensor([0.01, 0.05, 0.2, 0.7], requires_grad=True)
    clipped = clip_token_divergence(jsd, 0.05)
    assert clipped.tolist() == pytest.approx([0.01, 0.05, 0.05, 0.05])
    clipped.sum().backward()
    assert jsd.grad.tolist() == [1.0, 1.0, 0.0, 0.0]  # torch.clamp passes the gradient at the bound
    assert torch.equal(clip_token_divergence(jsd.detach(), 0.0), jsd.detach())


def test_the_authors_recipe_is_one_setting_and_explicit_keys_win():
    from rlpr.config.recipes import RECIPES

    cfg = load_config("reasoning", ["reward.kind=opsd", "opsd.recipe=authors_current"])
    for key, value in RECIPES["authors_current"].items():
        section, name = key.split(".")
        assert getattr(getattr(cfg, section), name) == value
    recipe = (cfg.opsd.beta, cfg.opsd.jsd_token_clip, cfg.rollout.temperature, cfg.rollout.top_p)
    assert recipe == (0.0, 0.05, 1.1, 0.95)
    # the command line's keys still win, in any order
    for order in (["opsd.recipe=authors_current", "rollout.temperature=1.0"],
                  ["rollout.temperature=1.0", "opsd.recipe=authors_current"]):
        assert load_config("reasoning", ["reward.kind=opsd", *order]).rollout.temperature == 1.0
    # a resumed run's config holds the values it ran with: nothing is expanded again
    base = {"opsd": {"recipe": "authors_current", "beta": 0.5}, "rollout": {"temperature": 0.9}}
    again = load_config("reasoning", [], base=base)
    assert (again.opsd.beta, again.rollout.temperature) == (0.5, 0.9)


@pytest.mark.parametrize("overrides,message", [
    (["reward.kind=opsd", "opsd.template=no question here {reference}"],
     "opsd.template: must be one of matched, reference_code or contain {question}"),
    (["reward.kind=opsd", 'opsd.template="{question}"'], "opsd.template: must contain {reference}"),
    (["reward.kind=opsd_no_teacher", "reward.shuffle_references=true"], "reward.kind=opsd_no_teacher reads no ref"),
    (["reward.kind=opsd", "opsd.context=none", "reward.shuffle_references=true"], "(opsd.context=none)"),
    (["reward.kind=opsd", "opsd.recipe=paper"], "opsd.recipe: 'paper' is not one of authors_current"),
    (["reward.kind=opsd", "opsd.transition=sometimes"], "opsd.transition: 'sometimes' is not one of auto, always"),
    (["opsd.jsd_token_clip=-1"], "opsd.jsd_token_clip: must be in [0, inf)"),
    (["reward.kind=opsd", "opsd.teacher=ema", "trainer.strategy=fsdp"], "use trainer.strategy=ddp"),
    (["opsd.beta=1.5"], "opsd.beta: must be in [0, 1]"),
    (["opsd.no_teacher_rho=0"], "opsd.no_teacher_rho: must be in (0, 1]"),
    (["opsd.loss=kl"], "opsd.loss: 'kl' is not one of jsd, sampled_token"),
    (["opsd.teacher=frozen"], "opsd.teacher: 'frozen' is not one of initial, current, ema"),
])
def test_config_errors_name_the_key(overrides, message):
    with pytest.raises(ConfigError) as e:
        load_config("demo", overrides)
    assert message in str(e.value)


def test_the_controls_are_config_values():
    load_config("demo", ["reward.kind=opsd", "reward.shuffle_references=true"])  # OP2SD
    load_config("demo", ["reward.kind=opsd", "opsd.context=none", 'opsd.template="{question}"'])  # context-only
    load_config("demo", ["reward.kind=opsd_hybrid", "reward.shuffle_references=true", "opsd.context=none"])
    assert load_config("demo", ["opsd.clip=inf"]).opsd.clip == math.inf  # the reference code's unclipped form


def test_the_solution_column_is_read_and_required(tmp_path):
    from rlpr.train.setup import load_examples_for

    rows = [{"question": "2+2?", "answer": "4", "worked": "2 and 2 make 4."},
            {"question": "3+3?", "answer": "6", "worked": "3 and 3 make 6."}]
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    overrides = ["reward.kind=opsd", "opsd.context=solution", "opsd.solution_column=worked", f"data.train={path}",
                 "data.val=", "trainer.prompts_per_step=2", "trainer.mini_batch_prompts=2"]
    cfg = load_config("demo", overrides)
    examples = load_examples_for(cfg, "train")
    assert [e.extra_info["worked"] for e in examples] == ["2 and 2 make 4.", "3 and 3 make 6."]
    verl = tmp_path / "verl.jsonl"
    verl.write_text(json.dumps({"prompt": [{"role": "user", "content": "2+2?"}], "worked": "Two twos.",
                                "reward_model": {"ground_truth": "4"}}) + "\n"
                    + json.dumps({"prompt": [{"role": "user", "content": "3+3?"}], "extra_info": {"worked": "Six."},
                                  "reward_model": {"ground_truth": "6"}}) + "\n")
    cfg = load_config("demo", [*overrides[:-3], f"data.train={verl}", "data.val=", "trainer.prompts_per_step=2",
                               "trainer.mini_batch_prompts=2"])
    assert [e.extra_info["worked"] for e in load_examples_for(cfg, "train")] == ["Two twos.", "Six."]
    rows[1]["worked"] = ""
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DataError, match=r"row 2: field 'worked' must be a non-empty string"):
        load_examples_for(load_config("demo", overrides), "train")
    del rows[1]["worked"]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DataError, match=r"row 2: field 'worked' is missing \(opsd.context=solution reads it\)"):
        load_examples_for(load_config("demo", overrides), "train")
    plain = load_config("demo", [f"data.train={path}", "data.val=", "trainer.prompts_per_step=2",
                                 "trainer.mini_batch_prompts=2"])
    assert all(e.extra_info == {} for e in load_examples_for(plain, "train"))  # read only for the teacher

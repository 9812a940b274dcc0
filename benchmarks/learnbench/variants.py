"""The learning benchmark's variants, model families and question sets: one registry that the runner,
the tables and the plots all read (a variant is config overrides on top of the preset, nothing else)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1]
RESULTS = BENCHMARKS / "results"
EXAMPLES = BENCHMARKS.parent / "examples"

# what a variant is in the summary: the method under test, an ablation of it, a control of RLPR (same
# estimator, filter and update, only the reward differs), an OPSD method, a control of OPSD, or an
# OPSD row of the teacher template its student never matched (issue 58: kept, labeled, out of the verdict)
ROLES = ("method", "ablation", "control", "opsd", "opsd_control", "opsd_mismatched")


@dataclass(frozen=True)
class Variant:
    name: str
    overrides: tuple[str, ...]
    role: str
    first: bool = False  # run for every seed before the others: a benchmark cut short still compares these
    doc: str = ""
    by_name: bool = False  # left out of the default --variants list: run only when named


REGISTRY: dict[str, Variant] = {}


def register(name: str, overrides: list[str], role: str, *, first: bool = False, doc: str = "",
             by_name: bool = False) -> Variant:
    """Add a variant (its order is the tables' row order and the plots' colour order: append only)."""
    if name in REGISTRY or name == "base":
        raise ValueError(f"variant {name!r} is registered already")
    if role not in ROLES:
        raise ValueError(f"variant {name!r}: role {role!r} is not one of {', '.join(ROLES)}")
    REGISTRY[name] = Variant(name, tuple(overrides), role, first, doc, by_name)
    return REGISTRY[name]


register("rlpr", [], "method", first=True,
         doc="the preset as it is (mean token probability, debiased by score A, EMA std filter)")
register("rlvr", ["reward.kind=verifier", "reward.verifier=oracle"], "method", first=True,
         doc="the `oracle` verifier: 1 when the eval grader accepts the response (the metric's own grader, "
             "an upper bound no real RLVR user has for free-form answers)")
register("rlvr_exact", ["reward.kind=verifier", "reward.verifier=exact"], "method", first=True,
         doc="normalized exact match of the extracted answer: the rule verifier a real RLVR user has")
register("no_debias", ["reward.debias=false"], "ablation")
register("no_std_filter", ["algorithm.std_filter=false"], "ablation")
register("seq_likelihood", ["reward.aggregation=seq_likelihood"], "ablation",
         doc="the sequence likelihood instead of the mean token probability")
# the verifier-free family on the same data, prompts and scoring position (the preset's spec-1b
# answer turn: the embedded model does not write <answer> tags, so the presets' tag formats would
# score nothing; docs/verifier-free.md). VeriFree: R = p(y* | x, z), RLOO, the policy gradient
# summed over the reasoning (here the whole response) plus the R-weighted SFT term on y*, one
# update per step (the preset's 4 prompts in one mini-batch), no std filter.
register("verifree", ["reward.aggregation=seq_likelihood", "reward.debias=false", "reward.shaping=identity",
                      "algorithm.advantage=rloo", "algorithm.std_filter=false", "algorithm.pg_tokens=reasoning",
                      "algorithm.loss_agg=seq_mean_token_sum", "algorithm.ref_sft_coef=1.0",
                      "algorithm.ref_sft_weight=reward", "algorithm.ref_sft_norm=sum", "algorithm.kl_coef=0",
                      "algorithm.entropy_coef=0"], "ablation", doc="VeriFree's reward, advantage and loss")
# NOVER: the group rank of the reasoning perplexity (the whole response, scored with the
# policy), GRPO, no std filter; every scored response is ranked (reward.nover_gate=scored), as
# no response passes NOVER's strict tag format here
register("nover", ["reward.kind=nover", "reward.nover_gate=scored", "reward.debias=false", "algorithm.advantage=grpo",
                   "algorithm.std_filter=false", "algorithm.kl_coef=0"], "ablation",
         doc="NOVER's reward, advantage and loss")
# debiasing where it can act: every group estimator (grpo, rloo, dr_grpo, reinforce_pp) subtracts
# the group mean, which cancels a per-prompt score A; REINFORCE's batch baseline compares rewards
# across prompts, so B - A and B rank the batch differently. The pair differs only in reward.debias.
register("reinforce", ["algorithm.advantage=reinforce"], "ablation",
         doc="r - the batch's mean reward: no group baseline, so a per-prompt score A is no longer cancelled")
register("reinforce_no_debias", ["algorithm.advantage=reinforce", "reward.debias=false"], "ablation")
# the entropy bonus only where the reward separates responses (algorithm.entropy_tokens, beyond
# the spec): does an RLVR run without signal stay put instead of drifting to noise, and does
# RLPR, whose groups mostly carry signal, learn as before?
register("rlvr_exact_nz", ["reward.kind=verifier", "reward.verifier=exact",
                           "algorithm.entropy_tokens=nonzero_advantage"], "ablation")
register("rlpr_nz", ["algorithm.entropy_tokens=nonzero_advantage"], "ablation")
# the controls and the label-free family (spec section 9; issue 33): the same estimator, filter and
# update as rlpr, only the reward differs. random: Bernoulli(0.5), the spurious-reward control;
# shuffled_reference: rlpr scored against another prompt's reference (a derangement fixed by the
# seed); entropy (EM-RL), self_certainty (INTUITOR), majority (TTRL): rewards that read no reference
register("random", ["reward.kind=random"], "control", first=True)
register("shuffled_reference", ["reward.shuffle_references=true"], "control", first=True)
register("entropy", ["reward.kind=entropy"], "control", first=True)
register("self_certainty", ["reward.kind=self_certainty"], "control")
register("majority", ["reward.kind=majority"], "control")
# on-policy self-distillation (issue 41): the same policy shown the reference is the teacher of the
# policy without it, token by token; the hybrid adds its token advantage to RLPR's sequence one. Its
# controls: the teacher shown another question's reference (OP2SD: the seeded derangement of
# shuffled_reference), the teacher template with no reference, and no teacher at all (a fixed
# negative advantage on the lowest-probability tokens). Every seed of all five runs before the next.
register("opsd", ["reward.kind=opsd"], "opsd", first=True, doc="on-policy self-distillation")
register("opsd_hybrid", ["reward.kind=opsd_hybrid"], "opsd", first=True,
         doc="RLPR's sequence advantage plus lambda times OPSD's token advantage")
register("op2sd", ["reward.kind=opsd", "reward.shuffle_references=true"], "opsd_control", first=True,
         doc="the teacher sees another question's reference")
register("opsd_context_only", ["reward.kind=opsd", "opsd.context=none"], "opsd_control", first=True,
         doc="the teacher template without the reference")
register("opsd_no_teacher", ["reward.kind=opsd_no_teacher"], "opsd_control", first=True,
         doc="a fixed negative advantage on the lowest-probability tokens, no teacher forward")
# precision arms of the same method (issue 42): on CPUs with fast bf16 `auto` rolls out on a bf16 copy,
# score B continues that copy's bf16 keys/values by default (reward.score_b_from_cache=always: B moves
# by up to 2e-2 against fp32) and the update runs under bf16 autocast (whose gradient missed one
# outlier sample: benchmarks/update_precision.py); the bf16 copy also runs B's continuation
# (reward.score_b_on_copy=always). Each arm changes one of those choices back to fp32; on an fp32
# machine they equal `rlpr`, so they run only when named. The results files ran under other defaults:
# in results/precision_arms.md `rlpr` is today's `rlpr_exact_b` and `rlpr_b_from_bf16_cache` today's
# `rlpr_b_by_policy`; in results/b_on_copy_arms.md `rlpr` is today's `rlpr_b_by_policy` and
# `rlpr_b_on_bf16_copy` today's `rlpr`.
register("rlpr_exact_b", ["reward.score_b_from_cache=auto"], "ablation", by_name=True,
         doc="score B recomputed in fp32 where the rollout copy's keys/values are bf16 (2.1x slower B)")
register("rlpr_fp32_update", ["trainer.mixed_precision=none"], "ablation", by_name=True,
         doc="the update in fp32 where `auto` would autocast it to bf16")
register("rlpr_b_by_policy", ["reward.score_b_on_copy=auto"], "ablation", by_name=True,
         doc="score B's continuation run by the fp32 policy where the rollout copy is bf16 (2.2x slower B)")

# The same four with the teacher template rlpr used before issue 58 (opsd.template=reference_code: "now
# articulate your own step-by-step reasoning", while the short-answer student is asked a plain question
# and given 32 tokens; sampled as a policy, that teacher answered 3.9% right against its student's 20.3%).
# Their rows ran as opsd, opsd_hybrid, op2sd and opsd_context_only and were renamed (docs/opsd.md).
for _name in ("opsd", "opsd_hybrid", "op2sd", "opsd_context_only"):
    register(f"{_name}_refcode_template", [*REGISTRY[_name].overrides, "opsd.template=reference_code"],
             "opsd_mismatched", by_name=True, doc=f"{_name} with the reference code's fixed teacher wording")
# OPSD at its authors' current recipe (opsd.recipe=authors_current: forward KL, the per-token clip 0.05,
# sampling at 1.1 / top-p 0.95, the initial teacher shown the worked solution), for tracks whose
# questions have worked solutions (the reasoning track); evaluated at the other rows' temperature 1.0
_RECIPE = ["opsd.recipe=authors_current", "trainer.eval_temperature=1.0", "trainer.eval_top_p=1.0"]
register("opsd_recipe", ["reward.kind=opsd", *_RECIPE], "opsd", by_name=True,
         doc="OPSD, the authors' current recipe, the teacher shown the worked solution")
register("opsd_hybrid_recipe", ["reward.kind=opsd_hybrid", *_RECIPE], "opsd", by_name=True,
         doc="RLPR's sequence advantage plus the recipe's clipped forward-KL distillation")
register("op2sd_recipe", ["reward.kind=opsd", "reward.shuffle_references=true", *_RECIPE], "opsd_control",
         by_name=True, doc="the recipe, the teacher shown another question's worked solution")
register("opsd_context_only_recipe", ["reward.kind=opsd", *_RECIPE, "opsd.context=none"], "opsd_control",
         by_name=True, doc="the recipe, the teacher block without the solution")

# RLPR's early learning (issue 61), one change each against the preset: fill the batch (rounds of exactly
# the missing groups, up to 4: every extra rollout counted in the row's `rollouts`), or twice the learning
# rate (the measured gradient norm of RLPR's steps is 0.68x self-certainty's at the same |A|;
# results/early_learning.md). Run by name, to the early-learning file (docs/learning.md).
register("rlpr_fill", ["algorithm.refill=missing", "algorithm.max_sampling_tries=4"], "ablation", by_name=True,
         doc="RLPR filling its batch: up to 4 sampling rounds of exactly the missing groups")
register("rlpr_lr2x", ["trainer.lr=4e-4"], "ablation", by_name=True, doc="RLPR at twice the preset's learning rate")

VARIANTS: dict[str, list[str]] = {name: list(v.overrides) for name, v in REGISTRY.items()}
MAIN_VARIANTS = tuple(name for name, v in REGISTRY.items() if v.first)
DEFAULT_VARIANTS = tuple(name for name, v in REGISTRY.items() if not v.by_name)  # what --variants runs unset
CONTROLS = tuple(name for name, v in REGISTRY.items() if v.role == "control")
OPSD_METHODS = tuple(name for name, v in REGISTRY.items() if v.role == "opsd")
OPSD_CONTROLS = tuple(name for name, v in REGISTRY.items() if v.role == "opsd_control")

# the second model family (issue 33): `--model gemma` trains and evaluates Gemma 3 270M (base) instead
# of the embedded SmolLM2-135M-Instruct; rows record `model`, and settings carry it (never mixed)
# (what the small preset needs beyond model.path: Gemma's base GGUF has no chat template, so its prompts
# use the Question/Answer text format, the response ends at a new line, and y* is scored after a second
# question in that format; rlpr.model.loading.QA_CHAT_TEMPLATE, docs/learning.md)
MODEL_TITLES = {"smollm2": "SmolLM2-135M-Instruct (the embedded model)", "gemma": "Gemma 3 270M (base)"}
MODELS = {"smollm2": [],
          "gemma": ["model.path=gemma3-270m", 'rollout.stop=["\\n"]', "reward.answer_turn=''",
                    'reward.answer_cue="\\n\\nQuestion: Repeat your answer in as few words as possible.\\nAnswer: "']}

# question sets beside the in-family held-out questions (set name -> file; never trained on)
TRANSFER = {"new_items": EXAMPLES / "family_new_items.jsonl", "general": EXAMPLES / "general_questions.jsonl"}
SET_TITLES = {"heldout": "in-family held-out", "new_items": "new family items", "general": "general questions"}
GRADED = ("acc", "greedy", "pass8")  # the numbers a grader decides (what --regrade recomputes)

# The held-out reward and score-B columns use one fixed scorer for every run and preset version
# (the "\nAnswer: " cue with the prompt-only A, what the first benchmark's preset trained with), so
# that those columns compare across variants and across changes of the preset's own reward.
SCORER = ['reward.answer_cue="\\nAnswer: "', "reward.answer_turn=''", "reward.score_a_form=prompt"]


def describe() -> str:
    """One line per variant: name, role, overrides and what it is (`--list-variants`)."""
    return "\n".join(f"{v.name:<20} {v.role:<13} {' '.join(v.overrides) or '(the preset)'}"
                     + (f"\n{'':<34}{v.doc}" if v.doc else "") for v in REGISTRY.values())

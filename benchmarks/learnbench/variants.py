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
# the verifier-free family at the preset's scoring position (docs/learning.md, "The verifier-free family")
register("verifree", ["reward.aggregation=seq_likelihood", "reward.debias=false", "reward.shaping=identity",
                      "algorithm.advantage=rloo", "algorithm.std_filter=false", "algorithm.pg_tokens=reasoning",
                      "algorithm.loss_agg=seq_mean_token_sum", "algorithm.ref_sft_coef=1.0",
                      "algorithm.ref_sft_weight=reward", "algorithm.ref_sft_norm=sum", "algorithm.kl_coef=0",
                      "algorithm.entropy_coef=0"], "ablation", doc="VeriFree's reward, advantage and loss")
register("nover", ["reward.kind=nover", "reward.nover_gate=scored", "reward.debias=false", "algorithm.advantage=grpo",
                   "algorithm.std_filter=false", "algorithm.kl_coef=0"], "ablation",
         doc="NOVER's reward, advantage and loss")
# debiasing where it can act (a batch baseline does not cancel a per-prompt score A; docs/learning.md,
# "When debiasing and the filter matter"): the pair differs only in reward.debias
register("reinforce", ["algorithm.advantage=reinforce"], "ablation",
         doc="r - the batch's mean reward: no group baseline, so a per-prompt score A is no longer cancelled")
register("reinforce_no_debias", ["algorithm.advantage=reinforce", "reward.debias=false"], "ablation")
# the entropy bonus only where the reward separates responses (algorithm.entropy_tokens, beyond the spec)
register("rlvr_exact_nz", ["reward.kind=verifier", "reward.verifier=exact",
                           "algorithm.entropy_tokens=nonzero_advantage"], "ablation")
register("rlpr_nz", ["algorithm.entropy_tokens=nonzero_advantage"], "ablation")
# RLPR's controls and the label-free family (issue 33): rlpr's estimator, filter and update, another reward
register("random", ["reward.kind=random"], "control", first=True)
register("shuffled_reference", ["reward.shuffle_references=true"], "control", first=True)
register("entropy", ["reward.kind=entropy"], "control", first=True)
register("self_certainty", ["reward.kind=self_certainty"], "control")
register("majority", ["reward.kind=majority"], "control")
# on-policy self-distillation (issue 41) and its controls (docs/opsd.md)
register("opsd", ["reward.kind=opsd"], "opsd", first=True, doc="on-policy self-distillation")
register("opsd_hybrid", ["reward.kind=opsd_hybrid"], "opsd", first=True,
         doc="RLPR's sequence advantage plus lambda times OPSD's token advantage")
register("op2sd", ["reward.kind=opsd", "reward.shuffle_references=true"], "opsd_control", first=True,
         doc="the teacher sees another question's reference")
register("opsd_context_only", ["reward.kind=opsd", "opsd.context=none"], "opsd_control", first=True,
         doc="the teacher template without the reference")
register("opsd_no_teacher", ["reward.kind=opsd_no_teacher"], "opsd_control", first=True,
         doc="a fixed negative advantage on the lowest-probability tokens, no teacher forward")
# precision arms (issue 42; docs/training.md): each changes one of `auto`'s bf16 choices on a fast-bf16 CPU
# back to fp32 (on an fp32 machine they equal `rlpr`: run only when named). The results ran under other defaults:
# in results/precision_arms.md `rlpr` is today's `rlpr_exact_b` and `rlpr_b_from_bf16_cache` today's
# `rlpr_b_by_policy`; in results/b_on_copy_arms.md `rlpr` is today's `rlpr_b_by_policy` and
# `rlpr_b_on_bf16_copy` today's `rlpr`.
register("rlpr_exact_b", ["reward.score_b_from_cache=auto"], "ablation", by_name=True,
         doc="score B recomputed in fp32 where the rollout copy's keys/values are bf16 (2.1x slower B)")
register("rlpr_fp32_update", ["trainer.mixed_precision=none"], "ablation", by_name=True,
         doc="the update in fp32 where `auto` would autocast it to bf16")
register("rlpr_b_by_policy", ["reward.score_b_on_copy=auto"], "ablation", by_name=True,
         doc="score B's continuation run by the fp32 policy where the rollout copy is bf16 (2.2x slower B)")

# the same four with the teacher template used before issue 58 (their rows ran under the plain names and
# were renamed; docs/opsd.md)
for _name in ("opsd", "opsd_hybrid", "op2sd", "opsd_context_only"):
    register(f"{_name}_refcode_template", [*REGISTRY[_name].overrides, "opsd.template=reference_code"],
             "opsd_mismatched", by_name=True, doc=f"{_name} with the reference code's fixed teacher wording")
# OPSD at its authors' current recipe, for tracks with worked solutions; evaluated at the other rows' temperature
_RECIPE = ["opsd.recipe=authors_current", "trainer.eval_temperature=1.0", "trainer.eval_top_p=1.0"]
register("opsd_recipe", ["reward.kind=opsd", *_RECIPE], "opsd", by_name=True,
         doc="OPSD, the authors' current recipe, the teacher shown the worked solution")
register("opsd_hybrid_recipe", ["reward.kind=opsd_hybrid", *_RECIPE], "opsd", by_name=True,
         doc="RLPR's sequence advantage plus the recipe's clipped forward-KL distillation")
register("op2sd_recipe", ["reward.kind=opsd", "reward.shuffle_references=true", *_RECIPE], "opsd_control",
         by_name=True, doc="the recipe, the teacher shown another question's worked solution")
register("opsd_context_only_recipe", ["reward.kind=opsd", *_RECIPE, "opsd.context=none"], "opsd_control",
         by_name=True, doc="the recipe, the teacher block without the solution")

# RLPR's early learning (issue 61; benchmarks/early_learning.py): fill the batch, or twice the learning rate
register("rlpr_fill", ["algorithm.refill=missing", "algorithm.max_sampling_tries=4"], "ablation", by_name=True,
         doc="RLPR filling its batch: up to 4 sampling rounds of exactly the missing groups")
register("rlpr_lr2x", ["trainer.lr=4e-4"], "ablation", by_name=True, doc="RLPR at twice the preset's learning rate")
register("rlpr_fp32", ["model.rollout_dtype=float32", "trainer.mixed_precision=none"], "ablation", by_name=True,
         doc="RLPR in fp32 throughout, as `auto` runs it on an AVX2 CPU: rollout copy, score B's caches, the update")

VARIANTS: dict[str, list[str]] = {name: list(v.overrides) for name, v in REGISTRY.items()}
MAIN_VARIANTS = tuple(name for name, v in REGISTRY.items() if v.first)
DEFAULT_VARIANTS = tuple(name for name, v in REGISTRY.items() if not v.by_name)  # what --variants runs unset
CONTROLS = tuple(name for name, v in REGISTRY.items() if v.role == "control")
OPSD_METHODS = tuple(name for name, v in REGISTRY.items() if v.role == "opsd")
OPSD_CONTROLS = tuple(name for name, v in REGISTRY.items() if v.role == "opsd_control")


def in_order(rows: list[dict]) -> list[str]:
    """The trained variants of `rows` in the registry's order, then names it no longer holds in row order:
    a renamed or retired arm's rows stay in their tables (a --regrade once dropped them)."""
    present = [r["variant"] for r in rows if r["variant"] != "base"]
    return [v for v in VARIANTS if v in present] + list(dict.fromkeys(v for v in present if v not in VARIANTS))

# the second model family (issue 33), `--model gemma`: its base GGUF has no chat template, so prompts and the
# answer cue use the Question/Answer format (rlpr.model.loading.QA_CHAT_TEMPLATE, docs/learning.md)
MODEL_TITLES = {"smollm2": "SmolLM2-135M-Instruct (the embedded model)", "gemma": "Gemma 3 270M (base)"}
MODELS = {"smollm2": [],
          "gemma": ["model.path=gemma3-270m", 'rollout.stop=["\\n"]', "reward.answer_turn=''",
                    'reward.answer_cue="\\n\\nQuestion: Repeat your answer in as few words as possible.\\nAnswer: "']}

# question sets beside the in-family held-out questions (set name -> file; never trained on)
TRANSFER = {"new_items": EXAMPLES / "family_new_items.jsonl", "general": EXAMPLES / "general_questions.jsonl"}
SET_TITLES = {"heldout": "in-family held-out", "new_items": "new family items", "general": "general questions"}
GRADED = ("acc", "greedy", "pass8")  # the numbers a grader decides (what --regrade recomputes)

# one fixed scorer for the held-out reward and score-B columns of every run (docs/learning.md)
SCORER = ['reward.answer_cue="\\nAnswer: "', "reward.answer_turn=''", "reward.score_a_form=prompt"]


def describe() -> str:
    """One line per variant: name, role, overrides and what it is (`--list-variants`)."""
    return "\n".join(f"{v.name:<20} {v.role:<13} {' '.join(v.overrides) or '(the preset)'}"
                     + (f"\n{'':<34}{v.doc}" if v.doc else "") for v in REGISTRY.values())

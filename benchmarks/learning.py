"""Does RLPR teach the embedded model? Held-out accuracy before and after, against RLVR and ablations.

Trains SmolLM2-135M-Instruct (LoRA) with the `small` preset on the built-in demo tasks, over
several seeds, and evaluates every run on the SAME held-out questions (the demo `val` split of
the preset's task families, drawn by a hash of the question text before any training, never
trained on) with the SAME fixed scorer (SCORER below), exactly as RLPR evaluates:

- Avg@8: 8 samples per question at the rollout temperature, accuracy averaged (the paper's metric),
- greedy accuracy, pass@8, mean probability reward and score B of the greedy response, format
  rate, response length; standard errors are binomial over the held-out questions.

Transfer: every run and the base model are also evaluated (Avg@8, greedy, pass@8, same sampling)
on two sets never trained on (TRANSFER below): examples/family_new_items.jsonl (110 new items of
the demo families, answers outside the demo dictionaries) and examples/general_questions.jsonl
(208 general short-answer questions of other kinds, aliases in the answer list). "Before" is the
base model for every run (every run starts from it).

Variants (config overrides on top of the preset):

- `rlpr`: the preset as it is (mean token probability, debiased by score A, EMA std filter),
- `rlvr`: reward.kind=verifier with the `oracle` verifier (1 when the eval grader accepts the
  response: the metric's own grader, an upper bound no real RLVR user has for free-form answers),
- `rlvr_exact`: reward.kind=verifier reward.verifier=exact (normalized exact match of the
  extracted answer: the rule verifier a real RLVR user has; rlpr/reward/verifiers.py),
- `no_debias`: reward.debias=false,  `no_std_filter`: algorithm.std_filter=false,
- `seq_likelihood`: reward.aggregation=seq_likelihood instead of the mean token probability,
- `verifree`, `nover`: VeriFree's and NOVER's rewards, advantages and losses (VARIANTS below) on the
  same data and scoring position,
- `reinforce`: algorithm.advantage=reinforce (r - the batch's mean reward: no group baseline, so a
  per-prompt score A is no longer cancelled), `reinforce_no_debias`: the same with
  reward.debias=false; the pair isolates what debiasing does where rewards are compared across
  prompts (docs/learning.md, "When debiasing and the filter matter"),
- `rlvr_exact_nz`, `rlpr_nz`: rlvr_exact and rlpr with algorithm.entropy_tokens=nonzero_advantage
  (no entropy bonus on responses whose advantage is 0),
- and `base`, the untrained model (evaluated once: every run starts from it).

    python benchmarks/learning.py              # the full benchmark (see --help for its size)
    python benchmarks/learning.py --variants rlpr,rlvr,rlvr_exact   # the three main variants only
    python benchmarks/learning.py --quick      # a smaller smoke setting (1 seed, rlpr + base)
    python benchmarks/learning.py --regrade    # re-grade the saved responses with the current grader

Two 1-thread workers share the job list (each job claimed by a file in the work dir; a worker
that needs the base evaluation waits for it):
    python benchmarks/learning.py --threads 1 & python benchmarks/learning.py --threads 1

Each finished run is appended to <output>.jsonl; a re-run skips the runs already there, so an
interrupted benchmark loses at most the runs in progress. Every row records the graders' version
(`rlpr.grading.GRADER_VERSION`, also part of the settings): rows graded by another
version are never mixed with new ones (they are skipped, with a message). Each run's final
responses (held-out, transfer and curve questions: per question the greedy and sampled
responses, the reference and its aliases, and their grades) go to
<output>_responses/<variant>-<seed>-<settings hash>.jsonl.gz, so that `--regrade` recomputes
every graded number (Avg@k, greedy, pass@k, the curves) with the current grader without
retraining; the training-time accuracies (`train[*].reward/accuracy`) and what the `rlvr` runs
were rewarded with stay those of the grader the run trained with (`regraded_from` says which).
The summary goes to <output>.json (`{"runs": [...], "table": [...]}`), <output>.md and
<output>.png (learning curves and transfer).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent
RESULTS = ROOT / "results"
EXAMPLES = ROOT.parent / "examples"

VARIANTS = {
    "rlpr": [],
    "rlvr": ["reward.kind=verifier", "reward.verifier=oracle"],
    "rlvr_exact": ["reward.kind=verifier", "reward.verifier=exact"],
    "no_debias": ["reward.debias=false"],
    "no_std_filter": ["algorithm.std_filter=false"],
    "seq_likelihood": ["reward.aggregation=seq_likelihood"],
    # the verifier-free family on the same data, prompts and scoring position (the preset's spec-1b
    # answer turn: the embedded model does not write <answer> tags, so the presets' tag formats would
    # score nothing; docs/verifier-free.md). VeriFree: R = p(y* | x, z), RLOO, the policy gradient
    # summed over the reasoning (here the whole response) plus the R-weighted SFT term on y*, one
    # update per step (the preset's 4 prompts in one mini-batch), no std filter.
    "verifree": ["reward.aggregation=seq_likelihood", "reward.debias=false", "reward.shaping=identity",
                 "algorithm.advantage=rloo", "algorithm.std_filter=false", "algorithm.pg_tokens=reasoning",
                 "algorithm.loss_agg=seq_mean_token_sum", "algorithm.ref_sft_coef=1.0",
                 "algorithm.ref_sft_weight=reward", "algorithm.ref_sft_norm=sum", "algorithm.kl_coef=0",
                 "algorithm.entropy_coef=0"],
    # NOVER: the group rank of the reasoning perplexity (the whole response, scored with the
    # policy), GRPO, no std filter; every scored response is ranked (reward.nover_gate=scored), as
    # no response passes NOVER's strict tag format here
    "nover": ["reward.kind=nover", "reward.nover_gate=scored", "reward.debias=false", "algorithm.advantage=grpo",
              "algorithm.std_filter=false", "algorithm.kl_coef=0"],
    # debiasing where it can act: every group estimator (grpo, rloo, dr_grpo, reinforce_pp) subtracts
    # the group mean, which cancels a per-prompt score A; REINFORCE's batch baseline compares rewards
    # across prompts, so B - A and B rank the batch differently. The pair differs only in reward.debias.
    "reinforce": ["algorithm.advantage=reinforce"],
    "reinforce_no_debias": ["algorithm.advantage=reinforce", "reward.debias=false"],
    # the entropy bonus only where the reward separates responses (algorithm.entropy_tokens, beyond
    # the spec): does an RLVR run without signal stay put instead of drifting to noise, and does
    # RLPR, whose groups mostly carry signal, learn as before?
    "rlvr_exact_nz": ["reward.kind=verifier", "reward.verifier=exact", "algorithm.entropy_tokens=nonzero_advantage"],
    "rlpr_nz": ["algorithm.entropy_tokens=nonzero_advantage"],
    # the controls and the label-free family (spec section 9; issue 33): the same estimator, filter and
    # update as rlpr, only the reward differs. random: Bernoulli(0.5), the spurious-reward control;
    # shuffled_reference: rlpr scored against another prompt's reference (a derangement fixed by the
    # seed); entropy (EM-RL), self_certainty (INTUITOR), majority (TTRL): rewards that read no reference
    "random": ["reward.kind=random"],
    "shuffled_reference": ["reward.shuffle_references=true"],
    "entropy": ["reward.kind=entropy"],
    "self_certainty": ["reward.kind=self_certainty"],
    "majority": ["reward.kind=majority"],
}
# the second model family (issue 33): `--model gemma` trains and evaluates Gemma 3 270M (base) instead
# of the embedded SmolLM2-135M-Instruct; rows record `model`, and settings carry it (never mixed)
# (what the small preset needs beyond model.path: Gemma's base GGUF has no chat template, so its prompts
# use the Question/Answer text format, the response ends at a new line, and y* is scored after a second
# question in that format; rlpr.model.loading.QA_CHAT_TEMPLATE, docs/learning.md)
MODEL_TITLES = {"smollm2": "SmolLM2-135M-Instruct (the embedded model)", "gemma": "Gemma 3 270M (base)"}
MODELS = {"smollm2": [],
          "gemma": ["model.path=gemma3-270m", 'rollout.stop=["\\n"]', "reward.answer_turn=''",
                    'reward.answer_cue="\\n\\nQuestion: Repeat your answer in as few words as possible.\\nAnswer: "']}
# run for every seed before the other variants: a benchmark cut short still compares these
MAIN_VARIANTS = ("rlpr", "rlvr", "rlvr_exact", "random", "shuffled_reference", "entropy")

# question sets beside the in-family held-out questions (set name -> file; never trained on)
TRANSFER = {"new_items": EXAMPLES / "family_new_items.jsonl", "general": EXAMPLES / "general_questions.jsonl"}
SET_TITLES = {"heldout": "in-family held-out", "new_items": "new family items", "general": "general questions"}
GRADED = ("acc", "greedy", "pass8")  # the numbers a grader decides (what --regrade recomputes)


def se(p: float, n: int) -> float:
    from rlpr.train.held_out import binomial_se  # the same standard error the trainer reports

    return binomial_se(p, n)


def in_ses(change: float, p: float, n: int) -> float:
    """A change in units of the binomial standard error of p (inf/nan when that error is 0)."""
    error = se(p, n)
    return change / error if error else (math.copysign(math.inf, change) if change else math.nan)


def grader_version() -> int:
    from rlpr.grading import GRADER_VERSION

    return GRADER_VERSION


# The held-out reward and score-B columns use one fixed scorer for every run and preset version
# (the "\nAnswer: " cue with the prompt-only A, what the first benchmark's preset trained with), so
# that those columns compare across variants and across changes of the preset's own reward.
SCORER = ['reward.answer_cue="\\nAnswer: "', "reward.answer_turn=''", "reward.score_a_form=prompt"]


def make_trainer(preset: str, overrides: list[str], run_dir: Path):
    """A Trainer for `preset` + overrides whose evaluations use the common, fixed scorer (SCORER)."""
    from rlpr.config import load_config
    from rlpr.model.forward import causal_lm
    from rlpr.reward.probability_reward import ProbabilityReward
    from rlpr.train.tracking import Tracker
    from rlpr.train.trainer import Trainer

    common = load_config(preset, [o for o in overrides if not o.startswith(("reward.", "algorithm."))] + SCORER)
    cfg = load_config(preset, overrides + ["trainer.tensorboard=false", "trainer.progress=false"])
    trainer = Trainer(cfg, run_dir)
    max_length = getattr(causal_lm(trainer.policy).config, "max_position_embeddings", None)
    trainer.eval_reward = ProbabilityReward(common.reward, trainer.tokenizer, cfg.rollout.temperature, max_length)
    trainer.tracker = Tracker(run_dir, tensorboard=False)
    return trainer


def model_name(trainer) -> str:
    """The row's `model`: the architecture and size of what was trained (e.g. llama-135M)."""
    from rlpr.model.forward import causal_lm

    lm = causal_lm(trainer.policy)
    params = sum(p.numel() for n, p in lm.named_parameters() if "lora_" not in n)
    name = {"llama": "smollm2", "gemma3_text": "gemma3"}.get(lm.config.model_type, lm.config.model_type)
    return f"{name}-{params / 1e6:.0f}M"


def transfer_prompts(trainer, limit: int) -> dict[str, list]:
    """Each transfer set's prompts, built as the trainer builds its held-out prompts (the preset's
    template and prefill); the first `limit` questions of each (0: all)."""
    from rlpr.data.loading import load_examples
    from rlpr.data.prompts import prepare_prompts

    d = trainer.cfg.data
    out = {}
    for name, path in TRANSFER.items():
        examples = load_examples(path, template=d.template)
        out[name] = prepare_prompts(examples[:limit] if limit else examples, trainer.tokenizer,
                                    d.max_prompt_tokens, d.prefill)[0]
    return out


def evaluation(trainer, limit: int = 0, prompts: list | None = None, keep: list | None = None) -> dict:
    """Held-out evaluation (rlpr.train.held_out.evaluate) on `prompts` (default: the trainer's
    held-out questions), or on their first `limit`; each question's responses and grades are
    appended to `keep`."""
    from rlpr.train.held_out import evaluate

    full = trainer.val_prompts
    chosen = full if prompts is None else prompts
    trainer.val_prompts = chosen[:limit] if limit else chosen
    try:
        return evaluate(trainer, keep)
    finally:
        trainer.val_prompts = full


def summary_of(ev: dict, suffix: str) -> dict:
    k = ev.get("eval/samples", 8)
    return {f"acc_{suffix}": ev["eval/accuracy"], f"greedy_{suffix}": ev["eval/greedy_accuracy"],
            f"reward_{suffix}": ev["eval/reward_mean"], f"pass8_{suffix}": ev.get(f"eval/pass@{k}"),
            f"score_b_{suffix}": ev["eval/score_b_mean"], f"format_{suffix}": ev["eval/format_rate"],
            f"len_{suffix}": ev["eval/response_len_mean"]}


def transfer_summary(ev: dict, name: str, suffix: str) -> dict:
    """A transfer set's graded numbers: {name}_acc_{suffix}, {name}_greedy_..., {name}_pass8_..."""
    k = ev.get("eval/samples", 8)
    return {f"{name}_acc_{suffix}": ev["eval/accuracy"], f"{name}_greedy_{suffix}": ev["eval/greedy_accuracy"],
            f"{name}_pass8_{suffix}": ev.get(f"eval/pass@{k}")}


# --------------------------------------------------------------------------- saved responses

def response_records(set_name: str, kept: list[dict], step: int | None = None) -> list[dict]:
    """One compact record per question (what a grader needs to re-grade it): the set, the
    example's chat prompt, data source, ability, reference, aliases and choices, the greedy and the
    sampled responses with their verdicts (1/0), and the step for curve points."""
    out = []
    for q in kept:
        e = q["prompt"].example
        rec = {"set": set_name, "uid": e.uid, "prompt": e.prompt, "data_source": e.data_source,
               "ability": e.ability, "reference": e.reference, "acceptable": list(e.acceptable),
               "greedy": q["greedy"], "greedy_correct": int(q["greedy_correct"]),
               "samples": q["samples"], "samples_correct": [int(c) for c in q["samples_correct"]]}
        if e.choices:
            rec["choices"] = list(e.choices)
        if step is not None:
            rec["step"] = step
        out.append(rec)
    return out


def graded_numbers(records: list[dict]) -> dict:
    """Avg@k (greedy when no samples), greedy accuracy and pass@k of records (one set, one step),
    as rlpr.train.held_out.evaluate computes them."""
    n = max(len(records), 1)
    greedy = sum(r["greedy_correct"] for r in records) / n
    if not any(r["samples"] for r in records):
        return {"acc": greedy, "greedy": greedy, "pass8": None}
    return {"acc": sum(sum(r["samples_correct"]) / len(r["samples_correct"]) for r in records) / n,
            "greedy": greedy, "pass8": sum(any(r["samples_correct"]) for r in records) / n}


def regrade_records(records: list[dict], grade) -> list[dict]:
    """The records with every verdict recomputed by `grade(example, response) -> bool`."""
    from rlpr.data.records import Example

    out = []
    for r in records:
        example = Example(prompt=r["prompt"], reference=r["reference"], uid=r.get("uid", ""),
                          data_source=r.get("data_source", ""), ability=r.get("ability", ""),
                          acceptable=list(r.get("acceptable") or []), choices=list(r.get("choices") or []))
        out.append({**r, "greedy_correct": int(grade(example, r["greedy"])),
                    "samples_correct": [int(grade(example, s)) for s in r["samples"]]})
    return out


def write_records(path: Path, records: list[dict]) -> None:
    """Gzipped jsonl, written whole and renamed into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with gzip.open(tmp, "wt", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r, ensure_ascii=False, separators=(",", ":")) + "\n")
    os.replace(tmp, path)


def read_records(path: Path) -> list[dict]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def settings_hash(settings: dict) -> str:
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:10]


def responses_path(log_path: Path, variant: str, seed, settings: dict) -> Path:
    return log_path.with_name(log_path.stem + "_responses") / \
        f"{variant}-{'base' if seed is None else seed}-{settings_hash(settings)}.jsonl.gz"


# --------------------------------------------------------------------------- runs

def evaluate_all(trainer, transfer: dict[str, list], records: list[dict], suffix: str) -> tuple[dict, dict]:
    """The in-family held-out evaluation and every transfer set's: (held-out eval dict, transfer
    numbers with `suffix`); every question's responses go to `records`."""
    kept: list[dict] = []
    ev = evaluation(trainer, keep=kept)
    records.extend(response_records("heldout", kept))
    numbers = {f"entropy_{suffix}": response_entropy(trainer, kept)}
    for name, prompts in transfer.items():
        kept = []
        numbers.update(transfer_summary(evaluation(trainer, prompts=prompts, keep=kept), name, suffix))
        numbers[f"n_{name}"] = len(kept)
        records.extend(response_records(name, kept))
    return ev, numbers


def response_entropy(trainer, kept: list[dict]) -> float:
    """The mean token entropy (nats) of the held-out sampled responses (greedy ones when none were
    sampled) under the trainer's policy: sharpening lowers it (spec section 9)."""
    import torch

    from rlpr.reward.scoring import response_distribution_stats

    pairs = [(q["prompt"].text, text) for q in kept for text in (q["samples"] or [q["greedy"]])]
    with torch.no_grad():
        stats = response_distribution_stats(trainer.policy, trainer.tokenizer, [p for p, _ in pairs],
                                            [t for _, t in pairs])
    values = [h for s in stats if s is not None for h in s[0].tolist()]
    return statistics.fmean(values) if values else math.nan


def backfill_base_entropy(log_path: Path, settings: dict, preset: str, overrides: list[str], workdir: Path) -> None:
    """Rows from before `entropy_*` was recorded: the base row's held-out entropy, from its saved
    responses and the untrained model (nothing is generated), written into its row in place."""
    from rlpr.data.prompts import chat_text

    if not log_path.exists():
        return
    lines = [json.loads(line) for line in log_path.read_text().splitlines() if line.strip()]
    i = next((i for i, r in enumerate(lines) if r["variant"] == "base" and r.get("settings") == settings
              and "entropy_before" not in r and r.get("responses")), None)
    if i is None or not (log_path.parent / lines[i]["responses"]).exists():
        return
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        trainer = make_trainer(preset, overrides, Path(tmp))
        records = [r for r in read_records(log_path.parent / lines[i]["responses"]) if r["set"] == "heldout"]

        class _Prompt:  # what response_entropy reads of a Prompt
            def __init__(self, text):
                self.text = text

        kept = [{"prompt": _Prompt(chat_text(trainer.tokenizer, r["prompt"])),  # responses hold the prefill
                 "samples": r["samples"], "greedy": r["greedy"]} for r in records]
        value = response_entropy(trainer, kept)
        name = model_name(trainer)
    lines = [json.loads(line) for line in log_path.read_text().splitlines() if line.strip()]  # re-read: appended
    for r in lines:
        if r["variant"] == "base" and r.get("settings") == settings:
            r.update(entropy_before=value, entropy_after=value, model=r.get("model", name))
    tmp_path = log_path.with_name(log_path.name + ".tmp")
    tmp_path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    os.replace(tmp_path, log_path)
    print(f"base row: held-out entropy {value:.3f} nats (from its saved responses)", flush=True)


def curve_point(trainer, step: int, curve_questions: int, records: list[dict]) -> dict:
    kept: list[dict] = []
    point = {"step": step, **summary_of(evaluation(trainer, curve_questions, keep=kept), "curve")}
    records.extend(response_records("curve", kept, step))
    return point


def run_base(preset: str, overrides: list[str], curve_questions: int, transfer_questions: int, workdir: Path,
             records: list[dict]) -> dict:
    """The untrained model on all held-out and transfer questions, and on the curve subset (every
    run's step 0)."""
    start = time.time()
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        trainer = make_trainer(preset, overrides, Path(tmp))
        ev, transfer = evaluate_all(trainer, transfer_prompts(trainer, transfer_questions), records, "before")
        curve = [curve_point(trainer, 0, curve_questions, records)] if curve_questions else []
    after = {k.replace("_before", "_after"): v for k, v in transfer.items() if k.endswith("_before")}
    transfer["model"] = model_name(trainer)
    return {"variant": "base", "seed": None, "steps": 0, "n_heldout": ev["eval/questions"],
            **summary_of(ev, "before"), **summary_of(ev, "after"), **transfer, **after, "curve": curve,
            "seconds": time.time() - start}


def run_one(preset: str, overrides: list[str], variant: str, seed: int, steps: int, curve_every: int,
            curve_questions: int, transfer_questions: int, get_base, workdir: Path, records: list[dict]) -> dict:
    """Train `steps` steps and evaluate; a few held-out points on the way for the curves.
    `get_base()` returns the base model's row (another worker may still be computing it: it is
    needed only once this run has finished)."""
    start = time.time()
    run_dir = workdir / "runs" / f"{variant}-{seed}-{time.time_ns()}"
    trainer = make_trainer(preset, overrides + VARIANTS[variant] + [f"trainer.seed={seed}",
                                                                    f"trainer.max_steps={steps}"], run_dir)
    curve, train = [], []
    for step in range(1, steps + 1):
        m = trainer.train_step(step)
        trainer.step = step
        trainer.tracker.log(step, m)
        train.append({"step": step, **{k: m.get(k) for k in (
            "reward/mean", "reward/accuracy", "reward/score_b_mean", "reward/score_a_mean", "filter/kept_frac",
            "filter/nonzero_std_frac", "rollout/response_len_mean", "rollout/distinct_frac", "policy/entropy",
            "rollout/distinct_answers", "rollout/identical_frac", "perf/step_s", "perf/reward_s")}})
        print(f"  {variant} seed {seed} step {step}: reward {m['reward/mean']:.3f} "
              f"acc {m.get('reward/accuracy', float('nan')):.3f} kept {m['filter/kept_frac']:.2f} "
              f"len {m['rollout/response_len_mean']:.1f} {m['perf/step_s']:.0f}s", flush=True)
        if curve_every and step % curve_every == 0 and step < steps:
            curve.append(curve_point(trainer, step, curve_questions, records))
    ev, transfer = evaluate_all(trainer, transfer_prompts(trainer, transfer_questions), records, "after")
    trainer.tracker.close()
    n = ev["eval/questions"]
    base = get_base()
    curve = ([dict(base["curve"][0])] if base.get("curve") else []) + curve  # step 0: the base model
    before = {k: v for k, v in base.items() if k.endswith("_before")}
    return {"variant": variant, "seed": seed, "steps": steps, "n_heldout": n, **before, **summary_of(ev, "after"),
            **transfer, "curve": curve, "curve_questions": curve_questions, "train": train,
            "step_s": statistics.fmean(t["perf/step_s"] for t in train),
            # the reward's own cost per step (score B and A, or the label-free kind's forward)
            "reward_s": statistics.fmean(t["perf/reward_s"] for t in train), "model": model_name(trainer),
            "seconds": time.time() - start}


# --------------------------------------------------------------------------- re-grading

def regraded_row(row: dict, records: list[dict], base: dict | None) -> dict:
    """A row's graded numbers recomputed from its (re-graded) records: the held-out and transfer
    sets ("after"; the base row also "before"), and its curve points; a run's "before" numbers and
    step-0 curve point come from the (re-graded) `base` row."""
    row = json.loads(json.dumps(row))
    whens = ("before", "after") if row["variant"] == "base" else ("after",)
    for set_name in ("heldout", *TRANSFER):
        chosen = [r for r in records if r["set"] == set_name]
        if not chosen:
            continue
        numbers = graded_numbers(chosen)
        for key, value in numbers.items():
            for when in whens:
                row[f"{key}_{when}" if set_name == "heldout" else f"{set_name}_{key}_{when}"] = value
    for point in row.get("curve", []):
        chosen = [r for r in records if r["set"] == "curve" and r.get("step") == point["step"]]
        if chosen:
            point.update({f"{k}_curve": v for k, v in graded_numbers(chosen).items()})
    if base is not None and row["variant"] != "base":
        row.update({k: v for k, v in base.items() if k.endswith("_before")})
        if row.get("curve") and base.get("curve") and row["curve"][0]["step"] == 0:
            row["curve"][0] = dict(base["curve"][0])
    return row


def unfinished_jobs(log_path: Path, settings: dict, workdir: Path) -> list[str]:
    """Jobs claimed under these settings with an OLDER grader version and no row yet: workers that
    may still be running. A re-grade moves the base row to the current version, and such a worker
    would then wait for its base row forever."""
    claims = workdir / "claims"
    if not claims.is_dir():
        return []
    rows = [json.loads(line) for line in log_path.read_text().splitlines() if line.strip()]
    out = []
    for version in range(1, settings["grader_version"]):
        old = {**settings, "grader_version": version}
        done = {f"{r['variant']}-{r['seed']}" for r in rows if r.get("settings") == old}
        tag = f"-{settings_hash(old)}"
        out += [c.name for c in sorted(claims.iterdir())
                if c.name.endswith(tag) and c.name[:-len(tag)] not in done]
    return out


def regrade(log_path: Path, settings: dict) -> None:
    """Re-grade, with the current grader, every row of `log_path` with these settings (any grader
    version) whose responses were saved; rows graded by another version with no saved responses
    are left as they are (and stay out of the summary). Rewrites the .jsonl and the response files."""
    from rlpr.grading import grade_example

    version = grader_version()
    lines = [json.loads(line) for line in log_path.read_text().splitlines() if line.strip()]
    mine = [i for i, r in enumerate(lines) if _same_settings(r.get("settings"), settings)]
    order = sorted(mine, key=lambda i: lines[i]["variant"] != "base")  # the base first: runs copy its numbers
    current = {(lines[i]["variant"], lines[i]["seed"]) for i in mine if lines[i].get("grader_version") == version}
    base, done, missing = None, 0, 0
    for i in order:
        row = lines[i]
        if row.get("grader_version") != version and (row["variant"], row["seed"]) in current:
            print(f"--regrade: {row['variant']} seed {row['seed']}: a row graded with version {version} exists; "
                  f"the one graded with {row.get('grader_version', 'unknown')} is left as it is", flush=True)
            continue
        path = log_path.parent / row["responses"] if row.get("responses") else None
        if path is None or not path.exists():
            if row.get("grader_version") != version:
                missing += 1
                print(f"--regrade: {row['variant']} seed {row['seed']}: no saved responses "
                      f"({row.get('responses') or 'none recorded'}); left at grader version "
                      f"{row.get('grader_version', 'unknown')}", flush=True)
            elif row["variant"] == "base":
                base = row
            continue
        records = regrade_records(read_records(path), lambda e, text: grade_example(e, text).correct)
        write_records(path, records)
        new = regraded_row(row, records, base)
        old = row.get("grader_version")
        if old != version:
            new["regraded_from"] = old
        new["grader_version"] = version
        new["settings"] = {**row["settings"], "grader_version": version}
        lines[i] = new
        if new["variant"] == "base":
            base = new
        done += 1
    tmp = log_path.with_name(log_path.name + ".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in lines))
    os.replace(tmp, log_path)
    print(f"--regrade: {done} rows re-graded with grader version {version}, {missing} without saved responses",
          flush=True)


# --------------------------------------------------------------------------- summary

def _pct(value) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}"


def summarise(rows: list[dict]) -> tuple[list[dict], str]:
    base = next((r for r in rows if r["variant"] == "base"), None)
    if base is None:
        return [], "(no base run yet)\n"
    n = base["n_heldout"]
    keys = ["acc", "greedy", "pass8", "reward", "score_b", "format", "len", "entropy"]
    transfer_keys = [f"{s}_{k}" for s in TRANSFER for k in GRADED if f"{s}_{k}_before" in base]
    table = []
    lines = ["| variant | seeds | steps | Avg@8 before ± SE | Avg@8 after: mean ± sd (per run ± SE) | change in SEs "
             "| greedy before -> after | greedy change in SEs | pass@8 before -> after | reward before -> after "
             "| score B after | format after | length after | s/step | min/run |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for variant in ["base", *VARIANTS]:
        runs = [r for r in rows if r["variant"] == variant]
        if not runs:
            continue
        entry = {"variant": variant, "seeds": [r["seed"] for r in runs], "steps": runs[0]["steps"], "n_heldout": n}
        for k in keys + [k for k in transfer_keys if all(f"{k}_after" in r for r in runs)]:
            after = [r.get(f"{k}_after") for r in runs]  # entropy: rows recorded before it have none
            entry[f"{k}_before"] = base.get(f"{k}_before")
            if any(a is None for a in after):
                entry[f"{k}_after"], entry[f"{k}_after_sd"] = None, None
                continue
            entry[f"{k}_after"] = statistics.fmean(after)
            entry[f"{k}_after_sd"] = statistics.stdev(after) if len(after) > 1 else 0.0
        # per seed: how many binomial standard errors (of the base accuracy) the change is
        entry["acc_change_se"] = [in_ses(r["acc_after"] - base["acc_before"], base["acc_before"], n) for r in runs]
        entry["greedy_change_se"] = [in_ses(r["greedy_after"] - base["greedy_before"], base["greedy_before"], n)
                                     for r in runs]
        for s in TRANSFER:
            m = base.get(f"n_{s}")
            if m and all(f"{s}_acc_after" in r for r in runs):
                entry[f"n_{s}"] = m
                for k in ("acc", "greedy"):
                    entry[f"{s}_{k}_change_se"] = [in_ses(r[f"{s}_{k}_after"] - base[f"{s}_{k}_before"],
                                                          base[f"{s}_{k}_before"], m) for r in runs]
        entry["step_s"] = statistics.fmean(r.get("step_s", 0.0) for r in runs)
        # the update's mean token entropy over the last 3 steps (policy/entropy): recorded by every run
        tails = [[t["policy/entropy"] for t in r.get("train", [])[-3:]  # NaN: a step that kept no group
                  if t.get("policy/entropy") is not None and math.isfinite(t["policy/entropy"])] for r in runs]
        entry["train_entropy_last"] = statistics.fmean(x for t in tails for x in t) if all(tails) and runs[0][
            "variant"] != "base" else None
        costs = [r.get("reward_s") for r in runs]
        entry["reward_s"] = statistics.fmean(costs) if runs[0]["variant"] != "base" and None not in costs else None
        entry["minutes_per_run"] = statistics.fmean(r["seconds"] for r in runs) / 60
        table.append(entry)

        def pm(k, scale=100.0, digits=1):
            if entry[f"{k}_after"] is None:
                return "n/a"
            spread = f" ± {entry[f'{k}_after_sd'] * scale:.{digits}f}" if len(runs) > 1 else ""
            return f"{entry[f'{k}_after'] * scale:.{digits}f}{spread}"

        per_run = ", ".join(f"{100 * r['acc_after']:.1f} ± {100 * se(r['acc_after'], n):.1f}" for r in runs)
        lines.append(
            f"| {variant} | {len(runs)} | {entry['steps']} | {100 * base['acc_before']:.1f}% ± {100 * se(base['acc_before'], n):.1f} "
            f"| {pm('acc')}% ({per_run}) | {', '.join(f'{c:+.1f}' for c in entry['acc_change_se'])} "
            f"| {100 * base['greedy_before']:.1f}% -> {pm('greedy')}% "
            f"| {', '.join(f'{c:+.1f}' for c in entry['greedy_change_se'])} "
            f"| {_pct(base['pass8_before'])}% -> {pm('pass8')}% "
            f"| {base['reward_before']:.3f} -> {pm('reward', 1, 3)} | {pm('score_b', 1, 3)} | {pm('format')}% "
            f"| {pm('len', 1, 1)} | {entry['step_s']:.0f} | {entry['minutes_per_run']:.0f} |")
    return table, "\n".join(lines) + "\n" + transfer_table(table, base) + controls_verdict(table, base)[1]


CONTROLS = ("random", "shuffled_reference", "entropy", "self_certainty", "majority")
METRICS = (("acc", "Avg@8"), ("greedy", "greedy"), ("pass8", "pass@8"))


def diff_se(a: dict, b: dict, key: str, n: int) -> float:
    """The standard error of (a's mean - b's mean) for `key`: the binomial error over the n questions of
    each mean (sqrt(p (1 - p) / n), as if the two were independent: conservative on shared questions)
    plus each mean's seed-to-seed spread (sd / sqrt(seeds))."""
    def var(e):
        p, k = e[f"{key}_after"], len(e["seeds"])
        return p * (1 - p) / n + (e[f"{key}_after_sd"] ** 2 / k if k > 1 else 0.0)

    return math.sqrt(var(a) + var(b))


def controls_verdict(table: list[dict], base: dict) -> tuple[list[dict], str]:
    """RLPR against the best control on every set and metric: RLPR's mean, each control's, the best
    control's, and RLPR - best in standard errors of that difference (`diff_se`). Sharpening alone
    lifts Avg@k toward greedy and can lower pass@k; learning lifts greedy and pass@k."""
    by = {e["variant"]: e for e in table}
    rlpr = by.get("rlpr")
    controls = [by[c] for c in CONTROLS if c in by]
    if rlpr is None or not controls:
        return [], ""
    sets = [("heldout", base["n_heldout"])] + [(s, base[f"n_{s}"]) for s in TRANSFER if base.get(f"n_{s}")]
    rows, lines = [], []
    names = [c["variant"] for c in controls]
    lines += ["| set | metric | base | RLPR | " + " | ".join(names) + " | RLPR - best control (SEs) |",
              "|---|---|---|---|" + "---|" * len(names) + "---|"]
    for set_name, n in sets:
        prefix = "" if set_name == "heldout" else f"{set_name}_"
        for key, label in METRICS:
            k = prefix + key
            if rlpr.get(f"{k}_after") is None or any(c.get(f"{k}_after") is None for c in controls):
                continue
            best = max(controls, key=lambda c: c[f"{k}_after"])
            net = rlpr[f"{k}_after"] - best[f"{k}_after"]
            error = diff_se(rlpr, best, k, n)
            rows.append({"set": set_name, "metric": label, "base": base[f"{k}_before"], "rlpr": rlpr[f"{k}_after"],
                         **{c["variant"]: c[f"{k}_after"] for c in controls}, "best_control": best["variant"],
                         "net": net, "net_se": net / error if error else math.nan})
            cells = " | ".join(f"{100 * c[f'{k}_after']:.1f}" for c in controls)
            lines.append(f"| {SET_TITLES[set_name]} | {label} | {100 * base[f'{k}_before']:.1f} "
                         f"| {100 * rlpr[f'{k}_after']:.1f} | {cells} | {100 * net:+.1f} ({best['variant']}; "
                         f"{rows[-1]['net_se']:+.1f} SE) |")
    cost = ["", "Held-out mean token entropy after training (nats; base "
            f"{base.get('entropy_before') or math.nan:.2f}; rows from before it was recorded: n/a), the update's "
            "token entropy over the last 3 training steps (every run records it), response length (tokens) and the "
            "reward's own cost per step (s: score B and A, or the label-free kind's forward; each row on the "
            "machine and under the load it ran with, so rows are not comparable: the side-by-side ratios are "
            "benchmarks/results/reward_cost.md's; n/a: rows recorded before the column existed):", "",
            "| variant | held-out entropy after | training entropy, last 3 steps | length after | reward s/step |",
            "|---|---|---|---|---|"]

    def num(value, digits):
        return "n/a" if value is None else f"{value:.{digits}f}"

    for e in [rlpr, *controls, *[by[v] for v in ("rlvr",) if v in by]]:
        cost.append(f"| {e['variant']} | {num(e.get('entropy_after'), 2)} | {num(e.get('train_entropy_last'), 2)} "
                    f"| {e['len_after']:.1f} | {num(e.get('reward_s'), 1)} |")
    header = ["", "Is it the reward? RLPR beside the controls (mean over seeds, %), and RLPR minus the best "
              "control in standard errors of the difference (binomial over questions plus seed spread).", ""]
    return rows, "\n".join(header + lines + cost) + "\n"


def transfer_table(table: list[dict], base: dict) -> str:
    """In-family held-out beside the transfer sets: Avg@k and greedy, before -> after (mean ± sd over
    seeds), and per seed the change in binomial standard errors of the base."""
    sets = [s for s in TRANSFER if base.get(f"n_{s}")]
    if not sets:
        return ""
    sizes = [("heldout", base["n_heldout"])] + [(s, base[f"n_{s}"]) for s in sets]
    head = "| variant | seeds | " + " | ".join(f"{SET_TITLES[s]} ({n} q) {m}" for s, n in sizes
                                              for m in ("Avg@k", "greedy")) + " |"
    lines = ["", "Transfer: the same runs on questions of other sets (never trained on); before -> after, "
             "mean ± sd over seeds (per-seed change in SEs of the base).", "", head,
             "|---|---|" + "---|" * (2 * (1 + len(sets)))]
    for e in table:
        cells = []
        for s in ["heldout", *sets]:
            prefix = "" if s == "heldout" else f"{s}_"
            for k in ("acc", "greedy"):
                after = e.get(f"{prefix}{k}_after")
                if after is None:
                    cells.append("n/a")
                    continue
                spread = f" ± {100 * e[f'{prefix}{k}_after_sd']:.1f}" if len(e["seeds"]) > 1 else ""
                changes = e.get(f"{prefix}{k}_change_se") or []
                per_seed = f" ({', '.join(f'{c:+.1f}' for c in changes)})" if e["variant"] != "base" else ""
                cells.append(f"{100 * e[f'{prefix}{k}_before']:.1f} -> {100 * after:.1f}{spread}{per_seed}")
        lines.append(f"| {e['variant']} | {len(e['seeds'])} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def smooth(values: list[float], width: int = 3) -> list[float]:
    """Trailing mean over `width` steps (one step is 32 samples: noisy)."""
    return [statistics.fmean(values[max(0, i - width + 1):i + 1]) for i in range(len(values))]


def plot(rows: list[dict], path: Path) -> None:
    """Held-out Avg@8 (curve points), the training reward and accuracy per step, one line per run,
    and Avg@k after training on the held-out and transfer sets per variant."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(22, 4.8))
    palette = plt.rcParams["axes.prop_cycle"].by_key()["color"] + [plt.get_cmap("tab20")(2 * i + 1) for i in range(10)]
    colors = dict(zip(VARIANTS, palette))  # more variants than the default cycle's 10 colours
    base = next((r for r in rows if r["variant"] == "base"), None)
    for r in rows:
        if r["variant"] == "base":
            continue
        c = colors.get(r["variant"])
        label = r["variant"] if r["seed"] == min(x["seed"] for x in rows if x["variant"] == r["variant"]) else None
        pts = r.get("curve", [])
        if pts:
            axes[0].plot([p["step"] for p in pts], [100 * p["acc_curve"] for p in pts], "o-", color=c, alpha=0.7,
                         label=label)
        axes[0].plot([r["steps"]], [100 * r["acc_after"]], "*", color=c, markersize=12)
        steps = [t["step"] for t in r["train"]]
        axes[1].plot(steps, smooth([t["reward/mean"] for t in r["train"]]), color=c, alpha=0.7, label=label)
        axes[2].plot(steps, smooth([100 * (t["reward/accuracy"] or 0) for t in r["train"]]), color=c, alpha=0.7,
                     label=label)
    if base:
        axes[0].axhline(100 * base["acc_before"], color="gray", ls="--", label="base, all held-out")
        sets = ["heldout", *[s for s in TRANSFER if base.get(f"n_{s}")]]
        variants = [v for v in VARIANTS if any(r["variant"] == v for r in rows)]
        width = 0.8 / max(len(variants), 1)
        for j, s in enumerate(sets):
            key = "acc_after" if s == "heldout" else f"{s}_acc_after"
            axes[3].hlines(100 * base[key], j - 0.4, j + 0.4, color="gray", ls="--",
                           label="base" if j == 0 else None)
            for i, v in enumerate(variants):
                values = [100 * r[key] for r in rows if r["variant"] == v and r.get(key) is not None]
                if not values:
                    continue
                x = j - 0.4 + width * (i + 0.5)
                axes[3].bar(x, statistics.fmean(values), width * 0.9, color=colors.get(v), alpha=0.6,
                            label=v if j == 0 else None)
                axes[3].plot([x] * len(values), values, "k.", markersize=4)
        axes[3].set_xticks(range(len(sets)), [SET_TITLES[s] for s in sets])
    axes[0].set(title="held-out Avg@k (%): lines on the curve subset,\nstars on all held-out questions", xlabel="step")
    axes[1].set(title="training reward (own reward kind; mean of 3 steps)", xlabel="step")
    axes[2].set(title="training rollouts graded correct (%, mean of 3 steps)", xlabel="step")
    axes[3].set(title="Avg@k after training (%), bars: mean over seeds,\ndots: seeds; dashed: base")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --------------------------------------------------------------------------- the rows

def _same_settings(a: dict | None, b: dict) -> bool:
    """Equal settings apart from the grader version."""
    if not isinstance(a, dict):
        return False
    def unversioned(d: dict) -> dict:
        return {k: v for k, v in d.items() if k != "grader_version"}

    return unversioned(a) == unversioned(b)


def read_rows(log_path: Path, settings: dict, report: bool = False) -> list[dict]:
    """The rows of `log_path` with these settings and graded by the current grader version; with
    `report`, one line about rows with these settings graded by another version (skipped)."""
    rows = [json.loads(line) for line in log_path.read_text().splitlines() if line.strip()] if log_path.exists() else []
    version = settings["grader_version"]
    kept = [r for r in rows if r.get("settings") == settings and r.get("grader_version") == version]
    if report:
        other = [r for r in rows if _same_settings(r.get("settings"), settings) and r not in kept]
        if other:
            versions = sorted({str(r.get("grader_version", "unknown")) for r in other})
            print(f"{log_path}: skipping {len(other)} rows graded with grader version {', '.join(versions)} "
                  f"(now {version}); they are never mixed with new ones: re-run them, or `--regrade` those "
                  f"whose responses were saved", flush=True)
        unversioned = [r for r in rows if isinstance(r.get("settings"), dict) and "grader_version" not in r["settings"]]
        if unversioned:
            print(f"{log_path}: skipping {len(unversioned)} rows recorded before the benchmark recorded grader "
                  f"versions and transfer sets (they stay in the file, out of this summary)", flush=True)
    return kept


def reuse_base(log_path: Path, settings: dict) -> dict | None:
    """The untrained model's row does not depend on the number of training steps: a base row of the
    same settings but another `steps` (a longer run's settings, say), copied under these settings
    and appended, so that a long run does not evaluate the base model again (~10 min)."""
    if not log_path.exists():
        return None
    rows = [json.loads(line) for line in log_path.read_text().splitlines() if line.strip()]
    bases = [r for r in rows if r["variant"] == "base" and isinstance(r.get("settings"), dict)
             and r.get("grader_version") == settings["grader_version"]]  # as read_rows keeps them

    def stepless(d: dict) -> dict:
        return {k: v for k, v in d.items() if k != "steps"}

    if any(r["settings"] == settings for r in bases):
        return None
    donor = next((r for r in bases if stepless(r["settings"]) == stepless(settings)), None)
    if donor is None:
        return None
    row = {**donor, "settings": settings, "reused_from_steps": donor["settings"]["steps"]}
    with log_path.open("a") as f:
        f.write(json.dumps(row) + "\n")
    return row


def claim(workdir: Path, job: tuple, settings: dict) -> bool:
    """Several workers share the job list: a job is claimed by creating a file (delete
    `workdir/claims` to re-run abandoned jobs)."""
    claims = workdir / "claims"
    claims.mkdir(exist_ok=True)
    try:
        (claims / f"{job[0]}-{job[1]}-{settings_hash(settings)}").open("x").close()
        return True
    except FileExistsError:
        return False


def transfer_fingerprint() -> dict:
    """The transfer files' SHA-256 (first 12 hex digits): rows evaluated on other questions never mix."""
    return {name: hashlib.sha256(path.read_bytes()).hexdigest()[:12] for name, path in TRANSFER.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="small")
    parser.add_argument("--quick", action="store_true", help="1 seed, rlpr only, 4 steps, 40 held-out questions, "
                                                             "20 per transfer set, 2 samples each (a smoke "
                                                             "setting, not a result)")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--heldout", type=int, default=203, help="held-out questions (demo val split; the small preset holds out 203)")
    parser.add_argument("--transfer-questions", type=int, default=0,
                        help="questions per transfer set (the first N of each file; 0: all)")
    parser.add_argument("--samples", type=int, default=8, help="k of Avg@k and pass@k")
    parser.add_argument("--curve-every", type=int, default=10, help="held-out curve point every N steps (0: none)")
    parser.add_argument("--curve-questions", type=int, default=50)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--set", nargs="*", default=[], help="extra config overrides for every run")
    parser.add_argument("--model", choices=list(MODELS), default="smollm2",
                        help="the model family: the embedded SmolLM2-135M-Instruct or Gemma 3 270M (base)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: all cores)")
    parser.add_argument("--output", default=str(RESULTS / "learning"))
    parser.add_argument("--summary", default=None,
                        help="path prefix of the summary (.md, .json, .png; default: --output's): runs of other "
                             "settings (--steps 60) share --output's .jsonl and its base row, not its summary")
    parser.add_argument("--reverse", action="store_true", help="take jobs in reverse order (a second worker)")
    parser.add_argument("--report", action="store_true", help="only summarise the runs already in the .jsonl")
    parser.add_argument("--regrade", action="store_true",
                        help="re-grade the saved responses of the runs in the .jsonl (these settings) with the "
                             "current grader, rewrite their rows, then summarise; trains nothing")
    parser.add_argument("--workdir", default=str(Path(tempfile.gettempdir()) / "rlpr-learning"))
    if "--quick" in sys.argv[1:]:  # smaller defaults; flags given explicitly still win
        parser.set_defaults(seeds=1, steps=4, heldout=40, transfer_questions=20, samples=2, variants="rlpr",
                            curve_every=2, curve_questions=10, output=str(RESULTS / "learning_quick"))
    args = parser.parse_args()
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    log_path = Path(args.output + ".jsonl")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    overrides = [f"data.demo_val_size={args.heldout}", f"trainer.eval_samples={args.samples}",
                 f"model.threads={args.threads}", *MODELS[args.model], *args.set]
    settings = {"preset": args.preset, "steps": args.steps, "heldout": args.heldout, "samples": args.samples,
                "set": args.set, "transfer_questions": args.transfer_questions, "transfer": transfer_fingerprint(),
                "grader_version": grader_version()}
    if args.model != "smollm2":  # the embedded model's rows keep the settings they were recorded with
        settings["model"] = args.model
    if args.regrade:
        if not log_path.exists():
            sys.exit(f"--regrade: {log_path} does not exist")
        running = unfinished_jobs(log_path, settings, Path(args.workdir))
        if running:
            sys.exit(f"--regrade: {len(running)} job(s) claimed under an older grader version have no row yet "
                     f"({', '.join(running[:4])}{', ...' if len(running) > 4 else ''} in {args.workdir}/claims): "
                     "their workers would wait forever for a base row moved to the new version. Re-grade when "
                     "they finish, or delete those claim files if nothing runs them")
        regrade(log_path, settings)
    if not (args.report or args.regrade) and claim(workdir, ("base_reuse", None), settings):
        reuse_base(log_path, settings)
    done = read_rows(log_path, settings, report=True)
    have = {(r["variant"], r["seed"]) for r in done}
    variants = [v for v in args.variants.split(",") if v]
    for v in variants:
        if v not in VARIANTS:
            sys.exit(f"--variants: unknown variant {v!r} (have {', '.join(VARIANTS)})")
    # the main variants (rlpr, rlvr, rlvr_exact) for every seed first, then the ablations: a benchmark
    # cut short by time still compares RLPR with both RLVRs over all seeds
    head, tail = [v for v in variants if v in MAIN_VARIANTS], [v for v in variants if v not in MAIN_VARIANTS]
    jobs = [("base", None)] + [(v, s) for s in range(args.seeds) for v in head] + \
        [(v, s) for v in tail for s in range(args.seeds)]
    start = time.time()
    if not (args.report or args.regrade) and claim(workdir, ("base_entropy", None), settings):
        backfill_base_entropy(log_path, settings, args.preset, overrides, workdir)
    for job in [] if (args.report or args.regrade) else (reversed(jobs) if args.reverse else jobs):
        if job in have or not claim(workdir, job, settings):
            continue
        def get_base() -> dict:
            while (base := next((r for r in read_rows(log_path, settings) if r["variant"] == "base"), None)) is None:
                time.sleep(20)  # another worker is evaluating the base model
            return base

        print(f"[{time.time() - start:6.0f}s] {job}", flush=True)
        records: list[dict] = []
        if job[0] == "base":
            row = run_base(args.preset, overrides, args.curve_questions if args.curve_every else 0,
                           args.transfer_questions, workdir, records)
        else:
            row = run_one(args.preset, overrides, job[0], job[1], args.steps, args.curve_every,
                          args.curve_questions, args.transfer_questions, get_base, workdir, records)
        path = responses_path(log_path, job[0], job[1], settings)
        write_records(path, records)  # before the row: a row always has its responses
        row["responses"] = str(path.relative_to(log_path.parent))
        row["settings"] = settings
        row["grader_version"] = settings["grader_version"]
        with log_path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        print({k: v for k, v in row.items() if k not in ("curve", "train", "settings")}, flush=True)
    # every model family's rows (these settings otherwise) go into one summary: a section and a plot each
    summary = args.summary or args.output
    sections, runs, tables, total = [], [], {}, 0.0
    for model in MODELS:
        mine = {k: v for k, v in settings.items() if k != "model"} | ({"model": model} if model != "smollm2" else {})
        done = read_rows(log_path, mine)
        if not done:
            continue
        table, markdown = summarise(done)
        base = next((r for r in done if r["variant"] == "base"), None)
        tables[model] = {"table": table, "controls": controls_verdict(table, base)[0] if base else []}
        sections.append((f"## {MODEL_TITLES[model]}\n\n" if model != "smollm2" or len(MODELS) > 1 else "") + markdown)
        runs += done
        total += sum(r["seconds"] for r in done)
        plot(done, Path(summary + ("" if model == "smollm2" else f"_{model}") + ".png"))
    transfer = (f"; transfer: {', '.join(f'{SET_TITLES[s]} ({TRANSFER[s].name})' for s in TRANSFER)}"
                f"{f', first {args.transfer_questions} questions of each' if args.transfer_questions else ''}")
    header = (f"Learning benchmark: preset `{args.preset}` {' '.join(args.set)}, {args.steps} steps per run, "
              f"{args.heldout} held-out questions x {args.samples} samples (Avg@{args.samples}) + greedy{transfer}; "
              f"graded with grader version {settings['grader_version']}; "
              f"'change in SEs' = (after - base) / binomial SE of the base over the set's questions, per seed; "
              f"runs took {total / 60:.0f} min in sum (workers overlap).\n\n")
    markdown = "\n".join(sections)
    Path(summary + ".md").write_text(header + markdown)
    main_model = tables.get("smollm2", {"table": [], "controls": []})
    Path(summary + ".json").write_text(json.dumps({"settings": settings, "total_minutes": total / 60,
                                                       "table": main_model["table"],
                                                       "controls": main_model["controls"],
                                                       "models": tables, "runs": runs}, indent=1))
    print(header + markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

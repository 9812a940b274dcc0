"""Training and evaluating one run: a Trainer whose evaluations use the common scorer, the held-out,
transfer and curve evaluations, the held-out entropy, and the base model's row."""

from __future__ import annotations

import math
import statistics
import tempfile
import time
from pathlib import Path

from .records import response_records
from .variants import GRADED, SCORER, TRANSFER, VARIANTS


def scorer_overrides(overrides: list[str]) -> list[str]:
    """The common scorer's config: the run's overrides but the sections a variant changes, then SCORER
    (the same scorer for every variant)."""
    return [o for o in overrides if not o.startswith(("reward.", "algorithm.", "opsd."))] + SCORER


def make_trainer(preset: str, overrides: list[str], run_dir: Path):
    """A Trainer for `preset` + overrides whose evaluations use the common, fixed scorer (SCORER)."""
    from rlpr.config import load_config
    from rlpr.model.forward import causal_lm
    from rlpr.reward.probability_reward import ProbabilityReward
    from rlpr.train.tracking import Tracker
    from rlpr.train.trainer import Trainer

    common = load_config(preset, scorer_overrides(overrides))
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


def run_facts(cfg) -> dict:
    """What a row records of its run's setting (issue 58): the track (short_answer or reasoning, by the
    demo families' kind; custom for other data), the response length, and OPSD's teacher template,
    context and recipe (null where the reward kind has no teacher)."""
    from rlpr.data.demo_tasks import family_kind
    from rlpr.reward.kinds import REWARD_KINDS

    teacher = REWARD_KINDS[cfg.reward.kind].token_signal == "teacher"
    return {"track": family_kind(cfg.data.demo_families) if cfg.data.train == "demo" else "custom",
            "max_new_tokens": cfg.rollout.max_new_tokens,
            "teacher_template": cfg.opsd.template if teacher else None,
            "teacher_context": cfg.opsd.context if teacher else None,
            "opsd_recipe": (cfg.opsd.recipe or None) if teacher else None}


def transfer_prompts(trainer, limit: int) -> dict[str, list]:
    """Each transfer set's prompts, built as the trainer builds its held-out prompts (the preset's
    template and prefill); the first `limit` questions of each (0: all; -1: no transfer sets, as on the
    reasoning track, whose prompt format they were not written for)."""
    from rlpr.data.loading import load_examples
    from rlpr.data.prompts import prepare_prompts

    d = trainer.cfg.data
    out = {}
    if limit < 0:
        return out
    for name, path in TRANSFER.items():
        examples = load_examples(path, template=d.template)
        out[name] = prepare_prompts(examples[:limit] if limit else examples, trainer.tokenizer,
                                    d.max_prompt_tokens, d.prefill)[0]
    return out


# rows' `eval_schedule` (docs/learning.md, "The evaluation schedule"): 2 scores only the final held-out
# evaluation (the transfer sets and curve points are graded only); rows without it are schedule 1
EVAL_SCHEDULE = 2
# what a row's `train` keeps of each step: these metric families (OPSD's, issue 41) and the fixed list
# (the reward and rollouts, and issue 61's accounting of groups, responses, |A| and the gradient norm)
TRAIN_PREFIXES = ("opsd/",)
TRAIN_KEYS = ("reward/mean", "reward/accuracy", "reward/score_b_mean", "reward/score_a_mean", "filter/kept_frac",
              "filter/nonzero_std_frac", "rollout/response_len_mean", "rollout/distinct_frac", "policy/entropy",
              "rollout/distinct_answers", "rollout/identical_frac", "perf/step_s", "perf/reward_s",
              "filter/generated_groups", "filter/passed_groups", "policy/groups", "policy/tokens",
              "policy/adv_abs_mean", "policy/grad_norm", "rollout/responses", "rollout/responses_total")


def evaluation(trainer, limit: int = 0, prompts: list | None = None, keep: list | None = None,
               score: bool = True) -> dict:
    """rlpr.train.held_out.evaluate on `prompts` (default: the held-out questions), or their first `limit`;
    each question's responses and grades go to `keep`; `score=False`: graded only."""
    from rlpr.train.held_out import evaluate

    full = trainer.val_prompts
    chosen = full if prompts is None else prompts
    trainer.val_prompts = chosen[:limit] if limit else chosen
    try:
        return evaluate(trainer, keep, score=score)
    finally:
        trainer.val_prompts = full


def summary_of(ev: dict, suffix: str) -> dict:
    """An evaluation's numbers with `suffix`; an evaluation graded only has no reward, score B or format."""
    k = ev.get("eval/samples", 8)
    out = {f"acc_{suffix}": ev["eval/accuracy"], f"greedy_{suffix}": ev["eval/greedy_accuracy"],
           f"reward_{suffix}": ev.get("eval/reward_mean"), f"pass8_{suffix}": ev.get(f"eval/pass@{k}"),
           f"score_b_{suffix}": ev.get("eval/score_b_mean"), f"format_{suffix}": ev.get("eval/format_rate"),
           f"len_{suffix}": ev["eval/response_len_mean"]}
    return {key: v for key, v in out.items() if v is not None or key.startswith("pass8")}


def transfer_summary(ev: dict, name: str, suffix: str) -> dict:
    """A transfer set's graded numbers (GRADED): {name}_acc_{suffix}, {name}_greedy_..., {name}_pass8_..."""
    return {f"{name}_{key}": v for key, v in summary_of(ev, suffix).items() if key.rsplit("_", 1)[0] in GRADED}


def evaluate_all(trainer, transfer: dict[str, list], records: list[dict], suffix: str,
                 score_transfer: bool = False) -> tuple[dict, dict]:
    """The in-family held-out evaluation and every transfer set's: (held-out eval dict, transfer
    numbers with `suffix`); every question's responses go to `records`. The transfer sets are graded
    only (EVAL_SCHEDULE) unless `score_transfer`."""
    kept: list[dict] = []
    ev = evaluation(trainer, keep=kept)
    records.extend(response_records("heldout", kept))
    numbers = {f"entropy_{suffix}": response_entropy(trainer, kept)}
    for name, prompts in transfer.items():
        kept = []
        numbers.update(transfer_summary(evaluation(trainer, prompts=prompts, keep=kept, score=score_transfer),
                                        name, suffix))
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


def curve_point(trainer, step: int, curve_questions: int, records: list[dict], score: bool = False) -> dict:
    """The held-out curve's point at `step`: the first `curve_questions` held-out questions, graded
    only (EVAL_SCHEDULE) unless `score`."""
    kept: list[dict] = []
    point = {"step": step, **summary_of(evaluation(trainer, curve_questions, keep=kept, score=score), "curve")}
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
            "eval_schedule": EVAL_SCHEDULE, **run_facts(trainer.cfg), "seconds": time.time() - start}


def run_one(preset: str, overrides: list[str], variant: str, seed: int, steps: int, curve_every: int,
            curve_questions: int, transfer_questions: int, get_base, workdir: Path, records: list[dict]) -> dict:
    """Train `steps` steps and evaluate; a few held-out points on the way for the curves.
    `get_base()` returns the base model's row (another worker may still be computing it: it is
    needed only once this run has finished)."""
    start = time.time()
    run_dir = workdir / "runs" / f"{variant}-{seed}-{time.time_ns()}"
    trainer = make_trainer(preset, overrides + VARIANTS[variant] + [f"trainer.seed={seed}",
                                                                    f"trainer.max_steps={steps}"], run_dir)
    curve, train, evaluating = [], [], 0.0
    for step in range(1, steps + 1):
        m = trainer.train_step(step)
        trainer.step = step
        trainer.tracker.log(step, m)
        train.append({"step": step, **{k: m.get(k) for k in TRAIN_KEYS},
                      **{k: v for k, v in m.items() if k.startswith(TRAIN_PREFIXES)}})
        number = {k: math.nan if m.get(k) is None else m[k] for k in (  # a reward kind may log no reward/mean
            "reward/mean", "reward/accuracy", "filter/kept_frac", "rollout/response_len_mean", "perf/step_s")}
        print(f"  {variant} seed {seed} step {step}: reward {number['reward/mean']:.3f} "
              f"acc {number['reward/accuracy']:.3f} kept {number['filter/kept_frac']:.2f} "
              f"len {number['rollout/response_len_mean']:.1f} {number['perf/step_s']:.0f}s", flush=True)
        if curve_every and step % curve_every == 0 and step < steps:
            tick = time.time()
            curve.append({**curve_point(trainer, step, curve_questions, records),
                          "rollouts": m.get("rollout/responses_total")})
            evaluating += time.time() - tick
    tick = time.time()
    ev, transfer = evaluate_all(trainer, transfer_prompts(trainer, transfer_questions), records, "after")
    evaluating += time.time() - tick
    trainer.tracker.close()
    n = ev["eval/questions"]
    base = get_base()
    curve = ([{**base["curve"][0], "rollouts": 0}] if base.get("curve") else []) + curve  # step 0: the base model
    before = {k: v for k, v in base.items() if k.endswith("_before")}
    return {"variant": variant, "seed": seed, "steps": steps, "n_heldout": n, **before, **summary_of(ev, "after"),
            **transfer, "curve": curve, "curve_questions": curve_questions, "train": train,
            "step_s": statistics.fmean(t["perf/step_s"] for t in train),
            # the reward's own cost per step (score B and A, or the label-free kind's forward)
            "reward_s": statistics.fmean(t["perf/reward_s"] for t in train), "model": model_name(trainer),
            "device": trainer.device.type,  # rows of one table may come from a CPU and a GPU: the report says which
            "eval_s": evaluating, "eval_schedule": EVAL_SCHEDULE, **run_facts(trainer.cfg),
            # issue 61: every response the training generated (all sampling rounds), and the training's wall
            # time (the run's seconds less its evaluations): the compute a row's accuracy cost
            "rollouts": train[-1]["rollout/responses_total"], "wall_s": time.time() - start - evaluating,
            "seconds": time.time() - start}

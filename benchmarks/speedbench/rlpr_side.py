"""rlpr's side: timed training steps at the demo settings, each phase's seconds, and score B both ways on
the same responses (from the rollout's caches and recomputed); it returns the prompts in the order the
steps took them, for TRL to train on the same."""

from __future__ import annotations

import copy
import time
from pathlib import Path

import torch

from rlpr.train.metrics import mean

from .settings import rlpr_config


def run_rlpr(args, workdir: Path, baton) -> tuple[dict, list]:
    """Timed rlpr steps, each a turn of `baton`, whose setup turn the
    caller began and the trainer's construction ends; also returns the prompts each step used. Every
    scoring computes score B both ways on the same responses (from the rollout's caches, and
    recomputed); the step trains on the one reward.score_b_from_cache picks, and the other's seconds
    are left out of the step."""
    from speedbench.score_b_paths import BothPaths

    from rlpr.train.trainer import Trainer

    cfg, overrides = rlpr_config(args, str(workdir))
    tick = time.perf_counter()
    trainer = Trainer(cfg, workdir / "rlpr-run")
    setup_s = time.perf_counter() - tick
    baton.end()
    configured = trainer.keep_caches  # reward.score_b_from_cache as resolved for this rollout copy
    trainer.keep_caches = True  # keep them for both paths; BothPaths returns the configured one
    both = BothPaths(trainer.reward, use_cache=configured)
    stream = copy.deepcopy(trainer.stream)  # the order in which the steps below take prompts
    n_steps = args.warmup + args.steps
    order = [trainer.train_prompts[i] for i in stream.take(cfg.trainer.prompts_per_step * n_steps)]
    steps = []
    for step in range(1, n_steps + 1):
        trainer.reward.seconds = {"score_b": 0.0, "score_a": 0.0}
        calls = len(both.calls)
        with baton.turn():
            m = trainer.train_step(step)
        trainer.step = step
        mine = both.calls[calls:]
        extra = sum(c["recomputed_s" if configured else "cache_s"] for c in mine)  # the path not returned
        b, a = trainer.reward.seconds["score_b"] - extra, trainer.reward.seconds["score_a"]
        row = {"step": step, "warmup": step <= args.warmup, "step_s": m["perf/step_s"] - extra,
               "rollout_s": m["perf/rollout_s"], "score_b_s": b, "score_a_s": a,
               "score_b_recomputed_s": sum(c["recomputed_s"] for c in mine),
               "score_b_from_cache_s": sum(c["cache_s"] for c in mine),
               "max_abs_diff_b": max((abs(x - y) for c in mine for x, y in zip(c["b_cache"], c["b_recomputed"])),
                                     default=0.0),
               "reward_other_s": m["perf/reward_s"] - extra - b - a, "old_logp_s": m["perf/old_logp_s"],
               "update_s": m["perf/update_s"],
               "generated_tokens": m["perf/rollout_tok_s"] * m["perf/rollout_s"],
               "rollout_tok_s": m["perf/rollout_tok_s"], "groups": m["filter/kept_groups"],
               "rollout_rounds": m["filter/tries"], "reward_mean": m["reward/mean"],
               "fallback_frac": m["reward/fallback_frac"], "response_len_mean": m["rollout/response_len_mean"]}
        row["other_s"] = row["step_s"] - sum(row[k] for k in ("rollout_s", "score_b_s", "score_a_s",
                                                               "reward_other_s", "old_logp_s", "update_s"))
        steps.append(row)
        print(f"rlpr step {step}{' (warm-up)' if row['warmup'] else ''}: {row['step_s']:.1f} s "
              f"(rollout {row['rollout_s']:.1f}, B {b:.1f} [recomputed {row['score_b_recomputed_s']:.1f}, from cache "
              f"{row['score_b_from_cache_s']:.1f}], A {a:.1f}, update {row['update_s']:.1f})", flush=True)
    timed = [r for r in steps if not r["warmup"]]
    keys = ["step_s", "rollout_s", "score_b_s", "score_a_s", "reward_other_s", "old_logp_s", "update_s",
            "other_s", "generated_tokens", "score_b_recomputed_s", "score_b_from_cache_s"]
    summary = {k: mean(r[k] for r in timed) for k in keys}
    summary["rollout_tok_s"] = summary["generated_tokens"] / summary["rollout_s"]
    summary["step_tok_s"] = summary["generated_tokens"] / summary["step_s"]
    summary["max_abs_diff_b"] = max(r["max_abs_diff_b"] for r in timed)
    out = {"overrides": overrides, "steps": steps, "mean": summary, "setup_s": setup_s,
           "score_b_from_cache": cfg.reward.score_b_from_cache,
           "score_b_on_copy": cfg.reward.score_b_on_copy, "configured_path": "cache" if configured else "recomputed",
           "rollout_dtype": str(trainer.engine.model.dtype).replace("torch.", ""),
           "prepacked_weights": bool(getattr(trainer.engine, "prepacked", False)),  # rollout.prepacked_weights resolved
           "mixed_precision": trainer.mixed_precision,  # the update's, as trainer.mixed_precision=auto resolved
           "pack_responses": trainer.pack,  # the update's rows, as trainer.pack_responses=auto resolved
           "torch_threads": torch.get_num_threads()}
    del trainer
    return out, order


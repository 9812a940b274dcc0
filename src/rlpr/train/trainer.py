"""The RLPR training loop, readable top to bottom: one method per stage of a step.

    prompts -> rollouts -> probability rewards -> group std filter (+ dynamic sampling)
            -> advantages -> old log-probs -> mini-batch PPO updates -> metrics / eval / checkpoint

The loop is SPMD: under torchrun every rank runs it on its own prompts and owns whole groups;
global counts go through `rlpr.parallel.distributed` (no-ops in a single process).
"""

from __future__ import annotations

import logging
import math
import random
import resource
import signal
import sys
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import yaml

from rlpr.parallel import distributed as dist
from rlpr.algorithms.advantages import centred_moments, compute_advantages
from rlpr.algorithms.std_filter import EMAStdFilter
from rlpr.model.attention import use_fp32_attention_under_autocast
from rlpr.train.checkpoint import (latest_checkpoint, load_state, load_weights, resume_changes, rng_state,
                                   save_checkpoint, set_rng_state)
from rlpr.config import SEED_MIX, Config, validate_world
from rlpr.data.prompts import Prompt, PromptStream, prepare_prompts
from rlpr.errors import ConfigError, TrainingError
from rlpr.model.forward import causal_lm
from rlpr.model.memory import cap_kernel_caches, release_memory
from rlpr.model.precision import frozen_linear_weights_in, resolve_mixed_precision, resolve_rollout_dtype
from rlpr.reward.probability_reward import ProbabilityReward, RewardOutput
from rlpr.reward.score_a import ScoreA
from rlpr.rollout.hf import HFRollout, Rollout
from rlpr.parallel.sharding import make_strategy
from rlpr.train.tracking import Tracker
from rlpr.train.update import Sample, accumulate_gradients, fill_logprobs

log = logging.getLogger("rlpr.train")


@dataclass
class Group:
    """The n responses to one prompt, with their rewards."""

    prompt: Prompt
    rollouts: list[Rollout]
    rewards: list[RewardOutput]

    @property
    def scalar_rewards(self) -> list[float]:
        return [r.reward for r in self.rewards]

    @property
    def std(self) -> float:
        values = torch.tensor(self.scalar_rewards, dtype=torch.float64)
        return values.std(unbiased=True).item()


def load_examples_for(cfg: Config, split: str):
    """Examples for 'train' or 'val' from the built-in demo tasks or a data file."""
    from rlpr.data.loading import ColumnMapping, load_examples

    source = cfg.data.train if split == "train" else cfg.data.val
    if not source:
        return []
    if source == "demo":
        from rlpr.data.demo_tasks import demo_examples

        n = cfg.data.demo_train_size if split == "train" else cfg.data.demo_val_size
        return demo_examples(split, n=n, seed=cfg.data.demo_seed, template=cfg.data.template,
                             families=cfg.data.demo_families, val_every=cfg.data.demo_val_every)
    mapping = ColumnMapping(cfg.data.question_column, cfg.data.answer_column, cfg.data.choices_column)
    return load_examples(source, cfg.data.template, mapping)


def build_policy(cfg: Config, model):
    """Wrap the base model for training: a LoRA adapter (peft) or all weights."""
    if cfg.model.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False
    if not cfg.model.lora:
        model.requires_grad_(True)
        return model
    from peft import LoraConfig, get_peft_model

    lora = LoraConfig(r=cfg.model.lora_rank, lora_alpha=cfg.model.lora_alpha,
                      lora_dropout=cfg.model.lora_dropout, target_modules=list(cfg.model.lora_target_modules),
                      task_type="CAUSAL_LM")
    if cfg.model.gradient_checkpointing:
        model.enable_input_require_grads()
    return get_peft_model(model, lora)


# Held-out samples are seeded apart from training rollouts, and the same before and after training.
EVAL_SEED = 7_000_003


def binomial_se(p: float, n: float) -> float:
    """Standard error of a proportion over n questions."""
    return math.sqrt(max(p * (1.0 - p), 0.0) / n) if n else float("nan")


def peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 ** 2


def mean(values) -> float:
    values = list(values)
    return sum(values) / len(values) if values else float("nan")


class Trainer:
    def __init__(self, cfg: Config, run_dir: Path, *, resume: bool = False, examples: dict | None = None):
        self.cfg = cfg
        self._examples = examples or {}  # {"train": [...], "val": [...]} already loaded (train() checks data first)
        self.run_dir = Path(run_dir)
        self.resume = resume
        self.stop_requested = False
        self.timings = {"perf/rollout_s": 0.0, "perf/reward_s": 0.0}
        self._setup()

    # -- set-up -----------------------------------------------------------------------------
    def _setup(self) -> None:
        from rlpr.model.loading import load_model

        cfg = self.cfg
        cap_kernel_caches()
        threads = cfg.model.threads or dist.default_threads()
        if threads:
            torch.set_num_threads(threads)
        self._seed_everything(cfg.trainer.seed)  # the same on every rank: identical initial weights
        if dist.is_main():
            log.info("loading model %s", cfg.model.path)
        self.device = dist.resolve_device(cfg.model.device)  # the reference and rollout copies follow it
        self.mixed_precision = resolve_mixed_precision(cfg.trainer.mixed_precision, self.device)
        model, self.tokenizer = load_model(cfg.model.path, device=self.device)
        self.policy = build_policy(cfg, model).to(self.device)
        self.policy.train()
        if self.mixed_precision == "bf16" and cfg.trainer.fp32_attention and self.device.type == "cpu":
            use_fp32_attention_under_autocast(causal_lm(self.policy))
        self.ref_model = None
        if cfg.algorithm.kl_coef and not cfg.model.lora:  # with LoRA the reference is the adapter-off base
            import copy

            self.ref_model = copy.deepcopy(causal_lm(self.policy)).eval().requires_grad_(False)

        train_examples = self._examples.get("train")
        if train_examples is None:
            train_examples = load_examples_for(cfg, "train")
        self.train_prompts, skipped = prepare_prompts(train_examples, self.tokenizer, cfg.data.max_prompt_tokens,
                                                           cfg.data.prefill)
        val_examples = self._examples.get("val")
        if val_examples is None:
            val_examples = load_examples_for(cfg, "val")
        if cfg.data.val_limit:
            val_examples = val_examples[:cfg.data.val_limit]
        val_prompts, val_skipped = prepare_prompts(val_examples, self.tokenizer, cfg.data.max_prompt_tokens,
                                                       cfg.data.prefill)
        self.val_prompts = val_prompts[dist.rank()::dist.world_size()]  # each rank evaluates its share
        self.skipped_prompts = skipped + val_skipped
        if skipped:
            log.warning("skipped %d training prompts longer than data.max_prompt_tokens=%d",
                        skipped, cfg.data.max_prompt_tokens)
        if not self.train_prompts:
            raise ConfigError(f"data.train: no usable prompts ({skipped} longer than data.max_prompt_tokens)")
        if len(self.train_prompts) < cfg.trainer.prompts_per_step:
            raise ConfigError(f"trainer.prompts_per_step ({cfg.trainer.prompts_per_step}) exceeds the "
                              f"{len(self.train_prompts)} usable training prompts: a step would repeat prompts")
        self.stream = PromptStream(len(self.train_prompts), cfg.trainer.seed, cfg.data.shuffle)

        max_length = getattr(causal_lm(self.policy).config, "max_position_embeddings", None)
        self.reward = ProbabilityReward(cfg.reward, self.tokenizer, cfg.rollout.temperature, max_length)
        # score A from the initial (or current) policy: the adapter-off base, the reference copy, or upfront
        self.score_a: ScoreA = self._bind_score_a(self.reward)
        self.eval_reward = self.reward  # what evaluate() scores with (a benchmark may set a common one)
        dtype = resolve_rollout_dtype(cfg.model.rollout_dtype, self.device)
        self.engine = HFRollout(self.policy, self.tokenizer, dtype, cfg.rollout.batch_sequences,
                                 cfg.rollout.share_prefill, cfg.rollout.decode_loop)
        # fsdp shards the policy in place; deepspeed wraps the optimizer (`attach`)
        self.strategy = make_strategy(cfg.trainer.strategy, self.policy, cfg.trainer.zero_stage)
        self.trainable = [p for p in self.policy.parameters() if p.requires_grad]
        a = cfg.algorithm
        self.filter = EMAStdFilter(beta=a.filter_beta, warmup_steps=a.filter_warmup_steps,
                                   init_steps=a.filter_init_steps, decay=a.filter_ema_decay, enabled=a.std_filter)
        t = cfg.trainer
        self.optimizer = torch.optim.AdamW(self.trainable, lr=t.lr, betas=(t.adam_beta1, t.adam_beta2),
                                           weight_decay=t.weight_decay)
        self.strategy.attach(self.optimizer, self.trainable, t.grad_clip)
        warmup = t.warmup_steps
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda k: min(1.0, (k + 1) / warmup) if warmup else 1.0)
        self.step = 0
        if dist.is_main():
            log.info("%d training prompts, %d held-out; %d steps of %d prompts x %d responses; run dir %s",
                     len(self.train_prompts), len(val_prompts), cfg.trainer.max_steps, cfg.trainer.prompts_per_step,
                     cfg.rollout.responses_per_prompt, self.run_dir)
        if self.resume:
            self._restore(latest_checkpoint(self.run_dir))
        elif self.score_a.needs_upfront:  # full fine-tuning without a reference copy
            with self.strategy.gathered():
                self.score_a.precompute(self.train_prompts + self.val_prompts)

    def _bind_score_a(self, reward: ProbabilityReward) -> ScoreA:
        """A reward's score A comes from this policy: current, or initial (the adapter-off base,
        the reference copy, or computed upfront for full fine-tuning without one)."""
        return reward.score_a.bind(self.policy, lora=self.cfg.model.lora, reference=self.ref_model)

    @property
    def eval_reward(self) -> ProbabilityReward:
        return self._eval_reward

    @eval_reward.setter
    def eval_reward(self, reward: ProbabilityReward) -> None:
        self._bind_score_a(reward)
        self._eval_reward = reward

    @staticmethod
    def _seed_everything(seed: int) -> None:
        random.seed(seed)
        np.random.seed(seed % 2**32)
        torch.manual_seed(seed)

    # -- stage 1-2: rollouts and rewards ------------------------------------------------------
    def rollout_groups(self, indices: list[int], seed: int) -> list[Group]:
        """Sample a group per prompt; each prompt's sampling is seeded by (seed, prompt index), so
        the responses do not depend on how prompts are batched or sharded over ranks."""
        cfg = self.cfg
        prompts = [self.train_prompts[i] for i in indices]
        tick = time.perf_counter()
        rollouts = self.engine.generate([p.token_ids for p in prompts], cfg.rollout.responses_per_prompt,
                                        max_new_tokens=cfg.rollout.max_new_tokens,
                                        temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p,
                                        seeds=[seed * SEED_MIX + p.index for p in prompts])
        self.timings["perf/rollout_s"] += time.perf_counter() - tick
        release_memory()
        tick = time.perf_counter()
        rewards = self.score(prompts, rollouts)
        self.timings["perf/reward_s"] += time.perf_counter() - tick
        release_memory()
        n = cfg.rollout.responses_per_prompt
        return [Group(p, rollouts[k * n:(k + 1) * n], rewards[k * n:(k + 1) * n]) for k, p in enumerate(prompts)]

    def score(self, prompts: list[Prompt], rollouts: list[Rollout],
              reward: ProbabilityReward | None = None) -> list[RewardOutput]:
        """Rewards of rollouts (with `reward`, default the training reward), graded for accuracy."""
        from rlpr.evaluation.graders import grade_example

        reward = reward or self.reward
        by_index = [prompts[r.prompt_index] for r in rollouts]
        responses = [p.response_text(r.text) for p, r in zip(by_index, rollouts)]
        correct = [grade_example(p.example, text).correct for p, text in zip(by_index, responses)]
        with self.strategy.gathered():  # every rank calls score(), even with no rollouts
            return reward(self.policy, [p.text for p in by_index], responses,
                          [p.example.reference for p in by_index],
                          precomputed_a=[p.example.score_a for p in by_index], correct=correct)

    # -- stage 3: filtering with dynamic sampling --------------------------------------------
    def collect(self, step: int) -> tuple[list[Group], dict]:
        """Roll out until `prompts_per_step` groups (over all ranks) pass the std filter.

        Every rank takes the same prompts from its (identical) stream and rolls out its share
        (positions rank, rank + world, ...); groups are ordered by (round, position), so the kept
        set is the same as in a single process.
        """
        cfg = self.cfg
        want = cfg.trainer.prompts_per_step
        ranks, me = dist.world_size(), dist.rank()
        self.filter.begin_step(step)
        kept: list[tuple[tuple[int, int], Group]] = []
        generated: list[Group] = []
        tries = global_kept = global_generated = 0
        while tries < cfg.algorithm.max_sampling_tries:
            rate = global_kept / global_generated if global_generated else 1.0
            to_roll = want if not tries else min(want, math.ceil((want - global_kept) / max(rate, 0.25)))
            taken = list(enumerate(self.stream.take(to_roll)))[me::ranks]
            seed = (cfg.trainer.seed * SEED_MIX + step) * 101 + tries
            groups = self.rollout_groups([index for _, index in taken], seed)
            keep = self.filter.keep(step, [g.std for g in groups])
            kept.extend(((tries, pos), g) for (pos, _), g, k in zip(taken, groups, keep) if k)
            generated.extend(groups)
            tries += 1
            global_kept, global_generated = (int(v) for v in dist.sum_values([len(kept), len(generated)]))
            if global_kept >= want:
                break
        kept_groups = self._first_kept(kept, want)
        stds = [g.std for g in generated]
        std_sum, std_count, nonzero = dist.sum_values(
            [sum(s for s in stds if math.isfinite(s)), sum(math.isfinite(s) for s in stds), sum(s > 1e-6 for s in stds)])
        kept_count = min(global_kept, want)
        mean_std = std_sum / std_count if std_count else float("nan")
        if kept_count < want and cfg.algorithm.on_insufficient == "error":
            raise TrainingError(
                f"step {step}: the std filter kept {kept_count} of {want} groups after "
                f"{tries} rollout rounds; raise algorithm.max_sampling_tries, lower algorithm.filter_beta, "
                f"or set algorithm.on_insufficient=train")
        threshold = self.filter.threshold(step)
        self.filter.end_step(step, mean_std)
        stats = {"filter/kept_frac": kept_count / max(global_generated, 1), "filter/kept_groups": kept_count,
                 "filter/generated_groups": global_generated, "filter/tries": tries, "filter/mean_std": mean_std,
                 "filter/ema_std": self.filter.ema if self.filter.ema is not None else float("nan"),
                 "filter/threshold": threshold if threshold is not None else 0.0,
                 "filter/nonzero_std_frac": nonzero / max(global_generated, 1),
                 "filter/cached_prompts": len(self.stream.cache)}
        return kept_groups, {"generated": generated, **stats}

    def _first_kept(self, kept: list[tuple[tuple[int, int], Group]], want: int) -> list[Group]:
        """This rank's share of the first `want` kept groups in global (round, position) order.
        The prompts of the surplus kept groups go back to every rank's stream cache, to be
        re-rolled later with a newer policy."""
        everyone = sorted(k for keys in dist.gather_objects([(key, g.prompt.index) for key, g in kept])
                          for k in keys)
        chosen = {key for key, _ in everyone[:want]}
        self.stream.give_back([index for _, index in everyone[want:]])
        return [g for key, g in kept if key in chosen]

    # -- stage 4-5: advantages, old log-probs, updates ----------------------------------------
    def make_samples(self, groups: list[Group]) -> list[list[Sample]]:
        """Per group, its responses as training samples with advantages (every rank calls it:
        REINFORCE++ normalises over the global batch)."""
        name = self.cfg.algorithm.advantage
        rewards = torch.tensor([g.scalar_rewards for g in groups], dtype=torch.float32)
        moments = None
        if name == "reinforce_pp" and dist.world_size() > 1:
            local = centred_moments(rewards) if groups else (0.0, 0.0, 0.0)
            moments = tuple(dist.sum_values(list(local)))
        if not groups:
            return []
        adv = compute_advantages(rewards, name, moments)
        return [[Sample(g.prompt.token_ids + r.token_ids, len(g.prompt.token_ids), float(a))
                 for r, a in zip(g.rollouts, adv_row.tolist()) if r.token_ids]
                for g, adv_row in zip(groups, adv)]

    def _precision(self):
        """Autocast the update's forwards/backwards to bf16 when asked (master weights stay fp32)."""
        if self.mixed_precision == "bf16":
            return torch.autocast(self.device.type, dtype=torch.bfloat16, cache_enabled=self.strategy.autocast_cache)
        return torch.autocast(self.device.type, enabled=False)

    def _frozen_weights(self):
        """The frozen weights in bf16 for the whole update (see rlpr/model/precision.py); not under the
        lock-step strategies (fsdp's parameters are shards it gathers itself; DeepSpeed's engine
        holds its own references to the parameters)."""
        t = self.cfg.trainer
        if self.mixed_precision == "bf16" and t.bf16_frozen_weights and not self.strategy.lockstep:
            return frozen_linear_weights_in(self.policy, torch.bfloat16)
        return nullcontext()

    def update(self, groups: list[Group]) -> dict:
        with self._frozen_weights():
            return self._update(groups)

    def _update(self, groups: list[Group]) -> dict:
        cfg, t = self.cfg, self.cfg.trainer
        per_group = self.make_samples(groups)
        pad = self.tokenizer.pad_token_id
        temp = cfg.rollout.temperature
        per_rank_mb = max(1, t.mini_batch_prompts // dist.world_size())
        n_updates = int(dist.max_value(math.ceil(len(per_group) / per_rank_mb) if per_group else 0))
        all_samples = [s for g in per_group for s in g]
        share = t.share_prompt_prefix and not cfg.model.gradient_checkpointing
        timings = {}
        tick = time.perf_counter()
        with self._precision(), self.strategy.gathered():
            if n_updates * t.epochs_per_step > 1:  # with one update, old log-probs = detached current ones
                fill_logprobs(self.policy, all_samples, "old_logp", t.micro_batch_sequences, pad, temp, share)
            if cfg.algorithm.kl_coef:
                with self.score_a.initial_policy() as ref:
                    fill_logprobs(ref, all_samples, "ref_logp", t.micro_batch_sequences, pad, temp, share)
        timings["perf/old_logp_s"] = time.perf_counter() - tick
        tick = time.perf_counter()
        totals: dict[str, float] = {}
        grad_norms = []
        self.policy.train()
        for _ in range(t.epochs_per_step):
            for u in range(n_updates):
                chunk = [s for g in per_group[u * per_rank_mb:(u + 1) * per_rank_mb] for s in g]
                with self._precision(), self.strategy.training():  # every rank calls it, even with no groups
                    stats = accumulate_gradients(self.policy, chunk, cfg.algorithm, t.micro_batch_sequences,
                                                 pad, temp, share, lockstep=self.strategy.lockstep,
                                                 backward=self.strategy.backward)
                grad_norms.append(self.strategy.step())  # reduce, clip at grad_clip, AdamW step
                for k, v in stats.items():
                    totals[k] = totals.get(k, 0.0) + v
        self.scheduler.step()
        timings["perf/update_s"] = time.perf_counter() - tick
        keys = ["pg_loss", "clipped", "entropy", "kl", "tokens", "ratio_gap"]
        sums = dict(zip(keys, dist.sum_values([totals.get(k, 0.0) for k in keys])))
        tokens = max(sums["tokens"], 1.0)
        return {"policy/pg_loss": sums["pg_loss"] / tokens, "policy/clip_frac": sums["clipped"] / tokens,
                "policy/entropy": sums["entropy"] / tokens, "policy/kl": sums["kl"] / tokens,
                "policy/ratio_gap": sums["ratio_gap"] / tokens,
                "policy/grad_norm": mean(grad_norms), "policy/updates": len(grad_norms),
                "policy/lr": self.scheduler.get_last_lr()[0], "policy/tokens": sums["tokens"], **timings}

    # -- one step -----------------------------------------------------------------------------
    def train_step(self, step: int) -> dict:
        start = time.perf_counter()
        self.timings = {"perf/rollout_s": 0.0, "perf/reward_s": 0.0}
        with self.strategy.gathered():
            self.engine.sync(self.policy)
        kept, info = self.collect(step)
        generated = info.pop("generated")
        collect_s = time.perf_counter() - start
        metrics = {**info, **self.rollout_metrics(generated), **self.update(kept), **self.timings}
        metrics["perf/collect_s"] = collect_s
        metrics["perf/step_s"] = time.perf_counter() - start
        metrics["perf/rollout_tok_s"] = metrics.pop("_tokens") / max(metrics["perf/rollout_s"], 1e-9) \
            / dist.world_size()
        metrics["perf/peak_rss_gb"] = peak_rss_gb()
        if self.cfg.trainer.sample_every and step % self.cfg.trainer.sample_every == 0 and dist.is_main():
            self.tracker.write_samples(step, self.sample_rows(generated))
        self._flag_collapse(step, metrics)
        return metrics

    def _flag_collapse(self, step: int, m: dict) -> None:
        """Warn when the groups' responses are nearly all the same text (the policy collapsed onto
        one answer or template, so the advantages are mostly zero); the metric stays in the log."""
        n = self.cfg.rollout.responses_per_prompt
        if dist.is_main() and m["rollout/distinct_frac"] <= 2.0 / n:
            log.warning("step %d: collapse? on average only %.1f distinct responses of %d per group "
                        "(rollout/distinct_frac %.2f)", step, m["rollout/distinct_frac"] * n, n,
                        m["rollout/distinct_frac"])

    def rollout_metrics(self, groups: list[Group]) -> dict:
        outs = [r for g in groups for r in g.rewards]
        rolls = [r for g in groups for r in g.rollouts]
        keys = ["score_b", "score_a", "reward", "format", "fallback", "valid", "delta", "penalty", "len",
                "truncated", "count", "correct", "graded", "distinct", "groups"]
        local = [sum(o.score_b for o in outs), sum(o.score_a for o in outs), sum(o.reward for o in outs),
                 sum(o.format for o in outs), sum(o.fallback for o in outs), sum(o.valid for o in outs),
                 sum(o.delta for o in outs), sum(o.penalty < 0 for o in outs),
                 sum(len(r.token_ids) for r in rolls), sum(not r.finished for r in rolls), len(outs),
                 sum(o.correct or 0.0 for o in outs), sum(o.correct is not None for o in outs),
                 sum(len({r.text.strip() for r in g.rollouts}) / max(len(g.rollouts), 1) for g in groups),
                 len(groups)]
        s = dict(zip(keys, dist.sum_values(local)))
        n = max(s["count"], 1)
        return {"reward/score_b_mean": s["score_b"] / n, "reward/score_a_mean": s["score_a"] / n,
                "reward/mean": s["reward"] / n, "reward/format_rate": s["format"] / n,
                "reward/valid_frac": s["valid"] / n, "reward/fallback_frac": s["fallback"] / n,
                "reward/delta_mean": s["delta"] / n, "reward/repetition_frac": s["penalty"] / n,
                "reward/accuracy": s["correct"] / s["graded"] if s["graded"] else float("nan"),
                "rollout/response_len_mean": s["len"] / n, "rollout/truncated_frac": s["truncated"] / n,
                # distinct responses per group / group size: falls toward 1/n when the policy collapses
                "rollout/distinct_frac": s["distinct"] / max(s["groups"], 1),
                "_tokens": s["len"]}

    def sample_rows(self, groups: list[Group], limit: int = 4) -> list[dict]:
        rows = []
        for g in groups[:limit]:
            for r, o in zip(g.rollouts, g.rewards):
                rows.append({"prompt": g.prompt.example.prompt[-1]["content"], "reference": g.prompt.example.reference,
                             "response": g.prompt.response_text(r.text), **o.to_dict()})
        return rows

    # -- evaluation ---------------------------------------------------------------------------
    @torch.no_grad()
    def evaluate(self) -> dict:
        """Held-out evaluation: greedy responses (probability reward, score B, greedy accuracy,
        format, length) and, with `trainer.eval_samples` = k > 0, k samples per question at the
        rollout temperature: Avg@k accuracy (spec section 7) and pass@k. Standard errors are
        binomial over the questions, sqrt(p (1 - p) / n)."""
        from rlpr.evaluation.graders import grade_example

        total = int(dist.sum_values([len(self.val_prompts)])[0])  # global: a rank may hold none
        if not total:
            return {}
        cfg = self.cfg
        k = cfg.trainer.eval_samples
        if dist.is_main():
            log.info("evaluating on %d held-out prompts (greedy%s)", total, f" and {k} samples each" if k else "")
        with self.strategy.gathered():
            self.engine.sync(self.policy)
        prompts = self.val_prompts
        max_new = cfg.trainer.eval_max_new_tokens or cfg.rollout.max_new_tokens
        rollouts = self.engine.generate([p.token_ids for p in prompts], 1, max_new_tokens=max_new,
                                        temperature=0.0)
        release_memory()
        rewards = self.score(prompts, rollouts, self.eval_reward)
        release_memory()
        correct = [bool(o.correct) for o in rewards]
        sampled_right = sampled_any = 0.0
        if k:
            samples = self.engine.generate([p.token_ids for p in prompts], k, max_new_tokens=max_new,
                                           temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p,
                                           seeds=[EVAL_SEED + p.index for p in prompts])
            release_memory()
            for i, p in enumerate(prompts):
                right = [grade_example(p.example, p.response_text(r.text)).correct for r in samples[i * k:(i + 1) * k]]
                sampled_right += sum(right) / k
                sampled_any += any(right)
        local = [sum(o.reward for o in rewards), sum(o.score_b for o in rewards), sum(correct),
                 sum(o.format for o in rewards), sum(len(r.token_ids) for r in rollouts), len(rewards),
                 sampled_right, sampled_any]
        reward_sum, b_sum, right, fmt, length, n, avg_k, pass_k = dist.sum_values(local)
        n = max(n, 1)
        out = {"eval/reward_mean": reward_sum / n, "eval/score_b_mean": b_sum / n,
               "eval/greedy_accuracy": right / n, "eval/greedy_accuracy_se": binomial_se(right / n, n),
               "eval/format_rate": fmt / n, "eval/response_len_mean": length / n, "eval/questions": n}
        # eval/accuracy: Avg@k when sampled (the paper's metric), else greedy
        out["eval/accuracy"], out["eval/accuracy_se"] = out["eval/greedy_accuracy"], out["eval/greedy_accuracy_se"]
        if k:
            out.update({"eval/accuracy": avg_k / n, "eval/accuracy_se": binomial_se(avg_k / n, n),
                        f"eval/pass@{k}": pass_k / n, "eval/samples": k})
        return out

    # -- checkpoints --------------------------------------------------------------------------
    def trainer_state(self) -> dict:
        return {"step": self.step, "optimizer": self.strategy.optimizer_state(self.policy, self.optimizer),
                "scheduler": self.scheduler.state_dict(), "filter": self.filter.state_dict(),
                "stream": self.stream.state_dict(), "score_a_cache": self.score_a.state_dict(),
                "rng": rng_state(), "world_size": dist.world_size(), "strategy": self.cfg.trainer.strategy}

    def save(self) -> Path | None:
        state = self.trainer_state()  # on every rank: with fsdp, gathering the optimizer state is a collective
        weights = self.strategy.model_state(self.policy)
        states = dist.gather_objects({k: v for k, v in state.items() if k in ("stream", "rng", "score_a_cache")})
        if not dist.is_main():
            dist.barrier()
            return None
        state["ranks"] = states
        path = save_checkpoint(self.run_dir, self.step, self.policy, self.tokenizer, state,
                               self.cfg.trainer.keep_last, weights)
        dist.barrier()
        return path

    def _restore(self, ckpt: Path) -> None:
        state = load_state(ckpt)
        if state.get("world_size", 1) != dist.world_size():
            raise ConfigError(f"{ckpt}: saved with {state.get('world_size', 1)} processes; resume with the same "
                              f"number (now {dist.world_size()})")
        if state.get("strategy", "ddp") != self.cfg.trainer.strategy:
            raise ConfigError(f"{ckpt}: saved with trainer.strategy={state.get('strategy', 'ddp')}; resume with it")
        with self.strategy.load_weights_context():
            load_weights(self.policy, ckpt)
        self.strategy.load_optimizer_state(self.policy, self.optimizer, state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.filter.load_state_dict(state["filter"])
        mine = state["ranks"][dist.rank()]
        self.stream.load_state_dict(mine["stream"])
        self.score_a.load_state_dict(mine["score_a_cache"])
        set_rng_state(mine["rng"])
        self.step = state["step"]
        log.info("resumed from %s at step %d", ckpt, self.step)

    # -- the loop -----------------------------------------------------------------------------
    def run(self) -> dict:
        t = self.cfg.trainer
        self.tracker = Tracker(self.run_dir, t.tensorboard and dist.is_main(),
                               resume_step=self.step if self.resume else None) if dist.is_main() else None
        if not dist.is_main():
            self.tracker = _NullTracker()
        summary: dict = {}
        if not self.resume and t.eval_before:
            before = self.evaluate()  # every rank calls it: it holds collectives
            if before:
                summary["before"] = before
                self.tracker.log(0, before)
        display = StepDisplay(t.max_steps, self.step, enabled=t.progress and dist.is_main())
        metrics: dict = {}
        with self._signals(), display:
            while self.step < t.max_steps and not self.stop_requested:
                step = self.step + 1
                metrics = self.train_step(step)
                self.step = step
                if t.eval_every and step % t.eval_every == 0 and step < t.max_steps:
                    metrics.update(self.evaluate())
                self.tracker.log(step, metrics)
                display.update(step, metrics)
                if t.save_every and step % t.save_every == 0 and step < t.max_steps:
                    self.save()
        if self.stop_requested and self.step < t.max_steps:
            self.save()
            if dist.is_main():
                print(f"\nstopped at step {self.step}; checkpoint saved. Resume with:\n"
                      f"  rlpr train --resume {self.run_dir}", file=sys.stderr)
            summary["interrupted"] = True
        else:
            after = self.evaluate()
            if after:
                summary["after"] = after
                self.tracker.log(self.step, after)
            self.save()
        summary.update(last=metrics, step=self.step, skipped_prompts=self.skipped_prompts,
                       peak_rss_gb=peak_rss_gb())
        self.tracker.close()
        return summary

    @contextmanager
    def _signals(self):
        """SIGINT/SIGTERM: finish the current step, checkpoint, exit 0. A second signal aborts."""
        def handler(signum, frame):
            if self.stop_requested:
                raise KeyboardInterrupt
            self.stop_requested = True
            if dist.is_main():
                print(f"\n{signal.Signals(signum).name}: finishing step {self.step + 1}, then saving a "
                      f"checkpoint (again to abort)", file=sys.stderr)

        try:
            previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
        except ValueError:  # not the main thread: no handlers
            previous = {}
        try:
            yield
        finally:
            for s, h in previous.items():
                signal.signal(s, h)


class _NullTracker:
    def log(self, *a, **k):
        pass

    def write_samples(self, *a, **k):
        pass

    def close(self):
        pass


class StepDisplay:
    """A live bar with step, reward, kept fraction and seconds per step (a log line per step when
    stderr is not a terminal)."""

    def __init__(self, total: int, start: int, enabled: bool = True):
        self.total, self.start, self.enabled = total, start, enabled
        self.tty = sys.stderr.isatty()
        self._progress = None

    def __enter__(self):
        if self.enabled and self.tty:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self._progress = Progress(TextColumn("step"), MofNCompleteColumn(), BarColumn(),
                                      TextColumn("{task.fields[info]}"), TimeRemainingColumn(),
                                      console=Console(stderr=True))
            self._progress.__enter__()
            self._task = self._progress.add_task("train", total=self.total, completed=self.start, info="")
        return self

    def update(self, step: int, m: dict) -> None:
        if not self.enabled:
            return
        info = (f"reward {m.get('reward/mean', float('nan')):.3f}  B {m.get('reward/score_b_mean', float('nan')):.3f}"
                f"  kept {m.get('filter/kept_frac', float('nan')):.2f}  {m.get('perf/step_s', 0):.1f}s/step")
        if self._progress is not None:
            self._progress.update(self._task, completed=step, info=info)
        else:
            print(f"step {step}/{self.total}  {info}", file=sys.stderr, flush=True)

    def __exit__(self, *exc):
        if self._progress is not None:
            self._progress.__exit__(*exc)


def default_run_dir(cfg: Config) -> Path:
    name = cfg.trainer.name or f"{cfg.preset or 'run'}-{time.strftime('%Y%m%d-%H%M%S')}"
    return Path(cfg.trainer.output_dir) / name


def train(cfg: Config, resume: str | None = None) -> dict:
    """Run (or resume) a training run; returns a summary (before/after eval, last metrics)."""
    dist.init_from_env(dist.resolve_device(cfg.model.device))  # NCCL on GPUs, gloo on CPU
    validate_world(cfg, dist.world_size())
    # refused before any model work; recorded once the checkpoint loads
    changes = resume_changes(resume, cfg) if resume else {}
    # a data error surfaces before the model loads and before anything is written
    examples = {split: load_examples_for(cfg, split) for split in ("train", "val")}
    run_dir = Path(dist.broadcast_object(str(resume) if resume else str(default_run_dir(cfg))))
    if not resume and (run_dir / "checkpoints").exists() and any((run_dir / "checkpoints").iterdir()):
        raise ConfigError(f"{run_dir} already has checkpoints: resume it with --resume {run_dir} "
                          f"or choose another trainer.name")
    if dist.is_main() and not resume:
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
            (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
        except OSError as e:
            raise ConfigError(f"{run_dir}: cannot write the run directory ({e.strerror or e}); "
                              f"set trainer.output_dir") from None
    dist.barrier()
    trainer = Trainer(cfg, run_dir, resume=bool(resume), examples=examples)
    if resume and dist.is_main():  # only once the checkpoint has loaded: a failed resume changes nothing
        record_resume(run_dir, trainer.step, changes)
    summary = trainer.run()
    if dist.is_main():
        (run_dir / "summary.yaml").write_text(yaml.safe_dump(_plain(summary), sort_keys=False))
        print(held_out_report(summary), file=sys.stderr)
        print(f"run directory: {run_dir}", file=sys.stderr)
    return summary


def record_resume(run_dir: Path, step: int, changes: dict) -> None:
    """config.yaml stays the run's original configuration; each resume writes resume_N.yaml with
    the step it resumed at and the keys it changed (old and new values)."""
    n = 1 + sum(1 for _ in run_dir.glob("resume_*.yaml"))
    (run_dir / f"resume_{n}.yaml").write_text(yaml.safe_dump(
        {"resumed_at_step": step, "changed": {k: {"was": a, "now": b} for k, (a, b) in changes.items()}},
        sort_keys=False))


def held_out_report(summary: dict) -> str:
    """The held-out results before -> after, with binomial standard errors, for the console."""
    before, after = summary.get("before") or {}, summary.get("after") or {}
    if not after:
        return "held-out: not evaluated (data.val is empty or the run was interrupted)"
    k = after.get("eval/samples")
    rows = [("accuracy" + (f" (Avg@{k})" if k else " (greedy)"), "eval/accuracy", "eval/accuracy_se", True)]
    if k:
        rows += [("greedy accuracy", "eval/greedy_accuracy", "eval/greedy_accuracy_se", True),
                 (f"pass@{k}", f"eval/pass@{k}", None, True)]
    rows += [("mean reward (greedy)", "eval/reward_mean", None, False),
             ("score B (greedy)", "eval/score_b_mean", None, False)]
    lines = [f"held-out ({int(after['eval/questions'])} questions), before -> after:"]
    for label, key, se_key, percent in rows:
        def show(d):
            if key not in d:
                return "n/a"
            value = f"{100 * d[key]:.1f}%" if percent else f"{d[key]:.4f}"
            return value + (f" ± {100 * d[se_key]:.1f}" if se_key and se_key in d else "")
        lines.append(f"  {label:<22} {show(before):>14} -> {show(after)}")
    return "\n".join(lines)


def _plain(obj):
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


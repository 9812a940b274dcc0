"""The RLPR training loop, readable top to bottom: one method per stage of a step.

    prompts -> rollouts -> probability rewards -> group std filter (+ dynamic sampling)
            -> advantages -> old log-probs (+ OPSD's teacher pass and per-token signal, train/opsd.py)
            -> mini-batch PPO updates -> metrics / eval / checkpoint

The loop is SPMD: under torchrun every rank runs it on its own prompts and owns whole groups;
global counts go through `rlpr.parallel.distributed` (no-ops in a single process).
"""

from __future__ import annotations

import logging
import math
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import torch

from rlpr.algorithms.advantages import NO_MOMENTS, compute_advantages, get_advantage
from rlpr.algorithms.refill import round_prompts
from rlpr.config import Config, validate_world
from rlpr.seeding import SEED_MIX
from rlpr.data.prompts import Prompt, PromptStream
from rlpr.errors import TrainingError
from rlpr.model.card import held_out_until, refresh_card
from rlpr.model.forward import causal_lm
from rlpr.model.memory import cap_kernel_caches, release_memory
from rlpr.model.precision import (autocast_dtype, frozen_linear_weights_in, resolve_mixed_precision,
                                  resolve_rollout_dtype, update_precision)
from rlpr.parallel import distributed as dist
from rlpr.parallel.sharding import make_strategy
from rlpr.parallel.threads import use_threads
from rlpr.reward.label_free import response_keys
from rlpr.reward.lagged import lagged_weights
from rlpr.reward.probability_reward import ProbabilityReward, RewardOutput
from rlpr.reward.score_a import ScoreA, initial_policy
from rlpr.reward.from_cache import uses_cache
from rlpr.rollout.engines import build_engine, keeping_caches
from rlpr.rollout.hf import Rollout
from rlpr.train import held_out, state
from rlpr.train.checkpoint import check_space_before_training, restore_latest, resume_changes
from rlpr.train.finite import stop_on_nonfinite
from rlpr.train.held_out import held_out_report
from rlpr.train.metrics import (CollapseMonitor, Group, LengthMonitor, filter_metrics, flag_collapse, group_std_stats,
                                peak_rss_gb, rollout_metrics, sample_rows)
from rlpr.train.opsd import Distiller
from rlpr.train.progress import StepDisplay
from rlpr.train.run_dir import (default_run_dir, prepare_run_dir, print_location, record_resume, write_run_report,
                                write_summary)
from rlpr.train.signals import end_of_run, finish_step_on_signal
from rlpr.train.setup import (build_optimizer, build_policy, build_scheduler, forward_layout, load_data,
                              reference_copy, scoring_budget, seed_everything, shuffled_targets, std_filter,
                              training_prompts)
from rlpr.train.tracking import NullTracker, Tracker
from rlpr.train.update import (Sample, accumulate_gradients, fill_step_logprobs, shares_prefix, step_or_drop,
                               training_sample, update_metrics)

log = logging.getLogger("rlpr.train")


class Trainer:
    def __init__(self, cfg: Config, run_dir: Path, *, resume: bool = False, examples: dict | None = None):
        self.cfg = cfg
        self._examples = examples or {}  # {"train": [...], "val": [...]} already loaded (train() checks data first)
        self.run_dir = Path(run_dir)
        self.resume = resume
        self.stop_requested = False
        self.display = StepDisplay(0, 0, enabled=False)  # run() sets the live one; phase() is a no-op until then
        self.timings = {"perf/rollout_s": 0.0, "perf/reward_s": 0.0}
        self._setup()

    # -- set-up -----------------------------------------------------------------------------
    def _setup(self) -> None:
        from rlpr.model.loading import load_model, quiet_deepspeed_accelerator

        cfg = self.cfg
        cap_kernel_caches()
        quiet_deepspeed_accelerator()  # a checkpoint's save_pretrained imports DeepSpeed (accelerate's unwrap)
        use_threads(cfg.model.threads, device=cfg.model.device)
        seed_everything(cfg.trainer.seed)  # the same on every rank: identical initial weights
        if dist.is_main():
            log.info("loading model %s", cfg.model.path)
        self.device = dist.resolve_device(cfg.model.device)  # the reference and rollout copies follow it
        self.mixed_precision = resolve_mixed_precision(cfg.trainer.mixed_precision, self.device)
        model, self.tokenizer = load_model(cfg.model.path, device=self.device)
        self.policy = build_policy(cfg, model).to(self.device)
        self.policy.train()
        self.pack = forward_layout(cfg, self.policy, self.device, self.mixed_precision)  # fp32 attention, packing
        self.ref_model = reference_copy(cfg, self.policy)  # with LoRA the reference is the adapter-off base
        self.lagged = lagged_weights(cfg, self.policy)  # reward.scorer=ema: the EMA of the trainable weights

        self.train_prompts, val_prompts, skipped, val_skipped = training_prompts(cfg, self.tokenizer, self._examples)
        self.val_prompts = val_prompts[dist.rank()::dist.world_size()]  # each rank evaluates its share
        self.skipped_prompts = skipped + val_skipped
        self.stream = PromptStream(len(self.train_prompts), cfg.trainer.seed, cfg.data.shuffle)

        max_length = getattr(causal_lm(self.policy).config, "max_position_embeddings", None)
        self.reward = ProbabilityReward(scoring_budget(cfg), self.tokenizer, cfg.rollout.temperature, max_length,
                                        pack=self.pack)  # the scoring forwards' rows as the update's
        self.reward.seed = cfg.trainer.seed  # kind=random's draws
        # reward.shuffle_references (the control): training prompt i is scored against prompt pi(i)'s
        # reference, pi a derangement fixed by the seed (no prompt keeps its own); None: each against its own
        self.scored_against = (shuffled_targets(self.train_prompts, cfg.trainer.seed)
                               if cfg.reward.shuffle_references else None)
        self.score_a: ScoreA = self._bind_score_a(self.reward)
        # reward.kind=opsd*: the teacher (the policy shown the reference) and each token's signal
        self.distiller = Distiller(cfg, self.policy, self.tokenizer, self.reward, self.train_prompts,
                                   self.scored_against or [p.example for p in self.train_prompts], self.ref_model)
        self.eval_reward = self.reward  # what evaluate() scores with (a benchmark may set a common one)
        dtype = resolve_rollout_dtype(cfg.model.rollout_dtype, self.device)
        self.engine = build_engine(self.policy, self.tokenizer, cfg.rollout, dtype)  # rollout.engine: hf | vllm
        # reward.score_b_from_cache: the engine keeps each response's KV cache and score B continues it
        self.keep_caches = uses_cache(cfg.reward.score_b_from_cache, self.reward.kind.needs_score_b, cfg.reward.scorer,
                                      dtype, next(self.policy.parameters()).dtype)
        # fsdp shards the policy in place; deepspeed wraps the optimizer (`attach`)
        self.strategy = make_strategy(cfg.trainer.strategy, self.policy, cfg.trainer.zero_stage, cfg.trainer.cpu_offload)
        self.trainable = [p for p in self.policy.parameters() if p.requires_grad]
        self.filter = std_filter(cfg)
        self.length_monitor = LengthMonitor(cfg.trainer.length_warn_ratio)
        self.collapse_monitor = CollapseMonitor()  # entropy, answers per group, identical responses
        self.optimizer = build_optimizer(cfg, self.trainable)
        self.strategy.attach(self.optimizer, self.trainable, cfg.trainer.grad_clip)
        self.scheduler = build_scheduler(cfg, self.optimizer)
        self.step = self.responses_total = 0  # and the responses generated since step 1 (checkpointed)
        if dist.is_main():
            log.info("%d training prompts, %d held-out; %d steps of %d prompts x %d responses; run dir %s",
                     len(self.train_prompts), len(val_prompts), cfg.trainer.max_steps, cfg.trainer.prompts_per_step,
                     cfg.rollout.responses_per_prompt, self.run_dir)
        if self.resume:
            restore_latest(self.run_dir, self._restore)  # a corrupt newest one: the previous, with a warning
        elif self.score_a.needs_upfront:  # full fine-tuning without a reference copy
            with self.strategy.gathered():
                self.score_a.precompute(self.train_prompts + self.val_prompts)

    def _bind_score_a(self, reward: ProbabilityReward) -> ScoreA:
        """A reward's A (and B) come from this policy as it is, its initial model (the adapter-off base, the
        reference copy, or computed upfront for full fine-tuning without one) or its lagged weights."""
        return reward.score_a.bind(self.policy, lora=self.cfg.model.lora, reference=self.ref_model, lagged=self.lagged)

    @property
    def eval_reward(self) -> ProbabilityReward:
        return self._eval_reward

    @eval_reward.setter
    def eval_reward(self, reward: ProbabilityReward) -> None:
        self._bind_score_a(reward)
        self._eval_reward = reward

    # -- stage 1-2: rollouts and rewards ------------------------------------------------------
    def rollout_groups(self, indices: list[int], seed: int) -> list[Group]:
        """Sample a group per prompt; each prompt's sampling is seeded by (seed, prompt index), so
        the responses do not depend on how prompts are batched or sharded over ranks."""
        cfg = self.cfg
        prompts = [self.train_prompts[i] for i in indices]
        self.display.phase("rollout")
        tick = time.perf_counter()
        with keeping_caches(self.engine, self.keep_caches):
            rollouts = self.engine.generate([p.token_ids for p in prompts], cfg.rollout.responses_per_prompt,
                                            max_new_tokens=cfg.rollout.max_new_tokens,
                                            temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p,
                                            seeds=[seed * SEED_MIX + p.index for p in prompts])
        self.timings["perf/rollout_s"] += time.perf_counter() - tick
        release_memory()
        self.display.phase("reward")
        tick = time.perf_counter()
        rewards = self.score(prompts, rollouts, training=True)
        self.timings["perf/reward_s"] += time.perf_counter() - tick
        release_memory()
        n = cfg.rollout.responses_per_prompt
        return [Group(p, rollouts[k * n:(k + 1) * n], rewards[k * n:(k + 1) * n]) for k, p in enumerate(prompts)]

    def score(self, prompts: list[Prompt], rollouts: list[Rollout],
              reward: ProbabilityReward | None = None, training: bool = False) -> list[RewardOutput]:
        """Rewards of rollouts (with `reward`, default the training reward), graded for accuracy
        against the true references. `training`: prompts of the training set, scored against another
        prompt's reference under reward.shuffle_references. The rollouts' kept KV caches (score B
        continues them) are dropped once the rewards are computed."""
        from rlpr.grading import grade_example

        reward = reward or self.reward
        by_index = [prompts[r.prompt_index] for r in rollouts]
        shuffled = training and self.scored_against is not None
        targets = [self.scored_against[p.index] if shuffled else p.example for p in by_index]
        responses = [p.response_text(r.text) for p, r in zip(by_index, rollouts)]
        correct = [grade_example(p.example, text).correct for p, text in zip(by_index, responses)]
        groups = [r.prompt_index for r in rollouts]
        keys = [(p.index, j) for p, (_, j) in zip(by_index, response_keys(groups))]  # (prompt, response index)
        caches = [r.cache for r in rollouts]
        for r in rollouts:
            r.cache = None  # held by `caches` until the reward returns, then freed
        with self.strategy.gathered():  # every rank calls score(), even with no rollouts
            return reward(self.policy, [p.text for p in by_index], responses, [t.reference for t in targets],
                          precomputed_a=[None if shuffled else t.score_a for t in targets], correct=correct,
                          acceptable=[t.acceptable for t in targets], groups=groups,
                          keys=keys, caches=caches)  # nover, majority: within a group; random: keys

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
            to_roll = round_prompts(cfg.algorithm.refill, want, global_kept, global_generated, tries)
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
        mean_std, nonzero = group_std_stats(generated)
        kept_count = min(global_kept, want)
        if kept_count < want and cfg.algorithm.on_insufficient == "error":
            raise TrainingError(
                f"step {step}: the std filter kept {kept_count} of {want} groups after "
                f"{tries} rollout rounds; raise algorithm.max_sampling_tries, lower algorithm.filter_beta, "
                f"or set algorithm.on_insufficient=train")
        threshold = self.filter.threshold(step)
        self.filter.end_step(step, mean_std)
        stats = filter_metrics(self.filter.ema, threshold, kept_count, global_generated, tries, mean_std, nonzero,
                               len(self.stream.cache), global_kept)
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
        """Per group, its responses as training samples with advantages (every rank calls it: the
        batch estimators, REINFORCE++ and REINFORCE, use the global batch's moments)."""
        name = self.cfg.algorithm.advantage
        estimator = get_advantage(name)
        rewards = torch.tensor([g.scalar_rewards for g in groups], dtype=torch.float32)
        moments = None
        if estimator.batch and dist.world_size() > 1:
            local = estimator.moments(rewards) if groups else NO_MOMENTS
            moments = tuple(dist.sum_values(list(local)))
        if not groups:
            return []
        adv = compute_advantages(rewards, name, moments)
        return [[training_sample(g.prompt, r, out, a, self.cfg, self.reward)
                 for r, out, a in zip(g.rollouts, g.rewards, adv_row.tolist()) if r.token_ids]
                for g, adv_row in zip(groups, adv)]

    def _precision(self):
        """Autocast the update's forwards/backwards to bf16 when asked (master weights stay fp32)."""
        return update_precision(self.policy, self.mixed_precision, self.device, self.strategy.autocast_cache)

    def _frozen_weights(self):
        """The frozen weights in bf16 for the whole update (see rlpr/model/precision.py); not under the
        lock-step strategies (fsdp's parameters are shards it gathers itself; DeepSpeed's engine
        holds its own references to the parameters)."""
        dtype = autocast_dtype(self.mixed_precision)
        if dtype is not None and self.cfg.trainer.bf16_frozen_weights and not self.strategy.lockstep:
            return frozen_linear_weights_in(self.policy, dtype)
        return nullcontext()

    def update(self, groups: list[Group], step: int | None = None) -> dict:
        self.display.phase("update")
        with self._frozen_weights():
            return self._update(groups, self.step + 1 if step is None else step)

    def _update(self, groups: list[Group], step: int) -> dict:
        cfg, t = self.cfg, self.cfg.trainer
        per_group = self.make_samples(groups)
        pad = self.tokenizer.pad_token_id
        temp = cfg.rollout.temperature
        per_rank_mb = max(1, t.mini_batch_prompts // dist.world_size())
        n_updates = int(dist.max_value(math.ceil(len(per_group) / per_rank_mb) if per_group else 0))
        all_samples = [s for g in per_group for s in g]
        timings = {}
        tick = time.perf_counter()
        with self._precision(), self.strategy.gathered():
            kl = initial_policy(self.policy, cfg.model.lora, self.ref_model) if cfg.algorithm.kl_coef else None
            # with one update, old log-probs = detached current ones (unless OPSD reads them before it)
            fill_step_logprobs(self.policy, all_samples, cfg, pad, n_updates * t.epochs_per_step > 1
                               or self.distiller.active, reference=kl, pack=self.pack)
            timings["perf/old_logp_s"] = time.perf_counter() - tick
            timings.update(self.distiller.prepare(all_samples, step))  # the teacher pass, each token's signal
        tick = time.perf_counter()
        totals: dict[str, float] = {"groups": float(sum(1 for g in per_group if g))}  # the groups trained on
        grad_norms, ratios = [], []
        self.policy.train()
        for _ in range(t.epochs_per_step):
            for u in range(n_updates):
                chunk = [s for g in per_group[u * per_rank_mb:(u + 1) * per_rank_mb] for s in g]
                with self._precision(), self.strategy.training():  # every rank calls it, even with no groups
                    stats = accumulate_gradients(self.policy, chunk, cfg.algorithm, t.micro_batch_sequences,
                                                 pad, temp, shares_prefix(cfg), lockstep=self.strategy.lockstep,
                                                 backward=self.strategy.backward, max_tokens=t.micro_batch_tokens,
                                                 pack=self.pack)
                # reduce, clip at grad_clip, AdamW step, unless algorithm.early_stop_ratio drops the mini-batch
                if step_or_drop(self.strategy, stats, cfg.algorithm.early_stop_ratio, totals, grad_norms, ratios):
                    self.lagged.update()  # reward.scorer=ema: fold the new weights into the lagged copy
                    self.distiller.update()  # opsd.teacher=ema: the same for the teacher
        self.scheduler.step()
        timings["perf/update_s"] = time.perf_counter() - tick
        return {**update_metrics(totals, grad_norms, self.scheduler.get_last_lr()[0], cfg.algorithm,
                                 len(ratios) - len(grad_norms), tuple(ratios)), **timings}

    # -- one step -----------------------------------------------------------------------------
    def train_step(self, step: int) -> dict:
        start = time.perf_counter()
        self.timings = {"perf/rollout_s": 0.0, "perf/reward_s": 0.0}
        # the policy's weights (LoRA merged) into the sampling model; under fsdp gathered layer by layer
        self.engine.sync(self.policy, self.strategy.full_weights(self.policy))
        self.timings["perf/sync_s"] = time.perf_counter() - start
        kept, info = self.collect(step)
        self.engine.sleep()  # rollout.vllm_sleep: vLLM's GPU memory goes to the update until the next sync
        generated = info.pop("generated")
        collect_s = time.perf_counter() - start
        metrics = {**info, **rollout_metrics(generated), **self.update(kept, step), **self.timings}
        metrics["rollout/responses_total"] = self.responses_total = self.responses_total + metrics["rollout/responses"]
        metrics["perf/collect_s"] = collect_s
        metrics["perf/step_s"] = time.perf_counter() - start
        metrics["perf/rollout_tok_s"] = metrics.pop("_tokens") / max(metrics["perf/rollout_s"], 1e-9) \
            / dist.world_size()
        metrics["perf/peak_rss_gb"] = peak_rss_gb()
        if self.cfg.trainer.sample_every and step % self.cfg.trainer.sample_every == 0 and dist.is_main():
            self.tracker.write_samples(step, sample_rows(generated))
        self._flag_collapse(step, metrics)
        stop_on_nonfinite(step, metrics, self.run_dir, self.policy, self.optimizer)  # NaN/inf: values or weights
        return metrics

    def _flag_collapse(self, step: int, m: dict) -> None:
        """Warn when the responses are nearly all the same text (`rlpr.train.metrics.flag_collapse`), a
        collapse monitor crosses its threshold (`CollapseMonitor`), or responses have shortened
        (`LengthMonitor`: adds rollout/response_len_ratio)."""
        flag_collapse(step, m, self.cfg.rollout.responses_per_prompt)
        self.collapse_monitor(step, m)
        self.length_monitor(step, m)

    # -- evaluation ---------------------------------------------------------------------------
    def evaluate(self) -> dict:
        """Held-out evaluation (rlpr/train/held_out.py, shown as the "eval" phase); every rank calls it."""
        return held_out.evaluate(self)

    # -- checkpoints (what they hold of the trainer: rlpr/train/state.py) ----------------------
    def trainer_state(self) -> dict:
        return state.trainer_state(self)

    def save(self) -> Path | None:
        return state.save(self)

    def _restore(self, ckpt: Path) -> None:
        state.restore(self, ckpt)

    # -- the loop -----------------------------------------------------------------------------
    def run(self) -> dict:
        t = self.cfg.trainer
        check_space_before_training(self)  # a disk too small for any checkpoint is found before step 1
        if dist.is_main():
            self.tracker = Tracker(self.run_dir, t.tensorboard, resume_step=self.step if self.resume else None,
                                   trackers=t.trackers, config=self.cfg.to_dict())
        else:
            self.tracker = NullTracker()
        summary: dict = {}
        self.display = StepDisplay(t.max_steps, self.step, enabled=t.progress and dist.is_main())
        with self.display:  # the eval before the first step and after the last show on it too
            if not self.resume and t.eval_before:
                before = self.evaluate()  # every rank calls it: it holds collectives
                if before:
                    summary["before"] = before
                    self.tracker.log(0, before)
            elif self.resume:  # the run's own evaluation before training, as logged at step 0
                before = held_out_until(self.run_dir, 0)[0]
                if before:
                    summary["before"] = before
            metrics: dict = {}
            with finish_step_on_signal(self):
                while self.step < t.max_steps and not self.stop_requested:
                    step = self.step + 1
                    metrics = self.train_step(step)
                    self.step = step
                    if t.eval_every and step % t.eval_every == 0 and step < t.max_steps:
                        metrics.update(self.evaluate())
                    self.tracker.log(step, metrics)
                    self.display.update(step, metrics)
                    if t.save_every and step % t.save_every == 0 and step < t.max_steps:
                        self.save()
                self.save()  # before the final evaluation: a signal there loses no step
                summary.update(end_of_run(self))  # the stop message, or the final evaluation (signals.py)
        summary.update(last=metrics, step=self.step, skipped_prompts=self.skipped_prompts,
                       peak_rss_gb=peak_rss_gb())
        self.tracker.close()
        return summary


def train(cfg: Config, resume: str | None = None, accept_base_change: bool = False) -> dict:
    """Run (or resume) a training run; returns a summary (before/after eval, last metrics).
    `accept_base_change`: resume even though the base model's weights changed (with a warning)."""
    dist.init_from_env(dist.resolve_device(cfg.model.device))  # NCCL on GPUs, gloo on CPU
    try:
        summary = _train(cfg, resume, accept_base_change)
    except BaseException:
        dist.shutdown(wait=False)
        raise
    dist.shutdown()  # after rank 0's writes: every rank leaves the group together
    return summary


def _train(cfg: Config, resume: str | None, accept_base_change: bool = False) -> dict:
    validate_world(cfg, dist.world_size())
    # refused before any model work; recorded once the checkpoint loads
    changes = resume_changes(resume, cfg) if resume else {}
    # a data error surfaces before the model loads and before anything is written
    examples = load_data(cfg)  # and prompts_per_step against the rows read
    run_dir = Path(dist.broadcast_object(str(resume) if resume else str(default_run_dir(cfg))))
    # config.yaml, data.yaml, base_model.yaml; a resume: data and base model unchanged
    prepare_run_dir(run_dir, cfg, examples, bool(resume), accept_base_change)
    trainer = Trainer(cfg, run_dir, resume=bool(resume), examples=examples)
    if resume and dist.is_main():  # only once the checkpoint has loaded: a failed resume changes nothing
        record_resume(run_dir, trainer.step, changes)
    summary = trainer.run()
    if dist.is_main():
        write_summary(run_dir, summary)
        print(held_out_report(summary), file=sys.stderr)
        last = print_location(run_dir)  # the run directory and its last checkpoint, shell-quoted to paste
        if last:  # the final checkpoint was saved before the final evaluation: its card gets before -> after
            refresh_card(last)
        if cfg.trainer.report:
            report = write_run_report(run_dir)
            if report:
                print(f"report: {report}", file=sys.stderr)
    return summary

"""TRL's side: GRPOTrainer doing the same work as rlpr's steps (same model, prompts in the same order,
LoRA, sampling and loss settings), with a reward function computing the same probability reward with
rlpr's scorer; steps timed with a TrainerCallback. TRL is imported only here."""

from __future__ import annotations

import time
from pathlib import Path

import torch

from rlpr.train.metrics import mean

from .settings import rlpr_config


def run_trl(args, workdir: Path, prompts: list, baton) -> dict:
    """TRL's timed steps, each a turn of `baton`, whose setup turn the caller began and train()'s
    set-up ends."""
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from rlpr.model.loading import load_model
    from rlpr.reward.probability_reward import ProbabilityReward

    cfg, _ = rlpr_config(args, str(workdir))
    model, tokenizer = load_model(cfg.model.path)
    n = cfg.rollout.responses_per_prompt
    per_step = cfg.trainer.prompts_per_step
    micro = cfg.trainer.micro_batch_sequences
    prefill = cfg.data.prefill
    rows = [{"prompt": p.text + prefill, "chat_text": p.text, "reference": p.example.reference} for p in prompts]
    same_ids = all(tokenizer(r["prompt"])["input_ids"] == p.token_ids for r, p in zip(rows, prompts))

    max_length = getattr(model.config, "max_position_embeddings", None)
    reward = ProbabilityReward(cfg.reward, tokenizer, cfg.rollout.temperature, max_length)
    holder: dict = {}
    seen = {"reward_autocast": set(), "generate_autocast": set()}
    step_stats = {"tokens": 0, "generate_s": 0.0}

    def rlpr_probability_reward(prompts, completions, completion_ids, chat_text, reference, **kwargs):
        policy = holder["trainer"].model
        seen["reward_autocast"].add(torch.is_autocast_enabled("cpu"))
        step_stats["tokens"] += sum(len(c) for c in completion_ids)

        def fill_a(pairs):  # score A with the initial policy: LoRA off, as rlpr does
            with policy.disable_adapter():
                reward.fill_score_a(policy, pairs)

        outs = reward(policy, list(chat_text), [prefill + c for c in completions], list(reference), fill_a=fill_a)
        return [o.reward for o in outs]

    lora = LoraConfig(r=cfg.model.lora_rank, lora_alpha=cfg.model.lora_alpha, lora_dropout=cfg.model.lora_dropout,
                      target_modules=list(cfg.model.lora_target_modules), task_type="CAUSAL_LM")
    t, a = cfg.trainer, cfg.algorithm
    gconf = GRPOConfig(
        output_dir=str(workdir / "trl-run"), use_cpu=True, bf16=args.trl_bf16,
        per_device_train_batch_size=micro, gradient_accumulation_steps=per_step * n // micro,
        num_generations=n, max_completion_length=args.max_new_tokens, temperature=cfg.rollout.temperature,
        top_p=cfg.rollout.top_p, top_k=0, beta=0.0, num_iterations=1, epsilon=a.clip_low, epsilon_high=a.clip_high,
        loss_type="dapo", scale_rewards="group", entropy_coef=a.entropy_coef,
        learning_rate=t.lr, weight_decay=t.weight_decay, adam_beta1=t.adam_beta1, adam_beta2=t.adam_beta2,
        max_grad_norm=t.grad_clip, optim="adamw_torch", lr_scheduler_type="constant", warmup_steps=0,
        max_steps=args.warmup + args.steps, gradient_checkpointing=False, shuffle_dataset=False,
        seed=t.seed, report_to="none", logging_strategy="no", save_strategy="no", eval_strategy="no",
        disable_tqdm=True, log_completions=False, dataloader_num_workers=0, remove_unused_columns=False)

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.steps: list[dict] = []

        def on_train_begin(self, args_, state, control, **kwargs):
            baton.end()  # the setup turn: the model, GRPOTrainer and train()'s optimizer and accelerator

        def on_step_begin(self, args_, state, control, **kwargs):
            reward.seconds = {"score_b": 0.0, "score_a": 0.0}
            step_stats.update(tokens=0, generate_s=0.0)
            baton.begin()
            self.tick = time.perf_counter()

        def on_step_end(self, args_, state, control, **kwargs):
            step_s = time.perf_counter() - self.tick
            baton.end()
            self.steps.append({"step": state.global_step, "warmup": state.global_step <= args.warmup,
                               "step_s": step_s, "generate_s": step_stats["generate_s"],
                               "score_b_s": reward.seconds["score_b"], "score_a_s": reward.seconds["score_a"],
                               "generated_tokens": step_stats["tokens"]})
            r = self.steps[-1]
            r["other_s"] = step_s - r["generate_s"] - r["score_b_s"] - r["score_a_s"]
            print(f"TRL step {r['step']}{' (warm-up)' if r['warmup'] else ''}: {step_s:.1f} s "
                  f"(generate {r['generate_s']:.1f}, B {r['score_b_s']:.1f}, A {r['score_a_s']:.1f})", flush=True)

    timer = StepTimer()
    trainer = GRPOTrainer(model=model, reward_funcs=rlpr_probability_reward, args=gconf,
                          train_dataset=Dataset.from_list(rows), processing_class=tokenizer,
                          peft_config=lora, callbacks=[timer])
    holder["trainer"] = trainer
    generate = trainer._generate_single_turn

    def timed_generate(*a_, **k_):
        tick = time.perf_counter()
        try:
            return generate(*a_, **k_)
        finally:
            step_stats["generate_s"] += time.perf_counter() - tick

    trainer._generate_single_turn = timed_generate
    lm_head = trainer.model.get_output_embeddings()

    def watch(module, inputs):  # is the generation forward autocast to bf16?
        if not torch.is_grad_enabled():
            seen["generate_autocast"].add(torch.is_autocast_enabled("cpu"))

    hook = lm_head.register_forward_pre_hook(watch)
    trainer.train()
    hook.remove()
    timed = [r for r in timer.steps if not r["warmup"]]
    keys = ["step_s", "generate_s", "score_b_s", "score_a_s", "other_s", "generated_tokens"]
    summary = {k: mean(r[k] for r in timed) for k in keys}
    summary["rollout_tok_s"] = summary["generated_tokens"] / summary["generate_s"] if summary["generate_s"] else 0.0
    summary["step_tok_s"] = summary["generated_tokens"] / summary["step_s"]
    settings = {k: getattr(gconf, k) for k in (
        "use_cpu", "bf16", "per_device_train_batch_size", "gradient_accumulation_steps", "generation_batch_size",
        "steps_per_generation", "num_generations", "max_completion_length", "temperature", "top_p", "top_k", "beta",
        "num_iterations", "epsilon", "epsilon_high", "loss_type", "scale_rewards", "entropy_coef", "learning_rate",
        "weight_decay", "max_grad_norm", "optim", "lr_scheduler_type", "gradient_checkpointing", "shuffle_dataset")}
    settings["optim"] = str(settings["optim"])
    settings["lr_scheduler_type"] = str(settings["lr_scheduler_type"])
    settings["lora"] = {"r": lora.r, "lora_alpha": lora.lora_alpha, "target_modules": sorted(lora.target_modules)}
    del trainer, model
    return {"settings": settings, "steps": timer.steps, "mean": summary, "prompt_ids_identical": same_ids,
            "generation_autocast_bf16": sorted(seen["generate_autocast"]),
            "reward_autocast_bf16": sorted(seen["reward_autocast"]),
            "torch_threads": torch.get_num_threads()}  # as rlpr's trainer left them: the same for both

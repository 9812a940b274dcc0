"""Set-up for a training run: the examples, the prompts, the policy to train, its optimizer."""

from __future__ import annotations

import copy
import dataclasses
import logging
import random

import numpy as np
import torch

from rlpr.algorithms.std_filter import EMAStdFilter
from rlpr.config import Config
from rlpr.data.prompts import Prompt, prepare_prompts
from rlpr.errors import ConfigError
from rlpr.model.attention import use_fp32_attention_under_autocast
from rlpr.model.forward import causal_lm
from rlpr.model.packing import resolve_packing
from rlpr.model.precision import autocast_dtype

log = logging.getLogger("rlpr.train")


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def load_examples_for(cfg: Config, split: str):
    """Examples for 'train' or 'val' from the built-in demo tasks or a data source (rlpr.data.sources)."""
    from rlpr.data.loading import ColumnMapping, load_examples

    source = cfg.data.train if split == "train" else cfg.data.val
    if not source:
        return []
    from rlpr.reward.kinds import REWARD_KINDS

    solution = (cfg.opsd.solution_column if split == "train" and cfg.opsd.context == "solution"
                and REWARD_KINDS[cfg.reward.kind].token_signal == "teacher" else "")  # the OPSD teacher's
    if source == "demo":
        from rlpr.data.demo_tasks import demo_examples

        n = cfg.data.demo_train_size if split == "train" else cfg.data.demo_val_size
        examples = demo_examples(split, n=n, seed=cfg.data.demo_seed, template=cfg.data.template,
                                 families=cfg.data.demo_families, val_every=cfg.data.demo_val_every,
                                 solution_key=cfg.opsd.solution_column)
        bare = sorted({e.data_source.split("/")[1] for e in examples if solution and solution not in e.extra_info})
        if bare:
            raise ConfigError(f"opsd.context=solution: the demo famil{'ies' if len(bare) > 1 else 'y'} "
                              f"{', '.join(bare)} {'have' if len(bare) > 1 else 'has'} no worked solutions (the "
                              f"reasoning families have: data.demo_families, docs/learning.md)")
        return examples
    mapping = ColumnMapping(cfg.data.question_column, cfg.data.answer_column, cfg.data.choices_column, solution)
    # a folder with several splits: training falls back to "train"; held-out data must name its split
    return load_examples(source, cfg.data.template, mapping, default_split="train" if split == "train" else None)


def load_data(cfg: Config) -> dict:
    """Both splits ({"train": [...], "val": [...]}), read before the model loads: a data error, or
    more prompts per step than the training data holds, is refused before any model work and
    before the run directory is written."""
    examples = {split: load_examples_for(cfg, split) for split in ("train", "val")}
    n, want = len(examples["train"]), cfg.trainer.prompts_per_step
    if n < want:
        raise ConfigError(f"trainer.prompts_per_step ({want}) exceeds the {n} usable training prompts in "
                          f"data.train ({cfg.data.train}): a step would repeat prompts; lower it or add data")
    return examples


def training_prompts(cfg: Config, tokenizer, examples: dict) -> tuple[list[Prompt], list[Prompt], int, int]:
    """(training prompts, held-out prompts, skipped training, skipped held-out): prompts longer than
    data.max_prompt_tokens are skipped; `examples` may hold the splits already loaded."""
    train_examples = examples.get("train")
    if train_examples is None:
        train_examples = load_examples_for(cfg, "train")
    train, skipped = prepare_prompts(train_examples, tokenizer, cfg.data.max_prompt_tokens, cfg.data.prefill)
    val_examples = examples.get("val")
    if val_examples is None:
        val_examples = load_examples_for(cfg, "val")
    if cfg.data.val_limit:
        val_examples = val_examples[:cfg.data.val_limit]
    val, val_skipped = prepare_prompts(val_examples, tokenizer, cfg.data.max_prompt_tokens, cfg.data.prefill)
    if skipped:
        log.warning("skipped %d training prompts longer than data.max_prompt_tokens=%d",
                    skipped, cfg.data.max_prompt_tokens)
    if not train:
        raise ConfigError(f"data.train: no usable prompts ({skipped} longer than data.max_prompt_tokens)")
    if len(train) < cfg.trainer.prompts_per_step:
        raise ConfigError(f"trainer.prompts_per_step ({cfg.trainer.prompts_per_step}) exceeds the "
                          f"{len(train)} usable training prompts: a step would repeat prompts")
    return train, val, skipped, val_skipped


def shuffled_targets(prompts: list[Prompt], seed: int) -> list:
    """reward.shuffle_references (the control): the example whose reference each training prompt is
    scored against, prompt i against prompt pi(i)'s (`label_free.derangement`). A control in which a
    prompt keeps its own reference text is no control (issue 43): one prompt, or prompts sharing one
    answer on more than half of the data, is refused with one line."""
    from collections import Counter

    from rlpr.reward.label_free import derangement, kept_own_reference

    references = [p.example.reference for p in prompts]
    pi = derangement(references, seed)
    own = kept_own_reference(references, pi)
    if own:
        common, count = Counter(references).most_common(1)[0]
        why = ("there is one training prompt" if len(references) == 1 else
               f"the most common reference, {common!r}, is that of {count} of {len(references)} prompts")
        raise ConfigError(f"reward.shuffle_references: {len(own)} of {len(references)} training prompts would be "
                          f"scored against their own reference text ({why}); a shuffled-reference control needs "
                          f"every reference text on at most half of the prompts: use more varied data")
    return [prompts[j].example for j in pi]


def forward_layout(cfg: Config, policy, device: torch.device, mixed_precision: str) -> bool:
    """How the policy's forwards run: its attention in fp32 inside a CPU bf16-autocast update
    (trainer.fp32_attention), and whether a prompt's responses run packed into rows after it
    (trainer.pack_responses, resolved: the return value)."""
    from rlpr.train.update import shares_prefix

    if autocast_dtype(mixed_precision) is not None and cfg.trainer.fp32_attention and device.type == "cpu":
        use_fp32_attention_under_autocast(causal_lm(policy))
    return resolve_packing(cfg.trainer.pack_responses, policy, device, shares_prefix(cfg))


def build_policy(cfg: Config, model):
    """Wrap the base model for training: a LoRA adapter (peft) or all weights. The adapter's modules
    follow model.lora_target_modules as `rlpr.model.lora.lora_targets` resolves them for this model."""
    if cfg.model.gradient_checkpointing:
        # transformers >= 5.20 renamed it (the old name warns); older 5.x has only the old one
        if hasattr(model, "activation_checkpointing_enable"):
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False
    if not cfg.model.lora:
        model.requires_grad_(True)
        return model
    from peft import LoraConfig, get_peft_model

    from rlpr.model.loading import peft_quiet
    from rlpr.model.lora import lora_targets

    lora = LoraConfig(r=cfg.model.lora_rank, lora_alpha=cfg.model.lora_alpha,
                      lora_dropout=cfg.model.lora_dropout,
                      target_modules=lora_targets(model, cfg.model.lora_target_modules), task_type="CAUSAL_LM")
    if cfg.model.gradient_checkpointing:
        model.enable_input_require_grads()
    with peft_quiet():
        return get_peft_model(model, lora)


def reference_copy(cfg: Config, policy):
    """A frozen copy of the initial policy for the KL term, the initial scorer (reward.scorer=initial) or
    OPSD's initial teacher (opsd.teacher=initial) under full fine-tuning (None otherwise: with LoRA the
    reference is the adapter-off base, and without either none is needed)."""
    from rlpr.reward.kinds import REWARD_KINDS

    teacher = REWARD_KINDS[cfg.reward.kind].token_signal == "teacher" and cfg.opsd.teacher == "initial"
    if (cfg.algorithm.kl_coef or cfg.reward.scorer == "initial" or teacher) and not cfg.model.lora:
        return copy.deepcopy(causal_lm(policy)).eval().requires_grad_(False)
    return None


def scoring_budget(cfg: Config):
    """The reward section with trainer.micro_batch_tokens (when set) bounding the scoring forwards
    too (score B and A): no phase of a step holds more tokens than the update's budget."""
    budget = cfg.trainer.micro_batch_tokens
    if not budget or budget >= cfg.reward.max_batch_tokens:
        return cfg.reward
    return dataclasses.replace(cfg.reward, max_batch_tokens=budget)


def std_filter(cfg: Config) -> EMAStdFilter:
    """The group std filter with its EMA (algorithm.std_filter and algorithm.filter_*); off for a kind
    without a sequence reward (pure OPSD and its no-teacher control: every group's std is 0)."""
    from rlpr.reward.kinds import REWARD_KINDS

    a = cfg.algorithm
    return EMAStdFilter(beta=a.filter_beta, warmup_steps=a.filter_warmup_steps, init_steps=a.filter_init_steps,
                        decay=a.filter_ema_decay, enabled=a.std_filter and REWARD_KINDS[cfg.reward.kind].sequence_reward)


def build_optimizer(cfg: Config, trainable: list) -> torch.optim.Optimizer:
    t = cfg.trainer
    return torch.optim.AdamW(trainable, lr=t.lr, betas=(t.adam_beta1, t.adam_beta2), weight_decay=t.weight_decay)


def build_scheduler(cfg: Config, optimizer) -> torch.optim.lr_scheduler.LambdaLR:
    """A linear warm-up over trainer.warmup_steps, then a constant learning rate."""
    warmup = cfg.trainer.warmup_steps
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda k: min(1.0, (k + 1) / warmup) if warmup else 1.0)

"""A Config's memory `Setup`: the settings of an rlpr configuration that move memory, resolved.

The memory plan's arithmetic takes a `Setup` (rlpr.parallel.memory_types), not a `Config`: what a
run will hold depends on settings as the trainer resolves them for a number of processes and a
device (`auto` precisions, the per-process share of prompts and held-out questions, whether score
B's caches are kept, the effective strategy). This module is that translation, the only part of the
plan that reads a Config and reaches into rlpr.reward (function-local), so that the arithmetic
stays pure and `rlpr plan` (rlpr/cli/plan.py) and the benchmarks resolve a configuration the same
way.
"""

from __future__ import annotations

import math

from rlpr.parallel.memory_types import BF16, FP32, Setup


def keeps_caches(cfg, rollout_bytes: int) -> bool:
    """Whether a run of `cfg` keeps the rollout's caches for score B (reward.score_b_from_cache, as the
    trainer resolves it: rlpr/reward/from_cache.py), with the rollout copy in `rollout_bytes`."""
    from rlpr.reward.from_cache import uses_cache
    from rlpr.reward.kinds import REWARD_KINDS

    r, ro = cfg.reward, cfg.rollout
    kind = REWARD_KINDS.get(r.kind)
    return (ro.engine == "hf" and ro.decode_loop != "generate" and kind is not None
            and uses_cache(r.score_b_from_cache, kind.needs_score_b, r.scorer, rollout_bytes, FP32))


def setup_from_config(cfg, processes: int, device: str, device_bytes: float, fast_bf16: bool = True,
                      runtime_bytes: float | None = None) -> Setup:
    """The Setup of a validated rlpr Config for `processes` processes on `device` ("cuda" or "cpu")
    with `device_bytes` each. `fast_bf16`: whether `auto` precisions pick bf16 there (always on GPUs;
    on CPUs with AVX512-BF16/AMX: rlpr.model.precision.fast_bf16)."""
    m, d, ro, t, r, a = cfg.model, cfg.data, cfg.rollout, cfg.trainer, cfg.reward, cfg.algorithm
    rollout_bytes = {"bfloat16": BF16, "float32": FP32}.get(m.rollout_dtype, BF16 if fast_bf16 else FP32)
    bf16 = t.mixed_precision == "bf16" or (t.mixed_precision == "auto" and fast_bf16)
    strategy = t.strategy if processes > 1 else "ddp"
    n = ro.responses_per_prompt
    per_rank_prompts = max(1, math.ceil(t.prompts_per_step / processes))
    rollout_rows = min(ro.batch_sequences, per_rank_prompts * n)
    eval_rows = eval_questions = 0
    if d.val:
        questions = d.val_limit or (d.demo_val_size if d.val == "demo" else ro.batch_sequences)
        eval_questions = max(1, math.ceil(questions / processes))
        eval_rows = min(ro.batch_sequences, eval_questions * max(1, t.eval_samples))
    mini_rows = max(1, t.mini_batch_prompts // processes) * n
    share = t.share_prompt_prefix and not m.gradient_checkpointing
    return Setup(
        processes=processes, device=device, device_bytes=device_bytes, strategy=strategy, zero_stage=t.zero_stage,
        cpu_offload=t.cpu_offload, lora=m.lora, gradient_checkpointing=m.gradient_checkpointing, bf16=bf16,
        fp32_attention=t.fp32_attention, bf16_frozen_weights=t.bf16_frozen_weights, engine=ro.engine,
        rollout_bytes=rollout_bytes, prompt_tokens=d.max_prompt_tokens, response_tokens=ro.max_new_tokens,
        responses_per_prompt=n, rollout_rows=rollout_rows, round_rows=per_rank_prompts * n, eval_rows=eval_rows,
        eval_questions=eval_questions, eval_samples=t.eval_samples if eval_questions else 0,
        keep_caches=keeps_caches(cfg, rollout_bytes),
        prepacked=ro.engine == "hf" and device == "cpu" and ro.prepacked_weights != "off",
        eval_response_tokens=t.eval_max_new_tokens or ro.max_new_tokens,
        micro_rows=t.micro_batch_sequences, mini_rows=mini_rows, micro_tokens=t.micro_batch_tokens, share_prefix=share,
        scoring_tokens=min(r.max_batch_tokens, t.micro_batch_tokens) if t.micro_batch_tokens else r.max_batch_tokens,
        reference_copy=(a.kl_coef > 0 or r.scorer == "initial") and not m.lora,
        lagged_copy="ema" in (r.scorer, r.score_a), vllm_gpu_fraction=ro.vllm_gpu_memory_utilization,
        vllm_kv_cache_gb=ro.vllm_kv_cache_gb, vllm_sleep=ro.vllm_sleep, runtime_bytes=runtime_bytes)

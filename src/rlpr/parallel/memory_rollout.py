"""The memory terms of the rollout engine: its copy of the policy, KV caches, decoding and the sync.

Sampling responses holds memory the update never sees, and the engine decides it: the hf engine's
own copy of the policy in model.rollout_dtype, its preallocated KV cache, the caches kept for score
B (reward.score_b_from_cache), the decode loop's temporaries, or instead vLLM's share of the device;
and the weight sync that copies the policy (LoRA merged) into the engine. These terms of
rlpr/parallel/memory_plan.py are held in the sync, rollout and scoring phases; each function's
docstring says why its term exists in rlpr's rollout code (rlpr/rollout/) and its formula. Pure
arithmetic; the prefill's working set is a no-grad forward, counted by
rlpr.parallel.memory_activations.
"""

from __future__ import annotations

import math

from rlpr.parallel.memory_activations import _no_grad_bytes
from rlpr.parallel.memory_types import ALL, FP32, GiB, Architecture, Setup, Term, _count


def rollout_copy(arch: Architecture, s: Setup) -> Term | None:
    """The hf engine samples from its own copy of the policy (rlpr/rollout/hf.py), whole on every
    process in model.rollout_dtype, for the whole run: P x dtype bytes (LoRA merged into it). With
    rollout.prepacked_weights on a CPU (rlpr/model/prepacked.py) its Linear weights are held a second
    time, laid out for oneDNN: the decoder layers' and the output layer's (tied or not), about P
    again less the input embedding of an untied model."""
    if s.engine != "hf":
        return None
    params = arch.params
    note = f"{s.rollout_bytes} B x {_count(arch.params)}"
    if s.prepacked:
        linear = arch.layers * arch.layer_params + arch.vocab * arch.hidden
        params += linear
        note += f" + prepacked Linear weights {_count(linear)}"
    return Term("rollout copy (hf engine)", s.rollout_bytes * params, ALL, note)


def rollout_kv_rows(s: Setup) -> list[tuple[int, int]]:
    """(rows, positions per row) of the decode batches: training rollouts and the evaluation's."""
    out = [(s.rollout_rows, s.prompt_tokens + s.response_tokens)]
    if s.eval_rows:
        out.append((s.eval_rows, s.prompt_tokens + s.eval_response_tokens))
    return out


def kv_cache(arch: Architecture, s: Setup) -> Term | None:
    """The hf engine's KV cache, preallocated for a decode batch (rlpr/rollout/decode.py): rows x
    (prompt + response tokens) x 2 x layers x kv_heads x head_dim x dtype bytes, plus the shared
    prefill's cache of the distinct prompts (1 / responses_per_prompt of it) while it is copied to
    their rows. The larger of the training and evaluation batches."""
    if s.engine != "hf":
        return None
    per = arch.kv_bytes_per_token(s.rollout_bytes)
    rows, positions = max(rollout_kv_rows(s), key=lambda rp: rp[0] * rp[1])
    b = rows * positions * per * (1 + 1 / max(s.responses_per_prompt, 1))
    return Term("KV cache (hf rollout)", b, ("rollout",),
                f"{rows} rows x {positions} tok x {per / 1024:.0f} KiB/tok x (1 + 1/{s.responses_per_prompt})")


def kept_caches(arch: Architecture, s: Setup) -> list[Term]:
    """reward.score_b_from_cache: the hf engine copies each finished response's keys and values out of
    the decode batch (rlpr/rollout/kept_cache.py) and keeps them until score B has continued them: the
    sequences of one rollout round (or the evaluation's greedy responses) x (prompt + response
    tokens) x 2 x layers x kv_heads x head_dim x the rollout dtype's bytes, in the rollout and scoring
    phases. Score B pads each batch's pasts into one cache in the scorer's dtype: reward.max_batch_tokens
    x the same in fp32, while it scores. (At run time rows beyond half the memory free when a rollout
    starts keep nothing and are recomputed.)"""
    if not s.keep_caches or s.engine != "hf":
        return []
    per = arch.kv_bytes_per_token(s.rollout_bytes)
    train = s.round_rows * (s.prompt_tokens + s.response_tokens)
    held_out = s.eval_questions * (s.prompt_tokens + s.eval_response_tokens)
    rows, tokens = (s.round_rows, s.prompt_tokens + s.response_tokens) if train >= held_out else \
        (s.eval_questions, s.prompt_tokens + s.eval_response_tokens)
    past = arch.kv_bytes_per_token(FP32)
    return [Term("kept KV caches (score B from the cache)", rows * tokens * per, ("rollout", "scoring"),
                 f"{rows} rows x {tokens} tok x {per / 1024:.0f} KiB/tok"),
            Term("score B's padded past (fp32)", s.scoring_tokens * past, ("scoring",),
                 f"{s.scoring_tokens} tok x {past / 1024:.0f} KiB/tok")]


def prompt_prefills(arch: Architecture, s: Setup) -> Term | None:
    """A held-out evaluation with samples keeps each prompt's prefill from its greedy pass for the
    sampled one (rlpr/rollout/prompt_prefill.py): questions x prompt tokens x 2 x layers x kv_heads x
    head_dim x the rollout dtype's bytes, at most its budget, while the evaluation runs."""
    from rlpr.rollout.prompt_prefill import BUDGET_BYTES

    if s.engine != "hf" or not (s.eval_questions and s.eval_samples):
        return None
    per = arch.kv_bytes_per_token(s.rollout_bytes)
    b = min(BUDGET_BYTES, s.eval_questions * s.prompt_tokens * per)
    return Term("kept prompt prefills (held-out evaluation)", b, ("rollout", "scoring"),
                f"min({s.eval_questions} prompts x {s.prompt_tokens} tok x {per / 1024:.0f} KiB/tok, "
                f"{BUDGET_BYTES / 2**20:.0f} MiB)")


def decode_working_set(arch: Architecture, s: Setup) -> Term | None:
    """Decoding's temporaries: the prefill of the distinct prompts (a no-grad forward, see
    `no_grad_working_set`) or, per new token, its logits and the sampler's fp32 copies (softmax,
    blocked CDF): about 4 x rows x vocab x 4 B. The larger of the two."""
    if s.engine != "hf":
        return None
    rows = max(r for r, _ in rollout_kv_rows(s))
    sampler = 4 * rows * arch.vocab * FP32
    unique = max(1, math.ceil(s.rollout_rows / max(s.responses_per_prompt, 1)))
    prefill = _no_grad_bytes(arch, unique * s.prompt_tokens, s.prompt_tokens, 1, s.rollout_bytes, s.device)
    b = max(sampler, prefill)
    return Term("decode working set", b, ("rollout",),
                f"max(4 x {rows} rows x {arch.vocab} x 4 B, prefill of {unique} x {s.prompt_tokens} tok)")


def vllm_engine(arch: Architecture, s: Setup) -> list[Term]:
    """rollout.engine=vllm, colocated in the process. On a GPU vLLM takes
    rollout.vllm_gpu_memory_utilization x the GPU's memory (its weights, P x dtype bytes, then the KV
    cache in what is left after its own activations); with rollout.vllm_sleep it frees the KV cache
    and moves its weights to CPU memory once the rewards are computed, so the update does not see it.
    On a CPU: its weights plus rollout.vllm_kv_cache_gb (an integer number of GiB, at least 1), held
    throughout (sleep does nothing there)."""
    if s.engine != "vllm":
        return []
    w = s.rollout_bytes * arch.params
    if s.device == "cpu":
        kv = max(1, round(s.vllm_kv_cache_gb)) * GiB
        return [Term("vLLM weights", w, ALL, f"{s.rollout_bytes} B x {_count(arch.params)}"),
                Term("vLLM KV cache", kv, ALL, f"rollout.vllm_kv_cache_gb -> {kv / GiB:.0f} GiB")]
    share = s.vllm_gpu_fraction * s.device_bytes
    awake = ("sync", "rollout", "scoring") if s.vllm_sleep else ALL
    kv = max(0.0, share - w)
    tokens = kv / arch.kv_bytes_per_token(s.rollout_bytes)
    return [Term("vLLM weights", w, awake, f"{s.rollout_bytes} B x {_count(arch.params)}",
                 host=w if s.vllm_sleep else 0),
            Term("vLLM KV cache + activations", kv, awake,
                 f"{s.vllm_gpu_fraction:g} x {s.device_bytes / GiB:.0f} GiB - weights (~{_count(tokens)} tokens)")]


def sync_transient(arch: Architecture, s: Setup) -> Term:
    """The weight sync into the rollout engine (`merged_weights`): with LoRA every adapted weight is
    merged into a new fp32 tensor (4 B x the adapted base weights; under fsdp one decoder layer's at a
    time); fsdp also gathers the root group (embeddings, output layer) and one layer. Each tensor is
    then cast to the engine's dtype (one tensor's worth)."""
    lora = FP32 * arch.lora_base_params if s.lora else 0.0
    if s.strategy == "fsdp" and s.processes > 1:
        gathered = FP32 * (arch.root_params + arch.layer_params)
        merged = lora / arch.layers
        return Term("sync: gathered root + 1 layer" + (", merged LoRA" if s.lora else ""), gathered + merged,
                    ("sync",), f"4 B x ({_count(arch.root_params)} + {_count(arch.layer_params)})")
    return Term("sync: merged LoRA weights" if s.lora else "sync: cast of one tensor",
                lora + s.rollout_bytes * arch.vocab * arch.hidden, ("sync",),
                (f"4 B x {_count(arch.lora_base_params)} adapted" if s.lora
                 else f"{s.rollout_bytes} B x vocab x hidden"))

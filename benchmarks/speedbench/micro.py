"""Part 3, the micro-benchmarks that speed.py runs in a fresh process (`--micro-only`): (a) the
score-B path against one bare forward over the same tokens, (b) rollout throughput at batch 32
against the weight-streaming floor of a decode step. Apart from the trainers' parts because the
child process needs only this."""

from __future__ import annotations

import statistics
import tempfile
import time

import torch

from rlpr.train.metrics import mean

from .settings import rlpr_config


def timed(fn, reps: int) -> list[float]:
    out = []
    for _ in range(reps):
        tick = time.perf_counter()
        fn()
        out.append(time.perf_counter() - tick)
    return out


@torch.no_grad()
def decode_matmul_floor(model, batch: int, reps: int) -> dict:
    """Time of the raw matmuls of one decode step: every nn.Linear of `model` (q/k/v/o, gate/up/down
    of every layer and the lm_head; the tied embedding is counted once, as the head) applied to a
    [batch, 1, in_features] input of the model's dtype, one after the other, each through its own
    forward (prepacked for oneDNN where rollout.prepacked_weights is on, as the decode loop runs it).
    No attention over the KV cache, norms, rotary, softmax/sampling or Python overhead: the
    weight-streaming floor."""
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    dtype = linears[0].weight.dtype
    inputs = [torch.randn(batch, 1, m.in_features, dtype=dtype) for m in linears]

    def one_step():
        for m, x in zip(linears, inputs):
            m(x)

    one_step()
    times = timed(one_step, reps)
    weight_bytes = sum(m.weight.numel() * m.weight.element_size() for m in linears)
    step = statistics.median(times)
    return {"linears": len(linears), "weight_mb": weight_bytes / 1024 ** 2, "step_s": step,
            "step_s_min": min(times), "weight_gb_per_s": weight_bytes / step / 1024 ** 3,
            "ceiling_tok_s": batch / step, "dtype": str(dtype).replace("torch.", "")}


def run_micro(args) -> dict:
    from rlpr.data.prompts import prepare_prompts
    from rlpr.model.forward import causal_lm
    from rlpr.model.loading import load_model
    from rlpr.reward.probability_reward import ProbabilityReward
    from rlpr.reward.scoring import _shared_prefix_groups
    from rlpr.reward.sequence import tokenize_scored
    from rlpr.model.precision import resolve_rollout_dtype
    from rlpr.rollout.hf import HFRollout
    from rlpr.train.setup import build_policy, load_examples_for

    cfg, _ = rlpr_config(args, tempfile.gettempdir())
    model, tokenizer = load_model(cfg.model.path)
    policy = build_policy(cfg, model)  # LoRA as in training (B = 0: the merged weights are the base)
    n, batch = cfg.rollout.responses_per_prompt, 32
    prompts, _ = prepare_prompts(load_examples_for(cfg, "train")[:batch // n], tokenizer,
                                 cfg.data.max_prompt_tokens, cfg.data.prefill)
    # the copy's dtype as the trainer's `auto` picks it (bf16 capped to AVX2 would time the slow kernels)
    dtype = resolve_rollout_dtype(cfg.model.rollout_dtype, torch.device("cpu"))
    engine = HFRollout(policy, tokenizer, dtype, batch_sequences=batch)
    reps, new = args.micro_reps, args.micro_new_tokens

    # (b) rollout throughput vs the decode floor
    def generate(max_new: int):
        return engine.generate([p.token_ids for p in prompts], n, max_new_tokens=max_new,
                               temperature=cfg.rollout.temperature, seeds=[p.index for p in prompts])

    rollouts = generate(new)  # warm-up (and the texts for (a))
    gen_times = timed(lambda: generate(new), reps)
    prefill_times = timed(lambda: generate(1), reps)  # prompt forward + one sampled token
    gen_s, prefill_s = statistics.median(gen_times), statistics.median(prefill_times)
    tokens = sum(len(r.token_ids) for r in rollouts)
    decode_steps = max(len(r.token_ids) for r in rollouts)
    floor = decode_matmul_floor(engine.model, batch, max(5, 4 * reps))
    per_step = (gen_s - prefill_s) / max(decode_steps - 1, 1)
    rollout = {
        "batch": batch, "max_new_tokens": new, "dtype": str(dtype).replace("torch.", ""), "generated_tokens": tokens,
        "decode_steps": decode_steps, "truncated_frac": sum(not r.finished for r in rollouts) / len(rollouts),
        "prompt_tokens_mean": mean(len(p.token_ids) for p in prompts),
        "generate_s": gen_s, "generate_s_all": gen_times, "prefill_plus_one_token_s": prefill_s,
        "generated_tok_s": tokens / gen_s, "row_steps_per_s": batch * decode_steps / gen_s,
        "decode_step_s": per_step, "decode_row_steps_per_s": batch / per_step, "floor": floor,
        "pct_of_ceiling": 100 * (tokens / gen_s) / floor["ceiling_tok_s"],
        "pct_of_ceiling_decode_only": 100 * floor["step_s"] / per_step if per_step > 0 else None,
    }

    # (a) the score-B path vs one bare forward over the same number of tokens
    reward = ProbabilityReward(cfg.reward, tokenizer, cfg.rollout.temperature,
                               getattr(causal_lm(policy).config, "max_position_embeddings", None))
    by_prompt = [prompts[r.prompt_index] for r in rollouts]
    texts = [p.text for p in by_prompt]
    responses = [p.response_text(r.text) for p, r in zip(by_prompt, rollouts)]
    refs = [p.example.reference for p in by_prompt]
    reward(policy, texts, responses, refs)  # warm-up; fills the score-A cache
    items = [it for it in (reward.score_b_text(p, r, y) for p, r, y in zip(texts, responses, refs)) if it]
    enc = tokenize_scored(tokenizer, items)
    total = sum(len(ids) for ids in enc.input_ids)
    groups, rest = _shared_prefix_groups(tokenizer, items, enc, list(range(len(items))))
    run_tokens = sum(len(prefix) + sum(len(enc.input_ids[k]) - len(prefix) for k in ks) for prefix, ks in groups)
    run_tokens += sum(len(enc.input_ids[k]) for k in rest)
    width = -(-total // batch)
    flat = [t for ids in enc.input_ids for t in ids]
    flat = (flat * 2)[:batch * width]  # the same tokens, packed into [32, width] (the tail repeats a few)
    ids = torch.tensor(flat).view(batch, width)
    lm = causal_lm(policy)
    policy.eval()

    @torch.no_grad()
    def bare(keep: int):
        lm(input_ids=ids, use_cache=False, logits_to_keep=keep)

    def score_b() -> float:
        before = reward.seconds["score_b"]
        reward(policy, texts, responses, refs)
        return reward.seconds["score_b"] - before

    bare(1)
    # interleaved, so that a slow spell of this shared machine hits both sides of the ratio
    b_times, bare_times, full_times = [], [], []
    for _ in range(reps):
        b_times.append(score_b())
        bare_times += timed(lambda: bare(1), 1)
        full_times += timed(lambda: bare(0), 1)
    ratios = [b / t for b, t in zip(b_times, bare_times)]
    b_s, bare_s = statistics.median(b_times), statistics.median(bare_times)
    score_b = {
        "texts": len(items), "tokens_in_texts": total, "tokens_run_with_prefix_sharing": run_tokens,
        "bare_batch_shape": [batch, width], "dtype": str(next(lm.parameters()).dtype).replace("torch.", ""),
        "score_b_s": b_s, "score_b_s_all": b_times, "bare_forward_s": bare_s, "bare_forward_s_all": bare_times,
        "bare_forward_full_logits_s": statistics.median(full_times),
        "ratio_score_b_over_bare": statistics.median(ratios), "ratios_per_rep": ratios,
        "ratio_score_b_over_bare_full_logits": statistics.median(b / t for b, t in zip(b_times, full_times)),
    }
    return {"score_b": score_b, "rollout": rollout}

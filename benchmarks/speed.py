"""Speed of an rlpr training step against TRL's GRPOTrainer doing the same work (issue 6).

In one process, on the embedded SmolLM2-135M-Instruct:

1. rlpr: `--warmup` untimed + `--steps` timed `Trainer.train_step` calls at the demo settings
   (LoRA r16/alpha32, 4 prompts x 8 responses x 64 new tokens, the preset's micro-batch, bf16 rollout copy,
   bf16 autocast update, r1_user template + "<think>" pre-filled, reward.invalid_fallback=free),
   with exactly one rollout round per step (std filter off, max_sampling_tries=1). Breakdown per
   step: rollout, score B, score A, old log-probs, update, the rest (weight sync to the rollout
   copy, parsing, advantages).
2. TRL 1.16 `GRPOTrainer` on a fresh copy of the same model, the same prompts in the same order
   (the same chat-templated text with "<think>" pre-filled, given as plain-text prompts), the same
   LoRA, 8 generations x 4 prompts per optimizer step (per-device batch = the micro-batch, accumulated),
   64 new tokens, temperature 1.0, beta 0, clip 0.2/0.27, entropy bonus 1e-3, bf16 autocast on
   CPU, gradient checkpointing off, and a reward function that computes the SAME probability
   reward with rlpr's `ProbabilityReward` on TRL's current model (score A with the adapter off,
   cached per prompt, as rlpr does). Steps are timed with a `TrainerCallback`.
3. Micro-benchmarks in a fresh process (`--micro-only`), on a fresh model: (a) the score-B path on 32 prompt+response+reference texts
   from a rollout vs one bare forward of the model over the same number of tokens; (b) rollout
   throughput of `HFRollout` at batch 32 (bf16) vs the weight-streaming floor of a decode step.

Peak RSS per part comes from a background thread sampling the process RSS every 20 ms (psutil);
`ru_maxrss` (the process's lifetime peak) is recorded too, and is exact only for the first part,
rlpr, which therefore runs first. Between parts the previous objects are freed and `malloc_trim`
returns memory to the OS.

    python benchmarks/speed.py                    # full: about 15-25 minutes on an idle 2-core CPU
    python benchmarks/speed.py --quick            # smoke test (1+1 steps, 16 tokens), a few minutes
    python benchmarks/speed.py --steps 5 --warmup 1 --skip-micro

Writes benchmarks/results/speed.json (all numbers, settings, versions, date, notes) and speed.md
(`--quick` writes to /tmp/rlpr-speed-quick/ unless --output is given). TRL is only needed by this
benchmark; it is not a dependency of rlpr.
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import logging
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

from rlpr.train.metrics import mean, peak_rss_gb

RESULTS = Path(__file__).resolve().parent / "results"
QUICK_OUTPUT = Path(tempfile.gettempdir()) / "rlpr-speed-quick" / "speed"


def demo_micro_batch() -> int:
    from rlpr.config import load_config

    return load_config("demo").trainer.micro_batch_sequences


# -- memory -------------------------------------------------------------------------------------

def rss_gb() -> float:
    try:
        import psutil

        return psutil.Process().memory_info().rss / 1024 ** 3
    except ImportError:  # Linux fallback
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1024 ** 3


def release_memory() -> None:
    """Free the previous part's objects and give the pages back (rlpr's own malloc_trim)."""
    from rlpr.model.memory import release_memory as trim

    gc.collect()
    trim()


class PeakRSS:
    """Max of the process RSS, sampled by a background thread while the block runs."""

    def __init__(self, interval: float = 0.02):
        self.interval = interval
        self.start = self.peak = 0.0
        self._stop = threading.Event()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_gb())
            self._stop.wait(self.interval)

    def __enter__(self):
        self.start = self.peak = rss_gb()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_gb())

    def to_dict(self) -> dict:
        return {"rss_at_start_gb": round(self.start, 3), "peak_rss_gb": round(self.peak, 3),
                "ru_maxrss_after_gb": round(peak_rss_gb(), 3)}


# -- settings -----------------------------------------------------------------------------------

def rlpr_config(args, output_dir: str):
    from rlpr.config import load_config

    overrides = ["algorithm.std_filter=false", "algorithm.max_sampling_tries=1",
                 "trainer.tensorboard=false", "trainer.progress=false", "trainer.sample_every=0",
                 f"trainer.output_dir={output_dir}", f"trainer.max_steps={args.warmup + args.steps}",
                 f"rollout.max_new_tokens={args.max_new_tokens}", f"model.threads={args.threads}"]
    if args.quick:
        overrides.append("data.demo_val_size=8")
    return load_config("demo", overrides), overrides


# -- part 1: rlpr -------------------------------------------------------------------------------

def instrument_rlpr(trainer, counter, unique: list) -> None:
    """Count each phase's tokens (rollout, score A, update; score B's two paths are BothPaths'), and
    append each training scoring's unique tokens (step_tokens.unique_tokens) to `unique`."""
    from step_tokens import reference_tails, unique_tokens

    def in_phase(name, fn):
        def run(*a, **k):
            with counter.phase(name):
                return fn(*a, **k)
        return run

    trainer.raw_generate = trainer.engine.generate  # timed_eval's phases wrap it instead
    trainer.engine.generate = in_phase("rollout", trainer.engine.generate)
    trainer.reward.score_a._compute = in_phase("score_a", trainer.reward.score_a._compute)
    trainer.update = in_phase("update", trainer.update)
    score = trainer.score

    def scored(prompts, rollouts, reward=None, training=False):
        if training:
            by = [prompts[r.prompt_index] for r in rollouts]
            ids, rids = [p.token_ids for p in by], [r.token_ids for r in rollouts]
            tails = reference_tails(trainer.reward, trainer.tokenizer, ids, rids, [p.text for p in by],
                                    [p.response_text(r.text) for p, r in zip(by, rollouts)],
                                    [p.example.reference for p in by])
            unique.append(unique_tokens(ids, [r.prompt_index for r in rollouts], rids, tails))
        return score(prompts, rollouts, reward, training)

    trainer.score = scored


def timed_eval(trainer, counter, both) -> dict:
    """The held-out evaluation as the demo runs it (before and after training), in phases: greedy
    generation, its scoring (score B both ways, the configured one counted), sampled generation. Its
    tokens: eval_greedy, eval_samples, and the scoring's under score_b_* and score_a."""
    seconds = {"greedy_generate_s": 0.0, "samples_generate_s": 0.0, "scoring_s": 0.0}
    generate, score = trainer.engine.generate, trainer.score

    def eval_generate(prompts, n, **kw):
        name = "greedy" if kw.get("temperature") == 0 else "samples"
        tick = time.perf_counter()
        with counter.phase(f"eval_{name}"):
            out = trainer.raw_generate(prompts, n, **kw)
        seconds[f"{name}_generate_s"] += time.perf_counter() - tick
        return out

    def eval_score(*a, **k):
        tick = time.perf_counter()
        with counter.phase("eval_scoring"):
            out = score(*a, **k)
        seconds["scoring_s"] += time.perf_counter() - tick
        return out

    trainer.engine.generate, trainer.score = eval_generate, eval_score
    calls = len(both.calls)
    tick = time.perf_counter()
    metrics = trainer.evaluate()
    total = time.perf_counter() - tick
    trainer.engine.generate, trainer.score = generate, score
    mine = both.calls[calls:]
    extra = both.extra_s(mine)
    seconds["scoring_s"] -= extra
    return {"eval_s": total - extra, **seconds, "score_b_from_cache_s": sum(c["cache_s"] for c in mine),
            "score_b_recomputed_s": sum(c["recomputed_s"] for c in mine), "questions": metrics.get("eval/questions"),
            "samples": metrics.get("eval/samples", 0), "tokens": counter.take()}


def run_rlpr(args, workdir: Path) -> tuple[dict, list]:
    """Timed rlpr steps; also returns the prompts each step used (for TRL, in the same order). Every
    scoring computes score B both ways on the same responses (from the rollout's caches, and
    recomputed); the step trains on the one reward.score_b_from_cache picks, and the other's seconds
    are left out of the step."""
    from score_b_cache import BothPaths
    from step_tokens import TokenCounter

    from rlpr.model.forward import causal_lm
    from rlpr.train.trainer import Trainer

    cfg, overrides = rlpr_config(args, str(workdir))
    tick = time.perf_counter()
    trainer = Trainer(cfg, workdir / "rlpr-run")
    setup_s = time.perf_counter() - tick
    configured = trainer.keep_caches  # reward.score_b_from_cache as resolved for this rollout copy
    trainer.keep_caches = True  # keep them for both paths; BothPaths returns the configured one
    counter, unique = TokenCounter(), []
    counter.watch(causal_lm(trainer.policy).get_decoder())
    counter.watch(trainer.engine.model.get_decoder())
    both = BothPaths(trainer.reward, use_cache=configured, counter=counter)
    instrument_rlpr(trainer, counter, unique)
    stream = copy.deepcopy(trainer.stream)  # the order in which the steps below take prompts
    n_steps = args.warmup + args.steps
    order = [trainer.train_prompts[i] for i in stream.take(cfg.trainer.prompts_per_step * n_steps)]
    steps = []
    for step in range(1, n_steps + 1):
        trainer.reward.seconds = {"score_b": 0.0, "score_a": 0.0}
        calls = len(both.calls)
        m = trainer.train_step(step)
        trainer.step = step
        mine = both.calls[calls:]
        extra = both.extra_s(mine)
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
               "fallback_frac": m["reward/fallback_frac"], "response_len_mean": m["rollout/response_len_mean"],
               "tokens": counter.take(), "unique_tokens": unique[-1] if unique else None}
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
    summary["tokens"] = mean_counts([r["tokens"] for r in timed])
    summary["unique_tokens"] = mean_counts([r["unique_tokens"] for r in timed if r["unique_tokens"]])
    out = {"overrides": overrides, "steps": steps, "mean": summary, "setup_s": setup_s,
           "score_b_from_cache": cfg.reward.score_b_from_cache, "configured_path": "cache" if configured else "recomputed",
           "rollout_dtype": str(trainer.engine.model.dtype).replace("torch.", ""),
           "torch_threads": torch.get_num_threads()}
    if not args.skip_eval:
        print("rlpr held-out evaluation (as the demo runs it before and after training)", flush=True)
        out["eval"] = timed_eval(trainer, counter, both)
    counter.close()
    del trainer
    return out, order


def mean_counts(rows: list[dict]) -> dict:
    """The mean of nested {name: number | {name: number}} dicts over `rows` (missing entries count 0)."""
    if not rows:
        return {}
    keys = {k for r in rows for k in r}
    out = {}
    for k in sorted(keys):
        values = [r.get(k, 0) for r in rows]
        out[k] = mean_counts([v or {} for v in values]) if any(isinstance(v, dict) for v in values) else \
            mean(values)
    return out


# -- part 2: TRL --------------------------------------------------------------------------------

def run_trl(args, workdir: Path, prompts: list) -> dict:
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from step_tokens import TokenCounter, reference_tails, unique_tokens

    from rlpr.model.forward import causal_lm
    from rlpr.model.loading import load_model
    from rlpr.reward.probability_reward import ProbabilityReward

    cfg, _ = rlpr_config(args, str(workdir))
    model, tokenizer = load_model(cfg.model.path)
    if args.trl_model_dtype == "bfloat16":
        model = model.to(torch.bfloat16)
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
    step_stats = {"tokens": 0, "generate_s": 0.0, "unique": []}
    counter = TokenCounter()

    def in_phase(name, fn):
        def run(*a, **k):
            with counter.phase(name):
                return fn(*a, **k)
        return run

    reward.score_b = in_phase("score_b", reward.score_b)
    reward.score_a._compute = in_phase("score_a", reward.score_a._compute)

    def rlpr_probability_reward(prompts, completions, completion_ids, chat_text, reference, **kwargs):
        policy = holder["trainer"].model
        seen["reward_autocast"].add(torch.is_autocast_enabled("cpu"))
        step_stats["tokens"] += sum(len(c) for c in completion_ids)
        ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
        completions_ids = [list(c) for c in completion_ids]
        tails = reference_tails(reward, tokenizer, ids, completions_ids, list(chat_text),
                                [prefill + c for c in completions], list(reference))
        step_stats["unique"].append(unique_tokens(ids, list(prompts), completions_ids, tails))

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

        def on_step_begin(self, args_, state, control, **kwargs):
            reward.seconds = {"score_b": 0.0, "score_a": 0.0}
            step_stats.update(tokens=0, generate_s=0.0, unique=[])
            counter.current = "other"  # the loss forwards; generation and the reward set their own
            self.tick = time.perf_counter()

        def on_step_end(self, args_, state, control, **kwargs):
            step_s = time.perf_counter() - self.tick
            self.steps.append({"step": state.global_step, "warmup": state.global_step <= args.warmup,
                               "step_s": step_s, "generate_s": step_stats["generate_s"],
                               "score_b_s": reward.seconds["score_b"], "score_a_s": reward.seconds["score_a"],
                               "generated_tokens": step_stats["tokens"], "tokens": counter.take(),
                               "unique_tokens": {k: sum(u[k] for u in step_stats["unique"])
                                                 for k in step_stats["unique"][0]} if step_stats["unique"] else None})
            counter.current = None
            r = self.steps[-1]
            r["other_s"] = step_s - r["generate_s"] - r["score_b_s"] - r["score_a_s"]
            print(f"TRL step {r['step']}{' (warm-up)' if r['warmup'] else ''}: {step_s:.1f} s "
                  f"(generate {r['generate_s']:.1f}, B {r['score_b_s']:.1f}, A {r['score_a_s']:.1f})", flush=True)

    timer = StepTimer()
    trainer = GRPOTrainer(model=model, reward_funcs=rlpr_probability_reward, args=gconf,
                          train_dataset=Dataset.from_list(rows), processing_class=tokenizer,
                          peft_config=lora, callbacks=[timer])
    holder["trainer"] = trainer
    counter.watch(causal_lm(trainer.model).get_decoder())
    generate = trainer._generate_single_turn

    def timed_generate(*a_, **k_):
        tick = time.perf_counter()
        try:
            with counter.phase("generate"):
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
    summary["tokens"] = mean_counts([r["tokens"] for r in timed])
    summary["unique_tokens"] = mean_counts([r["unique_tokens"] for r in timed if r["unique_tokens"]])
    counter.close()
    settings = {k: getattr(gconf, k) for k in (
        "use_cpu", "bf16", "per_device_train_batch_size", "gradient_accumulation_steps", "generation_batch_size",
        "steps_per_generation", "num_generations", "max_completion_length", "temperature", "top_p", "top_k", "beta",
        "num_iterations", "epsilon", "epsilon_high", "loss_type", "scale_rewards", "entropy_coef", "learning_rate",
        "weight_decay", "max_grad_norm", "optim", "lr_scheduler_type", "gradient_checkpointing", "shuffle_dataset")}
    settings["optim"] = str(settings["optim"])
    settings["lr_scheduler_type"] = str(settings["lr_scheduler_type"])
    settings["model_dtype"] = args.trl_model_dtype
    settings["lora"] = {"r": lora.r, "lora_alpha": lora.lora_alpha, "target_modules": sorted(lora.target_modules)}
    del trainer, model
    return {"settings": settings, "steps": timer.steps, "mean": summary, "prompt_ids_identical": same_ids,
            "generation_autocast_bf16": sorted(seen["generate_autocast"]),
            "reward_autocast_bf16": sorted(seen["reward_autocast"])}


# -- part 3: micro-benchmarks -------------------------------------------------------------------

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
    [batch, 1, in_features] input of the model's dtype, one after the other. No attention over the
    KV cache, norms, rotary, softmax/sampling or Python overhead: the weight-streaming floor."""
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    dtype = linears[0].weight.dtype
    inputs = [torch.randn(batch, 1, m.in_features, dtype=dtype) for m in linears]

    def one_step():
        for m, x in zip(linears, inputs):
            torch.nn.functional.linear(x, m.weight, m.bias)

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
    from rlpr.rollout.hf import HFRollout
    from rlpr.train.setup import build_policy, load_examples_for

    cfg, _ = rlpr_config(args, tempfile.gettempdir())
    model, tokenizer = load_model(cfg.model.path)
    policy = build_policy(cfg, model)  # LoRA as in training (B = 0: the merged weights are the base)
    n, batch = cfg.rollout.responses_per_prompt, 32
    prompts, _ = prepare_prompts(load_examples_for(cfg, "train")[:batch // n], tokenizer,
                                 cfg.data.max_prompt_tokens, cfg.data.prefill)
    engine = HFRollout(policy, tokenizer, torch.bfloat16, batch_sequences=batch)
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
        "batch": batch, "max_new_tokens": new, "dtype": "bfloat16", "generated_tokens": tokens,
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


# -- report -------------------------------------------------------------------------------------

def versions() -> dict:
    import accelerate
    import peft
    import transformers

    out = {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
           "peft": peft.__version__, "accelerate": accelerate.__version__}
    try:
        import trl

        out["trl"] = trl.__version__
    except ImportError:
        out["trl"] = None
    try:
        import subprocess

        out["rlpr_commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], check=False, capture_output=True,
                                            text=True, cwd=Path(__file__).parent).stdout.strip()
    except OSError:
        pass
    return out


ISA_CAPS = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")


def cpu_name() -> str:
    from score_b_cache import cpu_name as name

    return name()


def pct(value) -> str:
    return "n/a" if value is None else f"{value:.0f}%"


def markdown(res: dict) -> str:
    s = res["settings"]
    lines = [f"# Training-step speed: rlpr vs TRL GRPOTrainer ({res['date']})", "",
             (f"SmolLM2-135M-Instruct + LoRA r16, {s['prompts_per_step']} prompts x {s['responses_per_prompt']} "
             f"responses x {s['max_new_tokens']} new tokens, micro-batch {s['micro_batch_sequences']}; mean of {s['steps']} timed steps after "
             f"{s['warmup']} warm-up; {res['machine'].get('cpu', 'CPU')}, {res['machine']['cpu_count']} cores, "
             f"{res['machine']['torch_threads']} torch thread(s)"
             + (f" (instruction set capped: {', '.join(f'{k}={v}' for k, v in res['machine']['isa_caps'].items())})"
                if res['machine'].get('isa_caps') else "") + f", load average {res['machine'].get('load_before')} "
             f"before / {res['machine'].get('load_after')} after (other jobs on the machine)."), ""]
    r, t = res.get("rlpr"), res.get("trl")
    if r:
        lines += ["| | rlpr | TRL |", "|---|---|---|"]
        rm, tm = r["mean"], (t or {}).get("mean", {})

        def cell(d, k, fmt):
            return fmt.format(d[k]) if k in d else "-"

        lines += [f"| seconds per step | {rm['step_s']:.1f} | {cell(tm, 'step_s', '{:.1f}')} |",
                  f"| rollout (generation) s | {rm['rollout_s']:.1f} | {cell(tm, 'generate_s', '{:.1f}')} |",
                  f"| score B s ({r['configured_path']}) | {rm['score_b_s']:.2f} | {cell(tm, 'score_b_s', '{:.2f}')} |",
                  f"| score B recomputed s (score_b_s before issue 42) | {rm['score_b_recomputed_s']:.2f} | |",
                  f"| score B from the rollout's cache s | {rm['score_b_from_cache_s']:.2f} | |",
                  f"| score A s | {rm['score_a_s']:.2f} | {cell(tm, 'score_a_s', '{:.2f}')} |",
                  f"| generated tokens / step | {rm['generated_tokens']:.0f} | {cell(tm, 'generated_tokens', '{:.0f}')} |",
                  f"| generated tokens/s (rollout) | {rm['rollout_tok_s']:.0f} | {cell(tm, 'rollout_tok_s', '{:.0f}')} |",
                  (f"| peak RSS GB (sampled) | {r['memory']['peak_rss_gb']:.2f} | "
                  f"{cell(t['memory'], 'peak_rss_gb', '{:.2f}') if t else '-'} |"), ""]
        if res.get("ratio_rlpr_over_trl") is not None:
            lines += [f"**rlpr / TRL time per step: {res['ratio_rlpr_over_trl']:.2f}** (target <= 0.30)", ""]
        lines += ["rlpr breakdown (s per step): " + ", ".join(
            f"{k.removesuffix('_s')} {rm[k]:.2f}" for k in ("rollout_s", "score_b_s", "score_a_s", "reward_other_s",
                                                           "old_logp_s", "update_s", "other_s")),
                  "", f"Score B both ways on the same responses (rollout copy {r['rollout_dtype']}, "
                  f"reward.score_b_from_cache={r['score_b_from_cache']}: the step trained on {r['configured_path']}): "
                  f"from the cache {rm['score_b_from_cache_s']:.2f} s vs recomputed {rm['score_b_recomputed_s']:.2f} s "
                  f"per step ({pct(100 * (1 - rm['score_b_from_cache_s'] / rm['score_b_recomputed_s']))} less); "
                  f"max |B difference| {rm['max_abs_diff_b']:.1e}.", ""]
        lines += token_table(rm, tm)
        if "eval" in r:
            e = r["eval"]
            lines += [f"rlpr setup (model load, rollout copy) {r['setup_s']:.1f} s; one held-out evaluation as the demo "
                      f"runs it ({e['questions']:.0f} questions, greedy + {e['samples']} samples): {e['eval_s']:.1f} s = "
                      f"greedy generation {e['greedy_generate_s']:.1f} + its scoring {e['scoring_s']:.1f} (score B from "
                      f"the cache {e['score_b_from_cache_s']:.1f} vs recomputed {e['score_b_recomputed_s']:.1f}) + "
                      f"sampled generation {e['samples_generate_s']:.1f}.", ""]
    m = res.get("micro")
    if m:
        b, g = m["score_b"], m["rollout"]
        lines += ["| micro-benchmark | value | target |", "|---|---|---|",
                  (f"| score B on {b['texts']} texts ({b['tokens_in_texts']} tokens, {b['dtype']}) / bare forward "
                  f"{b['bare_batch_shape']} | {b['ratio_score_b_over_bare']:.2f} ({b['score_b_s']:.2f} s / "
                  f"{b['bare_forward_s']:.2f} s) | <= 1.2 |"),
                  (f"| same, vs bare forward with full-vocabulary logits | {b['ratio_score_b_over_bare_full_logits']:.2f} "
                  "| |"),
                  (f"| rollout batch {g['batch']}, {g['max_new_tokens']} new tokens: generated tok/s vs matmul ceiling "
                  f"| {g['generated_tok_s']:.0f} / {g['floor']['ceiling_tok_s']:.0f} = {g['pct_of_ceiling']:.0f}% "
                  "| >= 80% |"),
                  f"| decode steps only (prefill excluded, all rows) | {pct(g['pct_of_ceiling_decode_only'])} | |", ""]
    if res.get("notes"):
        lines += ["Notes:", ""] + [f"- {n}" for n in res["notes"]]
    return "\n".join(lines) + "\n"


PHASES = [("rollout / generation", "rollout", "generate"), ("score B", None, "score_b"),
          ("score B recomputed", "score_b_recomputed", None), ("score B from the cache", "score_b_cache", None),
          ("score A", "score_a", "score_a"), ("update (forwards; each has one backward)", "update", "other")]


def token_table(rm: dict, tm: dict) -> list[str]:
    """Tokens each phase runs through the model per step (padding included), against the step's unique tokens."""
    ru, tu = rm.get("unique_tokens") or {}, (tm or {}).get("unique_tokens") or {}
    if not ru:
        return []
    rt, tt = rm.get("tokens", {}), (tm or {}).get("tokens", {})

    def cell(counts, key, unique):
        if key is None or key not in counts:
            return "-"
        run = counts[key]["run"]
        return f"{run:.0f} ({run / unique['total']:.2f}x)" if unique else f"{run:.0f}"

    lines = ["| tokens per step (run through the model; x the step's unique tokens) | rlpr | TRL |", "|---|---|---|"]
    for label, rk, tk in PHASES:
        lines.append(f"| {label} | {cell(rt, rk, ru)} | {cell(tt, tk, tu)} |")
    for label, key in (("unique: prompts, once per group", "prompts"), ("unique: responses (fed tokens)", "responses"),
                       ("unique: reference tails (o' after the rollout's tokens)", "reference_tails"),
                       ("unique tokens of the step", "total")):
        lines.append(f"| {label} | {ru.get(key, 0):.0f} | {tu.get(key, 0):.0f} |" if tu else
                     f"| {label} | {ru.get(key, 0):.0f} | - |")
    return lines + [""]


def add_notes(res: dict, args) -> None:
    res["notes"] = notes = []
    notes.append("rlpr runs exactly one rollout round per step (algorithm.std_filter=false, "
                 "algorithm.max_sampling_tries=1), so both trainers sample, score and train on 32 sequences per step.")
    notes.append("With one mini-batch per step neither side computes separate old log-probs (rlpr: n_updates=1; "
                 "TRL: steps_per_generation == gradient_accumulation_steps), so rlpr's old_logp_s is ~0.")
    notes.append("Score B runs in fp32 on both sides (rlpr scores outside autocast; in TRL the reward function "
                 "calls rlpr's ProbabilityReward, which runs the decoder directly, outside accelerate's wrapped "
                 "forward). Score A uses the adapter-off model and is cached per (prompt, reference) on both sides.")
    notes.append("rlpr computes score B both ways at every scoring, on the same responses: recomputed (the whole o' "
                 "by the fp32 policy, each prompt once per group: the path before issue 42) and from the rollout's "
                 "kept KV cache (only o' after its common prefix with prompt + response runs, on the rollout copy's "
                 "keys and values: bf16 where the copy is bf16). The step trains on the one "
                 "reward.score_b_from_cache picks; the other path's seconds are subtracted from step_s and score_b_s.")
    notes.append("Tokens per step: query positions each phase runs through a decoder (forward pre-hooks on the "
                 "policy's and the rollout copy's decoder; padding included, backward passes not counted). The "
                 "step's unique tokens: each group's prompt once, each response's tokens fed back while decoding, "
                 "and each response's reference tail (o' after its longest common prefix with those); "
                 "benchmarks/step_tokens.py.")
    notes.append("rlpr's 'other' = step time not in rollout/reward/update: syncing the merged LoRA weights "
                 "into the bf16 rollout copy, advantages, metrics. reward_other = parsing and building o'.")
    if "trl" in res:
        tr = res["trl"]
        gen_ac = tr["generation_autocast_bf16"]
        notes.append(f"TRL generation autocast to bf16 observed: {gen_ac} (TRL on CPU generates with its training "
                     f"model, {args.trl_model_dtype} weights and the LoRA adapter unmerged; rlpr generates on a merged "
                     "bf16 copy). TRL's loss forward/backward run under accelerate's bf16 autocast "
                     f"(bf16={args.trl_bf16}); rlpr's update under torch.autocast bf16: equivalent.")
        notes.append("TRL's 'other' = everything but generation and the reward forwards: tokenisation, the "
                     "4 micro-batch forward/backward passes, optimizer step. rlpr runs each prompt's 8 responses "
                     "with the prompt once (share_prompt_prefix); TRL runs 8 padded prompt+completion rows.")
        if not tr["prompt_ids_identical"]:
            notes.append("WARNING: TRL tokenised some prompts differently from rlpr.")
        notes.append("Sampling differs in mechanism (rlpr: per-row seeded sampler as a logits processor; TRL: "
                     "HF do_sample with top_k=0, top_p=1), so the responses and their lengths differ; the "
                     "generated-token counts per step are reported for both.")
    if "micro" in res:
        notes.append("Micro (a): bare forward = the same (LoRA-wrapped, fp32) model's forward "
                     "`lm(input_ids, logits_to_keep=1)` over the score-B texts' tokens packed into a [32, width] "
                     "batch (same token count, no padding); 'full logits' is the same with every position "
                     "projected through the 49k-vocabulary head. rlpr's path shares each prompt across its "
                     "group (tokens_run_with_prefix_sharing) and projects only reference positions.")
        notes.append("Micro (b): ceiling = batch 32 / time of one pass of F.linear over all nn.Linear weights of "
                     "the bf16 rollout model (30 x q/k/v/o/gate/up/down + lm_head) on [32, 1, in_features] "
                     "inputs: the weight-streaming floor of a decode step, without attention over the KV cache, "
                     "norms, sampling or Python overhead. pct_of_ceiling uses real generated tokens/s (rows that "
                     "hit EOS early count only their tokens) including the prompt prefill; "
                     "pct_of_ceiling_decode_only = floor step time / measured time per decode step "
                     "((generate(N) - generate(1)) / (steps - 1)), all 32 rows counted; rlpr's decode loop drops finished rows, so later steps run fewer rows and this figure overstates the per-row efficiency.")
    if args.quick:
        notes.append("QUICK run: settings shrunk for validation; the numbers are not measurements.")


def write(res: dict, args, out: Path) -> str:
    add_notes(res, args)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(res, indent=2, default=str))
    text = markdown(res)
    out.with_suffix(".md").write_text(text)
    return text


def run_micro_in_child(args, path: Path) -> dict:
    """The micro-benchmarks in a fresh interpreter: after TRL in the same process they once ran
    3-4x slower (decode floor 149 vs 593 tok/s), so they must not inherit the parent's state."""
    import subprocess

    cmd = [sys.executable, __file__, "--micro-only", str(path), "--micro-new-tokens", str(args.micro_new_tokens),
           "--micro-reps", str(args.micro_reps), "--max-new-tokens", str(args.max_new_tokens),
           "--threads", str(args.threads)]
    subprocess.run(cmd, check=True)
    return json.loads(path.read_text())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3, help="timed steps per trainer")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps before them")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--micro-new-tokens", type=int, default=128, help="new tokens in micro-benchmark (b)")
    parser.add_argument("--micro-reps", type=int, default=5, help="repetitions per micro measurement (median)")
    parser.add_argument("--skip-trl", action="store_true")
    parser.add_argument("--skip-rlpr", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--skip-micro", action="store_true")
    parser.add_argument("--skip-eval", action="store_true", help="leave out the held-out evaluation's timing")
    parser.add_argument("--trl-bf16", action=argparse.BooleanOptionalAction, default=True,
                        help="TRL's bf16 flag (accelerate bf16 autocast on CPU)")
    parser.add_argument("--trl-model-dtype", choices=["float32", "bfloat16"], default="float32",
                        help="dtype of TRL's model copy (default: fp32 master weights, as rlpr)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--quick", action="store_true", help="1 warm-up + 1 timed step, 16 new tokens, 1 rep")
    parser.add_argument("--micro-only", metavar="JSON", help=argparse.SUPPRESS)  # the child of run_micro_in_child
    parser.add_argument("--output", default=None, help="path stem for .json/.md (default benchmarks/results/speed)")
    args = parser.parse_args()
    if args.quick:
        args.steps, args.warmup, args.max_new_tokens, args.micro_new_tokens, args.micro_reps = 1, 1, 16, 16, 1
    out = Path(args.output) if args.output else (QUICK_OUTPUT if args.quick else RESULTS / "speed")
    out = out.with_suffix("") if out.suffix in (".json", ".md") else out
    logging.basicConfig(level=logging.WARNING)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.micro_only:
        with PeakRSS() as mem:
            micro = run_micro(args)
        micro["memory"] = mem.to_dict()
        Path(args.micro_only).write_text(json.dumps(micro, default=str))
        return 0

    res: dict = {"date": time.strftime("%Y-%m-%d %H:%M:%S %z"), "quick": args.quick,
                 "settings": {"steps": args.steps, "warmup": args.warmup, "max_new_tokens": args.max_new_tokens,
                              "prompts_per_step": 4, "responses_per_prompt": 8,
                              "micro_batch_sequences": demo_micro_batch(),
                              "micro_new_tokens": args.micro_new_tokens, "micro_reps": args.micro_reps,
                              "rss_method": "psutil RSS sampled every 20 ms by a background thread (max per part); "
                                            "ru_maxrss = lifetime peak of the process"},
                 "versions": versions(),
                 "machine": {"cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                             "platform": platform.platform(), "cpu": cpu_name(),
                             "load_before": round(os.getloadavg()[0], 1),
                             # an emulated AVX2 machine (benchmarks/demo_time.py's avx2 mode): the caps set
                             "isa_caps": {k: os.environ[k] for k in ISA_CAPS if k in os.environ}}}
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="rlpr-speed-") as tmp:
        work = Path(tmp)
        prompts = None
        if not args.skip_rlpr:
            print("== rlpr", flush=True)
            with PeakRSS() as mem:
                res["rlpr"], prompts = run_rlpr(args, work)
            res["rlpr"]["memory"] = mem.to_dict()
            write(res, args, out)  # keep what is done if a later part fails
            release_memory()
        if not args.skip_trl:
            if prompts is None:  # the prompts rlpr would have used
                from rlpr.data.prompts import PromptStream, prepare_prompts
                from rlpr.model.loading import load_tokenizer
                from rlpr.train.setup import load_examples_for

                cfg, _ = rlpr_config(args, tmp)
                tok = load_tokenizer(cfg.model.path)
                train, _ = prepare_prompts(load_examples_for(cfg, "train"), tok, cfg.data.max_prompt_tokens,
                                           cfg.data.prefill)
                stream = PromptStream(len(train), cfg.trainer.seed, cfg.data.shuffle)
                prompts = [train[i] for i in stream.take(4 * (args.warmup + args.steps))]
            print("== TRL", flush=True)
            with PeakRSS() as mem:
                res["trl"] = run_trl(args, work, prompts)
            res["trl"]["memory"] = mem.to_dict()
            if "rlpr" in res:
                res["ratio_rlpr_over_trl"] = res["rlpr"]["mean"]["step_s"] / res["trl"]["mean"]["step_s"]
            write(res, args, out)
            release_memory()
        if not args.skip_micro:
            print("== micro-benchmarks (in a fresh process)", flush=True)
            res["micro"] = run_micro_in_child(args, work / "micro.json")
    res["wall_s"] = time.time() - started
    res["machine"]["load_after"] = round(os.getloadavg()[0], 1)
    text = write(res, args, out)
    print(text)
    print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.md')} ({res['wall_s']:.0f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

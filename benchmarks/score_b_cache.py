"""Score B from the rollout's kept KV cache against score B recomputed, on real demo rollouts (issue 42).

For each rollout dtype (float32: what model.rollout_dtype=auto picks on CPUs without fast bf16;
bfloat16: what it picks on GPUs and on CPUs with AMX or AVX512-BF16), runs `--steps` training steps
of the demo preset with reward.score_b_from_cache=always and, every time the step's responses are
scored, computes score B both ways on the same responses: continuing the kept caches, and
recomputed by the fp32 policy over the whole o' (the path before issue 42), in alternating order.
The step trains on the cached B. Reports, per dtype, max and mean |B_cache - B_recomputed| over the
responses, the same against the spread that the advantages read (the std of B within a group), and
the seconds of each path.

    python benchmarks/score_b_cache.py                  # 10 steps per dtype: ~15 minutes on 2 busy cores
    python benchmarks/score_b_cache.py --steps 2 --output /tmp/sbc

`--engine vllm` (in vLLM's environment, docs/vllm.md): the rollouts come from vLLM and B "from the
cache" is the engine's prompt log-probs with its prefix cache read (fp32 only here); `--new-tokens N`
makes every response exactly N tokens (rollout.min_new_tokens = max_new_tokens), so that o' spans
several of the engine's blocks (128 tokens on CPU; only whole blocks are cached). The row then
also counts the tokens of o' the engine read from its cache and the o' it declined (recomputed).

Writes benchmarks/results/score_b_cache.json and .md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


class BothPaths:
    """Replaces a ProbabilityReward's `score_b`: each call scores B from the caches and recomputed
    (alternating which runs first), records both, and returns the cached one (`use_cache`, else the
    recomputed one). `counter`: a step_tokens.TokenCounter whose phase each path runs in."""

    def __init__(self, reward, use_cache: bool = True, counter=None, floor: bool = False):
        self.reward, self.score_b, self.use_cache, self.counter = reward, reward.score_b, use_cache, counter
        self.floor = floor  # also recompute with other batch shapes: how far B moves without any cache
        reward.score_b = self
        self.calls: list[dict] = []

    def __call__(self, model, items, groups, too_long=None, caches=None):
        paths = {}
        order = ("recomputed", "cache") if len(self.calls) % 2 == 0 else ("cache", "recomputed")
        for name in order:
            phase = self.counter.phase(f"score_b_{name}") if self.counter is not None else nullcontext()
            tick = time.perf_counter()
            with phase:
                kept = caches if name == "cache" else None
                paths[name] = (self.score_b(model, items, groups, too_long if name == "cache" else [], kept),
                               time.perf_counter() - tick)
        if self.floor:
            from rlpr.reward.scoring import aggregate, reference_logprobs

            r = self.reward
            logps = reference_logprobs(model, r.tokenizer, items, temperature=r.temperature, max_length=r.max_length,
                                       max_batch_tokens=r.cfg.max_batch_tokens, splice=r.cfg.splice,
                                       share_prefix=False)
            rebatched = [0.0 if lp is None else aggregate(lp, r.cfg.aggregation) for lp in logps]
        self.calls.append({"groups": list(groups) if groups is not None else None,
                           "b_rebatched": rebatched if self.floor else None,
                           "scored": [it is not None for it in items],
                           "cached": [c is not None for c in caches] if caches is not None else [False] * len(items),
                           "b_cache": paths["cache"][0], "b_recomputed": paths["recomputed"][0],
                           "cache_s": paths["cache"][1], "recomputed_s": paths["recomputed"][1]})
        return paths["cache" if self.use_cache else "recomputed"][0]

    def extra_s(self, calls: list[dict]) -> float:
        """Seconds of `calls` spent in the path whose result was not returned."""
        return sum(c["recomputed_s" if self.use_cache else "cache_s"] for c in calls)


def group_std(values: list[float], groups: list) -> float:
    """Mean over groups of the population std of `values` within the group."""
    by: dict = {}
    for v, g in zip(values, groups):
        by.setdefault(g, []).append(v)
    stds = [statistics.pstdev(vs) for vs in by.values() if len(vs) > 1]
    return statistics.mean(stds) if stds else 0.0


class EngineReads:
    """Counts, over the score-B requests a vLLM engine serves, the tokens of o' and those it read from
    its prefix cache, and the o' it declined (`VLLMRollout.reference_logprobs` returned None)."""

    def __init__(self, engine):
        self.tokens = self.cached = self.requests = self.declined = 0
        generate, logprobs = engine.llm.generate, engine.reference_logprobs

        def counted_generate(requests, params, **kwargs):
            outputs = generate(requests, params, **kwargs)
            if getattr(params, "prompt_logprobs", None) is not None:
                self.tokens += sum(len(r["prompt_token_ids"]) for r in requests)
                self.cached += sum(o.num_cached_tokens or 0 for o in outputs)
            return outputs

        def counted_logprobs(*args, **kwargs):
            pieces = logprobs(*args, **kwargs)
            self.requests += len(pieces)
            self.declined += sum(p is None for p in pieces)
            return pieces

        engine.llm.generate, engine.reference_logprobs = counted_generate, counted_logprobs


def run(dtype: str, steps: int, workdir: Path, threads: int = 1, engine: str = "hf",
        new_tokens: int | None = None) -> dict:
    from rlpr.config import load_config
    from rlpr.train.trainer import Trainer

    overrides = [f"model.rollout_dtype={dtype}", "reward.score_b_from_cache=always", "trainer.tensorboard=false",
                 "trainer.progress=false", "trainer.sample_every=0", f"trainer.output_dir={workdir}",
                 f"trainer.max_steps={steps}", f"model.threads={threads}", f"rollout.engine={engine}"]
    if new_tokens:
        overrides += [f"rollout.max_new_tokens={new_tokens}", f"rollout.min_new_tokens={new_tokens}"]
    cfg = load_config("demo", overrides)
    trainer = Trainer(cfg, workdir / f"run-{engine}-{dtype}")
    both = BothPaths(trainer.reward, floor=True)
    reads = EngineReads(trainer.engine) if engine == "vllm" else None
    for step in range(1, steps + 1):
        trainer.train_step(step)
        trainer.step = step
        c = both.calls[-1]
        print(f"{dtype} step {step}: cache {c['cache_s']:.2f} s, recomputed {c['recomputed_s']:.2f} s, "
              f"max |dB| {max(abs(a - b) for a, b in zip(c['b_cache'], c['b_recomputed'])):.2e}", flush=True)
    diffs, floor, spreads, responses, cached = [], [], [], 0, 0
    for c in both.calls:
        pairs = [(a, b, f) for a, b, f, s in zip(c["b_cache"], c["b_recomputed"], c["b_rebatched"], c["scored"]) if s]
        diffs += [abs(a - b) for a, b, _ in pairs]
        floor += [abs(f - b) for _, b, f in pairs]
        responses += len(c["b_cache"])
        cached += sum(c["cached"])
        if c["groups"] is not None:
            spreads.append(group_std(c["b_recomputed"], c["groups"]))
    spread = statistics.mean(spreads) if spreads else 0.0
    del trainer
    engine_reads = {} if reads is None else {"engine_tokens": reads.tokens, "engine_cached_tokens": reads.cached,
                                             "engine_requests": reads.requests, "engine_declined": reads.declined}
    return {"engine": engine, "new_tokens": cfg.rollout.max_new_tokens, **engine_reads,
            "dtype": dtype, "steps": steps, "score_b_on_copy": cfg.reward.score_b_on_copy, "responses": responses, "scored": len(diffs), "from_cache": cached,
            "max_abs_diff_b": max(diffs), "mean_abs_diff_b": statistics.mean(diffs),
            "max_abs_diff_b_rebatched": max(floor), "mean_abs_diff_b_rebatched": statistics.mean(floor),
            "mean_b": statistics.mean(b for c in both.calls for b in c["b_recomputed"]),
            "mean_within_group_std_b": spread,
            "mean_abs_diff_over_group_std": statistics.mean(diffs) / spread if spread else None,
            "cache_s_per_step": statistics.mean(c["cache_s"] for c in both.calls),
            "recomputed_s_per_step": statistics.mean(c["recomputed_s"] for c in both.calls),
            "calls": [{k: v for k, v in c.items()} for c in both.calls]}


def markdown(res: dict) -> str:
    lines = [f"# Score B from the rollout's cache vs recomputed ({res['date']})", "",
             f"Demo preset (embedded SmolLM2-135M-Instruct + LoRA, 4 prompts x 8 responses, fallback cue path), {res['rows'][0]['steps']} training steps per rollout dtype, training on the "
             f"cached B; {res['machine']['cpu']}, {res['machine']['cpu_count']} cores, "
             f"{res['machine']['torch_threads']} torch thread(s), load average "
             f"{res['machine']['load_before']} before / {res['machine']['load_after']} after.", "",
             "| engine, new tokens | rollout copy | responses scored | from cache | max abs dB | mean abs dB | "
             "max / mean abs dB, recomputed rebatched | mean B | mean within-group std of B | mean abs dB / that std | "
             "B from cache s/step | B recomputed s/step |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    def sci(r: dict, key: str) -> str:  # results written before a column existed leave it out
        return f"{r[key]:.2e}" if r.get(key) is not None else "-"

    for r in res["rows"]:
        ratio = r["mean_abs_diff_over_group_std"]
        lines.append(f"| {r.get('engine', 'hf')}, {r.get('new_tokens', 32)} | {r['dtype']} | {r['scored']} | "
                     f"{r['from_cache']} | {r['max_abs_diff_b']:.2e} | "
                     f"{r['mean_abs_diff_b']:.2e} | {sci(r, 'max_abs_diff_b_rebatched')} / "
                     f"{sci(r, 'mean_abs_diff_b_rebatched')} | {r['mean_b']:.4f} | {r['mean_within_group_std_b']:.4f} | "
                     f"{'n/a' if ratio is None else f'{ratio:.3f}'} | {r['cache_s_per_step']:.2f} | "
                     f"{r['recomputed_s_per_step']:.2f} |")
    lines += ["", "B is the mean probability of the reference tokens (reward.aggregation=mean_prob); "
              "'recomputed' is the fp32 policy over the whole o' (the path before issue 42); "
              "'from cache' continues the rollout copy's keys and values (bf16 or fp32 as the copy), run "
              f"by the model reward.score_b_on_copy={res['rows'][0].get('score_b_on_copy', 'never')} picks (always: the "
              "copy itself; auto: the copy where fp32, else the fp32 policy; never: the policy); "
              "'recomputed rebatched' is the recomputed path again with every text in padded batches "
              "(no prompt shared), against the recomputed B: how far float rounding alone moves B. "
              "Each step's two paths ran on the same responses, in alternating order."]
    for r in res["rows"]:
        if r.get("engine") == "vllm":
            lines += ["", f"vllm, {r['new_tokens']} new tokens: the engine was asked for {r['engine_requests']} o' "
                      f"({r['engine_tokens']} tokens) and read {r['engine_cached_tokens']} of those tokens "
                      f"({100 * r['engine_cached_tokens'] / max(r['engine_tokens'], 1):.0f}%) from its prefix cache; "
                      f"it declined {r['engine_declined']} (a cached block held reference tokens), which the "
                      f"policy recomputed."]
    return "\n".join(lines) + "\n"


def cpu_name() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (1: steady on a machine shared with other jobs)")
    parser.add_argument("--engine", choices=["hf", "vllm"], default="hf", help="the rollout engine (vllm: its own "
                        "environment, docs/vllm.md)")
    parser.add_argument("--new-tokens", type=int, default=None,
                        help="every response exactly this many tokens (default: the demo's up to 32)")
    parser.add_argument("--output", default=None, help="path stem (default benchmarks/results/score_b_cache, "
                        "score_b_cache_vllm with --engine vllm)")
    args = parser.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    out = Path(args.output) if args.output else RESULTS / ("score_b_cache" + ("_vllm" if args.engine == "vllm" else ""))
    res = {"date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
           "machine": {"cpu": cpu_name(), "cpu_count": os.cpu_count(), "torch_threads": args.threads,
                       "load_before": round(os.getloadavg()[0], 1)}, "rows": []}
    with tempfile.TemporaryDirectory(prefix="rlpr-sbc-") as tmp:
        for dtype in args.dtypes:
            res["rows"].append(run(dtype, args.steps, Path(tmp), args.threads, args.engine, args.new_tokens))
    res["machine"]["load_after"] = round(os.getloadavg()[0], 1)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(res, indent=1))
    text = markdown(res)
    out.with_suffix(".md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

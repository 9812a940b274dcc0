"""gpu_check's `decode` part (issue 40): rollout tokens/s of the CUDA-graph decode loop against rlpr's
eager loop, in the same run, on the Qwen2.5-0.5B shape (random weights, bf16 rollout copy), 32, 128
and 256 rows of 1024 new tokens (responses forced to full length), and each figure as a fraction of
the HBM floor of a decode step: the rollout copy's weight bytes over the device's measured copy
bandwidth (bytes read + written per second by a device-to-device copy), the time one step needs
just to read every weight once. Also: what capturing the graphs cost, and whether the two loops draw
the same tokens on this GPU in fp32.

    python benchmarks/gpu_check.py --parts decode --out DIR          # on a GPU
    python benchmarks/gpu_check.py --device cpu --parts decode ...   # the CPU dry run (a tiny shape, no graphs)
"""

from __future__ import annotations

import time

ROWS = (32, 128, 256)
PROMPT_TOKENS = 128
GROUP = 8  # responses per prompt (the shared prefill repeats a prompt's cache for its rows)


def copy_bandwidth(device, nbytes: int = 2 << 30, repeats: int = 10) -> float:
    """Bytes read + written per second by a device-to-device copy of `nbytes` (the best of `repeats`)."""
    import torch

    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    best = float("inf")
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            dst.copy_(src)
            end.record()
            end.synchronize()
            best = min(best, start.elapsed_time(end) / 1e3)
        else:
            tick = time.perf_counter()
            dst.copy_(src)
            best = min(best, time.perf_counter() - tick)
    del src, dst
    return 2 * nbytes / best


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()


def _prompts(rows: int, vocab: int, seed: int) -> list[list[int]]:
    import torch

    g = torch.Generator().manual_seed(seed)
    return [torch.randint(100, vocab, (PROMPT_TOKENS,), generator=g).tolist() for _ in range(max(1, rows // GROUP))]


def timed_generate(engine, prompts, tokens: int, device) -> tuple[float, int]:
    """Seconds of one `generate` of len(prompts) x GROUP rows forced to `tokens` new tokens, and the tokens made."""
    _sync(device)
    tick = time.perf_counter()
    out = engine.generate(prompts, GROUP, max_new_tokens=tokens, min_new_tokens=tokens, temperature=1.0,
                          seeds=list(range(len(prompts))))
    _sync(device)
    return time.perf_counter() - tick, sum(len(r.token_ids) for r in out)


def agreement(policy, tokenizer, device, rows: int = 16, tokens: int = 128) -> dict:
    """fp32 rollout copies: the share of rows whose tokens are identical between the two loops, greedy
    and seeded (kernels differ: eager attention is SDPA's, the graph loop's is grouped matmuls)."""
    import torch

    from rlpr.rollout.hf import HFRollout

    prompts = _prompts(rows, len(tokenizer), seed=1)
    out = {}
    for name, temperature in (("greedy", 0.0), ("seeded", 1.0)):
        runs = [[r.token_ids for r in HFRollout(policy, tokenizer, torch.float32, batch_sequences=rows, loop=loop)
                 .generate(prompts, GROUP, max_new_tokens=tokens, temperature=temperature, seeds=[5] * len(prompts))]
                for loop in ("graph", "rlpr")]
        same = sum(a == b for a, b in zip(*runs))
        first = [next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None) for a, b in zip(*runs)]
        out[name] = {"rows": len(runs[0]), "identical_rows": same,
                     "first_difference": [f for f in first if f is not None]}
    return out


def decode_part(device_name: str, shape: str | None = None, rows=ROWS, tokens: int | None = None,
                eager_tokens: dict | None = None) -> dict:
    """The `decode` section of gpu_check.json."""
    import gc

    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from gpu_models import SHAPES, synthetic_tokenizer
    from gpu_train import GiB
    from rlpr.rollout import graph_decode
    from rlpr.rollout.hf import HFRollout

    device = torch.device(device_name)
    cuda = device.type == "cuda"
    shape = shape or ("qwen2.5-0.5b" if cuda else "tiny")
    tokens = tokens or (1024 if cuda else 24)
    # the eager loop is Python-bound (~27 ms a step whatever the rows): 1024 tokens at 32 rows, fewer at
    # more rows (its tokens/s at a shorter length is, if anything, flattered: less attention per step)
    eager_tokens = eager_tokens or ({32: 1024, 128: 256, 256: 256} if cuda else {})
    tokenizer = synthetic_tokenizer(SHAPES[shape]["vocab_size"])
    config = Qwen2Config(**SHAPES[shape], eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, bos_token_id=None)
    torch.manual_seed(0)
    with torch.device(device):
        policy = Qwen2ForCausalLM(config).eval()
    result = {"shape": shape, "prompt_tokens": PROMPT_TOKENS, "new_tokens": tokens, "group": GROUP,
              "rollout_dtype": "bfloat16", "copy_bandwidth_gbs": copy_bandwidth(device) / 1e9}
    result["agreement_fp32"] = agreement(policy, tokenizer, device, tokens=min(tokens, 128))
    runs = []
    for n in rows:
        row = {"rows": n}
        prompts = _prompts(n, len(tokenizer), seed=n)
        graph = HFRollout(policy, tokenizer, torch.bfloat16, batch_sequences=n, loop="graph")
        weights = sum(p.numel() * p.element_size() for p in graph.model.parameters())  # tied: counted once
        row["weight_bytes"] = weights
        step_floor = weights / (result["copy_bandwidth_gbs"] * 1e9)
        first_s, _ = timed_generate(graph, prompts, tokens, device)
        dec = graph_decode.decoder_for(graph.model)
        row.update(graph_first_call_s=first_s, capture_s=dec.capture_s, graphs=len(dec.graphs),
                   graph_failed=dec.failed)
        seconds, made = timed_generate(graph, prompts, tokens, device)
        row.update(graph_s=seconds, graph_tokens=made, graph_tok_s=made / seconds,
                   graph_step_ms=1e3 * seconds / tokens, step_floor_ms=1e3 * step_floor,
                   graph_floor_fraction=step_floor / (seconds / tokens))
        del graph
        gc.collect()
        e_tokens = eager_tokens.get(n, tokens)
        eager = HFRollout(policy, tokenizer, torch.bfloat16, batch_sequences=n, loop="rlpr")
        timed_generate(eager, prompts[:1], 8, device)  # warm-up: kernels, allocator
        seconds, made = timed_generate(eager, prompts, e_tokens, device)
        row.update(eager_tokens=e_tokens, eager_s=seconds, eager_tok_s=made / seconds,
                   eager_step_ms=1e3 * seconds / e_tokens, eager_floor_fraction=step_floor / (seconds / e_tokens))
        row["speedup"] = row["graph_tok_s"] / row["eager_tok_s"]
        del eager
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
            row["max_memory_allocated_gib"] = torch.cuda.max_memory_allocated() / GiB
        runs.append(row)
        print(f"decode: {n} rows: graph {row['graph_tok_s']:.0f} tok/s ({row['graph_step_ms']:.2f} ms/step, "
              f"{row['graph_floor_fraction']:.0%} of the floor), eager {row['eager_tok_s']:.0f} tok/s: "
              f"{row['speedup']:.1f}x; capture {row['capture_s']:.1f} s for {row['graphs']} graphs", flush=True)
    result["runs"] = runs
    return result


def report_lines(d: dict) -> list[str]:
    """gpu_check.md's `decode` section."""
    lines = ["## Decode: the CUDA-graph loop against the eager loop", ""]
    from gpu_report import unfinished  # gpu_report.write_report calls this: it is loaded

    if note := unfinished(d):
        return lines + note
    lines += [f"{d['shape']} shape, random weights, {d['rollout_dtype']} rollout copy, {d['prompt_tokens']}-token "
              f"prompts ({d['group']} rows share each), responses forced to {d['new_tokens']} new tokens; "
              f"device copy bandwidth {d['copy_bandwidth_gbs']:.0f} GB/s (read + written).", "",
              "| rows | graph tok/s | ms/step | floor ms/step | of floor | eager tok/s (tokens) | eager ms/step | speedup | capture s (graphs) |",
              "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in d["runs"]:
        lines.append(f"| {r['rows']} | {r['graph_tok_s']:.0f} | {r['graph_step_ms']:.2f} | {r['step_floor_ms']:.3f} | "
                     f"{r['graph_floor_fraction']:.1%} | {r['eager_tok_s']:.0f} ({r['eager_tokens']}) | "
                     f"{r['eager_step_ms']:.1f} | **{r['speedup']:.1f}x** | {r['capture_s']:.2f} ({r['graphs']}) |")
    lines.append("")
    for name, a in d.get("agreement_fp32", {}).items():
        lines.append(f"- fp32 copies, {name}: {a['identical_rows']} of {a['rows']} rows identical between the loops"
                     + (f" (first differences at tokens {sorted(a['first_difference'])[:8]})" if a["first_difference"] else ""))
    failed = {r["graph_failed"] for r in d["runs"] if r.get("graph_failed")}
    if failed:
        lines.append(f"- **graph capture failed** (the loop ran eagerly): {'; '.join(failed)}")
    return lines + [""]

"""gpu_check's `decode` part (issues 40, 63): rollout tokens/s of the CUDA-graph decode loop against the
eager loop on the Qwen2.5-0.5B shape (random weights, bf16 copy), as a fraction of the HBM floor (the
copy's weight bytes over the measured copy bandwidth), the capture's cost, the fp32 tokens of both loops,
and the arms each skipped with its reason when the budget would not hold it: vLLM's published step, a
step profile, Gemma 3's shape, the attention kernel, torch.compile (docs/distributed.md)."""

from __future__ import annotations

import time
from unittest import mock

ROWS = (32, 128, 256)
PROMPT_TOKENS = 128
GROUP = 8  # responses per prompt (the shared prefill repeats a prompt's cache for its rows)
# vLLM's own measurement (PR 53060, its benchmark of Qwen2.5-0.5B-Instruct decode, one H100 PCIe): ms per
# decode step (one token for every row) at batch 32, by context length
VLLM_PUBLISHED = {"model": "Qwen2.5-0.5B-Instruct", "card": "H100 PCIe", "rows": 32, "source": "vLLM PR 53060",
                  "ms_per_step": {"128": 2.148, "4096": 2.885}}
# Gemma 3 270M's published config.json numbers (google/gemma-3-270m); the rest are Gemma3TextConfig's
# defaults, as its own: 5 of 6 layers slide (local RoPE 10k, global 1M), tied embeddings, GELU-tanh
GEMMA_SHAPES = {
    "gemma-3-270m": dict(vocab_size=262144, hidden_size=640, intermediate_size=2048, num_hidden_layers=18,
                         num_attention_heads=4, num_key_value_heads=1, head_dim=256, sliding_window=512,
                         max_position_embeddings=32768, query_pre_attn_scalar=256, rms_norm_eps=1e-6),
    # the CPU dry run: a window of 16 under 128-token prompts
    "tiny-gemma": dict(vocab_size=4096, hidden_size=64, intermediate_size=128, num_hidden_layers=6,
                       num_attention_heads=4, num_key_value_heads=1, head_dim=16, sliding_window=16,
                       max_position_embeddings=2048, query_pre_attn_scalar=16, rms_norm_eps=1e-6),
}


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


def loop_row(policy, tokenizer, device, n: int, tokens: int, eager_tokens: int, bandwidth: float) -> dict:
    """One row count: the graph loop's tokens/s (a first call that captures, then a timed one) against the
    eager loop's, each as a fraction of the step's HBM floor (`bandwidth`: bytes read + written per s)."""
    import gc

    import torch

    from rlpr.rollout import graph_decode
    from rlpr.rollout.hf import HFRollout

    row = {"rows": n}
    prompts = _prompts(n, len(tokenizer), seed=n)
    graph = HFRollout(policy, tokenizer, torch.bfloat16, batch_sequences=n, loop="graph")
    weights = sum(p.numel() * p.element_size() for p in graph.model.parameters())  # tied: counted once
    row["weight_bytes"] = weights
    step_floor = weights / bandwidth
    first_s, _ = timed_generate(graph, prompts, tokens, device)
    dec = graph_decode.decoder_for(graph.model)
    row.update(graph_first_call_s=first_s, capture_s=dec.capture_s, graphs=len(dec.graphs), graph_failed=dec.failed)
    seconds, made = timed_generate(graph, prompts, tokens, device)
    row.update(graph_s=seconds, graph_tokens=made, graph_tok_s=made / seconds, graph_step_ms=1e3 * seconds / tokens,
               step_floor_ms=1e3 * step_floor, graph_floor_fraction=step_floor / (seconds / tokens))
    del graph
    gc.collect()
    eager = HFRollout(policy, tokenizer, torch.bfloat16, batch_sequences=n, loop="rlpr")
    timed_generate(eager, prompts[:1], 8, device)  # warm-up: kernels, allocator
    seconds, made = timed_generate(eager, prompts, eager_tokens, device)
    row.update(eager_tokens=eager_tokens, eager_s=seconds, eager_tok_s=made / seconds,
               eager_step_ms=1e3 * seconds / eager_tokens, eager_floor_fraction=step_floor / (seconds / eager_tokens))
    row["speedup"] = row["graph_tok_s"] / row["eager_tok_s"]
    del eager
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        from gpubench.train import GiB

        row["max_memory_allocated_gib"] = torch.cuda.max_memory_allocated() / GiB
    return row


def decode_part(device_name: str, rows=ROWS, tokens: int | None = None, budget_s: float | None = None) -> dict:
    """The `decode` section of gpu_check.json; `budget_s`: the seconds it may take (the arms after the
    row counts are skipped, with the reason, when what is left would not hold them)."""
    import torch

    from gpubench.models import SHAPES, random_model

    start = time.perf_counter()
    device = torch.device(device_name)
    cuda = device.type == "cuda"

    def fits(need_s: float) -> str | None:
        """None when `need_s` seconds are left of the budget, else why the arm is skipped."""
        left = float("inf") if budget_s is None else budget_s - (time.perf_counter() - start)
        return None if left >= need_s else f"not started: {left:.0f} s of the part's budget left, {need_s:.0f} s needed"

    shape = "qwen2.5-0.5b" if cuda else "tiny"
    tokens = tokens or (1024 if cuda else 24)
    # the eager loop is Python-bound (~27 ms a step whatever the rows): 1024 tokens at 32 rows, fewer at
    # more rows (its tokens/s at a shorter length is, if anything, flattered: less attention per step)
    eager_tokens = {32: 1024, 128: 256, 256: 256} if cuda else {}
    policy, tokenizer = random_model(SHAPES[shape], device)
    policy.eval()
    result = {"shape": shape, "prompt_tokens": PROMPT_TOKENS, "new_tokens": tokens, "group": GROUP,
              "rollout_dtype": "bfloat16", "copy_bandwidth_gbs": copy_bandwidth(device) / 1e9}
    result["agreement_fp32"] = agreement(policy, tokenizer, device, tokens=min(tokens, 128))
    runs = []
    for n in rows:
        row = loop_row(policy, tokenizer, device, n, tokens, eager_tokens.get(n, tokens),
                       result["copy_bandwidth_gbs"] * 1e9)
        runs.append(row)
        print(f"decode: {n} rows: graph {row['graph_tok_s']:.0f} tok/s ({row['graph_step_ms']:.2f} ms/step, "
              f"{row['graph_floor_fraction']:.0%} of the floor), eager {row['eager_tok_s']:.0f} tok/s: "
              f"{row['speedup']:.1f}x; capture {row['capture_s']:.1f} s for {row['graphs']} graphs", flush=True)
    result["runs"] = runs
    result["vllm"] = vllm_comparison(shape, runs, device, lambda: short_steps(policy, tokenizer, device))
    arms = (("profile", 45, lambda: profile_arm(policy, tokenizer, device, rows[0], 32 if cuda else 4)),
            ("gemma", 60, lambda: gemma_arm(device, tokens if cuda else 12, rows[0],
                                            eager_tokens.get(rows[0], tokens) if cuda else 12)),
            ("attention_kernel", 20, lambda: kernel_arm(policy, tokenizer, device, rows[0], 256 if cuda else 12)),
            ("compile", 200, lambda: compile_arm(policy, tokenizer, device, rows[0])))
    for name, need, arm in arms:
        tick = time.perf_counter()
        try:
            result[name] = {"skipped": why} if (why := fits(need if cuda else 1)) else arm()
        except Exception as e:  # noqa: BLE001 - an arm's failure is its finding; the rows above are kept
            import traceback

            result[name] = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-3000:]}
        result[name]["arm_s"] = time.perf_counter() - tick
        print(f"decode: {name}: {result[name].get('skipped') or result[name].get('error') or 'done'} "
              f"({result[name]['arm_s']:.0f} s)", flush=True)
    return result


def short_steps(policy, tokenizer, device, rows: int = 32, tokens: int = 128) -> float:
    """ms per step of the graph loop at `rows` rows of 128-token prompts and `tokens` new tokens (the
    context vLLM's figure is for), after a call that captures."""
    import torch

    from rlpr.rollout.hf import HFRollout

    engine = HFRollout(policy, tokenizer, torch.bfloat16, batch_sequences=rows, loop="graph")
    prompts = _prompts(rows, len(tokenizer), seed=rows)
    timed_generate(engine, prompts, tokens, device)
    return 1e3 * timed_generate(engine, prompts, tokens, device)[0] / tokens


def vllm_comparison(shape: str, runs: list[dict], device, short=None) -> dict:
    """The graph loop's step at vLLM's published batch beside vLLM's time (comparable only for the
    Qwen2.5-0.5B shape at 32 rows on a GPU): at 128-token prompts and 128 new tokens (`short()`, vLLM's
    short context), and the 1024-token rows' mean step (contexts of 128 to 1152 positions)."""
    out = {"published": VLLM_PUBLISHED}
    row = next((r for r in runs if r["rows"] == VLLM_PUBLISHED["rows"]), None)
    if shape != "qwen2.5-0.5b" or device.type != "cuda" or row is None:
        out["comparable"] = False
        out["why"] = f"{shape} shape at rows {[r['rows'] for r in runs]} on {device.type}"
        return out
    published = VLLM_PUBLISHED["ms_per_step"]["128"]
    ms = short() if short is not None else row["graph_step_ms"]
    out.update(comparable=True, rlpr_ms_per_step=ms, ratio=ms / published, at_or_under=ms <= published,
               rlpr_ms_per_step_1024=row["graph_step_ms"],
               note=f"rlpr: 32 rows, 128-token prompts, 128 new tokens; over 1024 new tokens "
                    f"{row['graph_step_ms']:.2f} ms a step. vLLM's figure is its own card's (an H100 PCIe)")
    return out


def _rows_batch(tokenizer, device, rows: int):
    """Left-padded ids and mask of `rows` rows (GROUP per prompt), as the engine hands the loop."""
    import torch

    prompts = _prompts(rows, len(tokenizer), seed=rows)
    ids = torch.tensor([p for p in prompts for _ in range(GROUP)][:rows], device=device)
    return ids, torch.ones_like(ids)


def profile_arm(policy, tokenizer, device, rows: int, steps: int) -> dict:
    """step_profile on the bf16 rollout copy (the same copy the rows above ran)."""
    import torch

    from rlpr.rollout import fused_step, graph_decode
    from rlpr.rollout.hf import HFRollout
    from rlpr.rollout.sampling import PerRowSampler
    from rlpr.rollout.step_profile import profile_decode

    # (a CPU copy's prepacked layers would keep the products apart: off, so the dry run profiles the GPU's path)
    model = HFRollout(policy, tokenizer, torch.bfloat16, batch_sequences=rows, loop="graph",
                      prepacked_weights="off").model
    ids, attn = _rows_batch(tokenizer, device, rows)

    def run():
        return profile_decode(model, ids, attn, lambda: PerRowSampler(list(range(rows))), steps=steps,
                              eos=tokenizer.eos_token_id, pad=tokenizer.pad_token_id)

    out = run()
    fused = fused_step.fused_step(model, graph_decode.DECODE_ATTENTION) is not None
    out.update(dtype="bfloat16", fused_projections=fused)
    with mock.patch.object(fused_step, "ENABLED", False):  # the model's own forward: what fusing q/k/v, gate/up saved
        plain = run()
    out["unfused"] = {k: plain.get(k) for k in ("kernels_per_step", "ops_per_step", "matrix_products_per_step",
                                                 "busy_ms_per_step",
                                                 "non_matrix_share", "class_ms_per_step", "graph") if k in plain}
    return out


def gemma_arm(device, tokens: int, rows: int, eager_tokens: int) -> dict:
    """The Gemma 3 270M shape's graph loop against its eager loop (and the fp32 tokens of both)."""
    from gpubench.models import random_model
    from rlpr.model.packing import attention_windows

    cuda = device.type == "cuda"
    shape = "gemma-3-270m" if cuda else "tiny-gemma"
    policy, tokenizer = random_model(GEMMA_SHAPES[shape], device, family="Gemma3")
    policy.eval()
    windows = attention_windows(policy)
    out = {"shape": shape, "sliding_layers": sum(w is not None for w in windows), "layers": len(windows),
           "window": GEMMA_SHAPES[shape]["sliding_window"], "prompt_tokens": PROMPT_TOKENS, "new_tokens": tokens}
    out["agreement_fp32"] = agreement(policy, tokenizer, device, rows=16 if cuda else GROUP, tokens=min(tokens, 128))
    out["run"] = loop_row(policy, tokenizer, device, rows, tokens, eager_tokens, copy_bandwidth(device))
    return out


def kernel_arm(policy, tokenizer, device, rows: int, tokens: int) -> dict:
    """The graph loop's step with its attention as grouped matmuls (graph_decode.KERNEL="matmul", the
    default) and as torch's scaled_dot_product_attention (enable_gqa), on the same rows and tokens."""
    import torch

    from rlpr.rollout import graph_decode
    from rlpr.rollout.hf import HFRollout

    prompts = _prompts(rows, len(tokenizer), seed=rows)
    out = {"rows": rows, "new_tokens": tokens}
    tokens_of = {}
    for kernel in ("matmul", "sdpa"):
        with mock.patch.object(graph_decode, "KERNEL", kernel):
            engine = HFRollout(policy, tokenizer, torch.bfloat16, batch_sequences=rows, loop="graph")
            timed_generate(engine, prompts, tokens, device)  # capture
            seconds, _ = timed_generate(engine, prompts, tokens, device)
            tokens_of[kernel] = [r.token_ids for r in engine.generate(prompts, GROUP, max_new_tokens=8, temperature=0.0)]
        out[f"{kernel}_step_ms"] = 1e3 * seconds / tokens
        out[f"{kernel}_graph_failed"] = graph_decode.decoder_for(engine.model).failed
    out["sdpa_over_matmul"] = out["sdpa_step_ms"] / out["matmul_step_ms"]
    out["same_greedy_rows"] = sum(a == b for a, b in zip(tokens_of["matmul"], tokens_of["sdpa"]))
    return out


def compile_arm(policy, tokenizer, device, rows: int, tokens: int = 128) -> dict:
    """torch.compile(mode="reduce-overhead") of the static loop's step (its CUDA graphs are inductor's
    cudagraph trees) against the hand-captured graphs, on the same rows and one span bucket (128-token
    prompts, `tokens` new: every step in the 256-position span, so one compiled shape). The state and
    KV buffers are marked static, so that the step's in-place writes do not keep cudagraphs off."""
    if device.type != "cuda":
        return {"skipped": "CUDA only: reduce-overhead mode captures CUDA graphs, which the CPU dry run has none of"}
    import logging

    import torch

    from rlpr.rollout import graph_decode
    from rlpr.rollout.hf import HFRollout
    from rlpr.rollout.sampling import PerRowSampler
    from rlpr.rollout.step_profile import _prefill

    model = HFRollout(policy, tokenizer, torch.bfloat16, batch_sequences=rows, loop="graph").model
    ids, attn = _rows_batch(tokenizer, device, rows)
    cache = _prefill(model, ids, attn)
    kw = dict(eos=tokenizer.eos_token_id, pad=tokenizer.pad_token_id, cache=cache, max_new_tokens=tokens,
              min_new_tokens=tokens)

    def timed(graphs: bool):
        torch.cuda.synchronize()
        tick = time.perf_counter()
        out = graph_decode.static_sample(model, ids, attn, PerRowSampler(list(range(rows))), graphs=graphs, **kw)
        torch.cuda.synchronize()
        return time.perf_counter() - tick, out

    timed(True)  # capture
    hand_s, hand = timed(True)
    notes = []

    class Keep(logging.Handler):
        def emit(self, record):
            if "cudagraph" in record.getMessage().lower():
                notes.append(record.getMessage()[:300])

    handler = Keep()
    logging.getLogger("torch._inductor").addHandler(handler)
    step = graph_decode._step
    dec = graph_decode.decoder_for(model)
    for t in (*dec.keys, *dec.values, *(v for v in vars(dec.state).values() if isinstance(v, torch.Tensor))):
        torch._dynamo.mark_static_address(t)
    graph_decode._step = torch.compile(step, mode="reduce-overhead")
    try:
        first_s, _ = timed(False)
        compiled_s, compiled = timed(False)
    finally:
        graph_decode._step = step
        logging.getLogger("torch._inductor").removeHandler(handler)
    return {"rows": rows, "new_tokens": tokens, "hand_graph_step_ms": 1e3 * hand_s / tokens,
            "compiled_first_call_s": first_s, "compiled_step_ms": 1e3 * compiled_s / tokens,
            "compiled_over_hand": compiled_s / hand_s, "same_tokens_rows": int((hand == compiled).all(-1).sum()),
            "inductor_cudagraph_notes": notes[:5]}

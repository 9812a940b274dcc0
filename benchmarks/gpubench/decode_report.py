"""gpu_check.md's `decode` section and its arms, from the JSON decode.py measured."""

from __future__ import annotations

from gpubench.markdown import fmt, section
from harness.files import table


def report_lines(d: dict) -> list[str]:
    """gpu_check.md's `decode` section."""
    return section("## Decode: the CUDA-graph loop against the eager loop", d, rows_lines)


def rows_lines(d: dict) -> list[str]:
    """The rows' table, the fp32 agreement, then the arms."""
    lines = [f"{d['shape']} shape, random weights, {d['rollout_dtype']} rollout copy, {d['prompt_tokens']}-token "
              f"prompts ({d['group']} rows share each), responses forced to {d['new_tokens']} new tokens; "
              f"device copy bandwidth {d['copy_bandwidth_gbs']:.0f} GB/s (read + written).", "",
              *table(["rows", "graph tok/s", "ms/step", "floor ms/step", "of floor", "eager tok/s (tokens)",
                      "eager ms/step", "speedup", "capture s (graphs)"], (
                  [r["rows"], f"{r['graph_tok_s']:.0f}", f"{r['graph_step_ms']:.2f}", f"{r['step_floor_ms']:.3f}",
                   f"{r['graph_floor_fraction']:.1%}", f"{r['eager_tok_s']:.0f} ({r['eager_tokens']})",
                   f"{r['eager_step_ms']:.1f}", f"**{r['speedup']:.1f}x**", f"{r['capture_s']:.2f} ({r['graphs']})"]
                  for r in d["runs"]), ["---:"] * 9), ""]
    for name, a in d.get("agreement_fp32", {}).items():
        lines.append(f"- fp32 copies, {name}: {a['identical_rows']} of {a['rows']} rows identical between the loops"
                     + (f" (first differences at tokens {sorted(a['first_difference'])[:8]})" if a["first_difference"] else ""))
    failed = {r["graph_failed"] for r in d["runs"] if r.get("graph_failed")}
    if failed:
        lines.append(f"- **graph capture failed** (the loop ran eagerly): {'; '.join(failed)}")
    return lines + [""] + arm_lines(d)


def arm_lines(d: dict) -> list[str]:
    """The issue-63 arms of the section: vLLM's figure, the profile, Gemma, the attention kernel, torch.compile."""
    lines = []
    v = d.get("vllm")
    if v:
        p = v["published"]
        lines.append(f"- vLLM's published decode step ({p['model']}, {p['rows']} rows, {p['card']}, {p['source']}): "
                     f"{p['ms_per_step']['128']} ms at a 128-token context, {p['ms_per_step']['4096']} ms at 4k; "
                     + (f"rlpr's graph loop {v['rlpr_ms_per_step']:.2f} ms ({v['ratio']:.2f}x; "
                        f"{'at or under' if v['at_or_under'] else 'over'} it; {v['note']})" if v.get("comparable")
                        else f"not comparable here ({v['why']})"))
    for key, title, body in ARMS:
        if key in d:
            lines += ["", *section(title, d[key], body)]
    return lines + [""]


def profile_lines(p: dict) -> list[str]:
    unit = "kernels" if p["device"] == "cuda" else "ops called from Python"
    count = p.get("kernels_per_step", p.get("ops_per_step"))
    lines = [f"{p['rows']} rows, {p['context']}-token prompts, {p['steps']} steps, {p.get('dtype', '')}; "
             f"{p['mode']}: {count:.0f} {unit} per step, {p['busy_ms_per_step']:.2f} ms busy per step, "
             f"{p['non_matrix_share']:.0%} of it not matrix products.", "",
             *table(["class", "ms/step", "share"], ([k, f"{ms:.3f}", f"{p['class_share'][k]:.1%}"]
                                                     for k, ms in p["class_ms_per_step"].items()),
                    ["---", "---:", "---:"]), "",
             "- top ops: " + "; ".join(f"{o['op']} {o['ms_per_step']:.3f} ms" for o in p["top_ops"][:8])]
    if u := p.get("unfused"):
        replays = f", graph replays {u['graph']['wall_ms_per_step']:.2f} ms per step" if u.get("graph") else ""
        lines.append(f"- without the fused q/k/v and gate/up products (the model's own forward): "
                     f"{u.get('kernels_per_step', u.get('ops_per_step')):.0f} {unit} per step "
                     f"({u['matrix_products_per_step']:.0f} matrix products against "
                     f"{p['matrix_products_per_step']:.0f}), {u['busy_ms_per_step']:.2f} ms busy{replays}")
    if g := p.get("graph"):
        lines.append(f"- graph replays: {g['wall_ms_per_step']:.2f} ms per step, {g['kernels_seen_per_step']:.0f} "
                     f"kernels seen per step, busy {fmt(g['kernel_busy_ms_per_step'], '.2f')} ms "
                     f"(idle share {fmt(g['idle_share'], '.0%')})")
    return lines


def gemma_lines(g: dict) -> list[str]:
    r = g["run"]
    return [f"{g['shape']} shape (random weights; {g['sliding_layers']} of {g['layers']} layers slide over "
            f"{g['window']} positions), {r['rows']} rows, {g['prompt_tokens']}-token prompts, "
            f"{g['new_tokens']} new tokens: graph {r['graph_tok_s']:.0f} tok/s ({r['graph_step_ms']:.2f} ms/step), "
            f"eager {r['eager_tok_s']:.0f} tok/s ({r['eager_step_ms']:.1f} ms/step, {r['eager_tokens']} tokens): "
            f"**{r['speedup']:.1f}x**; capture {r['capture_s']:.2f} s ({r['graphs']} graphs)"
            + (f"; capture failed: {r['graph_failed']}" if r["graph_failed"] else ""),
            *(f"- fp32, {name}: {a['identical_rows']} of {a['rows']} rows identical between the loops"
              for name, a in g["agreement_fp32"].items())]


ARMS = (("profile", "### Inside a decode step (torch.profiler)", profile_lines),
        ("gemma", "### Gemma 3 in the graph loop", gemma_lines),
        ("attention_kernel", "### Attention kernel of the graph loop's step", lambda k: [
            f"{k['rows']} rows, {k['new_tokens']} new tokens: grouped matmuls {k['matmul_step_ms']:.2f} ms/step, "
            f"SDPA (enable_gqa) {k['sdpa_step_ms']:.2f} ms/step ({k['sdpa_over_matmul']:.2f}x); "
            f"{k['same_greedy_rows']} of {k['rows']} rows the same 8 greedy tokens (bf16)"
            + "".join(f"; {n} capture failed: {k[n + '_graph_failed']}" for n in ("matmul", "sdpa")
                      if k[n + "_graph_failed"])]),
        ("compile", "### torch.compile(mode=\"reduce-overhead\") against the hand-captured graphs", lambda c: [
            f"{c['rows']} rows, {c['new_tokens']} new tokens: hand-captured {c['hand_graph_step_ms']:.2f} ms/step, "
            f"compiled {c['compiled_step_ms']:.2f} ms/step ({c['compiled_over_hand']:.2f}x; first call with the "
            f"compile {c['compiled_first_call_s']:.0f} s); {c['same_tokens_rows']} of {c['rows']} rows the same "
            "tokens (bf16)" + (f"; inductor: {' | '.join(c['inductor_cudagraph_notes'])}"
                               if c["inductor_cudagraph_notes"] else "")]))

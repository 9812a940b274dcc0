"""speed.json and speed.md: the versions, the notes that say how to read a run, the tables (markdown()
re-renders any saved speed*.json), and the run a rerun replaces as a history row."""

from __future__ import annotations

from pathlib import Path

from harness import files


def pct(value) -> str:
    return "n/a" if value is None else f"{value:.0f}%"


def threads(res: dict) -> str:
    """The torch threads each part ran with: rlpr's trainer sets them (model.threads=0: its share of
    the CPUs less those busy elsewhere when it starts); TRL's process keeps torch's default (before
    2026-11-29 it ran after rlpr in the same process and inherited rlpr's); the process's start value
    where a part did not record them."""
    start = res["machine"]["torch_threads"]
    parts = {}
    if "rlpr" in res:
        parts["rlpr"] = res["rlpr"].get("torch_threads", start)
    if "trl" in res:
        parts["trl"] = res["trl"].get("torch_threads", parts.get("rlpr", start))
    if len(set(parts.values())) <= 1:
        return str(next(iter(parts.values()), start))
    return " / ".join(f"{name} {n}" for name, n in parts.items())


def headline(res: dict) -> list[str]:
    """The ratio: of the means, and (interleaved runs) of each timed step pair, adjacent in time."""
    if res.get("ratio_rlpr_over_trl") is None:
        return []
    text = f"**rlpr / TRL time per step: {res['ratio_rlpr_over_trl']:.2f}** (target <= 0.30)"
    if res.get("pair_ratios"):
        text += (f"; step by step, each rlpr step over the TRL step after it: "
                 f"{', '.join(f'{r:.2f}' for r in res['pair_ratios'])} (median {res['ratio_median_of_pairs']:.2f})")
    return [text, ""]


def markdown(res: dict) -> str:
    s = res["settings"]
    lines = [f"# Training-step speed: rlpr vs TRL GRPOTrainer ({res['date']})", "", files.header(res), "",
             (f"SmolLM2-135M-Instruct + LoRA r16, {s['prompts_per_step']} prompts x {s['responses_per_prompt']} "
             f"responses x {s['max_new_tokens']} new tokens, micro-batch {s['micro_batch_sequences']}; mean of {s['steps']} timed steps after "
             f"{s['warmup']} warm-up; {res['machine'].get('cpu', 'CPU')}, {res['machine']['cpu_count']} cores, "
             f"{threads(res)} torch thread(s)"
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
        lines += headline(res)
        lines += ["rlpr breakdown (s per step): " + ", ".join(
            f"{k.removesuffix('_s')} {rm[k]:.2f}" for k in ("rollout_s", "score_b_s", "score_a_s", "reward_other_s",
                                                           "old_logp_s", "update_s", "other_s"))
                  + f"; setup (model load, rollout copy) {r['setup_s']:.1f} s",
                  "", f"Score B both ways on the same responses (rollout copy {r['rollout_dtype']}, "
                  f"reward.score_b_from_cache={r['score_b_from_cache']}: the step trained on {r['configured_path']}): "
                  f"from the cache {rm['score_b_from_cache_s']:.2f} s vs recomputed {rm['score_b_recomputed_s']:.2f} s "
                  f"per step ({pct(100 * (1 - rm['score_b_from_cache_s'] / rm['score_b_recomputed_s']))} less); "
                  f"max |B difference| {rm['max_abs_diff_b']:.1e}.", ""]
    if res.get("notes"):
        lines += ["Notes:", ""] + [f"- {n}" for n in res["notes"]]
    lines += [""] + files.history_table(res.get("history", []), HISTORY)
    return "\n".join(lines) + "\n"


def add_notes(res: dict, args) -> None:
    """What this run's settings were, where a reader needs them to read the tables (the method: docs/benchmarks.md)."""
    r, t = res.get("rlpr", {}), res.get("trl")
    spin = ", ".join(f"{side} GOMP_SPINCOUNT={res[side].get('gomp_spincount') or 'unset (libgomp default)'}"
                     for side in ("rlpr", "trl") if side in res)
    res["notes"] = notes = [
        f"Each trainer in its own process, their steps alternating (harness/baton.py); OpenMP's idle spin: {spin}.",
        "One rollout round and one mini-batch per step on both sides (32 sequences; no separate old log-probs).",
        f"rlpr scores B both ways on the same responses (recomputed by the fp32 policy, and from the rollout's kept "
        f"caches continued as reward.score_b_on_copy={r.get('score_b_on_copy', 'always')} picks); the step trains on "
        "the configured one, and the other path's seconds are left out of step_s and score_b_s.",
        f"rlpr: {r.get('rollout_dtype', 'bfloat16')} rollout copy"
        + (", weights prepacked for oneDNN" if r.get("prepacked_weights") else "")
        + f", update {'under bf16 autocast' if r.get('mixed_precision', 'bf16') == 'bf16' else 'in fp32'}, responses "
        + ("packed into rows" if r.get("pack_responses") else "one padded row each")
        + "; 'other' = the weight sync, advantages, metrics."]
    if res.get("same_prompts") is False:
        notes.append("WARNING: the two sides trained on different prompts.")
    if t:
        notes.append(f"TRL: generation under bf16 autocast observed {t['generation_autocast_bf16']} (fp32 "
                     f"weights, LoRA unmerged), loss bf16={args.trl_bf16}; 'other' = tokenisation, the micro-batch "
                     "forward/backward passes and the optimizer step. Sampling differs in mechanism, so the responses "
                     "and their lengths differ.")
        if not t["prompt_ids_identical"]:
            notes.append("WARNING: TRL tokenised some prompts differently from rlpr.")
    if args.quick:
        notes.append("QUICK run: settings shrunk for validation; the numbers are not measurements.")


def history_row(res: dict) -> dict:
    """One run as a row of the canonical file's history table."""
    m, t = res["machine"], res.get("trl", {}).get("mean", {})
    caps = "capped to AVX2" if m.get("isa_caps") else "native"
    return {"date": res["date"][:16], "machine": f"{m.get('cpu', '?')}, {m.get('cpu_count')} cores, {caps}",
            "commit": res.get("versions", {}).get("rlpr_commit", "?"),
            "rlpr_s": f"{res['rlpr']['mean']['step_s']:.1f}", "trl_s": f"{t['step_s']:.1f}" if t else "-",
            "ratio": f"{res['ratio_rlpr_over_trl']:.2f}" if res.get("ratio_rlpr_over_trl") else "-",
            "pairs_median": f"{res['ratio_median_of_pairs']:.2f}" if res.get("ratio_median_of_pairs") else "-",
            "timed_steps": res["settings"].get("steps"), "file": res.get("file", "")}


HISTORY = [("date", "date (UTC)"), ("machine", "machine"), ("commit", "commit"), ("rlpr_s", "rlpr s/step"),
           ("trl_s", "TRL s/step"), ("ratio", "rlpr / TRL (means)"), ("pairs_median", "median of pairs"),
           ("timed_steps", "timed steps"), ("file", "its files")]


def write(res: dict, args, out: Path) -> str:
    """speed.json and speed.md at `out`; the run they replace becomes the newest history row."""
    add_notes(res, args)
    files.carry_history(res, out, history_row)
    return files.save(res, out, markdown)

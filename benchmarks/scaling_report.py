"""benchmarks/scaling.py's results: each point's summary row, the linearity criterion, and the tables,
plot and notes it writes (scaling.{json,md,png})."""

from __future__ import annotations

import sys
from pathlib import Path

from harness import files

LENGTHS = (256, 512, 1024, 2048, 4096)
BASE_N, BASE_L = 2, 512
CRITERION = 1.2  # growth(4096) <= 1.2 * 8 * growth(512)


def summarise(row: dict) -> dict:
    m = row["metrics"]
    length, n = row["response_tokens"], row["group_size"]
    step_s = m["perf/step_s"]
    peak = row.get("step_peak_rss_gb", m["perf/peak_rss_gb"])  # older rows: one reset before the step
    return {"response_tokens": length, "group_size": n, "peak_rss_gb": peak,
            "phase_peak_gb": row.get("phase_peak_gb"),
            "step_s": step_s, "rollout_s": m.get("perf/rollout_s"), "reward_s": m.get("perf/reward_s"),
            "update_s": m.get("perf/update_s"), "sync_s": m.get("perf/sync_s"),
            "old_logp_s": m.get("perf/old_logp_s"), "micro_batches": m.get("perf/micro_batches"),
            "generated_tokens": length * n, "tokens_per_s": length * n / step_s,
            "rollout_tok_s": m.get("perf/rollout_tok_s"),
            "response_len_mean": m.get("rollout/response_len_mean"),
            "truncated_frac": m.get("rollout/truncated_frac"),
            "setup_peak_rss_gb": row.get("setup_peak_rss_gb"), "rss_before_step_gb": row.get("rss_before_step_gb"),
            "rss_after_step_gb": row.get("rss_after_step_gb"), "peak_reset": row.get("peak_reset"),
            "process_wall_s": row.get("process_wall_s"), "finished_at": row.get("finished_at")}


def criterion(rows: list[dict], model_gb: float | None) -> dict | None:
    by = {(r["response_tokens"], r["group_size"]): r for r in rows}
    small, large = by.get((BASE_L, BASE_N)), by.get((max(LENGTHS), BASE_N))
    if model_gb is None or not small or not large:
        return None
    g_small, g_large = small["peak_rss_gb"] - model_gb, large["peak_rss_gb"] - model_gb
    ratio = g_large / g_small if g_small > 0 else float("inf")
    limit = CRITERION * max(LENGTHS) / BASE_L
    return {"growth_512_gb": g_small, "growth_4096_gb": g_large, "ratio": ratio, "limit": limit,
            "holds": ratio <= limit}


def markdown(res: dict) -> str:
    s = res["settings"]
    lines = [f"# Training-step scaling: memory and time vs response length and group size ({res['date']})", "", files.header(res), "",
             (f"One full RLPR step (rollout, score B, update) of the embedded SmolLM2-135M-Instruct, full fine-tuning, "
              f"gradient checkpointing, trainer.micro_batch_tokens={s['budget']}, 1 prompt per step, every response "
              f"exactly L tokens (rollout.min_new_tokens = max_new_tokens = L); {s['threads']} torch threads on "
              f"{res['machine']['cpu_count']} cores shared with other jobs; a fresh process per point. "
              f"peak RSS = the peak resident size during the step (VmHWM reset right before it)."), ""]
    if res.get("model_gb") is not None:
        st = res["setup"]
        lines += [(f"**model_gb = {res['model_gb']:.2f} GiB**: RSS after the Trainer is built (fp32 weights, "
                   f"{st['rollout_dtype']} rollout copy, score-A cache: {st['trainer_rss_gb']:.2f} GiB) plus a gradient "
                   f"per parameter and AdamW's two moments ({st['trainable_params'] / 1e6:.0f}M trainable parameters)."),
                  ""]
    mg = res.get("model_gb")

    def f(v, fmt="{:.1f}"):
        return "-" if v is None else fmt.format(v)

    def row(r: dict) -> list:
        ph = r.get("phase_peak_gb") or {}
        return [r["response_tokens"], r["group_size"], f"{r['peak_rss_gb']:.2f}",
                f(None if mg is None else r["peak_rss_gb"] - mg, "{:.2f}"),
                " / ".join(f(ph.get(k), "{:.2f}") for k in ("rollout", "reward", "update", "optimizer_step")),
                f"{r['step_s']:.1f}", f(r["rollout_s"]), f(r["reward_s"]), f(r["update_s"]), f"{r['tokens_per_s']:.1f}",
                f(r["rollout_tok_s"], "{:.0f}")]

    lines += [*files.table(["response tokens L", "group size n", "peak RSS GiB", "growth over model_gb",
                            "peak in rollout / score B / update / AdamW step, GiB", "step s", "rollout s", "reward s",
                            "update s", "tokens/s (L n / step)", "rollout tok/s"], map(row, res["rows"])), ""]
    c = res.get("criterion")
    if c:
        verdict = "holds" if c["holds"] else "does NOT hold"
        lines += [(f"**Linearity criterion {verdict}**: growth above model_gb at L=4096 is {c['growth_4096_gb']:.3f} "
                   f"GiB, {c['ratio']:.3f}x the {c['growth_512_gb']:.3f} GiB at L=512 (n=2), against a limit of "
                   f"1.2 x 8 = {c['limit']:.1f}x. " + res.get("verdict_text", "")), ""]
    else:
        lines += ["Linearity criterion: not evaluated (the L=512 and L=4096 points at n=2 and model_gb are all "
                  "needed).", ""]
    if res.get("notes"):
        lines += ["Notes:", ""] + [f"- {n}" for n in res["notes"]]
    return "\n".join(lines) + "\n"


def verdict_text(rows: list[dict], model_gb: float) -> str:
    """A plain sentence on how memory grows with L (n=2)."""
    pts = sorted((r["response_tokens"], r["peak_rss_gb"] - model_gb) for r in rows if r["group_size"] == BASE_N)
    if len(pts) < 2:
        return ""
    per_k = [(length, g / length * 1024) for length, g in pts]
    return ("Growth per 1024 response tokens: " + ", ".join(f"{g:.2f} GiB at L={length}" for length, g in per_k)
            + " (flat or falling: at most linear; rising: faster than linear).")


def plot(res: dict):
    """The figure: peak RSS and the step's seconds against L (n = 2) and against n (L = 512)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = res["rows"]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for ax, (xkey, fixed_key, fixed, label) in zip(axes, [
            ("response_tokens", "group_size", BASE_N, f"response length L (group size {BASE_N})"),
            ("group_size", "response_tokens", BASE_L, f"group size n (L = {BASE_L})")]):
        sel = sorted((r for r in rows if r[fixed_key] == fixed), key=lambda r: r[xkey])
        if not sel:
            ax.set_visible(False)
            continue
        x = [r[xkey] for r in sel]
        ax.plot(x, [r["peak_rss_gb"] for r in sel], "o-", color="tab:blue", label="peak RSS during the step")
        if res.get("model_gb") is not None:
            ax.axhline(res["model_gb"], color="tab:blue", ls=":", label=f"model_gb {res['model_gb']:.2f}")
            if xkey == "response_tokens" and len(sel) > 1:
                # the linear reference through the smallest point: growth proportional to L
                x0, g0 = x[0], sel[0]["peak_rss_gb"] - res["model_gb"]
                ax.plot(x, [res["model_gb"] + g0 * v / x0 for v in x], "--", color="tab:gray", lw=1,
                        label=f"linear from L={x0}")
        ax.set_xlabel(label)
        ax.set_ylabel("GiB", color="tab:blue")
        if xkey == "response_tokens":
            ax.set_xscale("log", base=2)
        ax.set_xticks(x)
        ax.set_xticklabels([str(v) for v in x])
        tw = ax.twinx()
        tw.plot(x, [r["step_s"] for r in sel], "s-", color="tab:red", label="step s")
        for key, style in (("rollout_s", ":"), ("reward_s", "-."), ("update_s", "--")):
            tw.plot(x, [r[key] or 0 for r in sel], style, color="tab:red", alpha=0.6, label=key)
        tw.set_ylabel("seconds", color="tab:red")
        h1, l1 = ax.get_legend_handles_labels()
        h2, l2 = tw.get_legend_handles_labels()
        ax.legend(h1 + h2, l1 + l2, fontsize=7, loc="upper left")
        ax.set_title(f"vs {xkey.replace('_', ' ')}")
    fig.suptitle("One RLPR training step: SmolLM2-135M, full fine-tuning, checkpointing, "
                 f"{res['settings']['budget']}-token micro-batches")
    fig.tight_layout()
    return fig


def write(res: dict, stem: Path) -> str:
    figure = None
    try:
        figure = plot(res)
    except ImportError:
        print("matplotlib is not installed: no plot", file=sys.stderr)
    return files.save(res, stem, markdown, figure)


def notes(res: dict, args) -> list[str]:
    """How to read the run (docs/distributed.md, "Long responses", says what the growth is)."""
    out = [
        "Each point is one step in a fresh process; step s = perf/step_s (with the weight sync and advantages). "
        "peak RSS: VmHWM reset right before the step and at each phase boundary; each phase column is that phase's "
        "own peak (the update's includes its AdamW step). The end-of-run checkpoint is not measured. "
        "tokens/s = L x n generated tokens / step s.",
        f"Timings are noisy: other jobs shared the cores ({args.threads} torch threads here); memory is the "
        f"measurement. OMP_WAIT_POLICY={args.omp_wait_policy or '(unset)'} in the children.",
    ]
    out += res.get("run_notes", [])
    if res.get("missing"):
        out.append("Points not measured: " + ", ".join(f"L={a} n={b}" for a, b in res["missing"]) + ".")
    if res.get("quick"):
        out.append("QUICK run: 2 short points to check the script; the numbers are not measurements.")
    return out

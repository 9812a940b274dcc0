"""The summary's figure: held-out curves, training reward and accuracy per step, and Avg@k after
training on every set, per variant."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

from .variants import SET_TITLES, TRANSFER, VARIANTS, in_order


def smooth(values: list[float], width: int = 3) -> list[float]:
    """Trailing mean over `width` steps (one step is 32 samples: noisy)."""
    return [statistics.fmean(values[max(0, i - width + 1):i + 1]) for i in range(len(values))]


def plot(rows: list[dict], path: Path) -> None:
    """Held-out Avg@8 (curve points), the training reward and accuracy per step, one line per run,
    and Avg@k after training on the held-out and transfer sets per variant."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(22, 4.8))
    # more variants than the default cycle's 10 colours; appended ones keep the earlier variants' colours
    palette = plt.rcParams["axes.prop_cycle"].by_key()["color"] + [plt.get_cmap("tab20")(2 * i + 1) for i in range(10)]
    palette += [plt.get_cmap("tab20b")(4 * i + j) for j in (0, 2) for i in range(5)]
    colors = dict(zip(VARIANTS, palette))
    base = next((r for r in rows if r["variant"] == "base"), None)
    for r in rows:
        if r["variant"] == "base":
            continue
        c = colors.get(r["variant"])
        label = r["variant"] if r["seed"] == min(x["seed"] for x in rows if x["variant"] == r["variant"]) else None
        pts = r.get("curve", [])
        if pts:
            axes[0].plot([p["step"] for p in pts], [100 * p["acc_curve"] for p in pts], "o-", color=c, alpha=0.7,
                         label=label)
        axes[0].plot([r["steps"]], [100 * r["acc_after"]], "*", color=c, markersize=12)
        steps = [t["step"] for t in r["train"]]
        rewards = [math.nan if t.get("reward/mean") is None else t["reward/mean"] for t in r["train"]]
        axes[1].plot(steps, smooth(rewards), color=c, alpha=0.7, label=label)
        axes[2].plot(steps, smooth([100 * (t["reward/accuracy"] or 0) for t in r["train"]]), color=c, alpha=0.7,
                     label=label)
    if base:
        axes[0].axhline(100 * base["acc_before"], color="gray", ls="--", label="base, all held-out")
        sets = ["heldout", *[s for s in TRANSFER if base.get(f"n_{s}")]]
        variants = in_order(rows)
        width = 0.8 / max(len(variants), 1)
        for j, s in enumerate(sets):
            key = "acc_after" if s == "heldout" else f"{s}_acc_after"
            axes[3].hlines(100 * base[key], j - 0.4, j + 0.4, color="gray", ls="--",
                           label="base" if j == 0 else None)
            for i, v in enumerate(variants):
                values = [100 * r[key] for r in rows if r["variant"] == v and r.get(key) is not None]
                if not values:
                    continue
                x = j - 0.4 + width * (i + 0.5)
                axes[3].bar(x, statistics.fmean(values), width * 0.9, color=colors.get(v), alpha=0.6,
                            label=v if j == 0 else None)
                axes[3].plot([x] * len(values), values, "k.", markersize=4)
        axes[3].set_xticks(range(len(sets)), [SET_TITLES[s] for s in sets])
    axes[0].set(title="held-out Avg@k (%): lines on the curve subset,\nstars on all held-out questions", xlabel="step")
    axes[1].set(title="training reward (own reward kind; mean of 3 steps)", xlabel="step")
    axes[2].set(title="training rollouts graded correct (%, mean of 3 steps)", xlabel="step")
    axes[3].set(title="Avg@k after training (%), bars: mean over seeds,\ndots: seeds; dashed: base")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

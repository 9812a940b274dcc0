"""The summary's tables: every variant before -> after, transfer, and "Is it the reward?" (RLPR beside
its controls, OPSD beside its controls, in standard errors of each difference)."""

from __future__ import annotations

import math
import statistics

from harness.files import table as md_table
from rlpr.evaluation.metrics import binomial_se as se  # the same standard error the trainer reports

from .variants import CONTROLS, GRADED, OPSD_CONTROLS, OPSD_METHODS, REGISTRY, SET_TITLES, TRANSFER, in_order


def in_ses(change: float, p: float, n: int) -> float:
    """A change in units of the binomial standard error of p (inf/nan when that error is 0)."""
    error = se(p, n)
    return change / error if error else (math.copysign(math.inf, change) if change else math.nan)


def _pct(value) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}"


def summarise(rows: list[dict]) -> tuple[list[dict], str]:
    base = next((r for r in rows if r["variant"] == "base"), None)
    if base is None:
        return [], "(no base run yet)\n"
    n = base["n_heldout"]
    keys = ["acc", "greedy", "pass8", "reward", "score_b", "format", "len", "entropy"]
    transfer_keys = [f"{s}_{k}" for s in TRANSFER for k in GRADED if f"{s}_{k}_before" in base]
    table, cells = [], []
    k = base.get("settings", {}).get("samples", 8)  # k of Avg@k and pass@k (--samples)
    head = ["variant", "seeds", "steps", f"Avg@{k} before ± SE", f"Avg@{k} after: mean ± sd (per run ± SE)",
            "change in SEs", "greedy before -> after", "greedy change in SEs", f"pass@{k} before -> after",
            "reward before -> after", "score B after", "format after", "length after", "s/step", "min/run"]
    for variant in ["base", *in_order(rows)]:
        runs = [r for r in rows if r["variant"] == variant]
        entry = {"variant": variant, "seeds": [r["seed"] for r in runs], "steps": runs[0]["steps"], "n_heldout": n}
        for k in keys + [k for k in transfer_keys if all(f"{k}_after" in r for r in runs)]:
            after = [r.get(f"{k}_after") for r in runs]  # entropy: rows recorded before it have none
            entry[f"{k}_before"] = base.get(f"{k}_before")
            if any(a is None for a in after):
                entry[f"{k}_after"], entry[f"{k}_after_sd"] = None, None
                continue
            entry[f"{k}_after"] = statistics.fmean(after)
            entry[f"{k}_after_sd"] = statistics.stdev(after) if len(after) > 1 else 0.0
        # per seed and set: how many binomial standard errors (of the base accuracy) the change is
        for s, m, prefix in _sets(base):
            if prefix and not all(f"{prefix}acc_after" in r for r in runs):
                continue
            if prefix:
                entry[f"n_{s}"] = m
            for k in ("acc", "greedy"):
                before = base[f"{prefix}{k}_before"]
                entry[f"{prefix}{k}_change_se"] = [in_ses(r[f"{prefix}{k}_after"] - before, before, m) for r in runs]
        entry["step_s"] = statistics.fmean(r.get("step_s", 0.0) for r in runs)
        # the update's mean token entropy over the last 3 steps (policy/entropy): recorded by every run
        tails = [[t["policy/entropy"] for t in r.get("train", [])[-3:]  # NaN: a step that kept no group
                  if t.get("policy/entropy") is not None and math.isfinite(t["policy/entropy"])] for r in runs]
        entry["train_entropy_last"] = statistics.fmean(x for t in tails for x in t) if all(tails) and runs[0][
            "variant"] != "base" else None
        costs = [r.get("reward_s") for r in runs]
        entry["reward_s"] = statistics.fmean(costs) if runs[0]["variant"] != "base" and None not in costs else None
        entry["minutes_per_run"] = statistics.fmean(r["seconds"] for r in runs) / 60
        table.append(entry)

        def pm(k, scale=100.0, digits=1):
            if entry[f"{k}_after"] is None:
                return "n/a"
            spread = f" ± {entry[f'{k}_after_sd'] * scale:.{digits}f}" if len(runs) > 1 else ""
            return f"{entry[f'{k}_after'] * scale:.{digits}f}{spread}"

        per_run = ", ".join(f"{100 * r['acc_after']:.1f} ± {100 * se(r['acc_after'], n):.1f}" for r in runs)
        cells.append([variant, len(runs), entry["steps"],
                      f"{100 * base['acc_before']:.1f}% ± {100 * se(base['acc_before'], n):.1f}",
                      f"{pm('acc')}% ({per_run})", ", ".join(f"{c:+.1f}" for c in entry["acc_change_se"]),
                      f"{100 * base['greedy_before']:.1f}% -> {pm('greedy')}%",
                      ", ".join(f"{c:+.1f}" for c in entry["greedy_change_se"]),
                      f"{_pct(base['pass8_before'])}% -> {pm('pass8')}%",
                      f"{base['reward_before']:.3f} -> {pm('reward', 1, 3)}", pm("score_b", 1, 3), f"{pm('format')}%",
                      pm("len", 1, 1), f"{entry['step_s']:.0f}", f"{entry['minutes_per_run']:.0f}"])
    return table, ("\n".join(md_table(head, cells)) + "\n" + transfer_table(table, base)
                   + controls_verdict(table, base)[1] + opsd_verdict(table, base)[1])


METRICS = (("acc", "Avg@8"), ("greedy", "greedy"), ("pass8", "pass@8"))


def diff_se(a: dict, b: dict, key: str, n: int) -> float:
    """The standard error of (a's mean - b's mean) for `key`: the binomial error over the n questions of
    each mean (sqrt(p (1 - p) / n), as if the two were independent: conservative on shared questions)
    plus each mean's seed-to-seed spread (sd / sqrt(seeds))."""
    def var(e):
        p, k = e[f"{key}_after"], len(e["seeds"])
        return p * (1 - p) / n + (e[f"{key}_after_sd"] ** 2 / k if k > 1 else 0.0)

    return math.sqrt(var(a) + var(b))


def _num(value, digits: int) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def monitor_table(entries: list[dict]) -> list[str]:
    """The collapse monitors of each entry (held-out entropy and length after training, the update's
    entropy over the last 3 steps) and the reward's own cost per step: one table row each."""
    return md_table(["variant", "held-out entropy after", "training entropy, last 3 steps", "length after",
                     "reward s/step"],
                    ([e["variant"], _num(e.get("entropy_after"), 2), _num(e.get("train_entropy_last"), 2),
                      f"{e['len_after']:.1f}", _num(e.get("reward_s"), 1)] for e in entries))


def controls_verdict(table: list[dict], base: dict) -> tuple[list[dict], str]:
    """RLPR against the best control on every set and metric: RLPR's mean, each control's, the best
    control's, and RLPR - best in standard errors of that difference (`diff_se`). Sharpening alone
    lifts Avg@k toward greedy and can lower pass@k; learning lifts greedy and pass@k."""
    by = {e["variant"]: e for e in table}
    rlpr = by.get("rlpr")
    controls = [by[c] for c in CONTROLS if c in by]
    if rlpr is None or not controls:
        return [], ""
    rows, cells = [], []
    for set_name, n, prefix in _sets(base):
        for key, label in METRICS:
            k = prefix + key
            if rlpr.get(f"{k}_after") is None or any(c.get(f"{k}_after") is None for c in controls):
                continue
            best = max(controls, key=lambda c: c[f"{k}_after"])
            net, in_se = _difference(rlpr, best, k, n)
            rows.append({"set": set_name, "metric": label, "base": base[f"{k}_before"], "rlpr": rlpr[f"{k}_after"],
                         **{c["variant"]: c[f"{k}_after"] for c in controls}, "best_control": best["variant"],
                         "net": net, "net_se": in_se})
            cells.append([SET_TITLES[set_name], label, f"{100 * base[f'{k}_before']:.1f}",
                          f"{100 * rlpr[f'{k}_after']:.1f}", *(f"{100 * c[f'{k}_after']:.1f}" for c in controls),
                          f"{100 * net:+.1f} ({best['variant']}; {_in_se_text(rows[-1]['net_se'])})"])
    lines = md_table(["set", "metric", "base", "RLPR", *(c["variant"] for c in controls),
                      "RLPR - best control (SEs)"], cells)
    cost = ["", "Held-out mean token entropy after training (nats; base "
            f"{base.get('entropy_before') or math.nan:.2f}; rows from before it was recorded: n/a), the update's "
            "token entropy over the last 3 training steps (every run records it), response length (tokens) and the "
            "reward's own cost per step (s: score B and A, or the label-free kind's forward; each row on the "
            "machine and under the load it ran with, so rows are not comparable: the side-by-side ratios are "
            "benchmarks/results/archive/reward_cost.md's; n/a: rows recorded before the column existed):", "",
            *monitor_table([rlpr, *controls, *[by[v] for v in ("rlvr",) if v in by]])]
    header = ["", "Is it the reward? RLPR beside the controls (mean over seeds, %), and RLPR minus the best "
              "control in standard errors of the difference (binomial over questions plus seed spread).", ""]
    return rows, "\n".join(header + lines + cost) + "\n"


def _sets(base: dict) -> list[tuple[str, int, str]]:
    """The sets every run was evaluated on: name, number of questions, and the prefix of a row's keys."""
    return [("heldout", base["n_heldout"], "")] + [(s, base[f"n_{s}"], f"{s}_") for s in TRANSFER if base.get(f"n_{s}")]


def _difference(a: dict, b: dict, k: str, n: int) -> tuple[float, float | None]:
    """a's mean minus b's for key `k`, and that difference in its standard errors (`diff_se`); None
    where the standard error is 0 (both at 0% or 100% on every seed: no spread to measure it in),
    so that learning.json stays strict JSON."""
    net = a[f"{k}_after"] - b[f"{k}_after"]
    error = diff_se(a, b, k, n)
    return net, net / error if error else None


def _in_se_text(in_se: float | None) -> str:
    return "SE 0" if in_se is None else f"{in_se:+.1f} SE"


def opsd_verdict(table: list[dict], base: dict) -> tuple[list[dict], str]:
    """OPSD beside its controls: every OPSD row's mean per set and metric (RLPR's beside them), then
    each OPSD method minus each of its controls and minus the best of them, and RLPR minus each
    OPSD method, in standard errors of the difference (`diff_se`, as `controls_verdict`); and the
    collapse monitors of those rows. ([], "") when the table holds no OPSD row."""
    by = {e["variant"]: e for e in table}
    methods = [by[m] for m in OPSD_METHODS if m in by]
    controls = [by[c] for c in OPSD_CONTROLS if c in by]
    if not methods and not controls:
        return [], ""
    shown = [by[v] for v in ("rlpr",) if v in by] + methods + controls
    pairs = [(m, c) for m in methods for c in controls] + [(m, None) for m in methods if len(controls) > 1] + \
        [(by["rlpr"], m) for m in methods if "rlpr" in by]
    means = md_table(["set", "metric", "base", *(e["variant"] for e in shown)], (
        [SET_TITLES[set_name], label, f"{100 * base[f'{prefix}{key}_before']:.1f}",
         *(_num(None if e.get(f"{prefix}{key}_after") is None else 100 * e[f"{prefix}{key}_after"], 1) for e in shown)]
        for set_name, _, prefix in _sets(base) for key, label in METRICS))
    rows, nets = [], []
    for a, b in pairs:
        for set_name, n, prefix in _sets(base):
            cells = []
            for key, label in METRICS:
                k = prefix + key
                rivals = [b] if b is not None else controls
                if a.get(f"{k}_after") is None or any(c.get(f"{k}_after") is None for c in rivals):
                    cells.append("n/a")
                    continue
                rival = max(rivals, key=lambda c: c[f"{k}_after"])
                net, in_se = _difference(a, rival, k, n)
                rows.append({"comparison": f"{a['variant']} - {'best control' if b is None else b['variant']}",
                             "a": a["variant"], "b": rival["variant"], "set": set_name, "metric": label,
                             "a_mean": a[f"{k}_after"], "b_mean": rival[f"{k}_after"], "net": net, "net_se": in_se})
                cells.append(f"{100 * net:+.1f} ({rival['variant'] + '; ' if b is None else ''}{_in_se_text(in_se)})")
            nets.append([f"{a['variant']} - {'best control' if b is None else b['variant']}", SET_TITLES[set_name],
                         *cells])
    controls_named = ", ".join(f"`{c}` ({REGISTRY[c].doc})" for c in OPSD_CONTROLS)
    text = ["", "On-policy self-distillation (OPSD) beside its controls (mean over seeds, %): " + controls_named + ".",
            "", *means, "", "Each OPSD method minus each control and minus the best control, and RLPR minus each "
            "OPSD method: the difference in points (in standard errors of the difference, as above).", "",
            *md_table(["comparison", "set", *(label for _, label in METRICS)], nets),
            "", "Collapse monitors and the reward's cost per step of these rows (as above):", "", *monitor_table(shown)]
    return rows, "\n".join(text) + "\n"


def transfer_table(table: list[dict], base: dict) -> str:
    """In-family held-out beside the transfer sets: Avg@k and greedy, before -> after (mean ± sd over
    seeds), and per seed the change in binomial standard errors of the base."""
    sets = _sets(base)
    if len(sets) == 1:
        return ""
    head = ["variant", "seeds", *(f"{SET_TITLES[s]} ({n} q) {m}" for s, n, _ in sets for m in ("Avg@k", "greedy"))]
    rows = []
    for e in table:
        cells = []
        for _, _, prefix in sets:
            for k in ("acc", "greedy"):
                after = e.get(f"{prefix}{k}_after")
                if after is None:
                    cells.append("n/a")
                    continue
                spread = f" ± {100 * e[f'{prefix}{k}_after_sd']:.1f}" if len(e["seeds"]) > 1 else ""
                changes = e.get(f"{prefix}{k}_change_se") or []
                per_seed = f" ({', '.join(f'{c:+.1f}' for c in changes)})" if e["variant"] != "base" else ""
                cells.append(f"{100 * e[f'{prefix}{k}_before']:.1f} -> {100 * after:.1f}{spread}{per_seed}")
        rows.append([e["variant"], len(e["seeds"]), *cells])
    return "\n".join(["", "Transfer: the same runs on questions of other sets (never trained on); before -> after, "
                      "mean ± sd over seeds (per-seed change in SEs of the base).", "", *md_table(head, rows)]) + "\n"

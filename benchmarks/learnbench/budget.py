"""Comparisons fair in compute as well as in steps (issue 61): each variant's held-out Avg@k after its
steps, and its learning curve read at one number of generated responses (rollouts), the same for all.

A run's curve: the base model at 0 rollouts, its curve points (each records the responses generated so
far), and its final evaluation restricted to the curve's questions (from the saved responses), so that
every point of one curve is on the same questions. Between two points the curve is read linearly in
rollouts. The budget is the fewest rollouts any run generated, so every run reaches it."""

from __future__ import annotations

import math
import statistics

from harness.files import table

from .records import graded_numbers


def curve(row: dict, records: list[dict]) -> list[tuple[float, float]]:
    """(rollouts, Avg@k on the curve's questions) of one run, in rollout order; [] without a curve or
    without rollouts recorded (rows from before issue 61)."""
    points = [(p["rollouts"], p["acc_curve"]) for p in row.get("curve", []) if p.get("rollouts") is not None]
    uids = {r["uid"] for r in records if r["set"] == "curve"}
    final = [r for r in records if r["set"] == "heldout" and r["uid"] in uids]
    if not points or not final or row.get("rollouts") is None:
        return []
    return sorted(points + [(row["rollouts"], graded_numbers(final)["acc"])])


def read_at(points: list[tuple[float, float]], budget: float) -> float:
    """The curve's Avg@k at `budget` rollouts, linear between the points around it (nan past its end)."""
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if x0 <= budget <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (budget - x0) / (x1 - x0)
    return math.nan


def _spread(values: list[float]) -> tuple[float, float]:
    """Mean and its standard error over seeds (0 with one seed)."""
    mean = statistics.fmean(values)
    return mean, (statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else 0.0)


def _mean_or_none(values: list) -> float | None:
    """The mean of what was recorded (rows from before issue 61 record no rollouts or wall time)."""
    known = [v for v in values if v is not None]
    return statistics.fmean(known) if known else None


def compare(runs: list[dict], reference: str = "rlpr") -> dict:
    """`runs`: {variant, seed, steps, acc_after, n_heldout, rollouts, wall_s, curve_points, n_curve}. Per variant:
    seeds, mean Avg@k after (equal steps) and at the common budget (equal rollouts), each with its SE
    (the seeds' spread plus the binomial error over the questions), rollouts and wall time, and each
    difference from `reference` in SEs of the difference."""
    budget = min((r["rollouts"] for r in runs if r["curve_points"]), default=None)
    by_variant: dict[str, dict] = {}
    for run in runs:
        t = by_variant.setdefault(run["variant"], {"seeds": [], "steps": [], "budget": [], "rollouts": [], "wall_s": []})
        t["seeds"].append(run["seed"])
        t["steps"].append(run["acc_after"])
        t["budget"].append(read_at(run["curve_points"], budget) if budget is not None and run["curve_points"]
                           else math.nan)
        t["rollouts"].append(run["rollouts"])
        t["wall_s"].append(run["wall_s"])
        t["n_heldout"], t["n_curve"] = run["n_heldout"], run["n_curve"]
    out = {"budget_rollouts": budget, "reference": reference, "steps": max(r["steps"] for r in runs), "variants": {}}
    for name, t in by_variant.items():
        row = {"seeds": t["seeds"], **{k: _mean_or_none(t[k]) for k in ("rollouts", "wall_s")}}
        for key, n in (("steps", t["n_heldout"]), ("budget", t["n_curve"])):
            values = [v for v in t[key] if not math.isnan(v)]
            if not values:
                continue
            mean, seed_se = _spread(values)
            row[key] = mean
            row[f"{key}_se"] = math.sqrt(seed_se ** 2 + mean * (1 - mean) / max(n, 1))
        out["variants"][name] = row
    ref = out["variants"].get(reference)
    for name, row in out["variants"].items():
        for key in ("steps", "budget"):
            if ref is None or name == reference or key not in row or key not in ref:
                continue
            error = math.hypot(row[f"{key}_se"], ref[f"{key}_se"])
            row[f"{key}_diff"] = row[key] - ref[key]
            row[f"{key}_diff_in_se"] = row[f"{key}_diff"] / error if error else math.nan
    return out


def markdown(result: dict) -> list[str]:
    """The comparison as markdown lines (percentages; differences from the reference in SEs)."""
    ref = result["reference"]

    def pct(row, key):
        return f"{100 * row[key]:.1f} +- {100 * row[key + '_se']:.1f}" if key in row else "n/a"

    def diff(row, key):
        if f"{key}_diff" not in row:
            return "" if key in row else "n/a"
        return f"{100 * row[key + '_diff']:+.1f} ({row[key + '_diff_in_se']:+.1f})"

    def count(value):
        return "n/a" if value is None else f"{value:.0f}"

    return table(["variant", "seeds", "rollouts (mean)", "training s (mean)", f"Avg@8 after {result['steps']} steps",
                  f"- {ref} (SE)", f"Avg@8 at {result['budget_rollouts'] or 'equal'} rollouts", f"- {ref} (SE)"],
                 ([name, len(row["seeds"]), count(row["rollouts"]), count(row["wall_s"]), pct(row, "steps"),
                   diff(row, "steps"), pct(row, "budget"), diff(row, "budget")]
                  for name, row in result["variants"].items()))

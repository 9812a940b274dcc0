"""One self-contained HTML page for one run or several: plots as base64 PNGs (matplotlib, Agg,
no pyplot state), tables for the held-out before -> after, the config differences and a sample of
responses with their scores. Only the keys present in the runs are plotted.

A run directory is input like any other (issue 29): every value read from it goes through
`html.escape` before it reaches the page (`_fmt`, `_text`), and every text drawn by matplotlib has
its `$` escaped (`_mpl`), so that a metric key or run name is never parsed as mathtext."""

from __future__ import annotations

import base64
import html
import io
import json
import time

from rlpr.errors import ConfigError
from rlpr.report.data import RunData, _number, config_differences, held_out, pick_samples

# (title, [(key, label)], y label): one panel each, drawn when any run has one of its keys.
TRAIN_PANELS = [
    ("Reward (mean)", [("reward/mean", "reward")], ""),
    ("Score B (policy's probability of the reference)", [("reward/score_b_mean", "score B")], ""),
    ("Score A (debiasing baseline)", [("reward/score_a_mean", "score A")], ""),
    ("Format rate", [("reward/format_rate", "format")], "fraction"),
    ("Accuracy (graded responses)", [("reward/accuracy", "accuracy")], "fraction"),
    ("Std filter: kept fraction", [("filter/kept_frac", "kept")], "fraction"),
    ("Std filter: threshold and EMA std", [("filter/threshold", "threshold"), ("filter/ema_std", "EMA std")], ""),
    # what filling the batch costs and buys (algorithm.max_sampling_tries, algorithm.refill)
    ("Groups per step", [("filter/generated_groups", "generated"), ("filter/passed_groups", "passed the filter"),
                         ("policy/groups", "trained on")], "groups"),
    ("Rollouts generated (cumulative)", [("rollout/responses_total", "responses")], "responses"),
    ("Response length", [("rollout/response_len_mean", "mean")], "tokens"),
    ("Entropy", [("policy/entropy", "entropy")], "nats/token"),
    # collapse monitors (rlpr.train.metrics.COLLAPSE_WARNINGS): intrinsic rewards rise, then fall
    ("Collapse: answers per group", [("rollout/distinct_answers", "distinct extracted answers")], "answers"),
    ("Collapse: identical responses", [("rollout/identical_frac", "share equal to the group's most common"),
                                       ("rollout/distinct_frac", "distinct responses / group size")], "fraction"),
    ("KL to the initial policy", [("policy/kl", "KL")], ""),
    ("Clip fraction", [("policy/clip_frac", "clipped")], "fraction"),
    ("Gradient norm", [("policy/grad_norm", "grad norm")], ""),
    ("Advantage scale", [("policy/adv_abs_mean", "mean |A| over trained tokens")], ""),
    ("Peak memory", [("perf/peak_rss_gb", "peak RSS"), ("perf/peak_gpu_gb", "peak GPU")], "GiB"),
    # OPSD (reward.kind=opsd*, docs/opsd.md): the identity check and the teacher's signal
    ("OPSD identity: OPSD sum vs RLPR's log reward", [("opsd/identity_pearson", "Pearson r"),
                                                      ("opsd/identity_spearman", "Spearman rho")], "correlation"),
    ("OPSD identity: mean gap (OPSD sum - RLPR's log reward)", [("opsd/identity_mean_gap", "mean gap")], "nats"),
    ("OPSD: teacher vs student per token", [("opsd/log_ratio_mean", "log teacher - log student"),
                                            ("opsd/jsd", "JSD to the teacher")], "nats"),
    ("OPSD: token advantages", [("opsd/adv_mean", "mean advantage"), ("opsd/clip_frac", "clipped fraction"),
                                ("opsd/no_teacher_frac", "no-teacher: marked fraction")], ""),
]
PHASES = [("perf/rollout_s", "rollout"), ("perf/reward_s", "reward"), ("perf/teacher_s", "OPSD teacher"),
          ("perf/identity_s", "OPSD identity"), ("perf/update_s", "update")]
# eval/ keys that are counts or standard errors, not curves
EVAL_SKIP = ("eval/questions", "eval/samples")
HELD_OUT_ROWS = [("accuracy", "eval/accuracy", "eval/accuracy_se"),
                 ("greedy accuracy", "eval/greedy_accuracy", "eval/greedy_accuracy_se"),
                 ("mean reward (greedy)", "eval/reward_mean", None),
                 ("score B (greedy)", "eval/score_b_mean", None),
                 ("format rate", "eval/format_rate", None),
                 ("response length", "eval/response_len_mean", None)]
COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf"]

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px auto;max-width:1180px;
color:#222;padding:0 16px}h1{font-size:1.5em}h2{font-size:1.2em;border-bottom:1px solid #ddd;padding-bottom:4px;
margin-top:32px}table{border-collapse:collapse;margin:8px 0;font-size:.9em}td,th{border:1px solid #ddd;
padding:4px 8px;text-align:left;vertical-align:top}th{background:#f4f4f4}td.num{text-align:right;
font-variant-numeric:tabular-nums;white-space:nowrap}.grid{display:grid;
grid-template-columns:repeat(auto-fill,minmax(360px,1fr));gap:8px}.grid img{width:100%;border:1px solid #eee}
.muted{color:#777}.resp{white-space:pre-wrap;font-family:ui-monospace,monospace;font-size:.85em;max-width:640px}
.up{color:#1a7f37}.down{color:#cf222e}
"""


def _require_matplotlib():
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: F401
        from matplotlib.figure import Figure  # noqa: F401
    except ImportError:
        raise ConfigError("rlpr report needs matplotlib (pip install matplotlib)") from None


def _png(fig) -> bytes:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    return buf.getvalue()


def _mpl(text: str) -> str:
    """Text for matplotlib, drawn as written: a `$` would start mathtext (and `$\\frac{$` fails)."""
    return str(text).replace("$", r"\$")


def _figure():
    from matplotlib.figure import Figure

    fig = Figure(figsize=(4.6, 3.0), layout="constrained")
    return fig, fig.add_subplot()


def _style(ax, title: str, ylabel: str, legend: bool, steps=()) -> None:
    ax.set_title(_mpl(title), fontsize=10)
    ax.set_xlabel("step", fontsize=9)
    if ylabel:
        ax.set_ylabel(_mpl(ylabel), fontsize=9)
    ax.tick_params(labelsize=8)
    ax.ticklabel_format(axis="y", useOffset=False)  # 10.7899, not 0.0009 under "+1.0789e1"
    ax.grid(alpha=0.3)
    from matplotlib.ticker import MaxNLocator

    if steps and max(steps) - min(steps) < 6:  # a few steps: one tick each, half a step of margin
        ax.set_xlim(min(steps) - 0.5, max(steps) + 0.5)
        ax.set_xticks(range(min(steps), max(steps) + 1))
    else:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if legend:
        ax.legend(fontsize=7)


def error_bars(values: list[float], errs: list[float], bounds: tuple[float, float] | None) -> list[list[float]]:
    """matplotlib's [below, above] error bar lengths: +-1 SE, cut at `bounds` (an accuracy's bar
    never reaches below 0 or above 1)."""
    if bounds is None:
        return [list(errs), list(errs)]
    low, high = bounds
    return [[max(0.0, min(e, v - low)) for v, e in zip(values, errs)],
            [max(0.0, min(e, high - v)) for v, e in zip(values, errs)]]


def line_panel(runs: list[RunData], title: str, keys: list[tuple[str, str]], ylabel: str,
               se: dict[str, str] | None = None, bounds: tuple[float, float] | None = None) -> bytes | None:
    """One panel: a line per (run, key) present, with +-1 SE bars for keys in `se` (cut at `bounds`);
    None when no run has any of the keys."""
    fig, ax = _figure()
    drawn, all_steps = 0, set()
    for i, run in enumerate(runs):
        for j, (key, label) in enumerate(keys):
            steps, values = run.series(key)
            if not steps:
                continue
            all_steps.update(steps)
            name = _mpl(" ".join(x for x in (run.name if len(runs) > 1 else "", label if len(keys) > 1 else "") if x))
            color = COLORS[(i if len(runs) > 1 else j) % len(COLORS)]
            style = "-" if len(runs) == 1 or j == 0 else "--"
            if se and key in se:
                errs = dict(zip(*run.series(se[key])))
                yerr = error_bars(values, [errs.get(s, 0.0) for s in steps], bounds)
                ax.errorbar(steps, values, yerr=yerr, fmt="o" + style,
                            color=color, label=name or None, capsize=3, markersize=4)
            else:
                ax.plot(steps, values, style, marker="o", markersize=3, color=color, label=name or None)
            drawn += 1
    if not drawn:
        return None
    _style(ax, title, ylabel, legend=drawn > 1, steps=all_steps)
    return _png(fig)


def phase_panel(run: RunData, multi: bool) -> bytes | None:
    """Step time split by phase (rollout, reward, update) as stacked bars; the rest of perf/step_s
    (filtering, old log-probs, logging) on top as "other"."""
    series = {key: dict(zip(*run.series(key))) for key, _ in PHASES}
    steps = sorted(set().union(*series.values()))
    if not steps:
        return None
    fig, ax = _figure()
    bottom = [0.0] * len(steps)
    for (key, label), color in zip(PHASES, COLORS):
        if not series[key]:  # a phase this run does not have (the OPSD teacher)
            continue
        heights = [series[key].get(s, 0.0) for s in steps]
        ax.bar(steps, heights, bottom=bottom, label=label, color=color, width=0.8)
        bottom = [b + h for b, h in zip(bottom, heights)]
    total = dict(zip(*run.series("perf/step_s")))
    other = [max(total.get(s, b) - b, 0.0) for s, b in zip(steps, bottom)]
    if any(other):
        ax.bar(steps, other, bottom=bottom, label="other", color="#bbbbbb", width=0.8)
    ax.set_ylim(0, 1.3 * max(b + o for b, o in zip(bottom, other)) or 1.0)  # room for the legend above the bars
    _style(ax, "Step time by phase" + (f" ({run.name})" if multi else ""), "seconds", legend=False, steps=steps)
    ax.legend(fontsize=7, ncol=4, loc="upper center")
    return _png(fig)


def _img(png: bytes, alt: str) -> str:
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{base64.b64encode(png).decode()}">'


def _text(v, limit: int = 120) -> str:
    """Any value read from a run directory as escaped HTML text, at most `limit` characters."""
    try:
        text = json.dumps(v, default=str, ensure_ascii=False) if isinstance(v, (list, dict)) else str(v)
    except (TypeError, ValueError, RecursionError):  # a mapping with mixed keys, very deep nesting
        text = f"<{type(v).__name__}>"
    return html.escape(text if len(text) <= limit else text[:limit - 3] + "...")


def _fmt(v, pct: bool = False) -> str:
    if v is None:
        return "&ndash;"
    if not _number(v):  # text, lists, booleans, NaN, numbers beyond float range: shown as text
        return _text(v)
    if pct:
        return f"{100 * v:.1f}%"
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def _is_fraction(key: str) -> bool:
    """A held-out key whose values are fractions (shown as percentages in the table)."""
    return "accuracy" in key or "pass@" in key or "rate" in key


def _held_out_table(runs: list[RunData]) -> str:
    rows = []
    for run in runs:
        before, after = held_out(run)
        if not after:
            continue
        k = after.get("eval/samples")
        spec = list(HELD_OUT_ROWS)
        if k:
            spec[0] = (f"accuracy (Avg@{k})", "eval/accuracy", "eval/accuracy_se")
            spec.insert(2, (f"pass@{k}", f"eval/pass@{k}", None))
        else:
            spec = [s for s in spec if s[1] != "eval/greedy_accuracy"]
            spec[0] = ("accuracy (greedy)", "eval/accuracy", "eval/accuracy_se")
        for label, key, se in spec:
            if key not in after:
                continue
            pct = _is_fraction(key)
            cells = []
            for side in (before, after):
                v = side.get(key)
                text = _fmt(v, pct)
                if se and side.get(se) is not None and v is not None:
                    text += f" &plusmn; {_fmt(side[se], pct)}"
                cells.append(text)
            a, b = before.get(key), after.get(key)
            delta = ""
            if _number(a) and _number(b):
                d = b - a
                # green up, red down where higher is better; a length that moves is neither
                cls = "" if "len" in key else "up" if d > 0 else "down" if d < 0 else ""
                text = f"{100 * d:+.1f} pp" if pct else f"{d:+.4g}"
                delta = f'<span class="{cls}">{text}</span>'
            name = f"<td>{html.escape(run.name)}</td>" if len(runs) > 1 else ""
            rows.append(f"<tr>{name}<td>{html.escape(label)}</td><td class=num>{cells[0]}</td>"
                        f"<td class=num>{cells[1]}</td><td class=num>{delta}</td></tr>")
    if not rows:
        return '<p class="muted">No held-out evaluation in these runs (data.val is empty).</p>'
    head = "<th>run</th>" if len(runs) > 1 else ""
    n = next((held_out(r)[1].get("eval/questions") for r in runs if held_out(r)[1]), None)
    note = f'<p class="muted">{_fmt(n)} held-out questions; &plusmn; one binomial standard error.</p>' if n else ""
    return (f"<table><tr>{head}<th>metric</th><th>before</th><th>after</th><th>change</th></tr>"
            + "".join(rows) + "</table>" + note)


def _config_table(runs: list[RunData]) -> str:
    what, diffs = config_differences(runs)
    if not diffs:
        return f'<p class="muted">No configuration differences {what}.</p>'
    heads = [html.escape(r.name) for r in runs] if len(runs) > 1 else ["this run", "default"]
    rows = "".join(f"<tr><td><code>{html.escape(k)}</code></td>"
                   + "".join(f"<td>{_fmt(v)}</td>" for v in values) + "</tr>" for k, values in diffs.items())
    return (f"<p class=muted>Keys that differ {what}.</p><table><tr><th>key</th>"
            + "".join(f"<th>{h}</th>" for h in heads) + f"</tr>{rows}</table>")


def _plain(v) -> str:
    """A sample's text field as a string (not yet escaped)."""
    try:
        return v if isinstance(v, str) else json.dumps(v, default=str, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError):
        return f"<{type(v).__name__}>"


def _samples_table(run: RunData, limit_chars: int = 700) -> str:
    rows = pick_samples(run.samples)
    if not rows:
        return f'<p class="muted">{html.escape(run.name)}: no samples (trainer.sample_every=0).</p>'
    cols = [c for c in ("reward", "score_b", "score_a", "format", "correct") if any(c in r for r in rows)]
    out = [f"<p class=muted>{html.escape(run.name)}, step {_fmt(run.samples_step)}: for each of the first "
           f"prompts, the best and the worst response by reward.</p><table><tr><th>prompt</th>"
           f"<th>reference</th><th>response</th>" + "".join(f"<th>{c}</th>" for c in cols) + "</tr>"]
    for r in rows:
        response = _plain(r.get("response", ""))
        if len(response) > limit_chars:
            response = response[:limit_chars] + " [...]"
        out.append(f"<tr><td>{html.escape(_plain(r.get('prompt', ''))[:300])}</td>"
                   f"<td>{html.escape(_plain(r.get('reference', ''))[:200])}</td>"
                   f"<td class=resp>{html.escape(response)}</td>"
                   + "".join(f"<td class=num>{_fmt(r.get(c))}</td>" for c in cols) + "</tr>")
    return "".join(out) + "</table>"


def _last_values(runs: list[RunData]) -> str:
    keys = sorted(set().union(*(r.keys() for r in runs)))
    if not keys:
        return ""
    head = "".join(f"<th>{html.escape(r.name)}</th>" for r in runs)
    rows = "".join(f"<tr><td><code>{html.escape(k)}</code></td>"
                   + "".join(f"<td class=num>{_fmt(r.first_last(k)[1])}</td>" for r in runs) + "</tr>"
                   for k in keys)
    return (f"<details><summary>Every logged key, last value</summary><table><tr><th>key</th>{head}</tr>"
            f"{rows}</table></details>")


def constant_value(runs: list[RunData], keys: list[str]) -> float | None:
    """The one value that every series of `keys` present in `runs` holds at every step (each
    logged at two steps at least), else None: a flat line that says nothing a number does not."""
    values, series = set(), 0
    for run in runs:
        for key in keys:
            steps, logged = run.series(key)
            if not steps:
                continue
            if len(steps) < 2:
                return None
            values.update(logged)
            series += 1
    return values.pop() if series and len(values) == 1 else None


def _eval_keys(runs: list[RunData]) -> list[str]:
    return sorted({k for r in runs for k in r.keys()
                   if k.startswith("eval/") and not k.endswith("_se") and k not in EVAL_SKIP})


def constant_panels(runs: list[RunData]) -> dict[str, list[tuple[str, float]]]:
    """Section (train, eval) -> [(key, value)] of the panels not drawn because every series in them
    is constant over the run (format rate without a format term, KL at kl_coef=0, ...)."""
    train = [(key, value) for _, keys, _ in TRAIN_PANELS
             if (value := constant_value(runs, [k for k, _ in keys])) is not None
             for key, _ in keys if any(run.series(key)[0] for run in runs)]
    evals = [(key, value) for key in _eval_keys(runs) if (value := constant_value(runs, [key])) is not None]
    return {"train": train, "eval": evals}


def figures(runs: list[RunData]) -> dict[str, list[tuple[str, bytes]]]:
    """Section -> [(title, PNG bytes)]: the training curves, the step time, the held-out curves;
    panels constant over the run are left out (`constant_panels` lists them)."""
    _require_matplotlib()
    train = []
    for title, keys, ylabel in TRAIN_PANELS:
        if constant_value(runs, [k for k, _ in keys]) is not None:
            continue
        png = line_panel(runs, title, keys, ylabel)
        if png:
            train.append((title, png))
    perf = [(f"Step time {r.name}", png) for r in runs if (png := phase_panel(r, len(runs) > 1))]
    evals = []
    for key in _eval_keys(runs):
        if constant_value(runs, [key]) is not None:
            continue
        label = key[5:].replace("_mean", "").replace("_", " ")
        title = f"Held-out: {label}"
        fraction = _is_fraction(key)
        png = line_panel(runs, title, [(key, label)], "fraction" if fraction else "",
                         se={key: key + "_se"}, bounds=(0.0, 1.0) if fraction else None)
        if png:
            evals.append((title, png))
    return {"train": train, "perf": perf, "eval": evals}


def render_html(runs: list[RunData], figs: dict | None = None) -> str:
    """The report page for `runs` (one or more); `figs`: `figures(runs)` if already drawn."""
    if not runs:
        raise ConfigError("rlpr report: name at least one run directory")
    figs = figs if figs is not None else figures(runs)
    names = ", ".join(r.name for r in runs)
    title = f"rlpr report: {names}"
    def model_path(r):
        model = r.config.get("model")
        return model.get("path", "") if isinstance(model, dict) else ""

    meta = "".join(
        f"<tr><td>{html.escape(r.name)}</td><td><code>{html.escape(str(r.path))}</code></td>"
        f"<td class=num>{r.steps}</td><td class=num>{_fmt(r.first_last('rollout/responses_total')[1])}</td>"
        f"<td>{_text(r.config.get('preset', ''))}</td>"
        f"<td><code>{_text(model_path(r), 300)}</code></td>"
        f"<td>{'interrupted' if r.summary.get('interrupted') else 'finished' if r.summary else 'running or crashed'}"
        f"</td></tr>" for r in runs)

    def grid(items):
        return '<div class="grid">' + "".join(_img(png, t) for t, png in items) + "</div>"

    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>",
        f"<style>{CSS}</style></head><body><h1>{html.escape(title)}</h1>",
        f"<p class=muted>Written {time.strftime('%Y-%m-%d %H:%M')} by <code>rlpr report</code>.</p>",
        ("<table><tr><th>run</th><th>directory</th><th>steps</th><th>rollouts</th><th>preset</th><th>model</th>"
         "<th>state</th></tr>"),
        meta, "</table>",
        "<h2>Held-out evaluation, before &rarr; after</h2>", _held_out_table(runs),
    ]
    constant = constant_panels(runs)

    def folded(section):
        if not constant[section]:
            return ""
        listed = ", ".join(f"<code>{html.escape(k)}</code> {_fmt(v)}" for k, v in constant[section])
        return f'<p class="muted constant">Not drawn, constant over the run: {listed}</p>'

    if figs["eval"] or constant["eval"]:
        parts += ["<h2>Held-out evaluations over steps</h2>", grid(figs["eval"]), folded("eval")]
    if figs["train"] or constant["train"]:
        parts += ["<h2>Training</h2>", grid(figs["train"]), folded("train")]
    if figs["perf"]:
        parts += ["<h2>Step time</h2>", grid(figs["perf"])]
    parts += ["<h2>Configuration</h2>", _config_table(runs), "<h2>Sample responses</h2>"]
    parts += [_samples_table(r) for r in runs]
    parts += ["<h2>All metrics</h2>", _last_values(runs), "</body></html>"]
    return "\n".join(parts)


def write_pngs(figs: dict, folder) -> list:
    """The report's plots (`figures(runs)`) as PNG files in `folder`, one per panel."""
    from pathlib import Path

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for section, items in figs.items():
        for title, png in items:
            # ASCII letters and digits only, and short: a title holds metric keys and run names
            slug = "".join(c if c.isascii() and c.isalnum() else "_" for c in title.lower()).strip("_")[:80]
            path = folder / f"{section}-{slug}.png"
            if path in written:  # two titles alike once cut
                path = folder / f"{section}-{slug}-{len(written)}.png"
            path.write_bytes(png)
            written.append(path)
    return written

"""gpu_check.json and gpu_check.md, a section per part; `resummarize` rewrites a report from its JSON."""

from __future__ import annotations

import json
from pathlib import Path

from gpubench.decode_report import report_lines as decode_lines
from gpubench.learning import report_lines as learning_lines
from gpubench.learning import summarize
from gpubench.markdown import fmt, section
from gpubench.train import PHASES, PLAN_TOLERANCE
from harness.files import table
from learnbench.rows import load_rows


def write_report(out: Path, report: dict) -> None:
    (out / "gpu_check.json").write_text(json.dumps(report, indent=1, default=str))
    env = report.get("environment", {})
    lines = ["# rlpr GPU check", "",
             f"{report['started']}; device **{env.get('gpu', env.get('device'))}**; torch {env.get('torch')} "
             f"(CUDA {env.get('cuda')}), transformers {env.get('transformers')}, Python {env.get('python')}; "
             f"commit {env.get('commit', 'not recorded')}; "
             f"wall {fmt(report.get('wall_s'), '.0f')} s of a {report['budget_s']:.0f} s budget.", "",
             f"Command: `{report['command']}`", ""]
    lines += report.get("notes", [])  # what a person wrote of the run (kept when the report is rewritten)
    unmet = {k: v for k, v in env.get("requirements", {}).items() if not v[2]}
    if unmet:
        lines += [f"rlpr's requirements not met here: {unmet}", ""]
    if not env.get("rlpr_source", {}).get("matches_tree", True):
        lines += ["**rlpr was imported from files that differ from this tree** "
                  f"({env['rlpr_source']['path']}): rebuild the wheel.", ""]
    t = report.get("cuda_tests")
    if t:
        lines += ["## CUDA tests (tests/test_cuda.py)", "",
                  f"{t.get('tests', '?')} tests: {t.get('failures', '?')} failed, {t.get('errors', '?')} errors, "
                  f"{t.get('skipped', '?')} skipped ({fmt(t.get('seconds'), '.0f')} s)" + (f"; {t['error']}" if "error" in t else ""), ""]
        lines += [f"- FAILED {f}" for f in t.get("failed", [])] + ([""] if t.get("failed") else [])
    for name, r in report.get("models", {}).items():
        lines += section(f"## {name}: `--preset paper`, one device", r, model_lines)
    if s := report.get("score_b"):
        lines += section("## Score B on the device against the CPU in fp32", s, lambda s: [
            f"{s['shape']}, {s['texts']} texts ({', '.join(map(str, s['scored_tokens']))} reference tokens):",
            *(f"- {name}: max |log-prob diff| {s[name]['max_abs_logprob_diff']:.3g}, "
              f"max |score B diff| {s[name]['max_abs_score_b_diff']:.3g}" for name in ("fp32", "bf16_autocast") if name in s),
            ""])
    if r := report.get("resume"):
        lines += section("## Resume on the device", r, lambda r: [
            f"{r['shape']}: 3 steps, resumed from step 2: step 3's weights "
            f"{'bitwise equal' if r['bitwise'] else 'differ'} (max |diff| {r['max_abs_weight_diff']:.3g}, "
            f"{r['relative_to_step3_change']:.3g} of step 3's own change {r['step3_max_abs_change']:.3g}; "
            f"tolerance {r['tolerance']:g}): **{'passed' if r['passed'] else 'FAILED'}**; "
            f"step-3 metrics that differ: {r['step3_metrics_that_differ'] or 'none'}.", ""])
    if report.get("decode"):
        lines += decode_lines(report["decode"])
    if report.get("learning_cuda"):
        lines += learning_lines(report["learning_cuda"])
    if report.get("errors"):
        lines += ["## Errors", ""] + [f"- {e}" for e in report["errors"]] + [""]
    (out / "gpu_check.md").write_text("\n".join(lines))


def model_lines(r: dict) -> list[str]:
    """A trained shape's section: its steps' times and throughput, and each phase's memory against the plan."""
    plan = r["plan"]
    lines = [f"{r['params']:,} parameters; {r['steps']} steps of 4 prompts x 8 responses, "
             f"{r['prompt_tokens']}-token prompts (longest), responses forced to {r['response_tokens']} tokens; "
             f"model built in {r['model_built_s']:.0f} s, training {r['train_wall_s']:.0f} s.", "",
             f"- step time (s): {', '.join(fmt(v, '.1f') for v in r['step_s'])}",
             f"- rollout tokens/s: {', '.join(fmt(v, '.0f') for v in r['rollout_tok_s'])}",
             f"- update tokens/s (forward + backward + step, prompt and response tokens): "
             f"{fmt(r['update_tok_s'], '.0f')}"]
    per_step = {ph: r["phases"][ph].get("seconds_per_step") for ph in PHASES}
    if all(per_step.values()):  # (the first GPU run predates them)
        lines.append("- seconds per step, by phase: " + "; ".join(
            f"{ph} {', '.join(fmt(v, '.1f') for v in per_step[ph].values())}" for ph in PHASES))
    return lines + ["", *table(["phase", "seconds", "allocated GiB", "reserved GiB", "plan GiB (runtime term)",
                                "allocated / (plan - runtime)"], (
        [ph, f"{p['seconds']:.1f}", fmt(p.get("allocated_gib")), fmt(p.get("reserved_gib")),
         f"{plan['phases_gib'][ph]:.2f} ({plan['runtime_term_gib']:.2f})",
         fmt((r.get("measured_over_plan") or {}).get(ph), ".3f")]
        for ph, p in ((ph, r["phases"][ph]) for ph in PHASES)), ["---"] + ["---:"] * 5),
        "", f"Plan peak {plan['peak_gib']:.2f} GiB in the {plan['peak_phase']} phase; "
        f"CUDA context outside the allocator {fmt(r.get('cuda_context_gib'))} GiB; "
        f"plan within {PLAN_TOLERANCE:.0%} in every phase: **{r.get('plan_holds')}**.", ""]


def resummarize(report_path: Path, rows_path: Path) -> dict:
    """Recompute the `learning_cuda` comparisons of a gpu_check.json from the GPU rows (learning_cuda.jsonl)
    against the CPU table as it is now, and rewrite the report's .json and .md."""
    report = json.loads(report_path.read_text())
    part = report["learning_cuda"]
    part.update(summarize(load_rows(rows_path), part["steps"], part["seed"]))
    write_report(report_path.parent, report)
    return part

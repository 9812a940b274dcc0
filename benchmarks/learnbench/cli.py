"""`python benchmarks/learning.py`: the flags, the job list that several workers share, and the summary."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from harness import record

from .plots import plot
from .records import responses_path, write_records
from .regrade import regrade, unfinished_jobs
from .rows import (append_row, claim, free_responses_path, grader_version, private_dir, read_rows, reuse_base,
                   transfer_fingerprint)
from .runner import run_base, run_one, scorer_overrides
from .tables import controls_verdict, opsd_verdict, summarise
from .variants import (DEFAULT_VARIANTS, MAIN_VARIANTS, MODEL_TITLES, MODELS, RESULTS, SET_TITLES, TRANSFER, VARIANTS,
                       describe)


def parse_args(description: str, argv: list[str] | None = None) -> argparse.Namespace:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--preset", default="small")
    parser.add_argument("--quick", action="store_true", help="1 seed, rlpr only, 4 steps, 40 held-out questions, "
                                                             "20 per transfer set, 2 samples each (a smoke "
                                                             "setting, not a result)")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--heldout", type=int, default=203,
                        help="held-out questions (demo val split; the small preset holds out 203)")
    parser.add_argument("--transfer-questions", type=int, default=0,
                        help="questions per transfer set (the first N of each file; 0: all; -1: none)")
    parser.add_argument("--samples", type=int, default=8, help="k of Avg@k and pass@k")
    parser.add_argument("--curve-every", type=int, default=10, help="held-out curve point every N steps (0: none)")
    parser.add_argument("--curve-questions", type=int, default=50)
    parser.add_argument("--variants", default=",".join(DEFAULT_VARIANTS),
                        help="comma-separated (see --list-variants; the precision arms run only when named)")
    parser.add_argument("--list-variants", action="store_true", help="print every variant's overrides and exit")
    parser.add_argument("--set", nargs="*", default=[], help="extra config overrides for every run")
    parser.add_argument("--model", choices=list(MODELS), default="smollm2",
                        help="the model family: the embedded SmolLM2-135M-Instruct or Gemma 3 270M (base)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: all cores)")
    parser.add_argument("--output", default=str(RESULTS / "learning"))
    parser.add_argument("--summary", default=None,
                        help="path prefix of the summary (.md, .json, .png; default: --output's): runs of other "
                             "settings (--steps 60) share --output's .jsonl and its base row, not its summary")
    parser.add_argument("--reverse", action="store_true", help="take jobs in reverse order (a second worker)")
    parser.add_argument("--report", action="store_true", help="only summarise the runs already in the .jsonl")
    parser.add_argument("--regrade", action="store_true",
                        help="re-grade the saved responses of the runs in the .jsonl (these settings) with the "
                             "current grader, rewrite their rows, then summarise; trains nothing")
    parser.add_argument("--workdir", default=None,
                        help="where runs and job claims go (default: a private rlpr-learning-UID folder in the "
                             "temporary folder)")
    parser.add_argument("--teacher-gap", action="store_true",
                        help="only measure the preset's families: base greedy, Avg@k, pass@k and the self-teacher "
                             "gap (the model shown each question's worked solution), to "
                             "results/self_teacher_gap.{md,json} (learnbench/teacher_gap.py)")
    parser.add_argument("--gap-questions", type=int, default=24, help="--teacher-gap: training questions per family")
    if "--quick" in argv:  # smaller defaults; flags given explicitly still win
        parser.set_defaults(seeds=1, steps=4, heldout=40, transfer_questions=20, samples=2, variants="rlpr",
                            curve_every=2, curve_questions=10, output=str(RESULTS / "learning_quick"))
    return parser.parse_args(argv)


def default_workdir() -> Path:
    """The work folder's default: this user's own in the temporary folder (`rows.private_dir` checks it)."""
    import os

    return Path(tempfile.gettempdir()) / f"rlpr-learning-{os.getuid()}"


def job_list(variants: list[str], seeds: int) -> list[tuple]:
    """The base, then the main variants for every seed, then the others seed by seed: a benchmark
    cut short by time still compares RLPR with both RLVRs and the controls (and OPSD with its
    controls) over all seeds."""
    head, tail = [v for v in variants if v in MAIN_VARIANTS], [v for v in variants if v not in MAIN_VARIANTS]
    return [("base", None)] + [(v, s) for s in range(seeds) for v in head] + \
        [(v, s) for v in tail for s in range(seeds)]


def check_configs(preset: str, overrides: list[str], variants: list[str], steps: int) -> None:
    """Every run's config (and the common scorer's) loads, before any job is claimed: a bad --set or
    a variant whose keys this rlpr lacks stops here with one line, not after the base evaluation."""
    from rlpr.config import load_config
    from rlpr.errors import ConfigError

    for name in ["base", *variants]:
        extra = [] if name == "base" else VARIANTS[name]
        try:
            load_config(preset, overrides + extra + ["trainer.seed=0", f"trainer.max_steps={steps}"])
            if name == "base":
                load_config(preset, scorer_overrides(overrides))
        except ConfigError as e:
            sys.exit(f"learning benchmark, variant {name} ({' '.join(extra) or 'the preset'}): {e}")


def run_jobs(args, jobs: list[tuple], settings: dict, overrides: list[str], log_path: Path, workdir: Path) -> None:
    """Run every job of the list that has no row and no live claim, appending each row when its run
    has finished; two passes, the second to take over jobs whose workers ended meanwhile."""
    start = time.time()

    def finished() -> set:
        return {(r["variant"], r["seed"]) for r in read_rows(log_path, settings)}

    def get_base() -> dict:
        while (base := next((r for r in read_rows(log_path, settings) if r["variant"] == "base"), None)) is None:
            if claim(workdir, ("base", None), settings) and ("base", None) not in finished():
                run_job(("base", None))  # nobody evaluates it (its worker ended, or none took it yet)
                continue
            time.sleep(20)  # another worker is evaluating the base model
        return base

    def run_job(job: tuple) -> None:
        print(f"[{time.time() - start:6.0f}s] {job}", flush=True)
        records: list[dict] = []
        if job[0] == "base":
            row = run_base(args.preset, overrides, args.curve_questions if args.curve_every else 0,
                           args.transfer_questions, workdir, records)
        else:
            row = run_one(args.preset, overrides, job[0], job[1], args.steps, args.curve_every,
                          args.curve_questions, args.transfer_questions, get_base, workdir, records)
        path = free_responses_path(log_path, responses_path(log_path, job[0], job[1], settings))
        write_records(path, records)  # before the row: a row always has its responses
        row["responses"] = str(path.relative_to(log_path.parent))
        # where and from what it ran (issue 62): rows of one table come from several machines and commits
        row.update(record.stamp())
        row["settings"] = settings
        row["grader_version"] = settings["grader_version"]
        append_row(log_path, row)
        print({k: v for k, v in row.items() if k not in ("curve", "train", "settings")}, flush=True)

    have = finished()
    ordered = list(reversed(jobs)) if args.reverse else jobs
    for job in ordered + ordered:
        if job in have or not claim(workdir, job, settings):
            continue
        if job in (have := finished()):  # finished meanwhile by a worker that has ended since
            continue
        run_job(job)


def provenance(rows: list[dict]) -> str:
    """The summary's header line on where its rows ran: this summary's commit and date, and the rows'
    CPUs (or GPUs), commits and dates as the rows recorded them (rows from before 2026-12-07 did not)."""
    machines = [r.get("machine") or {} for r in rows]
    where = Counter(m.get("gpu") or m.get("cpu") or "not recorded" for m in machines)
    dates = sorted(r["date"][:10] for r in rows if r.get("date"))
    commits = sorted({r["commit"] for r in rows if r.get("commit")})
    return (f"Summary written at commit {record.commit()}, {record.now()}. Rows' machines: "
            + ", ".join(f"{name} ({n} rows)" for name, n in where.most_common())
            + (f"; rows' commits {', '.join(commits)}, dated {dates[0]} to {dates[-1]}" if dates else "") + ".")


def write_summary(args, settings: dict, log_path: Path) -> None:
    """Every model family's rows (these settings otherwise) in one summary: a section and a plot each."""
    summary = args.summary or args.output
    sections, runs, tables, total = [], [], {}, 0.0
    for model in MODELS:
        mine = {k: v for k, v in settings.items() if k != "model"} | ({"model": model} if model != "smollm2" else {})
        done = read_rows(log_path, mine)
        if not done:
            continue
        table, markdown = summarise(done)
        base = next((r for r in done if r["variant"] == "base"), None)
        tables[model] = {"table": table, "controls": controls_verdict(table, base)[0] if base else []}
        if base and (opsd := opsd_verdict(table, base)[0]):
            tables[model]["opsd"] = opsd
        sections.append((f"## {MODEL_TITLES[model]}\n\n" if model != "smollm2" or len(MODELS) > 1 else "") + markdown)
        runs += done
        total += sum(r["seconds"] for r in done)
        plot(done, Path(summary + ("" if model == "smollm2" else f"_{model}") + ".png"))
    transfer = "; no transfer sets" if args.transfer_questions < 0 else (
        f"; transfer: {', '.join(f'{SET_TITLES[s]} ({TRANSFER[s].name})' for s in TRANSFER)}"
        f"{f', first {args.transfer_questions} questions of each' if args.transfer_questions else ''}")
    header = (f"Learning benchmark: preset `{args.preset}` {' '.join(args.set)}, {args.steps} steps per run, "
              f"{args.heldout} held-out questions x {args.samples} samples (Avg@{args.samples}) + greedy{transfer}; "
              f"graded with grader version {settings['grader_version']}; "
              f"'change in SEs' = (after - base) / binomial SE of the base over the set's questions, per seed; "
              f"runs took {total / 60:.0f} min in sum (workers overlap).\n\n{provenance(runs)}\n\n")
    markdown = "\n".join(sections)
    Path(summary + ".md").write_text(header + markdown)
    main_model = tables.get("smollm2", {"table": [], "controls": []})
    from rlpr.errors import json_safe  # strict JSON: an undefined number (0/0, no seed spread) is null

    Path(summary + ".json").write_text(json.dumps(json_safe({
        "settings": settings, "total_minutes": total / 60, "table": main_model["table"],
        "controls": main_model["controls"], "models": tables, "runs": runs}), indent=1, allow_nan=False))
    print(header + markdown)


def main(description: str = "The learning benchmark", argv: list[str] | None = None) -> int:
    args = parse_args(description, argv)
    if args.teacher_gap:
        from .teacher_gap import main as teacher_gap

        return teacher_gap(args)
    if args.list_variants:
        print(describe())
        return 0
    variants = [v for v in args.variants.split(",") if v]
    for v in variants:
        if v not in VARIANTS:
            sys.exit(f"--variants: unknown variant {v!r} (have {', '.join(VARIANTS)})")
    workdir = Path(args.workdir) if args.workdir else private_dir(default_workdir())
    workdir.mkdir(parents=True, exist_ok=True)
    log_path = Path(args.output + ".jsonl")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    overrides = [f"data.demo_val_size={args.heldout}", f"trainer.eval_samples={args.samples}",
                 f"model.threads={args.threads}", *MODELS[args.model], *args.set]
    settings = {"preset": args.preset, "steps": args.steps, "heldout": args.heldout, "samples": args.samples,
                "set": args.set, "transfer_questions": args.transfer_questions, "transfer": transfer_fingerprint(),
                "grader_version": grader_version()}
    if args.model != "smollm2":  # the embedded model's rows keep the settings they were recorded with
        settings["model"] = args.model
    trains = not (args.report or args.regrade)
    if trains:
        check_configs(args.preset, overrides, variants, args.steps)
    if args.regrade:
        if not log_path.exists():
            sys.exit(f"--regrade: {log_path} does not exist")
        running = unfinished_jobs(log_path, settings, workdir)
        if running:
            sys.exit(f"--regrade: {len(running)} job(s) claimed under an older grader version have no row yet "
                     f"({', '.join(running[:4])}{', ...' if len(running) > 4 else ''} in {workdir}/claims): "
                     "their workers would wait forever for a base row moved to the new version. Re-grade when "
                     "they finish, or delete those claim files if nothing runs them")
        regrade(log_path, settings)
    if trains and claim(workdir, ("base_reuse", None), settings):
        reuse_base(log_path, settings)
    read_rows(log_path, settings, report=True)  # says which rows the summary leaves out
    if trains:
        run_jobs(args, job_list(variants, args.seeds), settings, overrides, log_path, workdir)
    write_summary(args, settings, log_path)
    return 0

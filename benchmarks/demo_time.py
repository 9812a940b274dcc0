"""README command 1 as a new user runs it, timed part by part (docs/benchmarks.md): a fresh clone of HEAD,
a fresh virtual environment (seeing this machine's packages) and a fresh rlpr cache, in each mode:
native and avx2 (PyTorch, oneDNN and MKL capped to AVX2: an AVX2 laptop's kernels and `auto` precisions).
Each row holds the held-out accuracies before and
after training, so that a faster demo is seen to learn as before.

    python benchmarks/demo_time.py [--modes native,avx2]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness import files, record

from rlpr.model.precision import AVX2_LAPTOP

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
MODES = {"native": {}, "avx2": AVX2_LAPTOP}
HELD_OUT = ("eval/accuracy", "eval/greedy_accuracy")  # Avg@k and greedy, before and after training
PHASES = ("perf/rollout_s", "perf/reward_s", "perf/update_s", "perf/step_s")


def readme_command() -> list[str]:
    """README's command 1 (the bash line that installs and runs `rlpr train`), split at `&&`."""
    for line in (ROOT / "README.md").read_text().splitlines():
        if line.startswith("pip install") and line.rstrip().endswith("rlpr train"):
            return [part.strip() for part in line.split("&&")]
    raise SystemExit("README.md: no 'pip install ... && rlpr train' line (command 1)")


def run_mode(mode: str, parts: list[str], work: Path) -> dict:
    clone, venv = work / f"clone-{mode}", work / f"venv-{mode}"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    env = {**os.environ, **MODES[mode], "RLPR_CACHE_DIR": str(work / f"cache-{mode}"),
           "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}", "VIRTUAL_ENV": str(venv)}
    env.pop("PYTHONPATH", None)
    times = {}
    log = work / f"{mode}.log"
    with log.open("w") as out:
        for part in parts:
            tick = time.perf_counter()
            done = subprocess.run(part, shell=True, cwd=clone, env=env, stdout=out, stderr=subprocess.STDOUT)
            times[part] = time.perf_counter() - tick
            if done.returncode:
                raise SystemExit(f"{mode}: `{part}` failed (exit {done.returncode}); see {log}")
    [metrics] = list((clone / "runs").glob("*/metrics.jsonl"))
    return {"mode": mode, "env": MODES[mode], **summary(times, parts[-1], metrics)}


def summary(times: dict[str, float], train_part: str, metrics: Path) -> dict:
    """Seconds per part of the command, and the training steps' mean phases from the run's metrics."""
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    steps = [s for s in rows if "perf/step_s" in s]
    evals = [r for r in rows if HELD_OUT[0] in r]
    held_out = {k: [evals[0][k], evals[-1][k]] for k in HELD_OUT if evals and k in evals[0]}
    phases = {p[len("perf/"):-len("_s")]: sum(s.get(p, 0.0) for s in steps) / len(steps) for p in PHASES}
    train_s = times[train_part]
    return {"parts_s": times, "total_s": sum(times.values()), "install_s": sum(times.values()) - train_s,
            "train_s": train_s, "steps": len(steps), "per_step_s": phases,
            "outside_steps_s": train_s - phases["step"] * len(steps), "held_out": held_out}


def history_row(res: dict) -> dict:
    """One run as a row of the canonical file's history table: each mode's total minutes."""
    return {"date": res.get("date", "?"), "machine": res["cpu"], "commit": res.get("commit", "?"),
            "totals": ", ".join(f"{r['mode']} {r['total_s'] / 60:.1f} min" for r in res["runs"]),
            "file": res.get("file", "")}


HISTORY = [("date", "date (UTC)"), ("machine", "machine"), ("commit", "commit"), ("totals", "total"),
           ("file", "its files")]


def markdown(res: dict) -> str:
    rows, cpu = res["runs"], res["cpu"]
    lines = [f"# README command 1, timed ({res.get('date', '?')})", "", files.header(res), "",
             f"{cpu}; a fresh clone, virtual environment (this machine's packages visible: nothing "
             "downloaded) and rlpr cache (the embedded model's conversion included); `python "
             "benchmarks/demo_time.py`. avx2 = PyTorch, oneDNN and MKL capped to AVX2: an "
             "approximation of an AVX2-only laptop on this machine's clock and memory.", ""]

    def held_out(r, key):
        return "{:.1f} -> {:.1f}".format(*(100 * v for v in r["held_out"][key])) if key in r.get("held_out", {}) else "-"

    cells = [("total (install + demo) min", lambda r: f"{r['total_s'] / 60:.1f}"),
             ("install s", lambda r: f"{r['install_s']:.0f}"), ("`rlpr train` s", lambda r: f"{r['train_s']:.0f}"),
             ("steps", lambda r: r["steps"]),
             *((f"{p} s per step", lambda r, p=p: f"{r['per_step_s'][p]:.1f}") for p in ("step", "rollout", "reward", "update")),
             ("outside the steps s (load, convert, evaluations, report)", lambda r: f"{r['outside_steps_s']:.0f}"),
             *((label, lambda r, k=k: held_out(r, k)) for k, label in zip(HELD_OUT, (
                 "held-out Avg@k % before -> after", "held-out greedy % before -> after")))]
    lines += files.table(["", *(r["mode"] for r in rows)], ([label, *map(fn, rows)] for label, fn in cells))
    if len(rows) == 2:
        lines += ["", f"**{rows[1]['mode']} / {rows[0]['mode']} total: {rows[1]['total_s'] / rows[0]['total_s']:.2f}** "
                  "(one run, one mode after the other)"]
    lines += [""] + files.history_table(res.get("history", []), HISTORY)
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--modes", default="native,avx2")
    parser.add_argument("--output", default=str(RESULTS / "demo_time"))
    args = parser.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        raise SystemExit(f"--modes: unknown {', '.join(unknown)}; choose from {', '.join(MODES)}")
    parts, cpu = readme_command(), f"{record.cpu_name()}, {len(os.sched_getaffinity(0))} CPUs"
    out, rows = Path(args.output), []
    res = files.carry_history({**record.stamp(), "cpu": cpu, "command": parts, "runs": rows}, out, history_row)
    work = Path(tempfile.mkdtemp(prefix="rlpr-demo-time-"))  # kept if a mode fails: its logs and runs
    for mode in modes:  # each mode's row is written as soon as it is measured
        rows.append(run_mode(mode, parts, work))
        print(f"{mode}: {rows[-1]['total_s'] / 60:.1f} min", flush=True)
        files.save(res, out, markdown)
    shutil.rmtree(work, ignore_errors=True)
    print(out.with_suffix(".md").read_text())


if __name__ == "__main__":
    main()

"""Two rlpr runs on one machine at once: old thread settings against the new defaults (issue 42, item 5).

    python benchmarks/shared_cpu.py                     # about 10-15 minutes on a 2-core CPU
    python benchmarks/shared_cpu.py --steps 2 --max-new-tokens 16 --output /tmp/shared-cpu   # smoke test

Each run is `python -m rlpr train` on the embedded SmolLM2-135M-Instruct (demo preset, short
lengths, no held-out evaluation), in a fresh process; a step's time is `perf/step_s` from its
metrics.jsonl, the first step (warm-up) left out. Scenarios, side by side in the same invocation:

- `before`: what rlpr did before: torch's default threads (one per CPU this process may use,
  `model.threads=N`) and libgomp's default wait (idle threads spin ~300,000 times after every
  parallel region: `GOMP_SPINCOUNT=300000`, which also keeps rlpr from making the wait passive);
- `after`: rlpr's defaults now: idle threads spin briefly, then sleep (`GOMP_SPINCOUNT=30000`), and
  threads chosen from the free CPUs;
- `passive`: rlpr's defaults of 2026-11-27 to -29: idle threads sleep at once (`OMP_WAIT_POLICY=PASSIVE`),
  threads chosen from the free CPUs;
- `threads=1`: the hand fix of the issue (`model.threads=1`, rlpr's wait);

each alone (one run) and as a pair (two runs started together). Ratios are of mean step times
measured in this invocation; the load average before each scenario is recorded, since other
processes on the machine change every number.

Writes benchmarks/results/shared_cpu.json and .md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def scenarios() -> dict[str, tuple[list[str], dict[str, str]]]:
    """name -> (extra overrides, extra environment) of each run."""
    return {
        "before": ([f"model.threads={cpus()}"], {"GOMP_SPINCOUNT": "300000"}),
        "after": ([], {}),
        "passive": ([], {"OMP_WAIT_POLICY": "PASSIVE"}),
        "threads=1": (["model.threads=1"], {}),
    }


def start_run(out: Path, name: str, args, overrides: list[str], env: dict[str, str]) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "rlpr", "train", f"trainer.output_dir={out}", f"trainer.name={name}",
           f"trainer.max_steps={args.steps}", f"rollout.max_new_tokens={args.max_new_tokens}",
           "rollout.responses_per_prompt=4", "trainer.prompts_per_step=2", "trainer.mini_batch_prompts=2",
           "data.val=", "trainer.save_every=0", "trainer.report=false", "trainer.tensorboard=false",
           "trainer.progress=false", "trainer.sample_every=0", *overrides]
    base = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS")}
    base["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    log = open(out / f"{name}.log", "w")
    return subprocess.Popen(cmd, cwd=out, env={**base, **env}, stdout=log, stderr=subprocess.STDOUT)


def step_times(run_dir: Path) -> list[float]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [r["perf/step_s"] for r in rows if "perf/step_s" in r]


def run_scenario(out: Path, label: str, copies: int, args) -> dict:
    overrides, env = scenarios()[label]
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    names = [f"{label.replace('=', '')}-{copies}x-{i}" for i in range(copies)]
    procs = [start_run(out, n, args, overrides, env) for n in names]
    for p, n in zip(procs, names):
        if p.wait() != 0:
            raise SystemExit(f"{n} failed: see {out / (n + '.log')}")
    wall = time.perf_counter() - t0
    steps = [step_times(out / n)[1:] for n in names]  # the first step warms up
    warned = [any("busy with other processes" in line for line in (out / f"{n}.log").read_text().splitlines())
              for n in names]
    mean = statistics.mean(s for run in steps for s in run)
    print(f"{label:>10} x{copies}: {mean:6.1f} s/step  (wall {wall:.0f} s, load before {load:.2f}, "
          f"warned {sum(warned)}/{copies})", flush=True)
    return {"scenario": label, "copies": copies, "step_s": steps, "mean_step_s": mean, "wall_s": wall,
            "load_before": load, "warned": warned}


def render(result: dict) -> str:
    rows = {(r["scenario"], r["copies"]): r for r in result["runs"]}
    lines = ["# Several rlpr runs on one machine (issue 42, item 5)", "",
             f"`python benchmarks/shared_cpu.py {' '.join(result['argv'])}` on {result['cpu']} "
             f"({result['cpus']} CPUs this process may use), {result['date']}. Each run: `rlpr train` on the "
             f"embedded SmolLM2-135M, {result['settings']}; mean `perf/step_s` of the steps after the first.", "",
             "| scenario | alone: s/step | two at once: s/step | two at once / alone | load average before (alone, pair) |",
             "|---|---|---|---|---|"]
    for label in scenarios():
        a, p = rows.get((label, 1)), rows.get((label, 2))
        if a and p:
            lines.append(f"| {label} | {a['mean_step_s']:.1f} | {p['mean_step_s']:.1f} | "
                         f"{p['mean_step_s'] / a['mean_step_s']:.2f} | {a['load_before']:.2f}, {p['load_before']:.2f} |")
    lines += ["", "Ratios measured side by side in this invocation:", ""]
    for key, value in result["ratios"].items():
        lines.append(f"- {key}: **{value:.2f}**")
    lines += ["", result["notes"], ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=3, help="steps per run (the first is left out)")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--output", type=Path, default=RESULTS, help="the folder shared_cpu.json/.md go to")
    parser.add_argument("--name", default="shared_cpu", help="their name (shared_cpu_amd: results/shared_cpu_amd.md)")
    args = parser.parse_args()
    runs = []
    with tempfile.TemporaryDirectory(prefix="rlpr-shared-cpu-") as tmp:
        out = Path(tmp)
        # alone first, then the pairs; the same order each time
        for copies in (1, 2):
            for label in scenarios():
                runs.append(run_scenario(out, label, copies, args))
    mean = {(r["scenario"], r["copies"]): r["mean_step_s"] for r in runs}
    ratios = {
        "two at once, before / after (s/step)": mean[("before", 2)] / mean[("after", 2)],
        "two at once, after / threads=1 (s/step)": mean[("after", 2)] / mean[("threads=1", 2)],
        "alone, after / before (s/step: the cost of the bounded wait and the choice alone)":
            mean[("after", 1)] / mean[("before", 1)],
        "alone, passive / after (s/step: sleeping at once against the bounded spin)":
            mean[("passive", 1)] / mean[("after", 1)],
        "two at once, passive / after (s/step)": mean[("passive", 2)] / mean[("after", 2)],
    }
    cpu = platform.processor() or platform.machine()
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    result = {"argv": sys.argv[1:], "cpu": cpu, "cpus": cpus(), "date": time.strftime("%Y-%m-%d %H:%M"),
              "settings": f"{args.steps} steps, 2 prompts x 4 responses x {args.max_new_tokens} new tokens, LoRA, "
                          "no held-out evaluation",
              "runs": runs, "ratios": ratios,
              "notes": "`before` reproduces the old defaults with model.threads=<CPUs> and GOMP_SPINCOUNT=300000 "
                       "(libgomp's spin count when OMP_WAIT_POLICY is unset). Other processes on the machine "
                       "(see the load averages) slow every scenario; compare ratios within one invocation."}
    args.output.mkdir(parents=True, exist_ok=True)
    (args.output / f"{args.name}.json").write_text(json.dumps(result, indent=1) + "\n")
    (args.output / f"{args.name}.md").write_text(render(result))
    print(render(result))


if __name__ == "__main__":
    main()

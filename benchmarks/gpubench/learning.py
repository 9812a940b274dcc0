"""gpu_check's `learning_cuda` part (issue 40): the learning benchmark's `small` RLPR variant and its
shuffled-reference control (20 steps, seed 0) trained on CUDA from the embedded model (benchmarks/learning.py
in a subprocess; the model carried by tools/gpu_loan.py), beside the CPU table's rows of the
same seed in standard errors, and the step time."""

from __future__ import annotations

import math
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from gpubench.markdown import unfinished
from harness.files import table
from learnbench.rows import load_rows

ROOT = Path(__file__).resolve().parents[2]
CPU_ROWS = ROOT / "benchmarks" / "results" / "learning.jsonl"
VARIANTS = ("rlpr", "shuffled_reference")
SETS = {"heldout": "", "new_items": "new_items_", "general": "general_"}  # set -> key prefix of a row
METRICS = ("acc", "greedy", "pass8")


def binomial_se(p: float, n: int) -> float:
    return math.sqrt(max(p * (1 - p), 1e-12) / n)


def cpu_rows(variant: str, steps: int, grader_version: int, path: Path | None = CPU_ROWS) -> dict:
    """The CPU learning table's rows of the embedded model for `variant` at `steps`, graded by this
    grader version, by seed (the newest row of a seed)."""
    return {r["seed"]: r for r in (load_rows(path) if path else []) if r["variant"] == variant and r["steps"] == (0 if variant == "base" else steps)
            and r.get("grader_version") == grader_version and not r.get("settings", {}).get("model")
            and not r.get("settings", {}).get("set")}


def compare(gpu: dict, cpu: dict | None, seeds: list[dict] = ()) -> dict:
    """Per set and metric: before, after on the GPU, after on the CPU row of the same seed, the GPU's
    gain in SEs of the base, GPU - CPU in binomial SEs of the difference (over each set's questions),
    and GPU - the CPU seeds' mean in SEs that count the seed-to-seed spread too: one run's value varies
    by the seeds' sd, their mean by sd / sqrt(k) (a single seed on another device is another draw)."""
    out = {}
    for name, prefix in SETS.items():
        n = gpu["n_heldout"] if name == "heldout" else gpu.get(f"n_{name}")
        if not n:
            continue
        for m in METRICS:
            before, after = gpu.get(f"{prefix}{m}_before"), gpu.get(f"{prefix}{m}_after")
            if before is None or after is None:
                continue
            entry = {"before": before, "after_gpu": after, "n": n,
                     "gain_ses": (after - before) / binomial_se(before, n)}
            if cpu is not None and cpu.get(f"{prefix}{m}_after") is not None:
                c = cpu[f"{prefix}{m}_after"]
                entry.update(after_cpu=c, gpu_minus_cpu_ses=(after - c) / math.hypot(binomial_se(after, n),
                                                                                     binomial_se(c, n)))
            values = [r[f"{prefix}{m}_after"] for r in seeds if r.get(f"{prefix}{m}_after") is not None]
            if len(values) > 1:
                mean, sd = statistics.fmean(values), statistics.stdev(values)
                spread = max(sd, binomial_se(mean, n))  # never below the binomial error of one run
                entry.update(cpu_seeds=values, cpu_seeds_mean=mean, cpu_seeds_sd=sd,
                             gpu_minus_cpu_seeds_ses=(after - mean) / (spread * math.sqrt(1 + 1 / len(values))))
            out[f"{name}/{m}"] = entry
    return out


def summarize(rows: list[dict], steps: int, seed: int, cpu_path: Path | None = CPU_ROWS) -> dict:
    """The GPU rows set beside the CPU table's (compare), per variant, and the base rows' difference."""
    from rlpr.grading import GRADER_VERSION

    out = {"variants": {}}
    for variant in VARIANTS:
        gpu = next((r for r in rows if r["variant"] == variant and r["seed"] == seed), None)
        if gpu is None:
            out["variants"][variant] = {"error": "no row (see output_tail)"}
            continue
        seeds = cpu_rows(variant, steps, GRADER_VERSION, cpu_path)
        cpu = seeds.get(seed)
        out["variants"][variant] = {
            "step_s_gpu": gpu["step_s"], "step_s_cpu": cpu["step_s"] if cpu else None,
            "reward_s_gpu": gpu.get("reward_s"), "seconds_gpu": gpu["seconds"],
            "entropy_after": gpu.get("entropy_after"), "len_after": gpu.get("len_after"),
            "train_accuracy": [t.get("reward/accuracy") for t in gpu.get("train", [])],
            "compare": compare(gpu, cpu, list(seeds.values()))}
    base = next((r for r in rows if r["variant"] == "base"), None)
    base_cpu = cpu_rows("base", steps, GRADER_VERSION, cpu_path).get(None)
    if base is not None and base_cpu is not None:
        out["base_before_gpu_minus_cpu_ses"] = {
            m: (base[f"{m}_before"] - base_cpu[f"{m}_before"]) / math.hypot(
                binomial_se(base[f"{m}_before"], base["n_heldout"]), binomial_se(base_cpu[f"{m}_before"], base["n_heldout"]))
            for m in METRICS}
    return out


def learning_part(out: Path, device: str, steps: int = 20, seed: int = 0, heldout: int | None = None,
                  timeout: float = 480.0, extra: list[str] | None = None, resume: str | None = None) -> dict:
    """Run the learning benchmark for VARIANTS on `device` and compare with the CPU rows; its files go
    to `out`/learning_cuda.tar.gz (one file: the device tool brings back at most 8). `resume`: such an
    archive from an earlier call, whose finished runs (the base evaluation among them) are kept."""
    from rlpr.grading import GRADER_VERSION

    work = Path(tempfile.mkdtemp(prefix="rlpr-learning-cuda-"))
    if resume:
        with tarfile.open(resume) as tar:
            tar.extractall(work, filter="data")
    output = work / "learning_cuda"
    # rollout.batch_sequences: the held-out evaluation decodes 256 rows at once on a GPU (each row's
    # draws do not depend on its batch: the same samples as 32 at a time)
    sets = [f"model.device={device}", "rollout.batch_sequences=256", *(extra or [])]
    cmd = [sys.executable, str(ROOT / "benchmarks" / "learning.py"), "--variants", ",".join(VARIANTS),
           "--seeds", str(seed + 1), "--steps", str(steps), "--output", str(output), "--workdir", str(work / "w"),
           "--set", *sets]
    if heldout:
        # the dry run's size: a few questions, 2 samples, no curve
        cmd += ["--heldout", str(heldout), "--transfer-questions", str(heldout), "--samples", "2", "--curve-every", "0"]
    tick = time.perf_counter()
    log = work / "learning_cuda.log"
    with log.open("w") as f:  # the runs finished before a timeout keep their rows (the .jsonl is appended per run)
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, text=True)
        try:
            returncode = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            returncode = f"killed after {timeout:.0f} s"
    wall = time.perf_counter() - tick
    print("\n".join(log.read_text().splitlines()[-30:]), flush=True)
    result = {"command": " ".join(cmd[1:]).replace(str(work), "WORK"), "wall_s": wall, "returncode": returncode,
              "output_tail": log.read_text()[-3000:], "device": device, "steps": steps, "seed": seed}
    rows = load_rows(output.with_suffix(".jsonl"))
    with tarfile.open(out / "learning_cuda.tar.gz", "w:gz") as tar:
        for f in sorted(work.glob("learning_cuda*")):
            tar.add(f, arcname=f.name)
    result["rows"] = [{k: v for k, v in r.items() if k not in ("curve", "train", "settings")} for r in rows]
    result.update(summarize(rows, steps, seed, None if heldout else CPU_ROWS))  # the dry run's few questions: no CPU rows
    return result


def report_lines(d: dict) -> list[str]:
    """gpu_check.md's `learning_cuda` section."""
    lines = ["## The embedded model learns on CUDA (learning benchmark, `small` preset)", ""]
    if note := unfinished(d):
        return lines + note
    lines += [f"`python benchmarks/learning.py {d['command'].split('learning.py', 1)[-1].strip()}`: "
              f"{d['wall_s']:.0f} s, exit {d['returncode']}.", ""]
    if "base_before_gpu_minus_cpu_ses" in d:
        lines += ["Base model on the GPU against the CPU's base row (in SEs of the difference): " + ", ".join(
            f"{m} {v:+.1f}" for m, v in d["base_before_gpu_minus_cpu_ses"].items()), ""]
    for variant, v in d.get("variants", {}).items():
        if "error" in v:
            lines += [f"### {variant}", "", v["error"], ""]
            continue
        lines += [f"### {variant} (seed {d['seed']}, {d['steps']} steps)", "",
                  f"Step time: {v['step_s_gpu']:.1f} s on the GPU"
                  + (f" against {v['step_s_cpu']:.1f} s on the CPU row ({v['step_s_cpu'] / v['step_s_gpu']:.1f}x)"
                     if v.get("step_s_cpu") else "") + f"; held-out entropy after {v['entropy_after']:.2f} nats, "
                  f"length {v['len_after']:.1f} tokens.", "",
                  *table(["set / metric", "before", "after (GPU)", "gain, SEs", "after (CPU, same seed)",
                          "GPU - CPU, binomial SEs", "CPU seeds", "GPU - CPU seeds' mean, SEs with seed spread"], (
                      [key, f"{100 * c['before']:.1f}", f"{100 * c['after_gpu']:.1f}", f"{c['gain_ses']:+.1f}",
                       f"{100 * c['after_cpu']:.1f}" if "after_cpu" in c else "-",
                       f"{c['gpu_minus_cpu_ses']:+.1f}" if "gpu_minus_cpu_ses" in c else "-",
                       ", ".join(f"{100 * x:.1f}" for x in c.get("cpu_seeds", [])) or "-",
                       f"{c['gpu_minus_cpu_seeds_ses']:+.1f}" if "gpu_minus_cpu_seeds_ses" in c else "-"]
                      for key, c in v["compare"].items()), ["---"] + ["---:"] * 5 + ["---", "---:"]), ""]
    return lines


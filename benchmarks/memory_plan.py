"""`rlpr plan` against measured peaks (docs/memory-plan.md): short `rlpr train` runs of the tiny random
Llama and the embedded model (LoRA and full, checkpointing, fsdp over 2 processes), each in a fresh
process whose peak RSS (`ru_maxrss` of the largest child) is set beside the plan's peak for the same
configuration (model.device=cpu); full fine-tuning runs 2 steps, since AdamW's states exist from the
first step on. Also measured: the runtime baseline (a run's imports and the tokenizer).

    python benchmarks/memory_plan.py [--only tiny-lora smol-lora]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness import files, record

RESULTS = Path(__file__).parent / "results"
TOLERANCE = 0.25  # |planned - measured| / measured

# every run: the demo preset, no evaluation, a short step
COMMON = ["data.val=", "data.max_prompt_tokens=46", "data.demo_train_size=16", "rollout.min_new_tokens=32",
          "trainer.progress=false", "trainer.report=false", "trainer.prompts_per_step=2",
          "trainer.mini_batch_prompts=2", "trainer.sample_every=0"]
TINY = "TINY"  # the tiny model's directory
# name -> (processes, steps, overrides)
CONFIGS: dict[str, tuple[int, int, list[str]]] = {
    "tiny-lora": (1, 2, [f"model.path={TINY}"]),
    "tiny-full": (1, 2, [f"model.path={TINY}", "model.lora=false"]),
    "smol-lora": (1, 1, []),
    "smol-full": (1, 2, ["model.lora=false"]),
    "smol-lora-ckpt": (1, 1, ["model.gradient_checkpointing=true"]),
    "tiny-full-fsdp-2": (2, 2, [f"model.path={TINY}", "model.lora=false", "trainer.strategy=fsdp"]),
}

WRAPPER = """
import resource, subprocess, sys
rc = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)  # KiB, the largest child
if rc.returncode:
    sys.stderr.write(rc.stderr[-3000:])
    sys.exit(rc.returncode)
"""

RUNTIME = """
import re
import rlpr.train.trainer, rlpr.grading, peft  # what a run imports
from torch.utils.tensorboard import SummaryWriter
from rlpr.model.loading import load_tokenizer
load_tokenizer("default")
print(int(re.search(r"VmHWM:\\s+(\\d+)", open("/proc/self/status").read()).group(1)))  # KiB
"""


def env(threads: int) -> dict:
    return {**os.environ, "OMP_NUM_THREADS": str(threads), "TOKENIZERS_PARALLELISM": "false"}


def measure_runtime() -> float:
    """GiB: RSS after the imports of a run and the tokenizer (a fresh process)."""
    out = subprocess.run([sys.executable, "-c", RUNTIME], env=env(2), capture_output=True, text=True, check=True)
    return int(out.stdout.strip().splitlines()[-1]) / 1024 ** 2


def build_tiny(directory: Path) -> None:
    from rlpr.model.loading import load_tokenizer, tiny_llama

    tokenizer = load_tokenizer("default")
    tiny_llama(tokenizer).save_pretrained(directory)
    tokenizer.save_pretrained(directory)


def overrides_for(name: str, tiny: Path, out: Path) -> list[str]:
    procs, steps, extra = CONFIGS[name]
    return [*COMMON, f"trainer.max_steps={steps}", f"trainer.output_dir={out}", f"trainer.name={name}",
            *(o.replace(TINY, str(tiny)) for o in extra)]


def planned(name: str, overrides: list[str]) -> dict:
    """The plan of `rlpr plan model.device=cpu --gpus N` for these overrides (same code path)."""
    from rlpr.cli.plan import checked_setup
    from rlpr.config import build_config
    from rlpr.model.architecture import architecture
    from rlpr.parallel import memory_plan as mp

    procs = CONFIGS[name][0]
    cfg = build_config("demo", [*overrides, "model.device=cpu"])
    setup = checked_setup(cfg, procs)
    arch = architecture(cfg.model)
    p = mp.plan(arch, setup)
    return {"peak_gib": p.peak / mp.GiB, "peak_phase": p.peak_phase, "label": setup.label,
            "phases_gib": {ph: round(p.total(ph) / mp.GiB, 3) for ph in mp.PHASES},
            "runtime_gib": next(t.bytes for t in p.terms if t.name.startswith("runtime")) / mp.GiB,
            "params": arch.params, "trainable": arch.trainable(setup.lora),
            "terms_gib": {t.name: round(t.bytes / mp.GiB, 4) for t in p.terms}}


def measured(name: str, overrides: list[str]) -> tuple[float, float]:
    """(peak RSS in GiB of the largest process, wall seconds) of one run in a fresh process."""
    procs = CONFIGS[name][0]
    if procs == 1:
        cmd, threads = [sys.executable, "-m", "rlpr", "train", *overrides], 2
    else:
        cmd, threads = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={procs}",
                        "-m", "rlpr", "train", *overrides], 1
    tick = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", WRAPPER, *cmd], env=env(threads), capture_output=True, text=True)
    seconds = time.perf_counter() - tick
    if out.returncode:
        raise RuntimeError(f"{name} failed:\n{out.stderr[-3000:]}")
    return int(out.stdout.strip().splitlines()[-1]) / 1024 ** 2, seconds


def markdown(result: dict) -> str:
    lines = [
        "# `rlpr plan` against measured peak RSS (CPU)", "",
        files.header(result), "",
        f"torch {result['torch']}; each run a fresh process "
        f"(`getrusage(RUSAGE_CHILDREN).ru_maxrss`, the largest process); plan for model.device=cpu "
        f"(its runtime line {result['plan_runtime_gib']:.2f} GiB; measured now: {result['runtime_gib']:.3f} GiB, "
        "RSS after a run's imports and the tokenizer).", "",
        *files.table(["config", "processes", "strategy", "planned peak (phase)", "measured peak", "measured / planned",
                      "within 25%", "run"], (
            [r["name"], r["processes"], r["plan"]["label"], f"{r['plan']['peak_gib']:.2f} GiB ({r['plan']['peak_phase']})",
             f"{r['measured_gib']:.2f} GiB", f"{r['ratio']:.2f}", "yes" if r["within"] else "NO", f"{r['seconds']:.0f} s"]
            for r in result["runs"]), ["---", "---:", "---", "---:", "---:", "---:", "---", "---:"]),
    ]
    lines += ["", "Overrides common to every run (demo preset): `" + " ".join(COMMON) + "`; per run: "
              + "; ".join(f"{n}: `{' '.join(o for o in CONFIGS[n][2]) or '-'}` ({CONFIGS[n][1]} steps)"
                          for n in [r["name"] for r in result["runs"]]) + ".", ""]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="+", choices=list(CONFIGS), default=list(CONFIGS))
    args = ap.parse_args()
    import torch

    from rlpr.parallel import memory_plan as mp

    runtime = measure_runtime()
    print(f"runtime baseline (imports + tokenizer): {runtime:.3f} GiB (the plan uses {mp.CPU_RUNTIME_BYTES / mp.GiB:.2f})")
    runs = []
    with tempfile.TemporaryDirectory(prefix="rlpr-memory-plan-") as tmp:
        tiny, out = Path(tmp) / "tiny", Path(tmp) / "runs"
        build_tiny(tiny)
        print(f"{'config':18s} {'procs':>5s} {'planned':>9s} {'measured':>9s} {'ratio':>6s}  phase    run")
        for name in args.only:
            overrides = overrides_for(name, tiny, out)
            plan = planned(name, overrides)
            gib, seconds = measured(name, overrides)
            ratio = gib / plan["peak_gib"]
            within = abs(plan["peak_gib"] - gib) / gib <= TOLERANCE
            runs.append({"name": name, "processes": CONFIGS[name][0], "steps": CONFIGS[name][1],
                         "overrides": [o.replace(str(tiny), "TINY").replace(str(out), "OUT") for o in overrides],
                         "plan": plan, "measured_gib": gib, "ratio": ratio, "within": within, "seconds": seconds})
            print(f"{name:18s} {CONFIGS[name][0]:5d} {plan['peak_gib']:8.2f}G {gib:8.2f}G {ratio:6.2f}  "
                  f"{plan['peak_phase']:8s} {seconds:.0f} s{'' if within else '  OUTSIDE 25%'}", flush=True)
    result = {**record.stamp(), "torch": torch.__version__, "runtime_gib": runtime,
              "plan_runtime_gib": mp.CPU_RUNTIME_BYTES / mp.GiB, "tolerance": TOLERANCE, "runs": runs}
    print(files.save(result, RESULTS / "memory_plan", markdown))
    print(f"wrote {RESULTS / 'memory_plan.json'} and memory_plan.md")


if __name__ == "__main__":
    main()

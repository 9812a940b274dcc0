"""`rlpr plan`: the memory of a training run per GPU (per process), before the run.

It reads the same configuration as `rlpr train` (`--preset`/`--config`, dotted overrides), the
model's architecture from model.path's config.json (or a built-in architecture: `--model
qwen2.5-7b`), and prints what rlpr/parallel/memory_plan.py computes: each term with the phases
of a step that hold it, each phase's total and the peak, whether it fits `--gpu-gb`, and the same
peak for every strategy with and without gradient checkpointing. docs/memory-plan.md.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import sys
from dataclasses import replace

from rlpr.cli.options import _record, add_config_options, command_config
from rlpr.errors import ConfigError


class ModelPath(argparse.Action):
    """`--model X`: model.path=X, in command-line order with the overrides (a plan-only flag: X may
    also name a built-in architecture, e.g. qwen2.5-7b)."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)
        _record(namespace, ("model.path", values))


def _machine_memory_gib() -> float:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) / 1024 ** 2
    except OSError:
        pass
    return 16.0


# The largest plan: finite sizes only (--gpu-gb 1e308 is infinite in bytes, and every phase "FITS")
MAX_GPUS = 1 << 20
MAX_GPU_GB = 1 << 20  # 1 PiB per process


def plan_config(args):
    """The validated Config of the command and the Setup of the plan (one-line ConfigError for bad input)."""
    if not 1 <= args.gpus <= MAX_GPUS:
        raise ConfigError(f"--gpus: the number of GPUs (processes) must be in 1..{MAX_GPUS}, got {args.gpus}")
    if args.gpu_gb is not None and not (math.isfinite(args.gpu_gb) and 0 < args.gpu_gb <= MAX_GPU_GB):
        raise ConfigError(f"--gpu-gb: the memory of one GPU (or CPU process) in GiB must be in (0, {MAX_GPU_GB}], got "
                          f"{args.gpu_gb}")
    cfg = command_config(args)
    return cfg, checked_setup(cfg, args.gpus, args.gpu_gb)


def checked_setup(cfg, gpus: int, gpu_gb: float | None = None):
    """Validate `cfg` as `rlpr train` would (its keys, ranges and the checks that depend on the
    number of processes; not the data files or whether DeepSpeed is installed: a plan is made before
    the run, on any machine) and resolve its memory Setup for `gpus` processes: on GPUs unless
    model.device=cpu, `gpu_gb` GiB each (default 80 GiB; on CPU this machine's memory / gpus)."""
    from rlpr.config import Config, validate, validate_world
    from rlpr.parallel import memory_plan as mp
    from rlpr.parallel.sharding import OFFLOADING

    device = "cpu" if cfg.model.device == "cpu" else "cuda"
    checked = copy.deepcopy(cfg)
    checked.model.device = "cpu" if device == "cpu" else "auto"  # a plan for GPUs is made on any machine
    validate(checked, tuple(f for f in Config.__dataclass_fields__ if f != "preset"))
    t = cfg.trainer
    if t.cpu_offload and t.strategy not in OFFLOADING:
        raise ConfigError(f"trainer.cpu_offload needs trainer.strategy={' or '.join(OFFLOADING)} (got {t.strategy})")
    if t.zero_stage not in (1, 2):
        raise ConfigError(f"trainer.zero_stage: {t.zero_stage!r} is not one of 1, 2")
    validate_world(cfg, gpus)
    if device == "cpu":
        from rlpr.model.precision import cpu_has_fast_bf16

        fast = cpu_has_fast_bf16()
        gib = gpu_gb if gpu_gb is not None else _machine_memory_gib() / gpus
    else:
        fast, gib = True, gpu_gb if gpu_gb is not None else 80.0
    return mp.setup_from_config(cfg, gpus, device, gib * mp.GiB, fast_bf16=fast)


def _settings_line(arch, s, mp) -> str:
    mb = mp.micro_batch(s)
    budget = f"micro_batch_tokens {s.micro_tokens}" if s.micro_tokens else f"micro_batch_sequences {s.micro_rows}"
    return (f"{s.label}, gradient checkpointing {'on' if s.gradient_checkpointing else 'off'}, "
            f"{'LoRA' if s.lora else 'full fine-tuning'}, update in {'bf16 autocast' if s.bf16 else 'fp32'}; "
            f"{s.prompt_tokens} prompt + {s.response_tokens} response tokens; micro-batch {mb.describe()} ({budget}); "
            f"rollout {s.engine} in {'bf16' if s.rollout_bytes == 2 else 'fp32'}")


def render(arch, cfg, p, rows, best, out=None) -> None:
    """The plan as rich tables on `out` (stdout)."""
    from rich.console import Console
    from rich.table import Table

    from rlpr.parallel import memory_plan as mp

    out = out or sys.stdout
    console = Console(file=out, width=None if out.isatty() else 150, highlight=False)
    s = p.setup
    where = "GPU" if s.device == "cuda" else "CPU process"
    trainable = arch.trainable(s.lora)
    console.print(f"[bold]rlpr plan[/bold]: {arch.name}: {arch.params / 1e9:.3f}e9 parameters "
                  f"({trainable / 1e6:,.1f}M trainable), {arch.layers} layers, hidden {arch.hidden}, "
                  f"vocab {arch.vocab}; {s.processes} x {where}, {s.device_bytes / mp.GiB:g} GiB each "
                  f"(preset {cfg.preset or 'none'})")
    console.print(_settings_line(arch, s, mp))
    table = Table(title=f"memory per {where} (GiB; x: held in that phase)", title_justify="left")
    table.add_column("term")
    table.add_column("GiB", justify="right")
    for phase in mp.PHASES:
        table.add_column(phase, justify="center")
    table.add_column("formula")
    for term in p.terms:
        table.add_row(term.name, f"{term.bytes / mp.GiB:.2f}", *("x" if ph in term.phases else "" for ph in mp.PHASES),
                      term.formula)
    table.add_section()
    table.add_row("[bold]total[/bold]", "", *(f"[bold]{p.total(ph) / mp.GiB:.2f}[/bold]" for ph in mp.PHASES), "")
    console.print(table)
    console.print(f"peak: [bold]{p.peak / mp.GiB:.2f} GiB[/bold] in the {p.peak_phase} phase of "
                  f"{s.device_bytes / mp.GiB:g} GiB: [bold]{p.verdict()}[/bold]"
                  + (f"; CPU memory per process for offloaded states: {p.host / mp.GiB:.2f} GiB" if p.host else ""))
    alt = Table(title=f"peak per {where} (GiB) by strategy", title_justify="left")
    alt.add_column("trainer.strategy")
    alt.add_column("checkpointing off", justify="right")
    alt.add_column("checkpointing on", justify="right")
    for setup, off, on in rows:
        cells = []
        for ckpt, q in ((False, off), (True, on)):
            mark = "*" if (setup.label == s.label and ckpt == s.gradient_checkpointing) else " "
            cells.append(f"{q.peak / mp.GiB:7.2f} {q.verdict():12s}{mark}")
        alt.add_row(setup.label, *cells)
    console.print(alt)
    console.print(f"* this configuration; FITS: <= {mp.FIT_MARGIN:.0%} of {s.device_bytes / mp.GiB:g} GiB, TIGHT: "
                  f"<= 100%" + ("" if s.processes > 1 else "; with one process every strategy runs as ddp"))
    if s.engine == "hf" and p.peak_phase == "rollout":
        v = mp.plan(arch, replace(s, engine="vllm"))
        console.print(f"with rollout.engine=vllm (paged KV cache in {s.vllm_gpu_fraction:g} of the GPU, asleep during "
                      f"the update): {v.peak / mp.GiB:.2f} GiB in the {v.peak_phase} phase, {v.verdict()}"
                      if s.device == "cuda" else
                      f"with rollout.engine=vllm: {v.peak / mp.GiB:.2f} GiB in the {v.peak_phase} phase, {v.verdict()}")
    smaller = mp.smaller_batches(arch, s) if best is None else None
    if best is None and smaller is None:
        console.print("recommended: none fits, even with smaller batches: more GPUs, LoRA (model.lora=true) or "
                      "shorter sequences")
        return
    changes = {}
    if best is None:
        changes, best = smaller
        console.print(f"none fits as configured (the {p.peak_phase} phase is the largest); with smaller batches:")
    setup, ckpt, q = best
    overrides = [f"trainer.strategy={setup.strategy}"]
    if setup.strategy == "deepspeed":
        overrides.append(f"trainer.zero_stage={setup.zero_stage}")
    if setup.offloaded:
        overrides.append("trainer.cpu_offload=true")
    overrides.append(f"model.gradient_checkpointing={'true' if ckpt else 'false'}")
    overrides += [f"{k}={v}" for k, v in changes.items()]
    console.print(f"recommended: {setup.label}, checkpointing {'on' if ckpt else 'off'}"
                  f"{''.join(f', {k}={v}' for k, v in changes.items())} "
                  f"({q.peak / mp.GiB:.2f} GiB, peak in the {q.peak_phase} phase, {q.verdict()}): "
                  f"{' '.join(overrides)}")


def as_dict(arch, p, rows, best) -> dict:
    from dataclasses import asdict

    from rlpr.parallel import memory_plan as mp

    def plan_dict(q):
        return {"peak_gib": q.peak / mp.GiB, "peak_phase": q.peak_phase, "verdict": q.verdict(),
                "phases_gib": {ph: q.total(ph) / mp.GiB for ph in mp.PHASES}, "host_gib": q.host / mp.GiB}

    return {"architecture": asdict(arch), "setup": asdict(p.setup), **plan_dict(p),
            "terms": [{"name": t.name, "gib": t.bytes / mp.GiB, "phases": list(t.phases), "formula": t.formula,
                       "host_gib": t.host / mp.GiB} for t in p.terms],
            "alternatives": [{"strategy": s.label, "checkpointing_off": plan_dict(off),
                              "checkpointing_on": plan_dict(on)}
                             for s, off, on in rows],
            "recommended": None if best is None else {"strategy": best[0].label, "checkpointing": best[1]}}


def cmd_plan(args) -> int:
    from rlpr.model.architecture import architecture
    from rlpr.parallel import memory_plan as mp

    cfg, setup = plan_config(args)
    arch = architecture(cfg.model)
    p = mp.plan(arch, setup)
    rows = mp.alternatives(arch, setup)
    best = mp.recommend(rows)
    if args.json:
        print(json.dumps(as_dict(arch, p, rows, best), indent=1, allow_nan=False))  # strict JSON, never Infinity
    else:
        render(arch, cfg, p, rows, best)
    return 0


def register(sub) -> None:
    p = sub.add_parser("plan", help="memory per GPU (per process) of a training run, before the run")
    add_config_options(p, default_preset="demo")
    p.add_argument("--model", action=ModelPath, default=None, metavar="PATH_OR_NAME",
                   help="sets model.path: a model directory (its config.json is read, no weights), a config.json, "
                        "a .gguf, 'default', or a built-in architecture: qwen2.5-7b, smollm2-135m")
    p.add_argument("--gpus", type=int, default=1, help="processes (GPUs) the run is launched with (default 1)")
    p.add_argument("--gpu-gb", type=float, default=None,
                   help="memory of one GPU in GiB (default 80; with model.device=cpu: this machine's memory / --gpus)")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.set_defaults(fn=cmd_plan)

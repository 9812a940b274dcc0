"""The record every result carries beside its measurements: the machine, the commit, the date and the
library versions, so that a reader knows which run a number comes from (issue 62)."""

from __future__ import annotations

import os
import platform
import subprocess
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# the CPU features a result depends on: bf16 (AMX, AVX512-BF16) decides rlpr's rollout dtype
ISA_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")


def cpu_name() -> str:
    """lscpu's model name (platform.processor() where lscpu is missing)."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def cpu_flags() -> list[str]:
    """Which of ISA_FLAGS the CPU reports (/proc/cpuinfo; empty where it is absent)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return []
    return [flag for flag in ISA_FLAGS if flag in flags]


def isa_caps() -> dict:
    """The instruction-set caps in force (ATEN_CPU_CAPABILITY, ONEDNN_MAX_CPU_ISA, ...): a capped run
    is a different machine for its numbers."""
    from rlpr.model.precision import ISA_CAP_VARS

    return {k: os.environ[k] for k in ISA_CAP_VARS if k in os.environ}


def machine() -> dict:
    """The CPU, how many the process sees, its instruction set and the caps in force, and the load
    average when the record is taken (what every CPU benchmark records beside its measurements)."""
    try:
        load = os.getloadavg()
    except OSError:
        load = None
    return {"cpu": cpu_name(), "cpu_count": os.cpu_count(), "cpu_flags": cpu_flags(), "isa_caps": isa_caps(),
            "load_average": load}


def commit() -> str:
    """The short commit of the tree the benchmark runs from, with `+dirty` when it has changes."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=False, cwd=ROOT).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "src"],
                               capture_output=True, text=True, check=False, cwd=ROOT).stdout.strip()
    except OSError:
        return "unknown"
    return (head or "unknown") + ("+dirty" if dirty else "")


def now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S +0000")


def stamp() -> dict:
    """The date, commit and machine every result carries (files.header states them)."""
    return {"date": now(), "commit": commit(), "machine": machine()}


def versions(*extra: str) -> dict:
    """Python's, torch's and transformers' versions, those of `extra` packages (None when absent, a line
    when broken), and rlpr's commit."""
    import importlib

    out = {"python": platform.python_version()}
    for name in ("torch", "transformers", *extra):
        try:
            out[name] = importlib.import_module(name).__version__
        except ImportError:
            out[name] = None
        except Exception as e:  # noqa: BLE001 - a broken package is a finding, not a crash
            out[name] = f"unavailable ({type(e).__name__})"
    out["rlpr_commit"] = commit()
    return out

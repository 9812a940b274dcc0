"""Atomic checkpoints and exact resume.

`checkpoints/step_N/` holds what others load (`adapter/`: a peft LoRA adapter, or `model/`: a HF
model with safetensors, plus the tokenizer) and `trainer_state.pt`: optimizer, scheduler, RNG
states, filter EMA and warm-up history, prompt stream and re-roll cache, score-A cache. It is
written into a temporary directory and renamed, so a crash never leaves a half checkpoint.
"""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path

import numpy as np
import torch
import yaml

from rlpr.config import Config, ConfigError, load_config
from rlpr.forward import causal_lm

STATE_FILE = "trainer_state.pt"


def rng_state() -> dict:
    """Every RNG's state as plain data (tensors, numbers, lists, tuples), loadable with
    torch.load(weights_only=True): numpy's key array becomes a list."""
    name, keys, pos, has_gauss, gauss = np.random.get_state()
    state = {"torch": torch.get_rng_state(), "python": random.getstate(),
             "numpy": (str(name), [int(k) for k in keys], int(pos), int(has_gauss), float(gauss))}
    if torch.cuda.is_initialized():  # e.g. LoRA dropout on the GPU draws from this process's device
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
    random.setstate(state["python"])
    name, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, gauss))


def is_peft(model) -> bool:
    return hasattr(model, "peft_config")


def save_checkpoint(run_dir: Path, step: int, policy, tokenizer, state: dict, keep_last: int,
                    weights: dict | None = None) -> Path:
    """Write checkpoints/step_N atomically and keep only the newest `keep_last`. `weights`: the
    policy's full trainable state dict when the module itself is sharded (FSDP)."""
    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step}"
    tmp = root / f".tmp-step_{step}"
    shutil.rmtree(tmp, ignore_errors=True)
    if is_peft(policy):
        policy.save_pretrained(tmp / "adapter", state_dict=weights)
    else:
        causal_lm(policy).save_pretrained(tmp / "model", safe_serialization=True, state_dict=weights)
        tokenizer.save_pretrained(tmp / "model")
    torch.save(state, tmp / STATE_FILE)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    for old in list_checkpoints(run_dir)[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def list_checkpoints(run_dir: Path) -> list[Path]:
    root = Path(run_dir) / "checkpoints"
    steps = [p for p in root.glob("step_*") if p.name[5:].isdigit() and (p / STATE_FILE).exists()]
    return sorted(steps, key=lambda p: int(p.name[5:]))


def latest_checkpoint(run_dir: Path) -> Path:
    found = list_checkpoints(run_dir)
    if not found:
        raise ConfigError(f"{run_dir}: no complete checkpoint to resume from")
    return found[-1]


def load_weights(policy, ckpt: Path) -> None:
    """Load a checkpoint's trained weights into an already-built policy (LoRA or full)."""
    from safetensors.torch import load_file

    if is_peft(policy):
        from peft import set_peft_model_state_dict

        set_peft_model_state_dict(policy, load_file(ckpt / "adapter" / "adapter_model.safetensors"))
    else:
        lm = causal_lm(policy)
        missing, unexpected = lm.load_state_dict(load_file(ckpt / "model" / "model.safetensors"), strict=False)
        real_missing = [k for k in missing if k not in lm.state_dict() or not _is_tied(lm, k)]
        if real_missing or unexpected:
            raise ConfigError(f"{ckpt}: model weights do not match (missing {real_missing[:3]}, "
                              f"unexpected {unexpected[:3]})")


def _is_tied(lm, key: str) -> bool:
    out = lm.get_output_embeddings()
    return out is not None and key.endswith("lm_head.weight") and \
        out.weight is lm.get_input_embeddings().weight


def load_state(ckpt: Path) -> dict:
    """The trainer state, read as plain data only: `weights_only=True` refuses pickled objects, so
    a crafted trainer_state.pt cannot run code on --resume."""
    import pickle

    try:
        return torch.load(ckpt / STATE_FILE, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError) as e:
        reason = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        raise ConfigError(f"{ckpt / STATE_FILE}: not a plain-data rlpr trainer state; refusing to load it "
                          f"(checkpoints may not execute code): {reason}") from None


def resume_config(run_dir: str | os.PathLike, overrides: list[str] | None = None) -> Config:
    """The run's saved config with command-line overrides on top (e.g. more trainer.max_steps)."""
    path = Path(run_dir) / "config.yaml"
    if not path.is_file():
        raise ConfigError(f"{run_dir}: not a run directory (no config.yaml)")
    return load_config("", overrides, base=yaml.safe_load(path.read_text()))

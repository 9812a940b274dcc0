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

from rlpr.config import Config, load_config, read_yaml
from rlpr.errors import ConfigError, error_reason
from rlpr.model.forward import causal_lm
from rlpr.train.tracking import flatten

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
    policy's full trainable state dict when the module itself is sharded (FSDP).

    Free space is checked first (against the size of the previous checkpoint, or of the state to
    write); a failed write (disk full, read-only) removes its partial copy and raises a one-line
    ConfigError, and the previous checkpoints stay intact and resumable."""
    root = Path(run_dir) / "checkpoints"
    final = root / f"step_{step}"
    tmp = root / f".tmp-step_{step}"
    try:
        root.mkdir(parents=True, exist_ok=True)
        _check_free_space(root, state, weights if weights is not None else _trainable_state(policy))
        shutil.rmtree(tmp, ignore_errors=True)
        if is_peft(policy):
            policy.save_pretrained(tmp / "adapter", state_dict=weights)
        else:
            causal_lm(policy).save_pretrained(tmp / "model", safe_serialization=True, state_dict=weights)
            tokenizer.save_pretrained(tmp / "model")
        torch.save(state, tmp / STATE_FILE)
        if final.exists():
            _remove(final)
        os.replace(tmp, final)
    except (OSError, RuntimeError) as e:  # safetensors reports a full disk as a RuntimeError
        shutil.rmtree(tmp, ignore_errors=True)
        previous = list_checkpoints(run_dir)
        kept = f"the previous checkpoint {previous[-1].name} is intact" if previous else "no earlier checkpoint exists"
        raise ConfigError(f"{root}: could not write checkpoint step_{step} ({error_reason(e)}); {kept}") from None
    for old in list_checkpoints(run_dir)[:-keep_last]:
        _remove(old)
    for broken in root.glob("step_*"):  # half-deleted by an older rlpr: never loadable
        if broken.is_dir() and not is_complete(broken):
            _remove(broken)
    for trash in root.glob(".trash-*"):  # left by a removal that was killed midway
        shutil.rmtree(trash, ignore_errors=True)
    return final


def _remove(ckpt: Path) -> None:
    """Rename first, then delete: a kill midway leaves a `.trash-` folder no loader looks at,
    never a half-deleted step_N."""
    trash = ckpt.with_name(f".trash-{ckpt.name}")
    shutil.rmtree(trash, ignore_errors=True)
    os.replace(ckpt, trash)
    shutil.rmtree(trash, ignore_errors=True)


def _trainable_state(policy) -> dict:
    return {n: p for n, p in policy.named_parameters() if p.requires_grad}


def _bytes_of(obj) -> int:
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(_bytes_of(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_bytes_of(v) for v in obj)
    return 64


def _check_free_space(root: Path, state: dict, weights: dict) -> None:
    previous = [p for p in root.glob("step_*") if p.is_dir()]
    if previous:
        need = sum(f.stat().st_size for f in max(previous, key=os.path.getmtime).rglob("*") if f.is_file())
    else:
        need = _bytes_of(state) + _bytes_of(weights)
    free = shutil.disk_usage(root).free
    if free < need * 1.1 + (16 << 20):
        raise OSError(f"not enough free space: {free / 2**20:.0f} MiB free, about {need / 2**20:.0f} MiB needed")


def is_complete(ckpt: Path) -> bool:
    """A checkpoint with its trainer state and its weights (adapter or full model)."""
    return (ckpt / STATE_FILE).is_file() and ((ckpt / "adapter" / "adapter_model.safetensors").is_file()
                                              or (ckpt / "model" / "model.safetensors").is_file())


def list_checkpoints(run_dir: Path) -> list[Path]:
    root = Path(run_dir) / "checkpoints"
    steps = [p for p in root.glob("step_*") if p.name[5:].isdigit() and is_complete(p)]
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
        raise ConfigError(f"{ckpt / STATE_FILE}: not a plain-data rlpr trainer state; refusing to load it "
                          f"(checkpoints may not execute code): {error_reason(e)}") from None


# What a resume may change: how long to train, how and how often to evaluate, log and save, and
# the host's threads. Anything else would no longer "continue exactly" (or would not load).
RESUMABLE_KEYS = frozenset({
    "trainer.max_steps", "trainer.eval_every", "trainer.eval_before", "trainer.eval_samples",
    "trainer.eval_max_new_tokens", "trainer.sample_every", "trainer.save_every", "trainer.keep_last",
    "trainer.progress", "trainer.tensorboard", "trainer.trackers", "trainer.report", "model.threads",
})


def _saved_config(run_dir: str | os.PathLike) -> dict:
    path = Path(run_dir) / "config.yaml"
    if not path.is_file():
        raise ConfigError(f"{run_dir}: not a run directory (no config.yaml)")
    saved = read_yaml(path)
    if not saved:  # an empty file: nothing to resume from
        raise ConfigError(f"{path}: expected a mapping at the top level")
    return saved


def resume_changes(run_dir: str | os.PathLike, cfg: Config) -> dict[str, list]:
    """{key: [the run's value, cfg's value]} for every key where `cfg` differs from the run's
    saved config; refused (one line naming the key and both values) unless a resume may change
    it (RESUMABLE_KEYS)."""
    old = flatten(load_config("", [], base=_saved_config(run_dir)).to_dict())
    new = flatten(cfg.to_dict())
    changed = {k: [old.get(k), v] for k, v in new.items() if v != old.get(k)}
    for k, (was, now) in changed.items():
        if k not in RESUMABLE_KEYS:
            raise ConfigError(f"--resume {run_dir}: {k} cannot change on resume (the run has {was!r}, "
                              f"asked {now!r}); start a new run to change it")
    return changed


def resume_config(run_dir: str | os.PathLike, overrides: list[str] | None = None) -> Config:
    """The run's saved config (the truth) with the command-line overrides a resume may change
    (RESUMABLE_KEYS, e.g. more trainer.max_steps); any other change is refused."""
    cfg = load_config("", overrides, base=_saved_config(run_dir))
    resume_changes(run_dir, cfg)
    return cfg

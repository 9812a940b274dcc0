"""The checkpoint format, as files: what `train/checkpoint.py` writes and `model/loading.py`,
`model/export.py` and `rlpr eval --checkpoint` read (docs/layout.md: imports run down, so the
format lives below both the trainer and the loaders).

A run directory holds `checkpoints/step_N/`, each with the trained weights (`adapter/`: a peft
LoRA adapter, `adapter_model.safetensors` and `adapter_config.json`; or `model/`: a Hugging Face
model, `model.safetensors` and the tokenizer) and `trainer_state.pt` (what a resume needs). A
checkpoint is complete when it has its trainer state and its weights; anything else under
`checkpoints/` (`.tmp-step_N` being written, `.trash-step_N` being removed, `corrupt-step_N` set
aside) is never loaded.
"""

from __future__ import annotations

from pathlib import Path

from rlpr.errors import ConfigError

CHECKPOINTS_DIR = "checkpoints"
STEP_PREFIX = "step_"
STATE_FILE = "trainer_state.pt"
ADAPTER_DIR = "adapter"
MODEL_DIR = "model"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
MODEL_WEIGHTS = "model.safetensors"


class CorruptCheckpoint(ConfigError):
    """A checkpoint whose files cannot be read back (truncated, malformed); `restore_latest` skips it."""


def step_dir(run_dir: Path, step: int) -> Path:
    """checkpoints/step_N of a run directory."""
    return Path(run_dir) / CHECKPOINTS_DIR / f"{STEP_PREFIX}{step}"


def weights_file(ckpt: Path, adapter: bool) -> Path:
    """The safetensors file of a checkpoint's LoRA adapter (`adapter`) or full model."""
    return ckpt / ADAPTER_DIR / ADAPTER_WEIGHTS if adapter else ckpt / MODEL_DIR / MODEL_WEIGHTS


def saved_weights(ckpt: Path) -> Path:
    """The weights file a checkpoint holds: its full model's when it has a model/ folder, else its
    adapter's."""
    return weights_file(ckpt, adapter=not (ckpt / MODEL_DIR).is_dir())


def is_complete(ckpt: Path) -> bool:
    """A checkpoint with its trainer state and its weights (adapter or full model)."""
    return (ckpt / STATE_FILE).is_file() and (weights_file(ckpt, True).is_file()
                                              or weights_file(ckpt, False).is_file())


# Under checkpoints/: a save (`.tmp-step_N`) or a removal (`.trash-step_N`) killed midway
LEFTOVER_PATTERNS = (".tmp-*", ".trash-*")


def leftovers(run_dir: Path) -> list[Path]:
    """What killed saves and removals left under a run's checkpoints/ (never loadable)."""
    root = Path(run_dir) / CHECKPOINTS_DIR
    return sorted(p for pattern in LEFTOVER_PATTERNS for p in root.glob(pattern))


def list_checkpoints(run_dir: Path) -> list[Path]:
    """A run directory's complete checkpoints, oldest first."""
    root = Path(run_dir) / CHECKPOINTS_DIR
    n = len(STEP_PREFIX)
    steps = [p for p in root.glob(f"{STEP_PREFIX}*") if p.name[n:].isdigit() and is_complete(p)]
    return sorted(steps, key=lambda p: int(p.name[n:]))


# What of a trainer state feeds a model on resume: the optimizer's moments and the EMA copies' weights
STATE_TENSOR_KEYS = ("optimizer", "lagged", "opsd")


def _float_tensors(tree, name: str = ""):
    """(dotted name, tensor) of every non-empty floating-point tensor in `tree` (a tensor, or dicts,
    lists and tuples of them); an FSDP shard as this process's part."""
    import torch

    if isinstance(tree, torch.Tensor):
        t = tree.to_local() if hasattr(tree, "to_local") else tree
        if t.is_floating_point() and t.numel():
            yield name or "tensor", t
        return
    items = tree.items() if isinstance(tree, dict) else enumerate(tree) if isinstance(tree, (list, tuple)) else ()
    for key, value in items:
        yield from _float_tensors(value, f"{name}.{key}" if name else str(key))


def nonfinite_tensors(tree) -> list[str]:
    """The names (dotted paths) of the floating-point tensors in `tree` that hold a NaN or an
    infinity (issue 60, S1: a NaN update must never be saved, nor loaded). One sum per tensor, read
    back once per device; only a tensor whose sum is not finite is checked element-wise (finite
    values whose sum overflows are no NaN)."""
    import torch

    by_device: dict = {}
    for name, t in _float_tensors(tree):
        by_device.setdefault(t.device, []).append((name, t))
    bad = []
    for found in by_device.values():
        sums = torch.stack([t.sum(dtype=torch.float32) for _, t in found])
        for (name, t), ok in zip(found, torch.isfinite(sums).tolist()):
            if not ok and not bool(torch.isfinite(t).all()):
                bad.append(name)
    return bad


def nonfinite_problem(what: str, bad: list[str]) -> str | None:
    """`what` holds non-finite values: the line that says so (None when `bad` is empty)."""
    if not bad:
        return None
    more = f" and {len(bad) - 1} more" if len(bad) > 1 else ""
    return f"{what} holds NaN or infinite values ({bad[0]}{more}): a diverged update; it is never loaded"

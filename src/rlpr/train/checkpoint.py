"""Atomic checkpoints and exact resume.

`checkpoints/step_N/` holds what others load (`adapter/`: a peft LoRA adapter, or `model/`: a HF
model with safetensors, plus the tokenizer) and `trainer_state.pt`: optimizer, scheduler, RNG
states, filter EMA and warm-up history, prompt stream and re-roll cache, score-A cache. It is
written into a temporary directory and renamed, so a crash never leaves a half checkpoint.
The files' names and what makes a checkpoint complete are the format `model/` reads too:
`rlpr.model.checkpoint_files`.
"""

from __future__ import annotations

import logging
import os
import random
import re
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch

from rlpr.config import Config, load_config, read_yaml
from rlpr.errors import ConfigError, error_reason, normal_modes, write_failure, write_failure_reason
from rlpr.model.card import checkpoint_card, write_card
from rlpr.model.checkpoint_files import (ADAPTER_DIR, CHECKPOINTS_DIR, MODEL_DIR, STATE_FILE, STATE_TENSOR_KEYS,
                                         STEP_PREFIX, CorruptCheckpoint, is_complete, list_checkpoints,
                                         nonfinite_problem, nonfinite_tensors, step_dir, weights_file)
from rlpr.model.forward import causal_lm
from rlpr.parallel import distributed as dist
from rlpr.train.tracking import flatten

log = logging.getLogger("rlpr.train")


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
                    weights: dict | None = None, config: dict | None = None) -> Path:
    """Write checkpoints/step_N atomically and keep only the newest `keep_last`. `weights`: the
    policy's full trainable state dict when the module itself is sharded (FSDP). The model card
    (README.md, rlpr/model/card.py, from `config` or the run's config.yaml) goes in step_N/
    and in its adapter/ or model/ folder, in place of peft's empty template.

    Free space is checked first (against the size of the previous checkpoint, or of the state to
    write); a failed write (disk full, read-only) removes its partial copy and raises a one-line
    ConfigError, and the previous checkpoints stay intact and resumable."""
    root = Path(run_dir) / CHECKPOINTS_DIR
    final = step_dir(run_dir, step)
    tmp = root / f".tmp-{final.name}"
    _refuse_nonfinite(run_dir, step, weights if weights is not None else _trainable_state(policy), state)
    try:
        root.mkdir(parents=True, exist_ok=True)
        _check_free_space(root, state, weights if weights is not None else _trainable_state(policy))
        shutil.rmtree(tmp, ignore_errors=True)
        if is_peft(policy):
            policy.save_pretrained(tmp / ADAPTER_DIR, state_dict=weights)
        else:
            causal_lm(policy).save_pretrained(tmp / MODEL_DIR, safe_serialization=True, state_dict=weights)
            tokenizer.save_pretrained(tmp / MODEL_DIR)
        folder = ADAPTER_DIR if is_peft(policy) else MODEL_DIR
        card = checkpoint_card(Path(run_dir), final, folder, config)
        if card:
            write_card(tmp, card)
            write_card(tmp / folder, card)
        torch.save(state, tmp / STATE_FILE)
        normal_modes(tmp)  # safetensors writes its weights 0600: readable by the user's group and others as any file
        if final.exists():
            _remove(final)
        os.replace(tmp, final)
    except Exception as e:  # noqa: BLE001 - safetensors' own SafetensorError on a full disk, torch.save's RuntimeError
        shutil.rmtree(tmp, ignore_errors=True)
        if not isinstance(e, (OSError, RuntimeError)) and not write_failure(e):
            raise
        previous = list_checkpoints(run_dir)
        kept = f"the previous checkpoint {previous[-1].name} is intact" if previous else "no earlier checkpoint exists"
        raise ConfigError(f"{root}: could not write checkpoint step_{step} ({write_failure_reason(e)}); "
                          f"{kept}") from None
    except BaseException:  # Ctrl-C, a signal: no partial copy either
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for old in list_checkpoints(run_dir)[:-keep_last]:
        _remove(old)
    for broken in root.glob(f"{STEP_PREFIX}*"):  # half-deleted by an older rlpr: never loadable
        if broken.is_dir() and not is_complete(broken):
            _remove(broken)
    for trash in root.glob(".trash-*"):  # left by a removal that was killed midway
        shutil.rmtree(trash, ignore_errors=True)
    return final


def _refuse_nonfinite(run_dir: Path, step: int, weights: dict, state: dict) -> None:
    """A checkpoint never holds a NaN or an infinity (issue 60, S1): it would be "the last good
    checkpoint" that eval scores, export writes and a resume continues from."""
    from rlpr.train.finite import NonFiniteValue, last_good

    bad = nonfinite_tensors(weights) + nonfinite_tensors({k: state.get(k) for k in STATE_TENSOR_KEYS})
    problem = nonfinite_problem(f"checkpoint step_{step}", bad)
    if problem:
        raise NonFiniteValue(f"{problem}; not saved; {last_good(run_dir)}. Lower trainer.lr or trainer.grad_clip")


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
        return obj.numel() * obj.element_size() + 512  # + its record in torch.save's archive
    if isinstance(obj, dict):
        return sum(_bytes_of(k) + _bytes_of(v) for k, v in obj.items())
    if isinstance(obj, (list, tuple)):
        return sum(_bytes_of(v) for v in obj) + 8
    if isinstance(obj, (str, bytes)):
        return len(obj) + 16
    return 16


def _enough(free: int, need: int) -> bool:
    """The margin is proportional to the checkpoint (10%, for file-system overhead and estimation
    error), plus 256 KiB for the small files written beside the weights (configs, model card)."""
    return free >= need * 1.1 + (256 << 10)


def _check_free_space(root: Path, state: dict, weights: dict) -> None:
    previous = [p for p in root.glob(f"{STEP_PREFIX}*") if p.is_dir()]
    if previous:
        need = sum(f.stat().st_size for f in max(previous, key=os.path.getmtime).rglob("*") if f.is_file())
    else:
        need = _bytes_of(state) + _bytes_of(weights)
    free = shutil.disk_usage(root).free
    if not _enough(free, need):
        raise OSError(f"not enough free space: {_mib(free)} free, about {_mib(need)} needed")


def _mib(n: float) -> str:
    return f"{n / 2**20:.1f} MiB" if n < 10 * 2**20 else f"{n / 2**20:.0f} MiB"


def checkpoint_estimate(policy, tokenizer, state: dict | None = None) -> int:
    """The size of a checkpoint before any is written: the saved weights (the trainable ones of a
    LoRA adapter, else the whole model, plus its tokenizer files), AdamW's two moments per
    trainable weight (in the weights' dtype), and `state` (caches, RNG states) as it stands."""
    trainable = [p for p in policy.parameters() if p.requires_grad]
    saved = trainable if is_peft(policy) else list(causal_lm(policy).parameters())
    weights = sum(_bytes_of(p) for p in saved)
    optimizer = sum(2 * _bytes_of(p) + _bytes_of(torch.zeros(())) for p in trainable)
    files = 0
    if not is_peft(policy):
        with tempfile.TemporaryDirectory() as tmp:  # not on the run's disk
            tokenizer.save_pretrained(tmp)
            files = sum(f.stat().st_size for f in Path(tmp).rglob("*") if f.is_file())
    return weights + optimizer + files + _bytes_of(state or {}) + _bytes_of(rng_state())


def check_space_before_training(trainer) -> None:
    """Before step 1 (and on resume, before its first step): refused with one line when the run
    directory's disk cannot hold one more checkpoint (`checkpoint_estimate`), rather than after
    every step has run. The main process (which writes the checkpoints) checks; every rank raises."""
    problem = None
    if dist.is_main():
        state = {"stream": trainer.stream.state_dict(), "score_a_cache": trainer.score_a.state_dict(),
                 "lagged": trainer.lagged.state_dict(), "opsd": trainer.distiller.state_dict()}
        need = checkpoint_estimate(trainer.policy, trainer.tokenizer, state)
        run_dir = Path(trainer.run_dir)
        free = shutil.disk_usage(next(p for p in (run_dir, *run_dir.absolute().parents) if p.exists())).free
        if not _enough(free, need):
            problem = (f"{run_dir}: not enough free space for a checkpoint: {_mib(free)} free, about {_mib(need)} "
                       f"needed (the trainable weights and their optimizer state); free some space or set "
                       f"trainer.output_dir")
    problem = dist.broadcast_object(problem)
    if problem:
        raise ConfigError(problem)


def latest_checkpoint(run_dir: Path) -> Path:
    found = list_checkpoints(run_dir)
    if not found:
        raise ConfigError(f"{run_dir}: no complete checkpoint to resume from")
    return found[-1]


def load_weights(policy, ckpt: Path) -> None:
    """Load a checkpoint's trained weights into an already-built policy (LoRA or full). A file that
    cannot be read (truncated) or whose tensors do not fit the policy is a CorruptCheckpoint."""
    from safetensors.torch import load_file

    path = weights_file(ckpt, adapter=is_peft(policy))
    try:
        tensors = load_file(path)
    except Exception as e:  # noqa: BLE001 - safetensors' own error type, OSError, ...: unreadable all the same
        raise CorruptCheckpoint(f"{path}: unreadable weights ({error_reason(e)})") from None
    problem = nonfinite_problem(str(path), nonfinite_tensors(tensors))  # a NaN saved by an older rlpr
    if problem:
        raise CorruptCheckpoint(problem)
    try:
        if is_peft(policy):
            from peft import set_peft_model_state_dict

            set_peft_model_state_dict(policy, tensors)
            return
        lm = causal_lm(policy)
        missing, unexpected = lm.load_state_dict(tensors, strict=False)
    except (RuntimeError, ValueError, KeyError) as e:  # shapes that do not fit
        raise CorruptCheckpoint(f"{path}: weights that do not fit the model ({error_reason(e)})") from None
    real_missing = [k for k in missing if k not in lm.state_dict() or not _is_tied(lm, k)]
    if real_missing or unexpected:
        raise CorruptCheckpoint(f"{ckpt}: model weights do not match (missing {real_missing[:3]}, "
                                f"unexpected {unexpected[:3]})")


def _is_tied(lm, key: str) -> bool:
    out = lm.get_output_embeddings()
    return out is not None and key.endswith("lm_head.weight") and \
        out.weight is lm.get_input_embeddings().weight


# What every trainer state holds (and its type): a state without them is not rlpr's. The
# optimizer's is a dict, or under ZeRO a list of every rank's partition (parallel/sharding.py).
STATE_KEYS = {"step": int, "optimizer": (dict, list), "scheduler": dict, "filter": dict, "ranks": list}


def load_state(ckpt: Path, resumable: bool = False) -> dict:
    """The trainer state, read as plain data only: `weights_only=True` refuses pickled objects, so
    a crafted trainer_state.pt cannot run code on --resume. A file that cannot be read (truncated,
    empty), or with `resumable` one that is not a whole trainer state (STATE_KEYS), is a
    CorruptCheckpoint, one line naming the file."""
    import pickle

    path = ckpt / STATE_FILE
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        found = re.search(r"WeightsUnpickler error:\s*(.+)", str(e))
        reason = found.group(1).strip() if found else error_reason(e)
        if "unsupported global" in reason.lower():  # an object to build: code a checkpoint must not run
            raise CorruptCheckpoint(f"{path}: not a plain-data rlpr trainer state; refusing to load it "
                                    f"(checkpoints may not execute code): {reason}") from None
        raise CorruptCheckpoint(f"{path}: unreadable trainer state ({reason})") from None
    except Exception as e:  # noqa: BLE001 - truncated or empty archives fail in many ways; all unreadable
        raise CorruptCheckpoint(f"{path}: unreadable trainer state ({error_reason(e)})") from None
    if not resumable:
        return state
    if not isinstance(state, dict):
        raise CorruptCheckpoint(f"{path}: not an rlpr trainer state (a {type(state).__name__}, not a mapping)")
    for key, kind in STATE_KEYS.items():
        if key not in state:
            raise CorruptCheckpoint(f"{path}: not an rlpr trainer state (missing {key})")
        if not isinstance(state[key], kind) or isinstance(state[key], bool):
            raise CorruptCheckpoint(f"{path}: not an rlpr trainer state ({key} is a {type(state[key]).__name__})")
    ranks = state["ranks"]
    if len(ranks) != state.get("world_size", 1) or not all(
            isinstance(r, dict) and {"stream", "rng", "score_a_cache"} <= set(r) for r in ranks):
        raise CorruptCheckpoint(f"{path}: not an rlpr trainer state (malformed per-process states)")
    problem = state_shape_problem(state, ckpt)
    if problem:
        raise CorruptCheckpoint(f"{path}: not an rlpr trainer state ({problem})")
    problem = nonfinite_problem(str(path), nonfinite_tensors({k: state.get(k) for k in STATE_TENSOR_KEYS}))
    if problem:
        raise CorruptCheckpoint(problem)
    return state


def _number(v) -> bool:
    import math

    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _count(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


MAX_THREADS = 4096  # a saved thread count a resume takes (train/state.py, keep_threads)


def state_shape_problem(state: dict, ckpt: Path) -> str | None:
    """What is wrong with a trainer state's contents, or None (issue 35, N8): a state of the wrong
    shape used to load ("resumed") and fail steps later with a traceback and no fallback, and an
    absurd step was accepted (resuming past trainer.max_steps saved a step_N that pruned the good
    checkpoints). The step must be the folder's N; the filter, prompt stream, RNG states and caches
    must hold what the trainer reads back."""
    step = state["step"]
    named = ckpt.name.removeprefix("step_")
    if step < 0 or (named.isdigit() and step != int(named)):
        return f"step {step} in {ckpt.name}"
    f = state["filter"]
    if not ({"ema", "history", "last_mean"} <= set(f) and (f["ema"] is None or _number(f["ema"]))
            and isinstance(f["history"], list) and all(_number(v) for v in f["history"])
            and (f["last_mean"] is None or _number(f["last_mean"]))):
        return "malformed filter state"
    for r in state["ranks"]:
        stream, rng, cache = r["stream"], r["rng"], r["score_a_cache"]
        if not (isinstance(stream, dict) and _count(stream.get("epoch")) and _count(stream.get("position"))
                and isinstance(stream.get("cache"), list) and all(_count(i) for i in stream["cache"])):
            return "malformed prompt stream"
        if not (isinstance(rng, dict) and isinstance(rng.get("torch"), torch.Tensor)
                and rng["torch"].dtype == torch.uint8 and isinstance(rng.get("python"), tuple)
                and isinstance(rng.get("numpy"), (tuple, list)) and len(rng["numpy"]) == 5):
            return "malformed RNG states"
        if not (isinstance(cache, list) and all(isinstance(e, (list, tuple)) and len(e) == 4 for e in cache)):
            return "malformed score-A cache"
        threads = r.get("threads")  # absent before threads were saved
        if threads is not None and not (_count(threads) and 1 <= threads <= MAX_THREADS):
            return f"torch threads {threads!r}"
    lagged, length = state.get("lagged"), state.get("length")
    if lagged is not None and not (isinstance(lagged, dict) and _count(lagged.get("steps"))
                                   and isinstance(lagged.get("weights"), dict)):
        return "malformed lagged scorer state"
    teacher = state.get("opsd")  # opsd.teacher=ema: the teacher's EMA weights, as the lagged scorer's
    ema = teacher.get("ema") if isinstance(teacher, dict) else None
    if (teacher is not None and not isinstance(teacher, dict)) or (ema is not None and not (
            isinstance(ema, dict) and _count(ema.get("steps")) and isinstance(ema.get("weights"), dict))):
        return "malformed OPSD teacher state"
    if length and not (isinstance(length, dict) and isinstance(length.get("first"), list)
                       and all(_number(v) for v in length["first"]) and isinstance(length.get("warned"), bool)):
        return "malformed length monitor state"
    return None


def restore_latest(run_dir: Path, restore) -> Path:
    """Resume from the newest checkpoint that loads: `restore(ckpt)` (the trainer's) is tried newest
    first; a corrupt one (CorruptCheckpoint, or a state that does not apply) is skipped with a
    warning naming it, and once an older one has loaded it is moved aside to
    checkpoints/corrupt-step_N (kept for inspection; pruning never keeps it over a good one).
    Other errors (a different world size or strategy) are not corruption: raised at once. None
    loadable: one line naming the newest and why."""
    found = list_checkpoints(run_dir)
    if not found:
        raise ConfigError(f"{run_dir}: no complete checkpoint to resume from")
    skipped: list[tuple[Path, str]] = []
    for ckpt in reversed(found):
        try:
            restore(ckpt)
        except CorruptCheckpoint as e:
            skipped.append((ckpt, str(e)))
        except ConfigError:
            raise
        except (KeyError, TypeError, IndexError, ValueError, RuntimeError) as e:
            skipped.append((ckpt, f"{ckpt / STATE_FILE}: does not load ({type(e).__name__}: {error_reason(e)})"))
        else:
            break
    else:
        more = f"; {len(skipped) - 1} older one(s) fail too" if len(skipped) > 1 else ""
        raise ConfigError(f"{run_dir}: no loadable checkpoint: {skipped[0][1]}{more}")
    if skipped:
        dist.barrier()  # every rank has read them before the main one moves them
    for bad, reason in skipped:
        if dist.is_main():
            log.warning("skipped the corrupt checkpoint %s (%s); %s; resumed from %s", bad, reason, _set_aside(bad),
                        ckpt)
    return ckpt


def _set_aside(ckpt: Path) -> str:
    """Rename a corrupt checkpoint to corrupt-step_N (-2, -3, ... if taken): no loader or pruning
    looks at it, and nothing is deleted."""
    aside, n = ckpt.with_name(f"corrupt-{ckpt.name}"), 1
    while aside.exists():
        n += 1
        aside = ckpt.with_name(f"corrupt-{ckpt.name}-{n}")
    try:
        os.replace(ckpt, aside)
    except OSError as e:
        return f"could not move it aside ({error_reason(e)})"
    return f"moved it to {aside.name}"


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

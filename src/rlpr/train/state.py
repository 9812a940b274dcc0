"""What a checkpoint holds of the trainer beyond the weights, and putting it back (`Trainer.save`,
`Trainer._restore`): the optimizer, the schedules, the std filter's EMA, each rank's prompt stream,
score A's cache and RNG, the EMA copies (reward.scorer=ema, opsd.teacher=ema), the length monitor.
Resuming from it continues the run bit for bit (tests/test_trainer.py)."""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from rlpr.errors import ConfigError
from rlpr.parallel import distributed as dist
from rlpr.train.checkpoint import load_state, load_weights, rng_state, save_checkpoint, set_rng_state

log = logging.getLogger("rlpr.train")


def trainer_state(trainer) -> dict:
    """The trainer's state that a checkpoint keeps beside the weights (trainer_state.pt): plain tensors,
    numbers and strings."""
    return {"step": trainer.step, "optimizer": trainer.strategy.optimizer_state(trainer.policy, trainer.optimizer),
            "scheduler": trainer.scheduler.state_dict(), "filter": trainer.filter.state_dict(),
            "stream": trainer.stream.state_dict(), "score_a_cache": trainer.score_a.state_dict(),
            "rng": rng_state(), "world_size": dist.world_size(), "strategy": trainer.cfg.trainer.strategy,
            "lagged": trainer.lagged.state_dict(), "length": trainer.length_monitor.state_dict(),
            "opsd": trainer.distiller.state_dict(), "responses_total": trainer.responses_total}



def save(trainer) -> Path | None:
    """A checkpoint of the trainer at its step (every rank calls it; rank 0 writes); its path on rank 0."""
    state = trainer_state(trainer)  # on every rank: with fsdp, gathering the optimizer state is a collective
    weights = trainer.strategy.model_state(trainer.policy)
    # each process's own: its prompt stream, RNG, score-A cache and torch threads (keep_threads)
    states = dist.gather_objects({**{k: state[k] for k in ("stream", "rng", "score_a_cache")},
                                  "threads": torch.get_num_threads()})
    if not dist.is_main():
        dist.barrier()
        return None
    state["ranks"] = states
    path = save_checkpoint(trainer.run_dir, trainer.step, trainer.policy, trainer.tokenizer, state,
                           trainer.cfg.trainer.keep_last, weights, config=trainer.cfg.to_dict())
    dist.barrier()
    return path



def restore(trainer, ckpt: Path) -> None:
    """Put checkpoint `ckpt` back into the trainer: weights, optimizer, schedules, the filter's EMA, the
    prompt stream, score A's cache, the RNG, the EMA copies; a mismatch is one ConfigError line."""
    state = load_state(ckpt, resumable=True)  # a malformed one: CorruptCheckpoint, skipped
    if state.get("world_size", 1) != dist.world_size():
        raise ConfigError(f"{ckpt}: saved with {state.get('world_size', 1)} processes; resume with the same "
                          f"number (now {dist.world_size()})")
    if state.get("strategy", "ddp") != trainer.cfg.trainer.strategy:
        raise ConfigError(f"{ckpt}: saved with trainer.strategy={state.get('strategy', 'ddp')}; resume with it")
    with trainer.strategy.load_weights_context():
        load_weights(trainer.policy, ckpt)
    put_back(trainer, state, state["ranks"][dist.rank()])
    log.info("resumed from %s at step %d", ckpt, trainer.step)


def put_back(trainer, state: dict, mine: dict) -> None:
    """`trainer_state`'s parts back into the trainer (all but the weights); `mine`: this process's
    prompt stream, score A cache, RNG and (optionally) torch threads."""
    trainer.strategy.load_optimizer_state(trainer.policy, trainer.optimizer, state["optimizer"])
    trainer.scheduler.load_state_dict(state["scheduler"])
    trainer.filter.load_state_dict(state["filter"])
    trainer.lagged.load_state_dict(state.get("lagged"))
    trainer.distiller.load_state_dict(state.get("opsd"))
    trainer.length_monitor.load_state_dict(state.get("length"))
    trainer.stream.load_state_dict(mine["stream"])
    trainer.score_a.load_state_dict(mine["score_a_cache"])
    set_rng_state(mine["rng"])
    keep_threads(trainer, mine.get("threads"))
    trainer.step = state["step"]
    # a checkpoint from before the count has none: the count restarts at the resume
    trainer.responses_total = int(state.get("responses_total", 0))


def keep_threads(trainer, saved: int | None) -> None:
    """Resume on the torch threads the run was saved with: a CPU matmul's sums depend on how many
    threads split them (2 threads then 1 moved a tiny model's weights by 7e-9 after one step), and the
    automatic choice (model.threads=0) follows how busy the machine is at the start. An explicit
    model.threads is taken as given."""
    if not saved or trainer.cfg.model.threads or trainer.device.type != "cpu" or saved == torch.get_num_threads():
        return
    torch.set_num_threads(saved)
    if dist.is_main():
        log.info("resuming on %d torch thread%s per process, as the run was saved: the steps continue bit for "
                 "bit (model.threads=N chooses another number)", saved, "s" if saved > 1 else "")

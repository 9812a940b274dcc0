"""torch.distributed helpers that are no-ops in a single process.

The trainer is SPMD: every rank runs the same loop on its own prompts and owns whole groups.
Only global quantities (token counts, kept-group counts, the filter's batch mean, metrics,
gradients) cross ranks, through these collectives.
"""

from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist

from rlpr.errors import ConfigError

DEVICES = ("auto", "cpu", "cuda")


def initialized() -> bool:
    return dist.is_available() and dist.is_initialized()


def world_size() -> int:
    return dist.get_world_size() if initialized() else 1


def rank() -> int:
    return dist.get_rank() if initialized() else 0


def is_main() -> bool:
    return rank() == 0


def resolve_device(name: str = "auto") -> torch.device:
    """`model.device` as a torch.device: `auto` is this process's GPU (cuda:LOCAL_RANK) when CUDA
    is available, else the CPU; `cuda` insists on the GPU (a one-line ConfigError without one)."""
    if name not in DEVICES:
        raise ConfigError(f"model.device: {name!r} is not one of {', '.join(DEVICES)}")
    if name == "cpu" or (name == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ConfigError("model.device=cuda, but CUDA is not available to torch "
                          f"{torch.__version__}; use model.device=auto or cpu")
    index, count = int(os.environ.get("LOCAL_RANK", "0")), torch.cuda.device_count()
    if index >= count:
        raise ConfigError(f"model.device={name}: LOCAL_RANK={index} but only {count} GPU(s) are visible")
    return torch.device("cuda", index)


def init_from_env(device: torch.device | None = None, timeout_s: float = 1800.0) -> None:
    """Join the process group when launched by torchrun/accelerate (WORLD_SIZE > 1): NCCL when
    the model runs on a GPU (`device`, default: model.device=auto), gloo on CPU."""
    if initialized() or int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return
    device = resolve_device("auto") if device is None else torch.device(device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(device)
    dist.init_process_group(backend=backend, timeout=timedelta(seconds=timeout_s))


_AT_SHUTDOWN: list = []


def at_shutdown(fn) -> None:
    """Call `fn()` once at the next `shutdown` (the end of a training run, however it ends), e.g. to
    release the run directory's lock."""
    _AT_SHUTDOWN.append(fn)


def shutdown(wait: bool = True) -> None:
    """Leave the process group before the interpreter exits. Without it a rank that finishes
    first can abort in gloo's destructor ("terminate called without an active exception", rc -6)
    while rank 0 still writes the summary. `wait`: meet the other ranks first (not on an error,
    where they may never arrive). The `at_shutdown` callbacks run first, with or without a group."""
    while _AT_SHUTDOWN:
        _AT_SHUTDOWN.pop()()
    if not initialized():
        return
    if wait:
        dist.barrier()
    dist.destroy_process_group()


def collective_device() -> torch.device:
    """Where collective tensors live: NCCL only takes CUDA tensors, gloo CPU ones."""
    if initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def sum_values(values: list[float]) -> list[float]:
    """Element-wise sum over ranks (float64, on the GPU under NCCL)."""
    if not initialized():
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device=collective_device())
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t.tolist()


def max_value(value: float) -> float:
    if not initialized():
        return value
    t = torch.tensor([value], dtype=torch.float64, device=collective_device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def sum_gradients(params) -> None:
    """Sum gradients over ranks. Losses are normalised by GLOBAL counts, so the sum is exactly the
    gradient of the global mini-batch, whatever the number of ranks."""
    if not initialized() or world_size() == 1:
        return
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)


def gather_objects(obj) -> list:
    if not initialized():
        return [obj]
    out = [None] * world_size()
    dist.all_gather_object(out, obj)
    return out


def gather_to_main(obj) -> list | None:
    """Every rank's `obj` on rank 0 (None elsewhere): what only rank 0 writes, without a copy per rank."""
    if not initialized():
        return [obj]
    out = [None] * world_size() if is_main() else None
    dist.gather_object(obj, out, dst=0)
    return out


def broadcast_object(obj):
    """Rank 0's value on every rank (e.g. a run directory named after the clock)."""
    if not initialized():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def barrier() -> None:
    if initialized():
        dist.barrier()

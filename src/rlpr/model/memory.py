"""Keep a long run's CPU memory flat: bounded kernel caches, and freed heap memory given back to
the OS between the big phases of a step.

glibc keeps freed memory in its arenas: after an update's micro-batches (about 1.4 GB of
activations and full-vocabulary logits freed) the process RSS stays high and the next phase
fragments it further. `malloc_trim(0)` returns the free pages; numbers are unaffected.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os

# oneDNN (and PyTorch's ideep layer above it) keep a compiled kernel per operation shape, 1024 of
# each by default. RL batches change shape at every step (response lengths, kept groups), so on
# CPU a bf16 update added 50-100 MB of kernels per step until the caches filled: the demo's RSS
# crept from 2.5 to 3.3 GiB over 10 steps. Decode steps and repeated shapes still hit a small cache.
KERNEL_CACHE_CAPACITY = 64


@functools.lru_cache(maxsize=1)
def _libc():
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    return libc if libc is not None and hasattr(libc, "malloc_trim") else None


def available_memory() -> int:
    """Bytes of memory this machine can still give (Linux: MemAvailable; else its physical memory)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 16 << 30


def release_memory() -> None:
    """malloc_trim(0) on glibc; a no-op elsewhere."""
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)


def cap_kernel_caches(capacity: int = KERNEL_CACHE_CAPACITY) -> None:
    """Bound oneDNN's kernel caches (a value already in the environment wins). The libraries read
    the variables when they create their first kernel, so call this before any model work."""
    for name in ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY"):
        os.environ.setdefault(name, str(capacity))


def available_bytes(device) -> int | None:
    """Memory a new allocation on `device` can take now: on CUDA the driver's free memory plus what
    the caching allocator holds unused; on CPU the kernel's MemAvailable (Linux), else the free
    physical pages; None where neither is known."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device))
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None

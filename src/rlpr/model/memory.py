"""Keep a long run's CPU memory flat: bounded kernel caches, and freed heap memory given back to
the OS between the big phases of a step when the machine needs it.

glibc keeps freed memory in its heaps: after an update's micro-batches the process holds 0.7-1.0 GiB
free there (the demo's step, SmolLM2 with LoRA). `malloc_trim(0)` returns those pages, and the next
phase takes them again through page faults: trimming after the rollout, the reward and the update
made the demo step 0.6-1.1 s slower (11.8 against 10.6 s over 12 steps; full fine-tuning 12.7
against 10.6 s) for the same peak resident size (2.71 GiB both ways; full fine-tuning 4.46 / 4.44).
So `release_memory` trims only when the free heap is a large share of the memory the machine has
left (`TRIM_SHARE` of MemAvailable), where giving it back matters more than the faults.
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


TRIM_SHARE = 0.25  # trim when glibc's free heap exceeds this share of the machine's available memory


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


def free_heap_bytes() -> int | None:
    """Bytes glibc holds free in its heaps (mallinfo2's fordblks: some of them may be returned
    already); None off glibc or before glibc 2.33."""
    libc = _libc()
    info = getattr(libc, "mallinfo2", None) if libc is not None else None
    if info is None:
        return None
    info.restype = _MallInfo2
    return int(info().fordblks)


def release_memory(force: bool = False) -> bool:
    """malloc_trim(0) on glibc when its free heap exceeds `TRIM_SHARE` of the machine's available
    memory (where glibc cannot say how much it holds free: always), or with `force` (benchmarks
    that measure each phase's own peak). Returns whether it trimmed; a no-op off glibc."""
    libc = _libc()
    if libc is None:
        return False
    if not force:
        free = free_heap_bytes()
        if free is not None and free <= TRIM_SHARE * available_memory():
            return False
    libc.malloc_trim(0)
    return True


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

"""bf16 where it is fast: the `auto` choice of precision, and frozen weights in bf16 for a
bf16-autocast update.

bf16 is 2-3x faster than fp32 on CPUs with AVX512-BF16/AMX (Sapphire Rapids) but 3-6x SLOWER on
CPUs without (measured on an AMD EPYC with AVX2 only: a 32x576x1536 matmul 0.57 ms fp32 vs 3.3 ms
bf16; rollout 156 vs 48 tok/s), so `model.rollout_dtype=auto` and `trainer.mixed_precision=auto`
pick bf16 only where the hardware has it.

Autocast caches its bf16 cast of a weight only for weights that require grad, so with LoRA every
forward re-casts the whole frozen base model (a fp32 read and a bf16 write of every weight; 12
forwards per demo update). Stored in bf16 for the update instead, autocast finds them already
in its compute dtype: the same rounding, so the same numbers, for 2 bytes per frozen weight
while the update runs (demo update about 10% faster).
"""

from __future__ import annotations

import functools
from contextlib import contextmanager
from pathlib import Path

import torch

from rlpr.model.forward import causal_lm


@functools.lru_cache(maxsize=None)
def cpu_has_fast_bf16() -> bool:
    """True when the CPU has native bf16 matrix instructions (AVX512-BF16 or AMX-BF16)."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:  # not Linux: trust torch's view of the vector unit
        return "AVX512" in torch.backends.cpu.get_cpu_capability()
    return "avx512_bf16" in flags or "amx_bf16" in flags


def fast_bf16(device: torch.device) -> bool:
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    return device.type == "cpu" and cpu_has_fast_bf16()


def resolve_rollout_dtype(name: str, device: torch.device) -> torch.dtype:
    """`model.rollout_dtype`: bfloat16 | float32 | auto (bf16 where it is fast)."""
    if name == "auto":
        return torch.bfloat16 if fast_bf16(device) else torch.float32
    return torch.bfloat16 if name == "bfloat16" else torch.float32


def resolve_mixed_precision(name: str, device: torch.device) -> str:
    """`trainer.mixed_precision`: none | bf16 | auto (bf16 where it is fast)."""
    if name == "auto":
        return "bf16" if fast_bf16(device) else "none"
    return name


@contextmanager
def frozen_linear_weights_in(model, dtype: torch.dtype):
    """Within the block, the frozen fp32 weights of the model's Linear layers are held in `dtype`
    (restored on exit). The input embedding is left alone (also when the output layer shares it):
    an embedding lookup is not autocast, so its dtype would change the numbers."""
    lm = causal_lm(model)
    embedding = lm.get_input_embeddings().weight
    swapped = []
    try:
        for module in lm.modules():
            weight = getattr(module, "weight", None)
            if (isinstance(module, torch.nn.Linear) and not weight.requires_grad and weight is not embedding
                    and weight.dtype == torch.float32):
                swapped.append((weight, weight.data))
                weight.data = weight.data.to(dtype)
        yield len(swapped)
    finally:
        for weight, data in swapped:
            weight.data = data

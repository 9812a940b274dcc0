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
import os
from collections.abc import Mapping
from contextlib import contextmanager
from pathlib import Path

import torch

from rlpr.model.forward import causal_lm


@functools.lru_cache(maxsize=None)
def _hardware_bf16() -> bool:
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:  # not Linux: trust torch's view of the vector unit
        return "AVX512" in torch.backends.cpu.get_cpu_capability()
    return "avx512_bf16" in flags or "amx_bf16" in flags


# The environment variables that cap the instructions torch's kernels (ATen), oneDNN (new and old name) and
# MKL may use; a benchmark records which were set, and AVX2_LAPTOP sets them to emulate an AVX2-only laptop.
ISA_CAP_VARS = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")
AVX2_LAPTOP = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}


def isa_capped_below_bf16(env: Mapping[str, str] = os.environ) -> bool:
    """True when the user capped the instructions torch's kernels (ATEN_CPU_CAPABILITY) or oneDNN, which
    runs the bf16 matmuls (ONEDNN_MAX_CPU_ISA, or its old name DNNL_MAX_CPU_ISA), may use below
    AVX512-BF16: the bf16 kernels that then run are the slow ones, whatever the CPU has."""
    aten = env.get("ATEN_CPU_CAPABILITY", "").strip().lower()
    onednn = (env.get("ONEDNN_MAX_CPU_ISA") or env.get("DNNL_MAX_CPU_ISA") or "").strip().upper()
    capped_aten = bool(aten) and "avx512" not in aten
    capped_onednn = bool(onednn) and onednn not in ("ALL", "DEFAULT") and not (
        "BF16" in onednn or "AMX" in onednn or "FP16" in onednn or onednn.startswith("AVX10"))
    return capped_aten or capped_onednn


def cpu_has_fast_bf16() -> bool:
    """True when the CPU has native bf16 matrix instructions (AVX512-BF16 or AMX-BF16) and they are
    not capped away (isa_capped_below_bf16: a user emulating an AVX2 laptop gets its choices too)."""
    return _hardware_bf16() and not isa_capped_below_bf16()


def fast_bf16(device: torch.device) -> bool:
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    return device.type == "cpu" and cpu_has_fast_bf16()


# The registries of precisions; with "auto" (bf16 where it is fast) their keys are the allowed values.
# model.rollout_dtype: the dtype of the sampling copy of the policy
ROLLOUT_DTYPES: dict[str, torch.dtype] = {"bfloat16": torch.bfloat16, "float32": torch.float32}
# trainer.mixed_precision: the dtype the update's forwards/backwards autocast to (None: fp32 throughout)
MIXED_PRECISION: dict[str, torch.dtype | None] = {"none": None, "bf16": torch.bfloat16}
AUTO = "auto"


def _known(key: str, name: str, registry: dict, auto: bool = True) -> None:
    if not (auto and name == AUTO) and name not in registry:
        known = [*registry, AUTO] if auto else list(registry)
        raise ValueError(f"unknown {key} {name!r}; choose one of {', '.join(known)}")


def resolve_rollout_dtype(name: str, device: torch.device) -> torch.dtype:
    """`model.rollout_dtype`: bfloat16 | float32 | auto (bf16 where it is fast)."""
    _known("model.rollout_dtype", name, ROLLOUT_DTYPES)
    if name == AUTO:
        return torch.bfloat16 if fast_bf16(device) else torch.float32
    return ROLLOUT_DTYPES[name]


def resolve_mixed_precision(name: str, device: torch.device) -> str:
    """`trainer.mixed_precision`: none | bf16 | auto (bf16 where it is fast)."""
    _known("trainer.mixed_precision", name, MIXED_PRECISION)
    if name == AUTO:
        return "bf16" if fast_bf16(device) else "none"
    return name


def autocast_dtype(mixed_precision: str) -> torch.dtype | None:
    """The dtype a resolved `trainer.mixed_precision` autocasts the update to (None: no autocast)."""
    _known("trainer.mixed_precision (resolved)", mixed_precision, MIXED_PRECISION, auto=False)
    return MIXED_PRECISION[mixed_precision]


def update_autocast(mixed_precision: str, device: torch.device, cache_enabled: bool = True):
    """Autocast for the update's forwards/backwards (master weights stay fp32), or a disabled one."""
    dtype = autocast_dtype(mixed_precision)
    if dtype is None:
        return torch.autocast(device.type, enabled=False)
    return torch.autocast(device.type, dtype=dtype, cache_enabled=cache_enabled)


@contextmanager
def update_precision(model, mixed_precision: str, device: torch.device, cache_enabled: bool = True):
    """`update_autocast`, and under autocast the LoRA layers' inputs left in the autocast dtype: peft
    casts each adapter's input to its fp32 weights' dtype and autocast casts it straight back to bf16
    for the matmul, two copies of every adapted projection's input (and two of its gradient in
    backward) that change no number (bf16 -> fp32 -> bf16 is exact; with lora_dropout > 0 the dropout
    scales in bf16). 3% of a demo update (AMD EPYC, 2 cores: 8.17 -> 7.93 s), identical gradients."""
    from peft.helpers import disable_input_dtype_casting

    with update_autocast(mixed_precision, device, cache_enabled), \
            disable_input_dtype_casting(model, active=autocast_dtype(mixed_precision) is not None):
        yield


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

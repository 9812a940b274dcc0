"""A frozen CPU model's Linear layers on weights laid out once for oneDNN (rollout.prepacked_weights).

A decode step multiplies a few rows ([rows, hidden]) by every weight of the model. PyTorch's CPU
linear hands each call to MKL (fp32) or oneDNN (bf16) with the weight in its plain [out, in]
layout, and the kernel re-lays it out on every call: for decode-sized inputs that costs about as
much as the product. oneDNN can lay a weight out once (`torch.ops.mkldnn._reorder_linear_weight`,
what torch.compile's CPU freezing pass uses) and multiply by it (`torch.ops.mkldnn._linear_pointwise`).

Measured on SmolLM2-135M's rollout copy (one pass over its 211 Linear layers, AMD EPYC Zen 4, 2 cores;
benchmarks/results/prepacked_amd*.md): bf16 at 8 / 16 / 32 rows 26.5 / 30.2 / 40.9 ms against
44.7 / 49.2 / 55.4, the same bits for layers without a bias (with one, the bias is added before the
single rounding to bf16); fp32 capped to AVX2 48.1 / 64.5 / 98.3 against 83.4 / 104.2 / 137.5, within
float rounding (another summation order). At 256 rows the layout was no faster (1.06x in one run),
so inputs over `MAX_ROWS` rows (prefills of many prompts, scoring forwards) keep `F.linear`.

The layout is a copy: the plain weight stays (for those large inputs and for `state_dict`), and a
weight changed in place must be laid out again (`repack`; the rollout engine's `sync` does).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

MODES = ("auto", "on", "off")
MAX_ROWS = 128  # inputs with more rows than this take F.linear (at 256 rows the layout was 6% slower)
BATCH_HINT = 16  # the rows oneDNN lays the weight out for (decode batches shrink as rows finish)


@functools.lru_cache(maxsize=None)
def available(dtype: torch.dtype) -> bool:
    """Whether this PyTorch build and CPU can prepack `dtype` weights (bf16 needs AVX512-BW/VL/DQ or
    AVX-NE-CONVERT; a build without oneDNN has none)."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        torch.ops.mkldnn._reorder_linear_weight(torch.zeros(8, 8, dtype=dtype), BATCH_HINT)
    except (RuntimeError, AttributeError, NotImplementedError):
        return False
    return True


def resolve(mode: str, device: torch.device | str, dtype: torch.dtype) -> bool:
    """`rollout.prepacked_weights` for a copy on `device` in `dtype`: auto (on for a CPU copy where
    `available`), on (refused with one line where it cannot run), off."""
    if mode not in MODES:
        raise ValueError(f"unknown rollout.prepacked_weights {mode!r}; choose one of {', '.join(MODES)}")
    possible = torch.device(device).type == "cpu" and available(dtype)
    if mode == "on" and not possible:
        raise ValueError(f"rollout.prepacked_weights=on needs a CPU rollout copy and oneDNN support for {dtype} "
                         f"on this CPU; use auto or off")
    return mode != "off" and possible


class PrepackedLinear(nn.Linear):
    """An `nn.Linear` that multiplies small no-grad inputs by its prepacked weight (`repack` after the
    weight changes). Everything else (grad, other dtypes or devices, large inputs) takes F.linear."""

    packed: torch.Tensor | None = None

    def repack(self) -> None:
        self.packed = torch.ops.mkldnn._reorder_linear_weight(self.weight.detach(), BATCH_HINT)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        p = self.packed
        if (p is None or x.dtype != p.dtype or x.device.type != "cpu" or x.numel() > MAX_ROWS * x.shape[-1]
                or (torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad))):
            return F.linear(x, self.weight, self.bias)
        return torch.ops.mkldnn._linear_pointwise(x, p, self.bias, "none", [], "")


def prepack(model: nn.Module) -> list[str]:
    """Every plain `nn.Linear` of `model` becomes a `PrepackedLinear` with its weight laid out; returns
    their module names."""
    names = []
    for name, module in model.named_modules():
        if type(module) is nn.Linear:
            module.__class__ = PrepackedLinear
            module.repack()
            names.append(name)
    return names


def repack(model: nn.Module, written) -> int:
    """Lay out again every `PrepackedLinear` whose weight is one of the tensors `written` (the
    model's own tensors, as `state_dict()` holds them; a tied output layer is found through the
    embedding it shares); returns how many were."""
    ptrs = {t.data_ptr() for t in written}
    done = 0
    for module in model.modules():
        if isinstance(module, PrepackedLinear) and module.weight.data_ptr() in ptrs:
            module.repack()
            done += 1
    return done

"""The policy's weights as plain tensors for a sampling copy (rlpr's hf copy or vLLM)."""

from __future__ import annotations

from typing import Callable

import torch

from rlpr.model.forward import causal_lm


def merged_weights(policy, keep: Callable[[str], bool] | None = None) -> dict[str, torch.Tensor]:
    """The policy's weights as a plain (un-wrapped) state dict, LoRA deltas merged in; with `keep`,
    only the modules whose name (as in the causal LM's `named_modules`) it accepts.

    Read from the modules' tensors rather than `state_dict()`: under FSDP (inside
    `sharding.gathered`, or while one layer is gathered for `full_weights`) those are the full
    weights, while `state_dict()` would reshard them."""
    lm = causal_lm(policy)
    try:
        from peft.tuners.lora import LoraLayer
    except ImportError:  # pragma: no cover - peft is a dependency
        LoraLayer = ()
    keep = keep or (lambda name: True)
    out: dict[str, torch.Tensor] = {}
    lora_prefixes = []
    for name, module in lm.named_modules():
        if LoraLayer and isinstance(module, LoraLayer):
            lora_prefixes.append(name + ".")
            if not keep(name):
                continue
            base = module.get_base_layer()
            weight = base.weight.detach()
            if not getattr(module, "disable_adapters", False):
                for adapter in module.active_adapters:
                    if adapter in module.lora_A:
                        weight = weight + module.get_delta_weight(adapter).detach()
            out[f"{name}.weight"] = weight
            # the wrapped layer's other tensors as they are (Qwen2's q/k/v biases: LoRA leaves them alone)
            for key, tensor in base.named_parameters():
                if key != "weight":
                    out[f"{name}.{key}"] = tensor.detach()
    for module_name, module in lm.named_modules(remove_duplicate=False):  # the keys of lm.state_dict()
        if not keep(module_name):
            continue
        prefix = f"{module_name}." if module_name else ""
        buffers = [(n, b) for n, b in module._buffers.items() if n not in module._non_persistent_buffers_set]
        for name, tensor in [*module._parameters.items(), *buffers]:
            if tensor is not None and not any((prefix + name).startswith(p) for p in lora_prefixes):
                out.setdefault(prefix + name, tensor.detach())
    return out

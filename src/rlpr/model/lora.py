"""Which modules of a model get a LoRA adapter (`model.lora_target_modules`).

The default names are Llama's seven projections. Models that fuse some of them (Phi-3: `qkv_proj`,
`gate_up_proj`) have only two of those names (`o_proj`, `down_proj`), and peft would silently put
the adapter on those two: no attention input, no MLP input. So the default falls back to every
linear layer of the decoder (peft's "all-linear"), which on Llama-style models is the same seven.
"""

from __future__ import annotations

import logging

from rlpr.errors import ConfigError

log = logging.getLogger(__name__)

ALL_LINEAR = "all-linear"


def _matches(names: list[str], target: str) -> bool:
    """peft's rule for a list entry: a module's full name equals it or ends with "." + it."""
    return any(n == target or n.endswith("." + target) for n in names)


def lora_targets(model, targets) -> list[str] | str:
    """peft's `target_modules` for `targets` (model.lora_target_modules) on `model`:

    - ["all-linear"]: every linear layer except the output layer (peft's own rule);
    - the default list on a model that lacks any of its names: "all-linear" as well (see above);
    - other names as given: a ConfigError when none names a module of the model, a warning for
      those that name none.
    """
    from rlpr.config import ModelConfig

    targets = list(targets)
    if targets == [ALL_LINEAR]:
        return ALL_LINEAR
    names = [name for name, _ in model.named_modules() if name]
    missing = [t for t in targets if not _matches(names, t)]
    if not missing:
        return targets
    if sorted(targets) == sorted(ModelConfig().lora_target_modules):
        log.info("model.lora_target_modules: %s has no %s (fused projections?); the adapter goes on every "
                 "linear layer (all-linear)", type(model).__name__, ", ".join(missing))
        return ALL_LINEAR
    if len(missing) == len(targets):
        linear = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if type(m).__name__ in ("Linear", "Conv1D")})
        raise ConfigError(f"model.lora_target_modules: none of {', '.join(targets)} is a module of "
                          f"{type(model).__name__} (its linear layers: {', '.join(linear)}; or use all-linear)")
    log.warning("model.lora_target_modules: %s has no %s; the adapter goes on %s", type(model).__name__,
                ", ".join(missing), ", ".join(t for t in targets if t not in missing))
    return targets

"""The per-key value checks that need no registry: every numeric key's allowed range (RANGES, one
table; SAMPLING_RANGES for the commands that do not train, where rollout.temperature may be 0) and
every string being encodable text. Apart from config/validation.py's cross-field checks because
docs/config.md's "allowed" column is generated from the same table (rlpr/cli/config_reference.py).
"""

from __future__ import annotations

import dataclasses
import math

from rlpr.config.tree import Config
from rlpr.errors import ConfigError


INF = float("inf")
# Every numeric key's allowed range: (low, high, low included, high included). One table, checked
# at load time; NaN never passes, and infinity only where the range reaches it (grad_clip).
RANGES: dict[str, tuple[float, float, bool, bool]] = {
    "model.lora_rank": (1, INF, True, False), "model.lora_alpha": (0, INF, False, False),
    "model.lora_dropout": (0, 1, True, False), "model.threads": (0, INF, True, False),
    "data.demo_train_size": (0, INF, True, False), "data.demo_val_size": (0, INF, True, False),
    "data.demo_val_every": (2, INF, True, False), "data.val_limit": (0, INF, True, False),
    "data.max_prompt_tokens": (1, INF, True, False),
    "rollout.responses_per_prompt": (2, INF, True, False), "rollout.max_new_tokens": (1, INF, True, False),
    "rollout.temperature": (0, INF, False, False), "rollout.top_p": (0, 1, False, True),
    "rollout.batch_sequences": (1, INF, True, False), "rollout.min_new_tokens": (0, INF, True, False),
    "rollout.vllm_kv_cache_gb": (0, INF, False, False), "rollout.vllm_gpu_memory_utilization": (0, 1, False, True),
    "rollout.vllm_max_model_len": (0, INF, True, False), "rollout.vllm_max_batched_tokens": (1, INF, True, False),
    "reward.pr_weight": (0, INF, True, False), "reward.vr_weight": (0, INF, True, False),
    "reward.alpha": (0, 1, True, True), "reward.repetition_window": (1, INF, True, False),
    "reward.repetition_count": (1, INF, True, False), "reward.max_batch_tokens": (1, INF, True, False),
    "reward.scorer_ema": (0, 1, True, True), "reward.scorer_ema_every": (1, INF, True, False),
    "reward.efficiency_weight": (0, INF, True, False),
    "reward.random_p": (0, 1, True, True), "reward.entropy_last_k": (0, INF, True, False),
    "algorithm.filter_beta": (0, INF, True, False), "algorithm.filter_warmup_steps": (0, INF, True, False),
    "algorithm.filter_init_steps": (0, INF, True, False), "algorithm.filter_ema_decay": (0, 1, True, True),
    "algorithm.max_sampling_tries": (1, INF, True, False), "algorithm.clip_low": (0, 1, True, False),
    "algorithm.clip_high": (0, INF, True, False), "algorithm.entropy_coef": (0, INF, True, False),
    "algorithm.kl_coef": (0, INF, True, False), "algorithm.ref_sft_coef": (0, INF, True, False),
    "algorithm.rollout_is_min": (0, INF, True, False), "algorithm.rollout_is_max": (0, INF, False, True),
    "algorithm.early_stop_ratio": (0, INF, True, False),
    "opsd.beta": (0, 1, True, True), "opsd.top_k": (0, INF, True, False), "opsd.clip": (0, INF, False, True),
    "opsd.ema_decay": (0, 1, True, True), "opsd.hybrid_lambda": (0, INF, True, False),
    "opsd.no_teacher_rho": (0, 1, False, True), "opsd.no_teacher_delta": (0, INF, True, False),
    "opsd.identity_every": (0, INF, True, False), "opsd.jsd_token_clip": (0, INF, True, False),
    "trainer.prompts_per_step": (1, INF, True, False), "trainer.mini_batch_prompts": (1, INF, True, False),
    "trainer.micro_batch_sequences": (1, INF, True, False),
    "trainer.micro_batch_tokens": (0, INF, True, False), "trainer.epochs_per_step": (1, INF, True, False),
    "trainer.lr": (0, INF, False, False), "trainer.weight_decay": (0, INF, True, False),
    "trainer.adam_beta1": (0, 1, True, False), "trainer.adam_beta2": (0, 1, True, False),
    "trainer.grad_clip": (0, INF, False, True),  # 0 would zero every gradient; inf: no clipping
    "trainer.warmup_steps": (0, INF, True, False), "trainer.max_steps": (1, INF, True, False),
    "trainer.eval_every": (0, INF, True, False), "trainer.eval_max_new_tokens": (0, INF, True, False),
    "trainer.eval_samples": (0, INF, True, False), "trainer.eval_temperature": (0, INF, True, False),
    "trainer.eval_top_p": (0, 1, True, True), "trainer.sample_every": (0, INF, True, False),
    "trainer.length_warn_ratio": (0, 1, True, True),
    "trainer.save_every": (0, INF, True, False), "trainer.keep_last": (1, INF, True, False),
}


# The sections that `rlpr eval`, `serve` and `reward-quality` read and check (the rest is
# training's); there rollout.temperature may be 0, which means greedy decoding.
SAMPLING_SECTIONS = ("model", "rollout", "reward")
SAMPLING_RANGES = {**RANGES, "rollout.temperature": (0, INF, True, False)}


# The largest float32 (the dtype the losses, clipping and sampling compute in): a finite float key
# above it became infinity, or "value cannot be converted to type float without overflow" at the first
# update, after the run folder was written (issue 60, S12: algorithm.clip_high=1e39, opsd.hybrid_lambda)
FLOAT32_MAX = 3.4028234663852886e38
# The smallest sampling temperature other than 0 (greedy): logits divided by less can overflow to
# infinity and the sampler draws garbage (issue 60, S8: --temperature 1e-40 was graded as real answers).
# Below it a temperature is greedy decoding to every digit that matters; vLLM's threshold is the same.
MIN_TEMPERATURE = 1e-5


def temperature_problem(value: float, zero: str = "") -> str | None:
    """Why a sampling temperature is refused beyond its range (None when it is not): between 0 and
    MIN_TEMPERATURE the logits divided by it overflow. `zero`: what 0 means there, if it is allowed."""
    if 0 < value < MIN_TEMPERATURE:
        return (f"{value!r} is below {MIN_TEMPERATURE:g}: the logits divided by it overflow float32 and sampling "
                f"returns garbage" + (f"; use 0 for {zero}" if zero else ""))
    return None


# Every temperature key, with what its 0 means in the training config (None: 0 is out of its range)
TEMPERATURE_KEYS = {"rollout.temperature": None, "trainer.eval_temperature": "rollout.temperature"}


def float_keys(cfg: Config) -> set[str]:
    """The keys whose field is a float (their values go into float32 tensor math)."""
    return {f"{s.name}.{f.name}" for s in dataclasses.fields(cfg) if dataclasses.is_dataclass(getattr(cfg, s.name))
            for f in dataclasses.fields(getattr(cfg, s.name)) if f.type in ("float", float)}


def check_ranges(cfg: Config, ranges: dict = RANGES, sections: tuple[str, ...] | None = None) -> None:
    """Every numeric key finite (but where its range reaches infinity) and inside its range; every
    float key within float32's range (`FLOAT32_MAX`); a temperature not below MIN_TEMPERATURE."""
    floats = float_keys(cfg)
    for key, (low, high, low_in, high_in) in ranges.items():
        if sections is not None and key.split(".")[0] not in sections:
            continue
        value = _get(cfg, key)
        below = value < low if low_in else value <= low
        above = value > high if high_in else value >= high
        if math.isnan(value) or below or above:
            raise ConfigError(f"{key}: must be in {interval(ranges[key])}, got {value!r}")
        if key in floats and math.isfinite(value) and abs(value) > FLOAT32_MAX:
            raise ConfigError(f"{key}: {value!r} is beyond float32's range ({FLOAT32_MAX:.4g}), which training and "
                              f"sampling compute in" + ("; inf is allowed" if high == INF and high_in else ""))
        zero = "greedy decoding" if ranges is SAMPLING_RANGES and key == "rollout.temperature" else \
            TEMPERATURE_KEYS.get(key)
        problem = temperature_problem(value, zero or "") if key in TEMPERATURE_KEYS else None
        if problem:
            raise ConfigError(f"{key}: {problem}")


def check_texts(cfg: Config, sections: tuple[str, ...] | None = None) -> None:
    """Every string of the configuration (list items included) is text a file and a tokenizer can
    hold: a lone surrogate ("\\ud800", from a YAML escape) is one line naming the key, not an
    encoding error in the tokenizer or the config.yaml writer."""
    for section in dataclasses.fields(cfg):
        part = getattr(cfg, section.name)
        if not dataclasses.is_dataclass(part) or (sections is not None and section.name not in sections):
            continue
        for f in dataclasses.fields(part):
            value = getattr(part, f.name)
            for i, text in enumerate(value if isinstance(value, list) else [value]):
                if isinstance(text, str):
                    try:
                        text.encode("utf-8")
                    except UnicodeEncodeError:
                        where = f" item {i}" if isinstance(value, list) else ""
                        raise ConfigError(f"{section.name}.{f.name}:{where} holds a lone surrogate ({text!r}), "
                                          f"which is not text") from None


def interval(bounds: tuple[float, float, bool, bool]) -> str:
    low, high, low_in, high_in = bounds
    return f"{'[' if low_in else '('}{low:g}, {high:g}{']' if high_in else ')'}"


def _get(cfg: Config, key: str):
    section, name = key.split(".")
    return getattr(getattr(cfg, section), name)

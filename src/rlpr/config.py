"""The single source of configuration truth: one tree of dataclasses with documented defaults.

Presets (YAML files in `configs/`) and dotted command-line overrides (`trainer.max_steps=3`)
only change values of this tree; everything is validated once, at load time, with one-line
errors that name the key.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.util
import math
import typing
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from rlpr.errors import ConfigError

PRESET_DIR = Path(__file__).parent / "configs"
# How a seed and an index (prompt, sample, step, epoch) become one seed: `seed * SEED_MIX + index`.
# A prime above any index used, so distinct (seed, index) pairs give distinct seeds.
SEED_MIX = 1_000_003


@dataclass
class ModelConfig:
    path: str = "default"  # "default" (embedded SmolLM2-135M-Instruct), a HF model dir or a .gguf
    lora: bool = True  # train a LoRA adapter (peft) instead of all weights
    lora_rank: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.0
    lora_target_modules: list[str] = field(default_factory=lambda: [
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    gradient_checkpointing: bool = False
    rollout_dtype: str = "auto"  # dtype of the sampling copy: auto (bfloat16 where the hardware has fast bf16:
    #                              GPUs, CPUs with AVX512-BF16/AMX; else float32) | bfloat16 | float32
    threads: int = 0  # torch threads per process (0: torch's default)
    device: str = "auto"  # auto (cuda:LOCAL_RANK when CUDA is available, else cpu) | cpu | cuda


@dataclass
class DataConfig:
    train: str = "demo"  # "demo" (built-in tasks) or a .parquet/.jsonl/.json/.csv file
    val: str = "demo"  # held-out data for evaluation: "demo", a file, or "" for none
    template: str = "r1"  # r1 | r1_nothink | r1_user | plain (flat files and demo tasks only)
    prefill: str = ""  # text the assistant turn starts with, e.g. "<think>" (part of the response)
    question_column: str = "question"
    answer_column: str = "answer"
    choices_column: str = "choices"
    demo_train_size: int = 1000
    demo_val_size: int = 50
    demo_seed: int = 0  # which draw of the demo tasks (fixed, so that training seeds share the data)
    demo_val_every: int = 8  # one demo question in this many is held out (by a hash of its text)
    demo_families: list[str] = field(default_factory=list)  # demo task families to use (empty: all of them;
    #                                                          see rlpr/data/demo_tasks.py FAMILIES)
    val_limit: int = 0  # evaluate on at most this many held-out examples (0: all)
    max_prompt_tokens: int = 1024  # longer prompts are skipped (counted), never crash the run
    shuffle: bool = True


@dataclass
class RolloutConfig:
    engine: str = "hf"  # rollout engine (Hugging Face generate)
    responses_per_prompt: int = 8  # the group size n
    max_new_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    batch_sequences: int = 32  # sequences per generate call
    share_prefill: bool = True  # prefill each prompt once and repeat its KV cache for its n rows
    decode_loop: str = "rlpr"  # rlpr (preallocated KV cache, finished rows leave the batch) | generate (HF's)


@dataclass
class RewardConfig:
    kind: str = "probability"  # probability (RLPR) | verifier (RLVR: 1 if the eval grader accepts) | hybrid
    #                            (vr_weight * verifier + pr_weight * probability, the official code's prob_mix)
    pr_weight: float = 0.5  # hybrid only
    vr_weight: float = 1.0  # hybrid only
    format_mode: str = "r1"  # r1 | r1_nothink | boxed
    aggregation: str = "mean_prob"  # mean_prob | mean_logprob | seq_likelihood | geo_mean_prob
    shaping: str = "threshold_0"  # identity | threshold_T | leaky_T | sigmoid_K | bin_N
    alpha: float = 0.1  # weight of the format reward
    debias: bool = True  # subtract score A (False: the "without debiasing" ablation)
    score_a: str = "initial"  # initial (cached, from the initial policy) | current (every step)
    repetition_penalty: bool = True
    repetition_window: int = 10
    repetition_count: int = 10
    repetition_only_nonzero: bool = True  # as the reference implementation: only if reward != 0
    invalid_fallback: str = "none"  # none | free (spec 1b: score a tagless response as reasoning)
    answer_cue: str = "\n<answer> "
    answer_turn: str = ""  # if set, the fallback's cue is instead a follow-up user turn asking this, written
    #                        by the model's chat template (the response becomes a finished assistant turn)
    score_a_form: str = "cue"  # A for fallback responses: cue (Q + answer_cue + y*, like their B) | prompt
    #                            (the paper's Q + " " + y*, as for valid responses); spec 1b
    max_batch_tokens: int = 8192  # padded tokens per scoring forward


@dataclass
class AlgorithmConfig:
    advantage: str = "grpo"  # grpo | rloo | dr_grpo | reinforce_pp
    std_filter: bool = True
    filter_beta: float = 0.5  # keep a group iff std >= beta * ema
    filter_warmup_steps: int = 10  # no filtering for steps 1..warmup
    filter_init_steps: int = 5  # the EMA starts as the mean of the last this-many warm-up steps
    filter_ema_decay: float = 0.99
    max_sampling_tries: int = 3  # rollout rounds per step for dynamic sampling
    on_insufficient: str = "train"  # train (on what was kept) | error
    clip_low: float = 0.2
    clip_high: float = 0.27
    loss_agg: str = "token_mean"  # token_mean | seq_mean_token_mean | seq_mean_token_sum
    entropy_coef: float = 1e-3
    kl_coef: float = 0.0  # 0 disables the KL term
    kl_estimator: str = "k3"  # k1 | k2 | k3


@dataclass
class TrainerConfig:
    prompts_per_step: int = 8  # groups kept per step (after filtering)
    mini_batch_prompts: int = 2  # prompts (whole groups) per optimizer update
    micro_batch_sequences: int = 8  # sequences per forward/backward (gradient accumulation)
    epochs_per_step: int = 1
    lr: float = 1e-6
    weight_decay: float = 0.01
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    grad_clip: float = 1.0
    warmup_steps: int = 0  # linear learning-rate warm-up, then constant
    mixed_precision: str = "none"  # none | bf16: autocast the update's passes (fp32 master weights) | auto
    #                                (bf16 where the hardware has fast bf16, else none)
    fp32_attention: bool = True  # with bf16 on CPU: attention in fp32 (faster there, and more precise)
    bf16_frozen_weights: bool = True  # with bf16: frozen weights (LoRA's base) cast once per update, not per
    #                                   forward (exact; 2 bytes per frozen weight during the update; ddp only)
    strategy: str = "ddp"  # ddp (a full replica per process) | fsdp (weights, gradients, optimizer states
    #                        sharded over processes) | deepspeed (DeepSpeed ZeRO; see rlpr/parallel/sharding.py).
    #                        One process: all the same
    zero_stage: int = 2  # with strategy=deepspeed: 1 (optimizer states sharded) | 2 (and gradients)
    share_prompt_prefix: bool = True  # run each prompt once for its responses, whatever the micro-batch
    #                                   (exact; not combined with model.gradient_checkpointing)
    max_steps: int = 100
    seed: int = 0
    eval_every: int = 0  # 0: only before the first and after the last step
    eval_before: bool = True  # evaluate the initial policy before the first step
    eval_max_new_tokens: int = 0  # 0: same as rollout.max_new_tokens
    eval_samples: int = 0  # k > 0: also k samples per held-out question at the rollout temperature
    #                        (Avg@k accuracy, pass@k); 0: greedy only
    sample_every: int = 1  # write sampled generations every N steps
    save_every: int = 10  # checkpoint every N steps and at the end (0: only at the end)
    keep_last: int = 2
    output_dir: str = "runs"
    name: str = ""  # run name (default: preset + timestamp)
    tensorboard: bool = True
    progress: bool = True


@dataclass
class Config:
    preset: str = "demo"
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


# -- building and overriding ------------------------------------------------------------------

def _coerce(value, tp, key: str):
    """Check/convert a YAML value to the field's declared type."""
    origin = typing.get_origin(tp)
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        (item_tp,) = typing.get_args(tp)
        return [_coerce(v, item_tp, key) for v in value]
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: expected true or false, got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ConfigError(f"{key}: expected an integer, got {value!r}")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
        raise ConfigError(f"{key}: expected a number, got {value!r}")
    if tp is str:
        if value is None:
            return ""
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
        raise ConfigError(f"{key}: expected a string, got {value!r}")
    return value


def _set(obj, dotted: str, value, prefix: str = "") -> None:
    head, _, rest = dotted.partition(".")
    names = {f.name: f for f in dataclasses.fields(obj)}
    key = prefix + head
    if head not in names:
        close = difflib.get_close_matches(head, names, n=1)
        hint = f" (did you mean '{prefix}{close[0]}'?)" if close else ""
        raise ConfigError(f"unknown config key '{key}'{hint}")
    hints = typing.get_type_hints(type(obj))
    current = getattr(obj, head)
    if dataclasses.is_dataclass(current):
        if rest:
            _set(current, rest, value, key + ".")
        elif isinstance(value, dict):
            for k, v in value.items():
                _set(current, str(k), v, key + ".")
        else:
            raise ConfigError(f"{key}: expected a mapping of its fields, got {value!r}")
        return
    if rest:
        raise ConfigError(f"unknown config key '{key}.{rest}' ('{key}' has no fields)")
    setattr(obj, head, _coerce(value, hints[head], key))


def apply(cfg: Config, values: dict, prefix: str = "") -> Config:
    for k, v in values.items():
        _set(cfg, str(k), v, prefix)
    return cfg


def preset_path(name: str) -> Path:
    path = Path(name)
    if path.suffix in (".yaml", ".yml"):
        if not path.is_file():
            raise ConfigError(f"{path}: config file not found")
        return path
    path = PRESET_DIR / f"{name}.yaml"
    if not path.is_file():
        names = ", ".join(sorted(p.stem for p in PRESET_DIR.glob("*.yaml")))
        raise ConfigError(f"unknown preset '{name}'; available: {names} (or a path to a .yaml)")
    return path


def read_yaml(path: Path) -> dict:
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    return data


def parse_override(text: str) -> tuple[str, object]:
    """`a.b=value` with the value read as YAML (numbers, booleans, lists). A plain string
    keeps its spaces exactly as given (`reward.answer_cue=<answer> ` ends with a space); quote
    it for YAML escapes ("\\n")."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"override {text!r}: expected key=value, e.g. trainer.max_steps=3")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    if isinstance(value, str) and raw.strip()[:1] not in ("'", '"'):
        value = raw  # YAML strips a plain scalar's leading and trailing spaces
    return key.strip(), value


def load_config(preset: str = "demo", overrides: list[str] | None = None,
                base: dict | None = None) -> Config:
    """Defaults <- preset YAML <- `base` dict (e.g. a resumed run's config) <- overrides; validated."""
    cfg = Config()
    if preset:
        data = read_yaml(preset_path(preset))
        data.pop("preset", None)
        apply(cfg, data)
        cfg.preset = Path(preset).stem
    if base:
        apply(cfg, base)
    for text in overrides or []:
        key, value = parse_override(text)
        _set(cfg, key, value)
    validate(cfg)
    return cfg


def _choice(key: str, value: str, allowed) -> None:
    if value not in allowed:
        raise ConfigError(f"{key}: {value!r} is not one of {', '.join(allowed)}")


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
    "rollout.batch_sequences": (1, INF, True, False),
    "reward.pr_weight": (0, INF, True, False), "reward.vr_weight": (0, INF, True, False),
    "reward.alpha": (0, 1, True, True), "reward.repetition_window": (1, INF, True, False),
    "reward.repetition_count": (1, INF, True, False), "reward.max_batch_tokens": (1, INF, True, False),
    "algorithm.filter_beta": (0, INF, True, False), "algorithm.filter_warmup_steps": (0, INF, True, False),
    "algorithm.filter_init_steps": (0, INF, True, False), "algorithm.filter_ema_decay": (0, 1, True, True),
    "algorithm.max_sampling_tries": (1, INF, True, False), "algorithm.clip_low": (0, 1, True, False),
    "algorithm.clip_high": (0, INF, True, False), "algorithm.entropy_coef": (0, INF, True, False),
    "algorithm.kl_coef": (0, INF, True, False),
    "trainer.prompts_per_step": (1, INF, True, False), "trainer.mini_batch_prompts": (1, INF, True, False),
    "trainer.micro_batch_sequences": (1, INF, True, False), "trainer.epochs_per_step": (1, INF, True, False),
    "trainer.lr": (0, INF, False, False), "trainer.weight_decay": (0, INF, True, False),
    "trainer.adam_beta1": (0, 1, True, False), "trainer.adam_beta2": (0, 1, True, False),
    "trainer.grad_clip": (0, INF, False, True),  # 0 would zero every gradient; inf: no clipping
    "trainer.warmup_steps": (0, INF, True, False), "trainer.max_steps": (1, INF, True, False),
    "trainer.eval_every": (0, INF, True, False), "trainer.eval_max_new_tokens": (0, INF, True, False),
    "trainer.eval_samples": (0, INF, True, False), "trainer.sample_every": (0, INF, True, False),
    "trainer.save_every": (0, INF, True, False), "trainer.keep_last": (1, INF, True, False),
}


def check_ranges(cfg: Config) -> None:
    """Every numeric key finite (but where its range reaches infinity) and inside its range."""
    for key, (low, high, low_in, high_in) in RANGES.items():
        section, name = key.split(".")
        value = getattr(getattr(cfg, section), name)
        below = value < low if low_in else value <= low
        above = value > high if high_in else value >= high
        if math.isnan(value) or below or above:
            interval = f"{'[' if low_in else '('}{low:g}, {high:g}{']' if high_in else ')'}"
            raise ConfigError(f"{key}: must be in {interval}, got {value!r}")


def validate(cfg: Config) -> None:
    """Cross-field checks; every message names the key."""
    from rlpr.algorithms.advantages import ADVANTAGES
    from rlpr.algorithms.losses import LOSS_AGGREGATIONS, KL_ESTIMATORS
    from rlpr.data.templates import TEMPLATES
    from rlpr.reward.kinds import REWARD_KINDS
    from rlpr.reward.parsing import FORMAT_MODES
    from rlpr.reward.scoring import AGGREGATIONS
    from rlpr.reward.sequence import FALLBACKS
    from rlpr.reward.shaping import get_shaping

    t, r, a, ro = cfg.trainer, cfg.reward, cfg.algorithm, cfg.rollout
    _choice("model.rollout_dtype", cfg.model.rollout_dtype, ("auto", "bfloat16", "float32"))
    from rlpr.parallel.distributed import resolve_device

    resolve_device(cfg.model.device)  # a one-line ConfigError for cuda without CUDA, at load time
    _choice("data.template", cfg.data.template, TEMPLATES)
    _choice("rollout.engine", ro.engine, ("hf",))
    _choice("rollout.decode_loop", ro.decode_loop, ("rlpr", "generate"))
    _choice("reward.kind", r.kind, tuple(REWARD_KINDS))
    _choice("reward.format_mode", r.format_mode, FORMAT_MODES)
    _choice("reward.aggregation", r.aggregation, tuple(AGGREGATIONS))
    _choice("reward.score_a", r.score_a, ("initial", "current"))
    _choice("reward.invalid_fallback", r.invalid_fallback, FALLBACKS)
    _choice("reward.score_a_form", r.score_a_form, ("cue", "prompt"))
    _choice("algorithm.advantage", a.advantage, tuple(ADVANTAGES))
    _choice("algorithm.loss_agg", a.loss_agg, tuple(LOSS_AGGREGATIONS))
    _choice("algorithm.kl_estimator", a.kl_estimator, tuple(KL_ESTIMATORS))
    _choice("algorithm.on_insufficient", a.on_insufficient, ("train", "error"))
    _choice("trainer.mixed_precision", t.mixed_precision, ("none", "bf16", "auto"))
    from rlpr.parallel.sharding import STRATEGIES

    _choice("trainer.strategy", t.strategy, tuple(STRATEGIES))
    if t.strategy in ("fsdp", "deepspeed") and cfg.model.gradient_checkpointing:
        raise ConfigError(f"trainer.strategy={t.strategy} cannot be combined with model.gradient_checkpointing yet")
    if t.zero_stage == 3:
        raise ConfigError("trainer.zero_stage=3 is not offered: use trainer.strategy=fsdp (rlpr's ZeRO-3-like "
                          "sharding); ZeRO-3 gathers weights in hooks that every process must run in step, and "
                          "rlpr's processes run unequal numbers of no-grad forwards (scoring, log-probs)")
    if t.zero_stage not in (1, 2):
        raise ConfigError(f"trainer.zero_stage: {t.zero_stage!r} is not one of 1, 2")
    if t.strategy == "deepspeed" and importlib.util.find_spec("deepspeed") is None:
        raise ConfigError("trainer.strategy=deepspeed: DeepSpeed is not installed (pip install deepspeed)")
    try:
        get_shaping(r.shaping)
    except ValueError as e:
        raise ConfigError(f"reward.shaping: {e}") from None
    check_ranges(cfg)
    if ro.responses_per_prompt < 2:
        raise ConfigError("rollout.responses_per_prompt: group statistics need at least 2 responses")
    if t.prompts_per_step % t.mini_batch_prompts:
        raise ConfigError(f"trainer.prompts_per_step ({t.prompts_per_step}) must be a multiple of "
                          f"trainer.mini_batch_prompts ({t.mini_batch_prompts})")
    if a.filter_init_steps > a.filter_warmup_steps:
        raise ConfigError("algorithm.filter_init_steps: cannot exceed algorithm.filter_warmup_steps")
    if "demo" in (cfg.data.train, cfg.data.val):
        from rlpr.data.demo_tasks import pool_size

        for split, key in (("train", "demo_train_size"), ("val", "demo_val_size")):
            try:
                have = pool_size(split, cfg.data.demo_seed, cfg.data.demo_families, cfg.data.demo_val_every)
            except ValueError as e:
                raise ConfigError(f"data.demo_families: {e}") from None
            if getattr(cfg.data, key) > have:
                raise ConfigError(f"data.{key}: the demo {split} split has {have} questions"
                                  f"{' of these families' if cfg.data.demo_families else ''}; "
                                  f"got {getattr(cfg.data, key)}")
    if cfg.data.train != "demo" and not Path(cfg.data.train).is_file():
        raise ConfigError(f"data.train: file not found: {cfg.data.train}")
    if cfg.data.val not in ("demo", "") and not Path(cfg.data.val).is_file():
        raise ConfigError(f"data.val: file not found: {cfg.data.val}")


def validate_world(cfg: Config, world_size: int) -> None:
    """Checks that depend on the number of processes (known only once launched)."""
    t = cfg.trainer
    for key, value in (("trainer.prompts_per_step", t.prompts_per_step),
                       ("trainer.mini_batch_prompts", t.mini_batch_prompts)):
        if value % world_size:
            raise ConfigError(f"{key} ({value}) must be divisible by the number of processes ({world_size}): "
                              f"every process owns whole groups")

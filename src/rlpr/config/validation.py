"""`validate`: a built Config checked once, at load time: the registries' choices, the ranges and the
cross-field rules (strategy and offloading, reward kinds and debiasing, OPSD's template, the demo
pool, data files), each failure one line naming the key; `validate_world` adds the checks that
need the number of processes. The rules' own modules are imported inside the functions, as before
the split, so that importing the configuration stays light.
"""

from __future__ import annotations

import importlib.util

from rlpr.config.ranges import RANGES, SAMPLING_RANGES, _get, check_ranges, check_texts
from rlpr.config.registries import ZERO_STAGES, _choice, choices
from rlpr.config.tree import Config
from rlpr.errors import ConfigError


def validate(cfg: Config, sections: tuple[str, ...] | None = None) -> None:
    """Choices, ranges and cross-field checks; every message names the key. `sections`: check only
    those (the commands that do not train pass SAMPLING_SECTIONS, with SAMPLING_RANGES)."""
    from rlpr.parallel.distributed import resolve_device
    from rlpr.reward.shaping import get_shaping

    def wanted(key: str) -> bool:
        return sections is None or key.split(".")[0] in sections

    for key, allowed in choices().items():
        if not wanted(key):
            continue
        if key == "model.device":
            resolve_device(cfg.model.device)  # its choices, and a one-line ConfigError for cuda without CUDA
        else:
            _choice(key, _get(cfg, key), allowed)
    t, r, a, ro = cfg.trainer, cfg.reward, cfg.algorithm, cfg.rollout
    if sections is None:
        from rlpr.parallel.sharding import OFFLOADING

        if t.cpu_offload and t.strategy not in OFFLOADING:
            raise ConfigError(f"trainer.cpu_offload moves sharded optimizer states to the CPU: it needs "
                              f"trainer.strategy={' or '.join(OFFLOADING)} (got {t.strategy})")
        if t.zero_stage == 3:
            raise ConfigError("trainer.zero_stage=3 is not offered: use trainer.strategy=fsdp (rlpr's ZeRO-3-like "
                              "sharding); ZeRO-3 gathers weights in hooks that every process must run in step, "
                              "and rlpr's processes run unequal numbers of no-grad forwards (scoring, log-probs)")
        from rlpr.reward.lagged import LAGGED_STRATEGIES, wants_lagged

        if wants_lagged(r) and t.strategy not in LAGGED_STRATEGIES:
            raise ConfigError(f"reward.scorer=ema / reward.score_a=ema swap the lagged weights into the policy, "
                              f"which trainer.strategy={t.strategy} shards: use trainer.strategy=ddp")
        if t.zero_stage not in ZERO_STAGES:
            raise ConfigError(f"trainer.zero_stage: {t.zero_stage!r} is not one of 1, 2")
        if t.strategy == "deepspeed" and importlib.util.find_spec("deepspeed") is None:
            raise ConfigError("trainer.strategy=deepspeed: DeepSpeed is not installed (pip install deepspeed)")
        from rlpr.train.tracking import active_trackers, missing_package

        for name in active_trackers(t.trackers, t.tensorboard):
            if missing_package(name):
                raise ConfigError(f"trainer.trackers: {missing_package(name)}")
    if wanted("reward"):
        try:
            get_shaping(r.shaping)
        except ValueError as e:
            raise ConfigError(f"reward.shaping: {e}") from None
        from rlpr.reward.scoring import GROUP_AGGREGATIONS, LOG_DOMAIN

        if r.aggregation in LOG_DOMAIN and r.invalid_fallback == "none" and r.kind != "verifier":
            raise ConfigError(f"reward.aggregation={r.aggregation} needs reward.invalid_fallback=free: its scores "
                              "are <= 0, and a response with an invalid format would score 0, above every scored one")
        if r.kind == "nover" and r.debias:
            raise ConfigError("reward.kind=nover has no score A (its reward is a rank within the group): "
                              "set reward.debias=false")
        if r.score_span == "block" and r.debias and r.kind != "verifier":
            raise ConfigError("reward.score_span=block scores the answer block's tags, which score A (prompt + "
                              "y*) has not: set reward.debias=false")
        if r.aggregation in GROUP_AGGREGATIONS and r.debias and r.kind != "verifier":
            raise ConfigError(f"reward.aggregation={r.aggregation} weighs tokens by their spread across the group, "
                              "which score A (one text per prompt) has not: set reward.debias=false")
        if r.nover_gate != "format" and r.kind != "nover":
            raise ConfigError(f"reward.nover_gate chooses which responses NOVER ranks: it needs reward.kind=nover "
                              f"(got {r.kind})")
        if r.shuffle_references and r.kind in ("verifier", "hybrid") and r.verifier == "oracle":
            raise ConfigError("reward.shuffle_references: the oracle verifier grades against the true reference; "
                              "use reward.verifier=exact for a shuffled-reference RLVR control")
        from rlpr.reward.kinds import reads_reference

        if r.shuffle_references and not reads_reference(r.kind, cfg.opsd.context):
            raise ConfigError(f"reward.shuffle_references: reward.kind={r.kind} reads no reference"
                              + (" (opsd.context=none)" if reads_reference(r.kind) else ""))
        if r.efficiency_weight and r.kind != "nover":
            raise ConfigError(f"reward.efficiency_weight is NOVER's efficiency term: it needs reward.kind=nover "
                              f"(got {r.kind})")
    check_ranges(cfg, RANGES if sections is None else SAMPLING_RANGES, sections)
    check_texts(cfg, sections)
    if wanted("rollout"):
        for i, stop in enumerate(ro.stop):
            if not stop:
                raise ConfigError(f"rollout.stop: item {i} is empty; a stop string must hold at least one character")
    if wanted("rollout") and ro.responses_per_prompt < 2:
        raise ConfigError("rollout.responses_per_prompt: group statistics need at least 2 responses")
    if sections is not None:
        return
    if t.prompts_per_step % t.mini_batch_prompts:
        raise ConfigError(f"trainer.prompts_per_step ({t.prompts_per_step}) must be a multiple of "
                          f"trainer.mini_batch_prompts ({t.mini_batch_prompts})")
    if a.filter_init_steps > a.filter_warmup_steps:
        raise ConfigError("algorithm.filter_init_steps: cannot exceed algorithm.filter_warmup_steps")
    if ro.vllm_lora and (ro.engine != "vllm" or not cfg.model.lora):
        raise ConfigError("rollout.vllm_lora serves the LoRA adapter through vLLM: it needs rollout.engine=vllm "
                          "and model.lora=true")
    if ro.prepacked_weights == "on" and ro.engine != "hf":
        raise ConfigError("rollout.prepacked_weights=on lays out the hf engine's rollout copy: it needs "
                          "rollout.engine=hf (vLLM runs its own kernels)")
    if ro.vllm_lora and t.strategy == "fsdp":
        raise ConfigError("rollout.vllm_lora saves the adapter from each process's full copy, which "
                          "trainer.strategy=fsdp shards: use trainer.strategy=ddp (a LoRA adapter is small)")
    if a.rollout_is != "none" and ro.engine == "hf":
        raise ConfigError("algorithm.rollout_is corrects for the sampling engine's own log-probs, which "
                          "rollout.engine=hf does not report (it samples with the trainer's model): use rollout.engine=vllm")
    validate_opsd(cfg)
    if 0 < a.early_stop_ratio <= 1:
        raise ConfigError(f"algorithm.early_stop_ratio ({a.early_stop_ratio}) bounds a mean importance ratio, which "
                          f"is 1 before a step's first update: use a bound above 1 (RLinf uses 5), or 0 for none")
    if a.early_stop_ratio and t.strategy == "deepspeed":
        raise ConfigError("algorithm.early_stop_ratio drops a mini-batch's gradient before the optimizer step, which "
                          "DeepSpeed's engine takes itself: use trainer.strategy=ddp or fsdp")
    if a.rollout_is_min >= a.rollout_is_max:
        raise ConfigError(f"algorithm.rollout_is_min ({a.rollout_is_min}) must be below algorithm.rollout_is_max "
                          f"({a.rollout_is_max})")
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
    from rlpr.data.sources import source_exists

    if cfg.data.train != "demo" and not source_exists(cfg.data.train):
        raise ConfigError(f"data.train: file not found: {cfg.data.train}")
    if cfg.data.val not in ("demo", "") and not source_exists(cfg.data.val):
        raise ConfigError(f"data.val: file not found: {cfg.data.val}")


def validate_opsd(cfg: Config) -> None:
    """The opsd section's cross-field checks (only when reward.kind uses a teacher)."""
    from rlpr.data.templates import TEACHER_TEMPLATES
    from rlpr.reward.kinds import REWARD_KINDS
    from rlpr.reward.lagged import LAGGED_STRATEGIES

    o = cfg.opsd
    if REWARD_KINDS[cfg.reward.kind].token_signal != "teacher":
        return

    own = o.template not in TEACHER_TEMPLATES  # a text of the user's own: it must place both
    if own and "{question}" not in o.template:
        raise ConfigError(f"opsd.template: must be one of {', '.join(TEACHER_TEMPLATES)} or contain {{question}} "
                          f"(where the prompt's question goes)")
    if own and o.context != "none" and "{reference}" not in o.template:
        raise ConfigError(f"opsd.template: must contain {{reference}} (opsd.context={o.context} shows the teacher "
                          f"a reference)")
    if o.context == "solution" and not o.solution_column.strip():
        raise ConfigError("opsd.solution_column: opsd.context=solution needs the data column that holds the solutions")
    if o.teacher == "ema" and cfg.trainer.strategy not in LAGGED_STRATEGIES:
        raise ConfigError(f"opsd.teacher=ema swaps the averaged weights into the policy, which "
                          f"trainer.strategy={cfg.trainer.strategy} shards: use trainer.strategy=ddp")


def validate_world(cfg: Config, world_size: int) -> None:
    """Checks that depend on the number of processes (known only once launched)."""
    t = cfg.trainer
    for key, value in (("trainer.prompts_per_step", t.prompts_per_step),
                       ("trainer.mini_batch_prompts", t.mini_batch_prompts)):
        if value % world_size:
            raise ConfigError(f"{key} ({value}) must be divisible by the number of processes ({world_size}): "
                              f"every process owns whole groups")

"""Every key with a fixed set of values, and those values: `choices()` reads them from the registries
that own them (advantages, templates, reward kinds, engines, ...; imported inside the function, so
that importing the configuration loads none of them), ZERO_STAGES, and `_choice`, the one-line
error for a value outside its set. docs/config.md's "allowed" column is generated from here too.
"""

from __future__ import annotations

from rlpr.errors import ConfigError, shown


ZERO_STAGES = (1, 2)  # trainer.zero_stage (3: use trainer.strategy=fsdp)


def choices() -> dict[str, tuple]:
    """Every key with a fixed set of values, read from the registries that own them (in the order
    `validate` checks them)."""
    from rlpr.algorithms.advantages import ADVANTAGES
    from rlpr.algorithms.opsd import CONTEXTS, LOSSES, TEACHERS
    from rlpr.algorithms.refill import REFILL
    from rlpr.algorithms.losses import (ENTROPY_TOKENS, KL_ESTIMATORS, LOSS_AGGREGATIONS, PG_TOKENS, REF_SFT_NORMS,
                                        ROLLOUT_IS, SFT_WEIGHTS)
    from rlpr.config.recipes import RECIPES
    from rlpr.data.templates import TEMPLATES, TRANSITIONS
    from rlpr.parallel.distributed import DEVICES
    from rlpr.parallel.sharding import STRATEGIES
    from rlpr.reward.kinds import REWARD_KINDS
    from rlpr.reward.nover import NOVER_GATES
    from rlpr.reward.from_cache import CACHE_MODES
    from rlpr.reward.parsing import FORMAT_MODES
    from rlpr.reward.scoring import aggregation_names
    from rlpr.model.packing import PACK_MODES
    from rlpr.model.prepacked import MODES as PREPACKED_MODES
    from rlpr.model.precision import AUTO, MIXED_PRECISION, ROLLOUT_DTYPES
    from rlpr.reward.score_a import SCORE_A_MODELS, SCORERS
    from rlpr.reward.verifiers import VERIFIERS
    from rlpr.reward.sequence import FALLBACKS, SCORE_SPANS, SPLICES
    from rlpr.rollout.engines import ENGINES
    from rlpr.rollout.hf import loop_names
    from rlpr.train.tracking import TRACKERS

    return {
        "model.rollout_dtype": (AUTO, *ROLLOUT_DTYPES),
        "model.device": tuple(DEVICES),
        "data.template": tuple(TEMPLATES),
        "rollout.engine": tuple(ENGINES),
        "rollout.decode_loop": loop_names(),
        "rollout.prepacked_weights": PREPACKED_MODES,
        "reward.kind": tuple(REWARD_KINDS),
        "reward.verifier": tuple(VERIFIERS),
        "reward.format_mode": tuple(FORMAT_MODES),
        "reward.aggregation": aggregation_names(),
        "reward.score_a": SCORE_A_MODELS,
        "reward.scorer": SCORERS,
        "reward.invalid_fallback": tuple(FALLBACKS),
        "reward.score_a_form": ("cue", "prompt"),
        "reward.splice": SPLICES,
        "reward.score_span": SCORE_SPANS,
        "reward.nover_gate": NOVER_GATES,
        "reward.score_b_from_cache": CACHE_MODES,
        "reward.score_b_on_copy": CACHE_MODES,
        "algorithm.advantage": tuple(ADVANTAGES),
        "algorithm.loss_agg": tuple(LOSS_AGGREGATIONS),
        "algorithm.kl_estimator": tuple(KL_ESTIMATORS),
        "algorithm.on_insufficient": ("train", "error"),
        "algorithm.refill": tuple(REFILL),
        "algorithm.pg_tokens": PG_TOKENS,
        "algorithm.entropy_tokens": tuple(ENTROPY_TOKENS),
        "algorithm.ref_sft_weight": tuple(SFT_WEIGHTS),
        "algorithm.ref_sft_norm": tuple(REF_SFT_NORMS),
        "algorithm.rollout_is": ROLLOUT_IS,
        "opsd.loss": LOSSES,
        "opsd.teacher": TEACHERS,
        "opsd.context": CONTEXTS,
        "opsd.transition": TRANSITIONS,
        "opsd.recipe": ("", *RECIPES),
        "trainer.mixed_precision": (*MIXED_PRECISION, AUTO),
        "trainer.pack_responses": PACK_MODES,
        "trainer.strategy": tuple(STRATEGIES),
        "trainer.trackers": tuple(TRACKERS),
    }


def _choice(key: str, value, allowed) -> None:
    if isinstance(value, list):  # a list key (trainer.trackers): each item
        for item in value:
            _choice(key, item, allowed)
        return
    if value not in allowed:
        raise ConfigError(f"{key}: {shown(value)} is not one of {', '.join(allowed)}")

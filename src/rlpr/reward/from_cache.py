"""When score B continues the rollout's kept KV cache instead of recomputing o' (reward.score_b_from_cache).

Score B's o' is the prompt, the response's reasoning and the reference: the rollout engine has just
computed the keys and values of the prompt and the response, and score B then runs only the tokens
after the longest common prefix of o' and the rollout's tokens (reward/scoring.py). That is the same
arithmetic as recomputing o' only where the cache came from the weights and the dtype that score B
uses: B's scorer is the policy itself (reward.scorer=current; the engine is synced from it before
every step and before the held-out evaluation), and the rollout copy has the scorer's dtype
(model.rollout_dtype=float32, what `auto` picks on CPUs without fast bf16). With LoRA the copy holds
the merged weights: they differ from the adapter's separate matmuls by float rounding only (the
rewards equal recomputed ones to 1e-6 in fp32, tests/test_score_b_cache.py). From a bf16 copy the
keys and values carry bf16 rounding into B: measured on the demo's rollouts in
benchmarks/results/archive/score_b_cache.md (mean |dB| 3% of B's spread within a group, the worst 43%), and
learning was unchanged within seeds (benchmarks/results/precision_arms.md), so the default takes the
cache from either copy (`always`; it halves the native CPU step's score B and the held-out
evaluation's scoring) and `auto` is the exact-only choice.
"""

from __future__ import annotations

# reward.score_b_from_cache: always (the default: from any rollout copy), auto (only where exact: the
# rollout copy in the scorer's dtype), never
CACHE_MODES = ("auto", "always", "never")


def uses_cache(mode: str, kind_needs_score_b: bool, scorer: str, cache_dtype, scorer_dtype) -> bool:
    """Whether score B continues the rollout's caches: `mode` (reward.score_b_from_cache) for a reward
    kind that scores the reference (`kind_needs_score_b`) with `scorer` (reward.scorer), from caches
    in `cache_dtype` (the rollout copy's) for a scorer in `scorer_dtype` (torch dtypes, or their
    sizes in bytes as the memory plan has them)."""
    if mode not in CACHE_MODES:
        raise ValueError(f"unknown reward.score_b_from_cache {mode!r}; choose one of {', '.join(CACHE_MODES)}")
    if not kind_needs_score_b or scorer != "current":
        return False
    return allows(mode, cache_dtype, scorer_dtype)


def allows(mode: str, copy_dtype, scorer_dtype) -> bool:
    """A CACHE_MODES setting for the rollout copy's work in `copy_dtype` where the scorer computes in
    `scorer_dtype`: always takes it, auto only where the dtypes match (exact), never does not.
    reward.score_b_from_cache reads it for the caches, reward.score_b_on_copy for who continues them."""
    return mode == "always" or (mode == "auto" and copy_dtype == scorer_dtype)

"""Score B both ways in every training scoring of the speed run: from the rollout's kept caches and
recomputed, on the same responses."""

from __future__ import annotations

import time


class BothPaths:
    """Replaces a ProbabilityReward's `score_b`: each call scores B from the caches and recomputed
    (alternating which runs first), records both, and returns the cached one (`use_cache`, else the
    recomputed one)."""

    def __init__(self, reward, use_cache: bool = True):
        self.reward, self.score_b, self.use_cache = reward, reward.score_b, use_cache
        reward.score_b = self
        self.calls: list[dict] = []

    def __call__(self, model, items, groups, too_long=None, caches=None):
        paths = {}
        order = ("recomputed", "cache") if len(self.calls) % 2 == 0 else ("cache", "recomputed")
        for name in order:
            tick = time.perf_counter()
            kept = caches if name == "cache" else None
            paths[name] = (self.score_b(model, items, groups, too_long if name == "cache" else [], kept),
                           time.perf_counter() - tick)
        self.calls.append({"groups": list(groups) if groups is not None else None,
                           "scored": [it is not None for it in items],
                           "cached": [c is not None for c in caches] if caches is not None else [False] * len(items),
                           "b_cache": paths["cache"][0], "b_recomputed": paths["recomputed"][0],
                           "cache_s": paths["cache"][1], "recomputed_s": paths["recomputed"][1]})
        return paths["cache" if self.use_cache else "recomputed"][0]

"""Named groups of keys (`opsd.recipe`): a method's published recipe as one setting. A recipe is
applied where it is named (a preset, or the command line), before that layer's own keys, so an
explicit key still wins; a resumed run reads the values its config recorded and expands nothing.
"""

from __future__ import annotations

RECIPES: dict[str, dict[str, object]] = {
    # siyan-zhao/OPSD after its 2026 update (spec section 10): forward KL, a per-token clip of the
    # divergence, sampling at 1.1 with top-p 0.95, the fixed initial teacher shown worked solutions
    "authors_current": {"opsd.loss": "jsd", "opsd.beta": 0.0, "opsd.jsd_token_clip": 0.05,
                        "rollout.temperature": 1.1, "rollout.top_p": 0.95, "opsd.teacher": "initial",
                        "opsd.context": "solution"},
}

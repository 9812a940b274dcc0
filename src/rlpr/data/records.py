"""The one in-memory record every data source is turned into, and its verl row layout."""

from __future__ import annotations

from dataclasses import dataclass, field

from rlpr.errors import DataError  # noqa: F401 (re-exported: data.convert imports it from here)


@dataclass
class Example:
    """One prompt with its reference answer.

    `prompt` is a list of chat messages ({role, content}); `reference` the ground truth string;
    `acceptable` extra acceptable answers (for graders); `score_a` a precomputed score A.
    """

    prompt: list[dict]
    reference: str
    uid: str = ""
    data_source: str = ""
    ability: str = ""
    style: str = "rule"
    acceptable: list[str] = field(default_factory=list)
    choices: list[str] = field(default_factory=list)
    score_a: float | None = None
    extra_info: dict = field(default_factory=dict)

    def to_verl_row(self) -> dict:
        """The verl/RLPR parquet layout (spec section 8)."""
        extra = dict(self.extra_info)
        extra.setdefault("index", self.uid)
        if self.acceptable:
            extra["acceptable_answers"] = list(self.acceptable)
        if self.choices:
            extra["choices"] = list(self.choices)
        row = {
            "data_source": self.data_source,
            "prompt": [{"role": m["role"], "content": m["content"]} for m in self.prompt],
            "ability": self.ability,
            "reward_model": {"ground_truth": self.reference, "style": self.style},
            "extra_info": extra,
        }
        if self.score_a is not None:
            row["score_a"] = float(self.score_a)
        return row

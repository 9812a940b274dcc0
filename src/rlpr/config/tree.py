"""`Config`, the whole configuration tree: one field per section, in the order docs/config.md lists
them. It has a module of its own so that loading (config/loading.py) and the checks
(config/ranges.py, config/validation.py) can both name it without importing each other.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from rlpr.config.sampling import ModelConfig, RewardConfig, RolloutConfig
from rlpr.config.training import AlgorithmConfig, DataConfig, OpsdConfig, TrainerConfig


@dataclass
class Config:
    """The whole configuration: defaults <- preset <- overrides."""

    preset: str = "demo"
    """The preset (or config file stem) the run started from; set by the loader."""
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    opsd: OpsdConfig = field(default_factory=OpsdConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

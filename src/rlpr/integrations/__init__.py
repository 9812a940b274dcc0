"""Bridges to other training frameworks (each imports its framework lazily; none is a dependency).

- `rlpr.integrations.trl`: the RLPR reward as a reward function of TRL's `GRPOTrainer` (docs/trl.md).
"""

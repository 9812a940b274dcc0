"""rlpr: Reinforcement Learning with Reference Probability Reward (verifier-free RL)."""

__version__ = "0.1.0"

"""rlpr: Reinforcement Learning with Reference Probability Reward (verifier-free RL)."""

from rlpr.version import __version__  # noqa: F401


def __getattr__(name):
    """rlpr.config / score / evaluate (rlpr/api.py), imported on first use so that `import rlpr`
    stays quick; rlpr.train is the rlpr.train package, callable (rlpr/train/__init__.py)."""
    if name == "train":
        import rlpr.train

        return rlpr.train
    if name in ("config", "score", "evaluate"):
        from rlpr import api

        return getattr(api, name)
    raise AttributeError(f"module 'rlpr' has no attribute {name!r}")

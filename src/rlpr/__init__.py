"""rlpr: Reinforcement Learning with Reference Probability Reward (verifier-free RL)."""

import sys as _sys

from rlpr.parallel import threads as _threads
from rlpr.version import __version__  # noqa: F401

# before torch loads OpenMP (it reads the variable once): idle threads spin briefly, then sleep, so
# that several processes on one machine do not burn each other's CPUs (parallel/threads.py)
_threads.bounded_openmp_wait(torch_loaded="torch" in _sys.modules)
_threads.mark()


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

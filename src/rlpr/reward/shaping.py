"""Shaping of the debiased score x = B - A (spec section 2).

Names carry their parameter: `threshold_0` (default, max(0, x) = clip(B - A, 0, 1)),
`threshold_0.1`, `leaky_0`, `sigmoid_10`, `bin_10`, `identity`.
"""

from __future__ import annotations

import math
from typing import Callable


def identity(x: float) -> float:
    return x


def threshold(t: float) -> Callable[[float], float]:
    """x if x >= t else 0 (t = 0 gives max(0, x))."""
    return lambda x: x if x >= t else 0.0


def leaky(t: float) -> Callable[[float], float]:
    """x above t, 0.01 x below."""
    return lambda x: x if x >= t else 0.01 * x


def sigmoid(k: float) -> Callable[[float], float]:
    """1 / (1 + exp(-k (2x - 1)))."""
    def fn(x: float) -> float:
        z = -k * (2.0 * x - 1.0)
        return 0.0 if z > 700 else 1.0 / (1.0 + math.exp(z))
    return fn


def binned(n: float) -> Callable[[float], float]:
    """Round to the nearest multiple of 1/n."""
    if n <= 0:
        raise ValueError("bin_n needs n > 0")
    return lambda x: round(x * n) / n


_FAMILIES: dict[str, Callable[[float], Callable[[float], float]]] = {
    "threshold": threshold, "leaky": leaky, "sigmoid": sigmoid, "bin": binned,
}
SHAPINGS = ("identity", "threshold_T", "leaky_T", "sigmoid_K", "bin_N")


def get_shaping(name: str) -> Callable[[float], float]:
    """Resolve a shaping name such as `threshold_0` or `sigmoid_5`; ValueError names the problem."""
    if name == "identity":
        return identity
    family, _, param = name.partition("_")
    if family in _FAMILIES and param:
        try:
            value = float(param)
        except ValueError:
            pass
        else:
            return _FAMILIES[family](value)
    raise ValueError(f"unknown shaping {name!r}; use one of {', '.join(SHAPINGS)} (e.g. threshold_0)")

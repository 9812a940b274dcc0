"""`rlpr.config(...)`, the Python API's call: `from_preset` with the checks of its arguments' types
(`override_list`: a string of overrides is one line naming it, not its characters), and
`_CallableModule`, the class the package module rlpr.config takes (config/__init__.py) so that the
module itself is that call. Apart from loading.py because only the Python API needs these checks;
the command line passes its overrides to load_config directly.
"""

from __future__ import annotations

import os

from rlpr.config.loading import load_config
from rlpr.config.tree import Config
from rlpr.errors import ArgumentTypeError


def from_preset(preset: str = "demo", overrides=None) -> Config:
    """A validated Config: the preset (a name in rlpr/configs or a YAML file) with dotted overrides,
    given as ["trainer.max_steps=5", ...] or {"trainer.max_steps": 5} (rlpr.config(...) in Python)."""
    return load_config(preset, override_list(overrides))


def _kind(value) -> str:
    return f"{type(value).__name__} {value!r}"[:120]


def override_list(overrides) -> list:
    """Dotted overrides as load_config takes them: a list of "key=value" strings as given, a dict as
    (key, value) pairs, its values kept as the Python values they are (as text they would be re-read
    as YAML: {"reward.answer_cue": "true"} became the boolean True); any other type is one line
    naming it (issue 35, N11: list("a=b") would be its characters, each an override)."""
    if overrides is None:
        return []
    if isinstance(overrides, (str, bytes)):
        raise ArgumentTypeError(f"overrides: expected a list of 'key=value' strings or a dict, got the string "
                                f"{overrides!r} (for one, pass [{overrides!r}])")
    if isinstance(overrides, dict):
        bad = next((k for k in overrides if not isinstance(k, str)), None)
        if bad is not None:
            raise ArgumentTypeError(f"overrides: the keys must be strings like 'trainer.max_steps', got {_kind(bad)}")
        return list(overrides.items())
    if not isinstance(overrides, (list, tuple)):
        raise ArgumentTypeError(f"overrides: expected a list of strings, got {_kind(overrides)}")
    for i, item in enumerate(overrides):
        if not isinstance(item, str):
            raise ArgumentTypeError(f"overrides[{i}]: expected a string, got {_kind(item)}")
    return list(overrides)


class _CallableModule(__import__("types").ModuleType):
    """`rlpr.config(...)` is the Python API's call (rlpr/api.py's config). Importing this module binds
    the name `config` on `rlpr` to the module, hiding rlpr/__init__'s __getattr__; so the module
    itself is callable (as rlpr.train is), with the same argument checks (issue 35, N11: a string of
    overrides was read character by character), and its contents are unaffected."""

    def __call__(self, preset: str = "demo", overrides=None) -> Config:
        if not isinstance(preset, (str, os.PathLike)) or isinstance(preset, bool):
            raise ArgumentTypeError(f"preset: expected a path (str or os.PathLike), got {_kind(preset)}")
        return from_preset(str(preset), overrides)

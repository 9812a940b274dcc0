"""The single source of configuration truth: one tree of dataclasses with documented defaults.

Presets (YAML files in `configs/`) and dotted command-line overrides (`trainer.max_steps=3`)
only change values of this tree; everything is validated once, at load time, with one-line
errors that name the key. Every field carries its docstring; docs/config.md, the key reference,
is generated from them (`rlpr config --reference`, rlpr/cli/config_reference.py).

This package is the one place the rest of rlpr imports from (`from rlpr.config import NAME` for
every name below); the parts live beside it, one concern each, imports running down:
sampling.py (the model, rollout and reward sections) and training.py (data, algorithm, opsd,
trainer) <- tree.py (`Config`) <- ranges.py (RANGES, the text check) and registries.py (`choices`)
<- validation.py (`validate`, `validate_world`) <- loading.py (presets, overrides, `load_config`)
<- call.py (`from_preset`, `override_list`, and the call `rlpr.config(...)` this module answers).
"""

from __future__ import annotations

import sys

from rlpr.config.call import _CallableModule, _kind, from_preset, override_list  # noqa: F401 (re-exported)
from rlpr.config.loading import (  # noqa: F401 (re-exported: rlpr.config.NAME)
    PRESET_DIR, _coerce, _field_type, _set, apply, build_config, load_config, override_value, parse_override,
    preset_path, read_yaml)
from rlpr.config.ranges import (  # noqa: F401 (re-exported)
    INF, RANGES, SAMPLING_RANGES, SAMPLING_SECTIONS, _get, check_ranges, check_texts, interval)
from rlpr.config.registries import ZERO_STAGES, _choice, choices  # noqa: F401 (re-exported)
from rlpr.config.sampling import ModelConfig, RewardConfig, RolloutConfig  # noqa: F401 (re-exported)
from rlpr.config.training import (  # noqa: F401 (re-exported)
    AlgorithmConfig, DataConfig, OpsdConfig, TrainerConfig)
from rlpr.config.tree import Config  # noqa: F401 (re-exported)
from rlpr.config.validation import validate, validate_opsd, validate_world  # noqa: F401 (re-exported)
from rlpr.errors import ArgumentTypeError, ConfigError  # noqa: F401 (re-exported, as before the split)

sys.modules[__name__].__class__ = _CallableModule

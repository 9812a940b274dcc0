"""Building a Config: defaults <- a command's own defaults <- the preset or YAML file
(src/rlpr/configs/NAME.yaml) <- a base (a resumed run's config) <- dotted overrides, each value
checked against its field's declared type with a one-line error naming the key (`build_config`);
`load_config` then validates. Apart from the dataclasses because this is the only code that reads
files and override text; it imports the checks (config/validation.py), which never import it.
"""

from __future__ import annotations

import dataclasses
import difflib
import typing
from pathlib import Path

import yaml

from rlpr.config.tree import Config
from rlpr.config.validation import validate
from rlpr.errors import PARSE_ERRORS, ConfigError, parse_error_reason, shown, yaml_load

PRESET_DIR = Path(__file__).parent.parent / "configs"


def _coerce(value, tp, key: str):
    """Check/convert a YAML value to the field's declared type."""
    origin = typing.get_origin(tp)
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{key}: expected a list, got {shown(value)}")
        (item_tp,) = typing.get_args(tp)
        if item_tp is str and None in value:  # [null] became [""]: an empty stop string, a module named ""
            raise ConfigError(f"{key}: item {value.index(None)} is null; expected a string")
        return [_coerce(v, item_tp, key) for v in value]
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: expected true or false, got {shown(value)}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ConfigError(f"{key}: expected an integer, got {shown(value)}")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
        raise ConfigError(f"{key}: expected a number, got {shown(value)}")
    if tp is str:
        if value is None:
            return ""
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
        raise ConfigError(f"{key}: expected a string, got {shown(value)}")
    return value


def _set(obj, dotted: str, value, prefix: str = "") -> None:
    head, _, rest = dotted.partition(".")
    names = {f.name: f for f in dataclasses.fields(obj)}
    key = prefix + head
    if head not in names:
        close = difflib.get_close_matches(head, names, n=1)
        hint = f" (did you mean '{prefix}{close[0]}'?)" if close else ""
        raise ConfigError(f"unknown config key {shown(key)}{hint}")
    hints = typing.get_type_hints(type(obj))
    current = getattr(obj, head)
    if dataclasses.is_dataclass(current):
        if rest:
            _set(current, rest, value, key + ".")
        elif isinstance(value, dict):
            for k, v in value.items():
                _set(current, str(k), v, key + ".")
        else:
            raise ConfigError(f"{key}: expected a mapping of its fields, got {shown(value)}")
        return
    if rest:
        raise ConfigError(f"unknown config key '{key}.{rest}' ('{key}' has no fields)")
    setattr(obj, head, _coerce(value, hints[head], key))


def apply(cfg: Config, values: dict, prefix: str = "") -> Config:
    for k, v in values.items():
        _set(cfg, str(k), v, prefix)
    return cfg


def preset_path(name: str) -> Path:
    path = Path(name)
    if path.suffix in (".yaml", ".yml"):
        if not path.is_file():
            raise ConfigError(f"{path}: config file not found")
        return path
    path = PRESET_DIR / f"{name}.yaml"
    if not path.is_file():
        names = ", ".join(sorted(p.stem for p in PRESET_DIR.glob("*.yaml")))
        raise ConfigError(f"unknown preset '{name}'; available: {names} (or a path to a .yaml)")
    return path


def read_yaml(path: Path) -> dict:
    try:
        data = yaml_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML ({str(e).splitlines()[0]})") from None
    except PARSE_ERRORS as e:  # not UTF-8, an integer of over 4300 digits, nesting a thousand deep
        raise ConfigError(f"{path}: not valid YAML ({parse_error_reason(e)})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    return data


def parse_override(text: str) -> tuple[str, object]:
    """`a.b=value` with the value read as YAML (numbers, booleans, lists). A plain string
    keeps its spaces exactly as given (`reward.answer_cue=<answer> ` ends with a space); quote
    it for YAML escapes ("\\n")."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"override {shown(text)}: expected key=value, e.g. trainer.max_steps=3")
    try:
        value = yaml_load(raw) if raw.strip() else ""
    except (yaml.YAMLError, *PARSE_ERRORS):  # an integer of over 4300 digits, nesting a thousand deep: the text
        value = raw
    if isinstance(value, str) and raw.strip()[:1] not in ("'", '"'):
        value = raw  # YAML strips a plain scalar's leading and trailing spaces
    return key.strip(), value


def _field_type(cfg: Config, dotted: str):
    """The declared type of a dotted key (None when there is no such key: `_set` names it)."""
    obj, parts = cfg, dotted.split(".")
    for i, part in enumerate(parts):
        if not dataclasses.is_dataclass(obj) or part not in {f.name for f in dataclasses.fields(obj)}:
            return None
        if i == len(parts) - 1:
            return typing.get_type_hints(type(obj))[part]
        obj = getattr(obj, part)
    return None


def override_value(cfg: Config, text: str) -> tuple[str, object]:
    """A `key=value` override as `_set` takes it: for a string key the text as typed, unless quoted
    (YAML would make `trainer.name=2024-01-01` a date, `=null` an empty string and `=007` the
    number 7); for any other key the value read as YAML (`parse_override`)."""
    key, value = parse_override(text)
    raw = text.partition("=")[2]
    if _field_type(cfg, key) is str and raw.strip()[:1] not in ("'", '"'):
        return key, raw
    return key, value


def build_config(preset: str = "demo", overrides: list | None = None, base: dict | None = None, *,
                 defaults: dict | None = None) -> Config:
    """Defaults <- `defaults` (a command's own, e.g. eval's longer responses) <- preset YAML <- `base`
    (e.g. a resumed run's config) <- overrides, in order; not validated (`load_config` is).

    An override is `key=value` text (`parse_override`) or a `(key, value)` pair: what a command's
    shorthand flag sets (`--max-new-tokens 8` is `("rollout.max_new_tokens", 8)`)."""
    cfg = Config()
    if defaults:
        apply(cfg, defaults)
    if preset:
        data = read_yaml(preset_path(preset))
        data.pop("preset", None)
        opsd = data.get("opsd")
        apply_recipe(cfg, opsd.get("recipe") if isinstance(opsd, dict) else None)
        apply(cfg, data)
        cfg.preset = Path(preset).stem
    if base:
        apply(cfg, base)  # a resumed run's config holds its recipe's values: nothing is expanded again
    pairs = [override_value(cfg, item) if isinstance(item, str) else item for item in overrides or []]
    apply_recipe(cfg, next((value for key, value in reversed(pairs) if key == "opsd.recipe"), None))
    for key, value in pairs:
        _set(cfg, key, value)
    return cfg


def apply_recipe(cfg: Config, name) -> None:
    """Set the keys of the recipe `name` (config/recipes.py; None or "": nothing)."""
    from rlpr.config.recipes import RECIPES

    if not name:
        return
    if not isinstance(name, str) or name not in RECIPES:  # a preset's YAML may hold any value here
        raise ConfigError(f"opsd.recipe: {shown(name)} is not one of {', '.join(RECIPES)}")
    apply(cfg, RECIPES[name])


def load_config(preset: str = "demo", overrides: list | None = None, base: dict | None = None, *,
                defaults: dict | None = None, sections: tuple[str, ...] | None = None) -> Config:
    """`build_config`, then `validate(cfg, sections)`."""
    cfg = build_config(preset, overrides, base, defaults=defaults)
    validate(cfg, sections)
    return cfg

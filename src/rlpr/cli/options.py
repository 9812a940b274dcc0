"""The configuration options every model command shares: `--preset NAME` / `--config FILE`, dotted
overrides (`rollout.max_new_tokens=8`) and shorthand flags that each set one config key
(`--max-new-tokens 8`).

Precedence, lowest first: the dataclass defaults; the command's own defaults (`rlpr eval`: 1024
new tokens); the preset or config file; then the shorthand flags and the dotted overrides in the
order they stand on the command line, so that of two settings of one key the later wins
(`--max-new-tokens 8 rollout.max_new_tokens=16` gives 16, the other order 8). An argument of the
form `section.key=value` is an override wherever it stands, also among `--data` files; the
positional overrides form one group (argparse refuses a second group after more flags).
"""

from __future__ import annotations

import argparse
import re

SETTINGS = "config_settings"  # namespace attribute: shorthands and overrides, in command-line order
OVERRIDE = re.compile(r"^[A-Za-z_]\w*(\.\w+)+=")  # section.key=value


def _record(namespace, item) -> None:
    items = getattr(namespace, SETTINGS, None)
    if items is None:
        items = []
        setattr(namespace, SETTINGS, items)
    items.append(item)


class Shorthand(argparse.Action):
    """A flag that sets one config key (`--max-new-tokens` sets rollout.max_new_tokens)."""

    def __init__(self, option_strings, dest, key: str, **kwargs):
        self.key = key
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)
        _record(namespace, (self.key, values))


class Overrides(argparse.Action):
    """The positional dotted overrides."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, [*(getattr(namespace, self.dest, None) or []), *values])
        for text in values:
            _record(namespace, text)


class FilesAndOverrides(argparse.Action):
    """A list of files (`--data a b`) that passes on the dotted overrides typed after it."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, [v for v in values if not OVERRIDE.match(v)])
        for text in values:
            if OVERRIDE.match(text):
                _record(namespace, text)
                namespace.overrides = [*(getattr(namespace, "overrides", None) or []), text]
        if not getattr(namespace, self.dest):
            parser.error(f"argument {option_string}: expected at least one file")


def add_config_options(p, default_preset: str | None, defaults: dict | None = None) -> None:
    """`--preset`/`--config`, the positional overrides, and the command's own defaults."""
    shown = default_preset or "none: the documented defaults (docs/config.md)"
    p.add_argument("--preset", "--config", dest="preset", default=None, metavar="NAME_OR_FILE",
                   help=f"a preset in src/rlpr/configs/ or a .yaml config file (default: {shown})")
    p.add_argument("overrides", nargs="*", action=Overrides,
                   help="dotted overrides, e.g. rollout.max_new_tokens=8 (docs/config.md lists every key)")
    p.set_defaults(default_preset=default_preset, config_defaults=defaults or {})


def shorthand(p, flag: str, key: str, help: str, **kwargs) -> None:
    """A flag for one config key; its default is the key's (after the preset)."""
    p.add_argument(flag, action=Shorthand, key=key, default=None, help=f"{help} (sets {key})", **kwargs)


def command_config(args):
    """The command's Config, not yet validated (see the module docstring for the order)."""
    from rlpr.config import build_config

    return build_config(args.preset or args.default_preset or "", getattr(args, SETTINGS, None) or [],
                        defaults=args.config_defaults)

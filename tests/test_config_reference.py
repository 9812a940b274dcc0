"""Every config key is documented, and docs/config.md (the key reference) is generated from
those docs: this test fails when it is stale."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from rlpr.cli.config_reference import SECTIONS, field_docs
from rlpr.config import Config

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent
REGENERATE = "PYTHONPATH=src python -m rlpr config --reference > docs/config.md"


def generated(capsys) -> str:
    from rlpr.cli.main import main

    assert main(["config", "--reference"]) == 0
    return capsys.readouterr().out


def test_every_field_has_a_docstring():
    missing = [f"{s}.{f.name}" for s in SECTIONS for f in dataclasses.fields(getattr(Config(), s))
               if not field_docs(type(getattr(Config(), s))).get(f.name)]
    assert missing == []
    assert [f.name for f in dataclasses.fields(Config)] == ["preset", *SECTIONS]


def test_docs_config_md_is_up_to_date(capsys):
    text = generated(capsys)
    on_disk = (ROOT / "docs" / "config.md").read_text(encoding="utf-8")
    assert on_disk == text, f"docs/config.md is stale: regenerate it with `{REGENERATE}`"


def test_the_reference_lists_every_key_with_its_allowed_values(capsys):
    text = generated(capsys)
    for s in SECTIONS:
        for f in dataclasses.fields(getattr(Config(), s)):
            assert f"| `{s}.{f.name}` |" in text
    row = next(line for line in text.splitlines() if line.startswith("| `algorithm.advantage` |"))
    assert "grpo, rloo, dr_grpo, reinforce_pp, reinforce" in row
    row = next(line for line in text.splitlines() if line.startswith("| `rollout.max_new_tokens` |"))
    assert "[1, inf)" in row and "`--max-new-tokens` (eval, reward-quality, serve)" in row
    assert "(docs/config.md)" in (ROOT / "README.md").read_text()

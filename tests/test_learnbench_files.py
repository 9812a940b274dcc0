"""The learning benchmark's shared files (issue 60, S10): the default work folder is this user's own
and private, and claim and row files are created exclusively, never through a planted link."""

import importlib
import importlib.util
import json
import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "learning.py"
_spec = importlib.util.spec_from_file_location("bench_learning", BENCH)
_spec.loader.exec_module(importlib.util.module_from_spec(_spec))  # puts benchmarks/ on the path, as running it does
rows_mod = importlib.import_module("learnbench.rows")
cli = importlib.import_module("learnbench.cli")


def test_a_planted_link_never_redirects_a_claim_or_a_rewrite(tmp_path):
    """The claim went through `claims/NAME.tmp` with write_text, following a link planted at that
    predictable name in the shared temporary folder and overwriting its target."""
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    settings = {"steps": 1}
    claims = tmp_path / "work" / "claims"
    claims.mkdir(parents=True)
    name = f"rlpr-0-{rows_mod.settings_hash(settings)}"
    (claims / f"{name}.tmp").symlink_to(victim)
    (claims / ".lock").symlink_to(tmp_path / "created-through-the-lock")
    with pytest.raises(OSError):  # the lock refuses to follow the link
        rows_mod.claim(tmp_path / "work", ("rlpr", 0), settings)
    (claims / ".lock").unlink()
    assert rows_mod.claim(tmp_path / "work", ("rlpr", 0), settings)
    assert victim.read_text() == "precious\n" and not (tmp_path / "created-through-the-lock").exists()
    assert json.loads((claims / name).read_text())["pid"] == os.getpid()
    log = tmp_path / "learning.jsonl"
    rows_mod.append_row(log, {"variant": "base", "seed": None})
    (tmp_path / "learning.jsonl.tmp").symlink_to(victim)
    with rows_mod.rewriting(log) as rows:
        rows.append({"variant": "rlpr", "seed": 0})
    assert victim.read_text() == "precious\n" and len(log.read_text().splitlines()) == 2


def test_the_default_work_folder_is_private(tmp_path, monkeypatch):
    monkeypatch.setattr(cli.tempfile, "gettempdir", lambda: str(tmp_path))
    folder = rows_mod.private_dir(cli.default_workdir())
    assert folder == tmp_path / f"rlpr-learning-{os.getuid()}" and (folder.stat().st_mode & 0o777) == 0o700
    os.chmod(folder, 0o777)
    with pytest.raises(SystemExit, match="not a private folder of this user"):
        rows_mod.private_dir(folder)
    folder.rmdir()
    (tmp_path / "elsewhere").mkdir(mode=0o700)
    folder.symlink_to(tmp_path / "elsewhere")  # planted by another user before the first run
    with pytest.raises(SystemExit, match="not a private folder of this user"):
        rows_mod.private_dir(folder)


def test_a_run_never_writes_over_another_rows_responses(tmp_path):
    """A renamed variant's rows keep their responses' file names (variant-seed-settings hash): a run of the
    old name must get a file of its own, not replace theirs (issue 58's matched OPSD runs once did)."""
    log = tmp_path / "learning.jsonl"
    path = tmp_path / "learning_responses" / "opsd-0-abc.jsonl.gz"
    assert rows_mod.free_responses_path(log, path) == path  # no rows yet
    rows_mod.append_row(log, {"variant": "opsd_refcode_template", "seed": 0,
                              "responses": "learning_responses/opsd-0-abc.jsonl.gz"})
    second = rows_mod.free_responses_path(log, path)
    assert second == path.with_name("opsd-0-abc-2.jsonl.gz")
    rows_mod.append_row(log, {"variant": "opsd", "seed": 0, "responses": "learning_responses/opsd-0-abc-2.jsonl.gz"})
    assert rows_mod.free_responses_path(log, path) == path.with_name("opsd-0-abc-3.jsonl.gz")
    # a file that no row names (a run killed before its row was appended) is written over
    other = tmp_path / "learning_responses" / "rlpr-0-abc.jsonl.gz"
    assert rows_mod.free_responses_path(log, other) == other


def test_saved_responses_are_never_written_through_a_planted_link(tmp_path):
    """write_records wrote through `NAME.tmp`, a predictable name: a link planted there had its target
    overwritten. Now it writes as the rows and claims do (a random name, renamed into place)."""
    records = importlib.import_module("learnbench.records")
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    path = tmp_path / "learning_responses" / "rlpr-0-abc.jsonl.gz"
    path.parent.mkdir()
    path.with_name(path.name + ".tmp").symlink_to(victim)
    rows = [{"set": "heldout", "greedy": "Paris", "samples": ["Paris", "Lyon"]}]
    records.write_records(path, rows)
    assert victim.read_text() == "precious\n" and records.read_records(path) == rows
    assert not path.is_symlink() and (path.stat().st_mode & 0o777) == 0o644

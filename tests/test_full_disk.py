"""A full disk is one line wherever it happens (issue 43, item 2): a checkpoint save and an export
on a really full small file system (a tmpfs of a few KiB; skipped where mounting is not
permitted), where safetensors raises its own error type (SafetensorError, neither an OSError nor
a RuntimeError): it used to be a traceback and a `.tmp-step_N` left behind."""

import pytest

from rlpr.cli.main import main
from rlpr.errors import ConfigError, write_failure, write_failure_reason

from helpers import small_filesystem, tiny_cfg

pytestmark = pytest.mark.integration


def one_line(message):
    assert len(str(message).strip().splitlines()) == 1, message
    return str(message)


def test_safetensors_own_error_is_a_write_failure(tmp_path):
    import torch
    from safetensors import SafetensorError
    from safetensors.torch import save_file

    with small_filesystem(tmp_path / "disk", "16k") as disk:
        with pytest.raises(SafetensorError) as e:
            save_file({"w": torch.zeros(64 * 1024)}, str(disk / "w.safetensors"))
    assert not isinstance(e.value, (OSError, RuntimeError))  # why a catch of those two missed it
    assert write_failure(e.value) and write_failure_reason(e.value) == "No space left on device"
    assert not write_failure(ValueError("a bad value"))


@pytest.mark.parametrize("lora", [True, False], ids=["adapter", "full-model"])
def test_a_checkpoint_save_on_a_full_disk_is_one_line_and_leaves_no_temporary(tiny_dir, tmp_path, monkeypatch, lora):
    import rlpr.train.checkpoint as checkpoint
    from rlpr.train.trainer import Trainer

    with small_filesystem(tmp_path / "disk", "64k") as disk:
        cfg = tiny_cfg(tiny_dir, disk, "run", "trainer.max_steps=1", "data.val=", *([] if lora else ["model.lora=false"]))
        trainer = Trainer(cfg, disk / "run")
        # past the free-space estimate: the write itself meets the full disk
        monkeypatch.setattr(checkpoint, "_check_free_space", lambda *a: None)
        with pytest.raises(ConfigError) as e:
            trainer.save()
        message = one_line(e.value)
        assert "could not write checkpoint step_0 (No space left on device)" in message, message
        assert list((disk / "run" / "checkpoints").iterdir()) == []  # no .tmp-step_0


def test_an_export_on_a_full_disk_is_one_line_and_leaves_nothing(tiny_dir, tmp_path, capsys):
    from rlpr.train.trainer import train

    train(tiny_cfg(tiny_dir, tmp_path, "run", "trainer.max_steps=1", "data.val=", "trainer.report=false",
                   "rollout.responses_per_prompt=2", "trainer.prompts_per_step=2", "rollout.max_new_tokens=4"))
    capsys.readouterr()
    with small_filesystem(tmp_path / "disk", "64k") as disk:
        for fmt, out in (("hf", disk / "hf"), ("gguf", disk / "m.gguf")):
            assert main(["export", str(tmp_path / "run"), "--format", fmt, "-o", str(out)]) == 2
            err = capsys.readouterr().err.strip()
            assert one_line(err).startswith(f"rlpr: error: cannot write {out}: No space left on device"), err
            assert list(disk.iterdir()) == []  # no partial folder, no hidden temporary

"""A checkpoint is data, never code (issue 16, item 1): a crafted trainer_state.pt must not run
anything on `--resume`, and rlpr's own states round-trip as plain data."""

import random

import numpy as np
import pytest
import torch

from rlpr.train.checkpoint import STATE_FILE, load_state, rng_state, set_rng_state
from rlpr.errors import ConfigError

pytestmark = pytest.mark.integration


class _Payload:
    """Pickling this object makes unpickling call touch(marker): what an attacker would ship."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        import pathlib

        return (pathlib.Path.touch, (pathlib.Path(self.marker),))


def test_crafted_trainer_state_does_not_run_code(tmp_path):
    marker = tmp_path / "pwned"
    ckpt = tmp_path / "step_1"
    ckpt.mkdir()
    torch.save({"step": 1, "evil": _Payload(str(marker))}, ckpt / STATE_FILE)
    with pytest.raises(ConfigError, match="refusing to load"):
        load_state(ckpt)
    assert not marker.exists()


def test_rng_state_is_plain_data_and_restores_exactly(tmp_path):
    random.seed(3), np.random.seed(4), torch.manual_seed(5)
    state = rng_state()
    ckpt = tmp_path / "step_1"
    ckpt.mkdir()
    torch.save({"rng": state, "step": 1}, ckpt / STATE_FILE)
    expected = (random.random(), np.random.rand(), torch.rand(1).item())
    random.seed(0), np.random.seed(0), torch.manual_seed(0)
    set_rng_state(load_state(ckpt)["rng"])  # weights_only=True
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected


# --------------------------------------------------------------------------- resume (items 3-4)

def test_resume_refuses_changes_and_a_failed_resume_keeps_the_run(tiny_dir, tmp_path):
    import yaml

    from rlpr.train.checkpoint import latest_checkpoint, resume_config
    from rlpr.config import load_config
    from rlpr.train.trainer import train

    run = tmp_path / "run"
    cfg = load_config("demo", [f"model.path={tiny_dir}", f"trainer.output_dir={tmp_path}", "trainer.name=run",
                               "rollout.max_new_tokens=4", "rollout.responses_per_prompt=2",
                               "trainer.prompts_per_step=2", "trainer.mini_batch_prompts=2", "data.val=",
                               "data.demo_train_size=8", "trainer.max_steps=1", "trainer.progress=false",
                               "trainer.tensorboard=false"])
    train(cfg)
    saved = (run / "config.yaml").read_text()
    for override, key in (("model.lora=false", "model.lora"), ("rollout.responses_per_prompt=4",
                                                                 "rollout.responses_per_prompt"),
                          ("data.train=demo", None)):
        if key is None:  # an unchanged value is no change
            resume_config(run, [override])
            continue
        with pytest.raises(ConfigError, match=f"{key} cannot change on resume"):
            resume_config(run, [override])
    # a resume that fails while loading its checkpoint leaves config.yaml as it was
    state = latest_checkpoint(run) / STATE_FILE
    good = state.read_bytes()
    state.write_bytes(b"not a checkpoint")
    with pytest.raises(ConfigError):
        train(resume_config(run, ["trainer.max_steps=2"]), resume=str(run))
    assert (run / "config.yaml").read_text() == saved and not list(run.glob("resume_*.yaml"))
    state.write_bytes(good)
    train(resume_config(run, ["trainer.max_steps=2"]), resume=str(run))
    assert (run / "config.yaml").read_text() == saved
    record = yaml.safe_load((run / "resume_1.yaml").read_text())
    assert record == {"resumed_at_step": 1, "changed": {"trainer.max_steps": {"was": 1, "now": 2}}}


# --------------------------------------------------------------------------- saving (items 2, 12)

def _tiny_lora(tiny_dir):
    from rlpr.config import load_config
    from rlpr.model.loading import load_model
    from rlpr.train.setup import build_policy

    model, tok = load_model(str(tiny_dir))
    return build_policy(load_config("demo", [f"model.path={tiny_dir}"]), model), tok


def test_a_failed_save_keeps_the_previous_checkpoint(tiny_dir, tmp_path, monkeypatch):
    """A full disk (simulated: the free-space check and a write that fails midway) gives one line,
    leaves no partial step, and the previous checkpoint stays complete."""
    import shutil

    from rlpr.train import checkpoint as ck

    policy, tok = _tiny_lora(tiny_dir)
    state = {"step": 1, "rng": rng_state()}
    first = ck.save_checkpoint(tmp_path, 1, policy, tok, state, keep_last=2)
    real = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage", lambda p: real(p)._replace(free=1024))
    with pytest.raises(ConfigError, match="not enough free space.*previous checkpoint step_1 is intact"):
        ck.save_checkpoint(tmp_path, 2, policy, tok, {**state, "step": 2}, keep_last=2)
    monkeypatch.setattr(shutil, "disk_usage", real)

    def full_disk(*a, **k):
        raise RuntimeError("No space left on device (os error 28)")

    monkeypatch.setattr(torch, "save", full_disk)
    with pytest.raises(ConfigError, match="could not write checkpoint step_2 .No space left"):
        ck.save_checkpoint(tmp_path, 2, policy, tok, {**state, "step": 2}, keep_last=2)
    assert ck.list_checkpoints(tmp_path) == [first] and ck.is_complete(first)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_1"]


def test_pruning_is_atomic_and_loaders_skip_incomplete_checkpoints(tiny_dir, tmp_path):
    import shutil

    from rlpr.train import checkpoint as ck
    from rlpr.errors import ModelError
    from rlpr.model.loading import find_checkpoint

    policy, tok = _tiny_lora(tiny_dir)
    for step in (1, 2, 3):
        ck.save_checkpoint(tmp_path, step, policy, tok, {"step": step}, keep_last=2)
    root = tmp_path / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == ["step_2", "step_3"]
    # a step whose weights were half deleted (an older rlpr killed while pruning) is never loaded
    shutil.rmtree(root / "step_3" / "adapter")
    assert ck.list_checkpoints(tmp_path) == [root / "step_2"] and find_checkpoint(tmp_path) == root / "step_2"
    (root / "step_3" / "adapter").mkdir()
    with pytest.raises(ModelError, match="incomplete checkpoint"):
        find_checkpoint(root / "step_3")
    # a removal killed after its rename leaves only a .trash- folder, cleaned at the next save
    (root / ".trash-step_9").mkdir()
    ck.save_checkpoint(tmp_path, 4, policy, tok, {"step": 4}, keep_last=2)
    assert sorted(p.name for p in root.iterdir()) == ["step_2", "step_4"]  # no trash, no broken step_3


# --------------------------------------------------------------------------- free space (issue 29, item 20)

def test_the_free_space_margin_is_proportional_to_the_checkpoint(tiny_dir, tmp_path, monkeypatch):
    """A 1 MiB checkpoint saves with 5 MiB free (no fixed 16 MiB margin); twice its size is refused."""
    import shutil

    from rlpr.train import checkpoint as ck

    policy, tok = _tiny_lora(tiny_dir)
    real = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage", lambda p: real(p)._replace(free=5 << 20))
    state = {"step": 1, "blob": torch.zeros(1 << 18)}  # 1 MiB
    ck.save_checkpoint(tmp_path / "a", 1, policy, tok, state, keep_last=2)
    assert ck.list_checkpoints(tmp_path / "a")
    with pytest.raises(ConfigError, match="not enough free space"):
        ck.save_checkpoint(tmp_path / "b", 1, policy, tok, {"step": 1, "blob": torch.zeros(5 << 18)}, keep_last=2)


def test_the_checkpoint_estimate_covers_a_real_checkpoint(tiny_dir, tmp_path):
    """The size checked before step 1 (trainable weights + AdamW's two moments) is at least the
    size of the checkpoint written after an optimizer step, and not far above it."""
    from rlpr.train import checkpoint as ck
    from rlpr.train.setup import build_optimizer

    policy, tok = _tiny_lora(tiny_dir)
    from rlpr.config import load_config

    trainable = [p for p in policy.parameters() if p.requires_grad]
    estimate = ck.checkpoint_estimate(policy, tok)
    optimizer = build_optimizer(load_config("demo", []), trainable)
    for p in trainable:
        p.grad = torch.ones_like(p)
    optimizer.step()
    path = ck.save_checkpoint(tmp_path, 1, policy, tok, {"step": 1, "optimizer": optimizer.state_dict(),
                                                         "rng": rng_state()}, keep_last=1)
    written = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    assert written <= estimate <= 2 * written


# --------------------------------------------------------------------------- file modes (issue 35, E2)

def test_checkpoint_and_converted_files_get_the_umask_s_modes(tiny_dir, tmp_path):
    """safetensors wrote a checkpoint's weights 0600 and `rlpr data convert` (mkstemp) its parquet
    0600: other users and groups of a shared cluster could not read them. Now 0644 under umask 022,
    and 0640 under 027 (the umask decides, never rlpr)."""
    import os
    import json

    from rlpr.data.convert import convert_file
    from rlpr.train import checkpoint as ck

    policy, tok = _tiny_lora(tiny_dir)
    src = tmp_path / "q.jsonl"
    src.write_text(json.dumps({"question": "2+2?", "answer": "4"}) + "\n")
    old = os.umask(0o022)
    try:
        for mask, file_mode, dir_mode in ((0o022, 0o644, 0o755), (0o027, 0o640, 0o750)):
            os.umask(mask)
            ckpt = ck.save_checkpoint(tmp_path / f"run{mask:o}", 1, policy, tok, {"step": 1}, keep_last=2)
            files = [p for p in ckpt.rglob("*") if p.is_file()]
            assert any(p.name == "adapter_model.safetensors" for p in files)
            for p in files:
                assert p.stat().st_mode & 0o777 == file_mode, (p, oct(p.stat().st_mode))
            for p in [ckpt, *(d for d in ckpt.rglob("*") if d.is_dir())]:
                assert p.stat().st_mode & 0o777 == dir_mode, p
            out = tmp_path / f"q{mask:o}.parquet"
            convert_file("jsonl", str(src), str(out))
            assert out.stat().st_mode & 0o777 == file_mode
    finally:
        os.umask(old)

"""rlpr.model.memory: bounded oneDNN kernel caches (a user's own setting wins)."""

import os

import pytest

from rlpr.model.memory import KERNEL_CACHE_CAPACITY, cap_kernel_caches

pytestmark = pytest.mark.unit

NAMES = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")


def test_kernel_caches_are_capped_unless_the_user_set_them(monkeypatch):
    for name in NAMES:
        monkeypatch.delenv(name, raising=False)
    cap_kernel_caches()
    assert [os.environ[n] for n in NAMES] == [str(KERNEL_CACHE_CAPACITY)] * 2
    monkeypatch.setenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "512")
    cap_kernel_caches(8)
    assert os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == "512"


def test_the_trainer_caps_them_before_loading_a_model(monkeypatch, tiny_dir, tmp_path):
    from rlpr.config import load_config
    from rlpr.train.trainer import Trainer

    for name in NAMES:
        monkeypatch.delenv(name, raising=False)
    cfg = load_config("demo", [f"model.path={tiny_dir}", "data.val=", "data.demo_train_size=8",
                               f"trainer.output_dir={tmp_path}", "trainer.tensorboard=false"])
    Trainer(cfg, tmp_path / "run")
    assert os.environ["LRU_CACHE_CAPACITY"] == str(KERNEL_CACHE_CAPACITY)


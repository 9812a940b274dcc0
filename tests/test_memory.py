"""rlpr.model.memory: bounded oneDNN kernel caches (a user's own setting wins), and freed heap memory
given back only where the machine needs it."""

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



def test_the_free_heap_goes_back_only_when_it_is_a_large_share_of_what_is_left(monkeypatch):
    from rlpr.model import memory

    if memory._libc() is None or memory.free_heap_bytes() is None:
        pytest.skip("not glibc 2.33 or later: no mallinfo2")
    blocks = [bytearray(1 << 16) for _ in range(1024)]  # 64 MiB in blocks under the mmap threshold: the heap
    del blocks
    free = memory.free_heap_bytes()
    assert free >= 32 << 20
    monkeypatch.setattr(memory, "available_memory", lambda: 1 << 40)  # plenty left: keep the pages
    assert memory.release_memory() is False
    monkeypatch.setattr(memory, "available_memory", lambda: int(free / memory.TRIM_SHARE) - 1)  # scarce
    assert memory.release_memory() is True
    monkeypatch.setattr(memory, "available_memory", lambda: 1 << 40)
    assert memory.release_memory(force=True) is True

"""Shared fixtures: the embedded model's real tokenizer and tiny in-process models."""

from __future__ import annotations

import os

import pytest

# The suite runs several processes at once (one pytest worker per CPU, and the runs some tests start),
# each with up to 2 torch threads on tiny models: OpenMP's idle threads sleep at once here instead of
# spinning first (rlpr's default, rlpr/parallel/threads.py), which cost this suite 32% (9 min 56 s
# against 7 min 30 s of pytest on 2 cores, 2026-11-29). Set before rlpr and torch load OpenMP; a choice
# in the environment stands.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import rlpr  # noqa: E402,F401  (before torch, as in a run: rlpr/parallel/threads.py)
import torch  # noqa: E402

torch.set_num_threads(min(2, torch.get_num_threads()))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def pytest_xdist_auto_num_workers(config):
    """`-n auto` (pyproject's addopts): one worker per CPU this process may use, at most 4 (more would
    mostly add memory: each worker holds its own tiny models, some the embedded one)."""
    from rlpr.parallel.threads import allowed_cpus

    return max(1, min(len(allowed_cpus() or ()) or os.cpu_count() or 1, 4))


@pytest.fixture(scope="session")
def tokenizer():
    """SmolLM2's real tokenizer (fast, with its chat template)."""
    from rlpr.model.loading import load_tokenizer

    return load_tokenizer("default")


@pytest.fixture(scope="session")
def tiny_model(tokenizer):
    """A 2-layer Llama with SmolLM2's vocabulary, random weights."""
    from rlpr.model.loading import tiny_llama

    return tiny_llama(tokenizer, layers=2, hidden=64, seed=0)


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory, tiny_model, tokenizer):
    """The tiny model saved as a real HF model directory (what `model.path` / `--model` take)."""
    path = tmp_path_factory.mktemp("tiny-model")
    tiny_model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="session")
def real_model():
    """The embedded SmolLM2-135M-Instruct (end-to-end tests only)."""
    from rlpr.model.loading import load_model

    model, tok = load_model("default")
    return model, tok


@pytest.fixture(scope="session")
def one_process_run(tiny_dir, tmp_path_factory):
    """`one_process_run(steps, *overrides)`: the run directory of a one-process training run on the
    tiny model with helpers.common's settings, checkpointed after every step. Each (steps, overrides)
    trains once per test session: the multi-process tests (DDP, FSDP, DeepSpeed, accelerate) that
    compare against the same one-process run share it, and only read it."""
    from helpers import common

    from rlpr.config import load_config
    from rlpr.train.trainer import train

    runs = {}

    def run(steps, *overrides):
        key = (steps, *overrides)
        if key not in runs:
            out = tmp_path_factory.mktemp("one-process")
            train(load_config("demo", common(tiny_dir, out, "one", steps) + [*overrides, "trainer.save_every=1"]))
            runs[key] = out / "one"
        return runs[key]

    return run


@pytest.fixture
def no_model(monkeypatch):
    """Loading a model fails the test: the check under test must come first."""
    import rlpr.model.loading

    def fail(*a, **k):
        raise AssertionError("the model loaded before the bad input was refused")

    monkeypatch.setattr(rlpr.model.loading, "load_policy", fail)
    monkeypatch.setattr(rlpr.model.loading, "load_model", fail)

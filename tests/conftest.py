"""Shared fixtures: the embedded model's real tokenizer and tiny in-process models."""

from __future__ import annotations

import os

import pytest

import rlpr  # noqa: F401  (before torch, as in a run: OpenMP's passive wait, rlpr/parallel/threads.py)
import torch

torch.set_num_threads(min(2, torch.get_num_threads()))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


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

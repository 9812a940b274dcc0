"""A checkpoint is data, never code (issue 16, item 1): a crafted trainer_state.pt must not run
anything on `--resume`, and rlpr's own states round-trip as plain data."""

import random

import numpy as np
import pytest
import torch

from rlpr.checkpoint import STATE_FILE, load_state, rng_state, set_rng_state
from rlpr.config import ConfigError


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

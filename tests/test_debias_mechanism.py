"""The debiasing experiment (issue 28): the learning benchmark's `reinforce` variants are valid configs
that differ only in reward.debias. (The training-free look at saved samples, debias_mechanism.py, is
retired with its tests: its answer is results/archive/debias_mechanism.md, its code in commit a0f9d4c.)"""

import importlib
import importlib.util
from pathlib import Path

import pytest

from rlpr.config import load_config

pytestmark = pytest.mark.unit

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def module(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCHMARKS / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_reinforce_variants_are_tail_variants_that_differ_only_in_debias():
    module("learning")  # puts benchmarks/ on the path, as running it does
    variants = importlib.import_module("learnbench.variants")
    with_a, without = variants.VARIANTS["reinforce"], variants.VARIANTS["reinforce_no_debias"]
    assert set(without) - set(with_a) == {"reward.debias=false"} and set(with_a) <= set(without)
    assert not {"reinforce", "reinforce_no_debias"} & set(variants.MAIN_VARIANTS)
    for overrides, debias in ((with_a, True), (without, False)):
        cfg = load_config("small", overrides)  # validated as the benchmark loads it
        assert cfg.algorithm.advantage == "reinforce" and cfg.reward.debias is debias
        # everything else is the preset's (the rlpr variant): the std filter stays on
        assert cfg.algorithm.std_filter == load_config("small", []).algorithm.std_filter


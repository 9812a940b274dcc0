"""End-to-end checks on the real embedded SmolLM2-135M-Instruct (few and targeted)."""

import pytest

from rlpr.config import RewardConfig
from rlpr.data.templates import build_messages
from rlpr.reward.probability_reward import ProbabilityReward

pytestmark = pytest.mark.slow


def test_paris_beats_berlin(real_model):
    model, tokenizer = real_model
    prompt = tokenizer.apply_chat_template(build_messages("What is the capital of France?", "r1"),
                                           tokenize=False, add_generation_prompt=True)
    response = ("<think> France is a country in western Europe; its capital is its largest city, "
                "on the Seine. </think> <answer> Paris </answer>")
    reward = ProbabilityReward(RewardConfig(), tokenizer)
    paris, berlin = reward(model, [prompt, prompt], [response, response], ["Paris", "Berlin"])
    assert paris.valid and berlin.valid
    assert paris.score_b > berlin.score_b
    assert paris.reward > berlin.reward


def test_gguf_conversion_is_trainable_and_saveable(real_model, tmp_path):
    model, _ = real_model
    assert not getattr(model, "is_quantized", False)
    assert all(p.dtype.is_floating_point for p in model.parameters())
    model.save_pretrained(tmp_path)  # refused while the GGUF "quantized" marker is set
    assert (tmp_path / "model.safetensors").exists()

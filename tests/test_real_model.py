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


def test_demo_preset_two_steps_end_to_end(tmp_path):
    """2 steps of the demo preset on the embedded model with tiny lengths."""
    from safetensors.torch import load_file

    from rlpr.train.checkpoint import latest_checkpoint
    from rlpr.config import load_config
    from rlpr.model.loading import load_policy
    from rlpr.train.tracking import read_metrics
    from rlpr.train.trainer import train

    cfg = load_config("demo", [f"trainer.output_dir={tmp_path}", "trainer.name=e2e", "trainer.max_steps=2",
                               "rollout.max_new_tokens=12", "rollout.responses_per_prompt=4",
                               "trainer.prompts_per_step=2", "trainer.mini_batch_prompts=1",
                               "data.demo_val_size=2", "trainer.progress=false",
                               "trainer.report=false"])  # the report's own tests draw it (test_report*.py)
    summary = train(cfg)
    run = tmp_path / "e2e"
    steps = [m for m in read_metrics(run) if "reward/mean" in m]
    assert [m["step"] for m in steps] == [1, 2]
    assert all(m["policy/updates"] == 2 for m in steps)
    adapter = load_file(str(latest_checkpoint(run) / "adapter" / "adapter_model.safetensors"))
    assert any("lora_B" in k and v.abs().max() > 0 for k, v in adapter.items())  # LoRA B starts at 0
    model, tokenizer = load_policy("default", run)
    ids = tokenizer("Hello", return_tensors="pt")["input_ids"]
    assert model(input_ids=ids).logits.shape[-1] == len(tokenizer)
    assert summary["after"]["eval/questions"] == 2


def test_opsd_end_to_end_on_the_embedded_model(tmp_path):
    """reward.kind=opsd from the command line on the real model (issue 41): the teacher sees the
    reference, its JSD and the identity are logged and finite, the adapter moves."""
    import math

    from safetensors.torch import load_file

    from rlpr.cli.main import main
    from rlpr.train.checkpoint import latest_checkpoint
    from rlpr.train.tracking import read_metrics

    assert main(["train", "reward.kind=opsd", "opsd.top_k=50", f"trainer.output_dir={tmp_path}", "trainer.name=opsd",
                 "trainer.max_steps=2", "rollout.max_new_tokens=12", "rollout.responses_per_prompt=4",
                 "trainer.prompts_per_step=2", "trainer.mini_batch_prompts=2", "data.val=", "trainer.progress=false",
                 "trainer.report=false"]) == 0
    steps = [m for m in read_metrics(tmp_path / "opsd") if "reward/mean" in m]
    assert [m["step"] for m in steps] == [1, 2]
    for m in steps:
        assert m["opsd/identity_n"] >= 4 and m["opsd/jsd"] > 0
        assert all(math.isfinite(m[k]) for k in ("opsd/jsd", "opsd/log_ratio_mean", "opsd/identity_pearson",
                                                 "opsd/identity_spearman", "opsd/identity_mean_gap"))
    adapter = load_file(str(latest_checkpoint(tmp_path / "opsd") / "adapter" / "adapter_model.safetensors"))
    assert any("lora_B" in k and v.abs().max() > 0 for k, v in adapter.items())


@pytest.mark.parametrize("gguf_type", ["f16", "q8_0"])
def test_gguf_export_of_the_embedded_model_answers_the_same(real_model, tmp_path, gguf_type):
    """The embedded model written back as a GGUF (rlpr export's writer; the tokenizer's fields copied
    from the embedded GGUF) reloads with transformers' GGUF loader and gives the same greedy answers."""
    import torch
    from transformers import AutoModelForCausalLM

    from rlpr.model.export import write_gguf
    from rlpr.model.gguf_fields import fast_gguf_loading
    from rlpr.model.loading import embedded_gguf_path

    model, tokenizer = real_model
    write_gguf(model, tokenizer, tmp_path / "m.gguf", gguf_type, embedded_gguf_path())
    # the model's own config: transformers would parse the GGUF's 49k-token vocabulary once more for it (about 5 s);
    # reading the config from a GGUF is test_export.py's f32 case
    with fast_gguf_loading():  # transformers' loader through the reader test_gguf_fields.py checks
        exported = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file="m.gguf", dtype=torch.float32,
                                                        config=model.config).eval()
    for question in ("What is the capital of France?", "What color is the sky?", "What is 2 + 3?"):
        text = tokenizer.apply_chat_template([{"role": "user", "content": question}], tokenize=False,
                                             add_generation_prompt=True)
        ids = torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"]])
        a = model.generate(ids, max_new_tokens=12, do_sample=False)
        b = exported.generate(ids, max_new_tokens=12, do_sample=False)
        assert torch.equal(a, b), (tokenizer.decode(a[0, ids.shape[1]:]), tokenizer.decode(b[0, ids.shape[1]:]))

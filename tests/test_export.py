"""`rlpr export`: a run's trained model as a Hugging Face folder and as a GGUF file, each read back
by transformers (its GGUF loader is the one llama.cpp's files are written for) and equal to the
trained policy; a model card in both."""

import pytest
import torch

from rlpr.cli.main import main
from rlpr.model.loading import load_policy
from rlpr.train.trainer import train

from helpers import tiny_cfg

pytestmark = pytest.mark.integration

PROMPTS = ["The capital of France is", "Water is made of", "<|im_start|>user\nName a color.<|im_end|>\n"]


@pytest.fixture(scope="module")
def runs(tiny_dir, tmp_path_factory):
    """Two 1-step runs of the tiny model: LoRA (an adapter checkpoint) and full fine-tuning."""
    out = tmp_path_factory.mktemp("export-runs")
    for name, extra in (("lora", []), ("full", ["model.lora=false"])):
        train(tiny_cfg(tiny_dir, out, name, "trainer.max_steps=1", "trainer.eval_samples=0", *extra))
    return out


def logits(model, tokenizer):
    return [model(torch.tensor([tokenizer(p)["input_ids"]])).logits[0] for p in PROMPTS]


@pytest.mark.parametrize("kind", ["lora", "full"])
def test_hf_folder_loads_with_transformers_and_equals_the_trained_policy(runs, tiny_dir, tmp_path, kind, capsys):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    assert main(["export", str(runs / kind), "--format", "hf", "-o", str(tmp_path / "hf")]) == 0
    assert "wrote" in capsys.readouterr().out
    trained, tokenizer = load_policy(tiny_dir, runs / kind)
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    with torch.no_grad():
        for a, b in zip(logits(trained, tokenizer), logits(exported, tokenizer)):
            assert torch.equal(a, b)
    assert AutoTokenizer.from_pretrained(tmp_path / "hf")(PROMPTS[2])["input_ids"] == tokenizer(PROMPTS[2])["input_ids"]
    card = (tmp_path / "hf" / "README.md").read_text()
    assert "| steps | 1 |" in card and "probability (mean_prob; " in card and tiny_dir in card
    assert (tmp_path / "hf" / "generation_config.json").exists()


@pytest.mark.parametrize("gguf_type,atol", [("f32", 1e-5), ("f16", 2e-3), ("q8_0", 3e-2)])
def test_gguf_reloads_with_the_same_tokenizer_and_logits(runs, tiny_dir, tmp_path, gguf_type, atol):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target = tmp_path / "model.gguf"
    assert main(["export", str(runs / "lora"), "--format", "gguf", "--gguf-type", gguf_type, "-o", str(target)]) == 0
    trained, tokenizer = load_policy(tiny_dir, runs / "lora")
    exported = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=target.name, dtype=torch.float32).eval()
    with torch.no_grad():
        for a, b in zip(logits(trained, tokenizer), logits(exported, tokenizer)):
            scale = max(a.abs().max().item(), 1.0)
            assert (a - b).abs().max().item() <= atol * scale
            if gguf_type == "f32":  # exact weights: the same greedy token everywhere
                assert torch.equal(a.argmax(-1), b.argmax(-1))
    reread = AutoTokenizer.from_pretrained(tmp_path, gguf_file=target.name)
    for p in PROMPTS:
        assert reread(p)["input_ids"] == tokenizer(p)["input_ids"]
    assert reread.eos_token_id == tokenizer.eos_token_id
    assert "library_name: gguf" in (tmp_path / "README.md").read_text()


def test_export_errors_are_one_line(runs, tmp_path, capsys):
    assert main(["export", str(tmp_path), "-o", str(tmp_path / "x")]) == 2
    assert "not a run directory (no config.yaml)" in capsys.readouterr().err
    assert main(["export", str(runs / "lora"), "--step", "7", "-o", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "no complete checkpoint for step 7" in err and len(err.strip().splitlines()) == 1


def test_gguf_refuses_an_architecture_llama_cpp_layout_is_not_known_for(tokenizer, tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    from rlpr.errors import ConfigError
    from rlpr.model.export import write_gguf

    model = GPT2LMHeadModel(GPT2Config(vocab_size=len(tokenizer), n_embd=32, n_layer=1, n_head=2))
    with pytest.raises(ConfigError, match="GGUF export supports .* not GPT2LMHeadModel: export --format hf"):
        write_gguf(model, tokenizer, tmp_path / "m.gguf")

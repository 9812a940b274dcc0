"""gpu_check's models, made here so that nothing is downloaded: the shapes it trains (Qwen2.5-0.5B's and
-1.5B's published config.json numbers, a small one for resume, a tiny one for the CPU dry run), a
byte-level BPE tokenizer padded to the model's vocabulary (every id a random model samples decodes;
ChatML as Qwen2.5's), and a HF folder of random weights."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

# The published config.json numbers of Qwen2.5-0.5B and -1.5B (tied embeddings, GQA, q/k/v biases)
SHAPES: dict[str, dict] = {
    "qwen2.5-0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                         num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True,
                         max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-6),
    "qwen2.5-1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                         num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True,
                         max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-6),
    # the resume check on a GPU: Qwen2.5's vocabulary and layout, 4 small layers
    "qwen-small": dict(hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4,
                       num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True,
                       max_position_embeddings=4096, rope_theta=1000000.0, rms_norm_eps=1e-6),
    # the CPU dry run
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=4096, tie_word_embeddings=True, max_position_embeddings=2048,
                 rope_theta=1000000.0, rms_norm_eps=1e-6),
}
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = ("{%- for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] "
          "+ '<|im_end|>\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
          "{%- endif %}")


# -- the model: a tokenizer made here, random weights from a config ------------------------------
def _corpus() -> list[str]:
    from rlpr.data.demo_tasks import demo_examples

    texts = []
    for ex in demo_examples("train", 600):
        texts.extend(m["content"] for m in ex.prompt)
        texts.append(ex.reference)
    texts.append("<think> reasoning </think> <answer> 42 </answer> The answer is 0123456789.")
    return texts


def synthetic_tokenizer(vocab_size: int, bpe_size: int = 2048):
    """A fast byte-level BPE tokenizer of exactly `vocab_size` ids: `bpe_size` trained on the demo
    questions (deterministic), the rest tokens that no merge produces (never encoded, but decoded),
    so any id a random model samples has text. ChatML special tokens and template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    trainer = trainers.BpeTrainer(vocab_size=min(bpe_size, vocab_size), special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=alphabet, show_progress=False)
    tok.train_from_iterator(_corpus(), trainer)
    data = json.loads(tok.to_str())
    vocab = data["model"]["vocab"]
    for c, b, a in itertools.product(alphabet, repeat=3):  # three bytes and a space, the first varying fastest
        if len(vocab) >= vocab_size:
            break
        vocab.setdefault(a + b + c + "\u0120", len(vocab))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(json.dumps(data)),
                                        eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tokenizer.chat_template = CHATML
    assert len(tokenizer) == vocab_size, (len(tokenizer), vocab_size)
    return tokenizer


def random_model(shape: dict, device, seed: int = 0, family: str = "Qwen2"):
    """(model, tokenizer): random fp32 weights of `shape` (a config's numbers) built on `device` (a GPU
    initialises 1.5B parameters in a second); `family`: Qwen2 or Gemma3 (transformers' class prefix)."""
    import torch
    import transformers

    tokenizer = synthetic_tokenizer(shape["vocab_size"])
    config_class = getattr(transformers, "Gemma3TextConfig" if family == "Gemma3" else f"{family}Config")
    config = config_class(**shape, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                          bos_token_id=None)
    torch.manual_seed(seed)
    with torch.device(device):
        return getattr(transformers, f"{family}ForCausalLM")(config), tokenizer


def random_model_dir(path: Path, shape: str, device: str, seed: int = 0) -> Path:
    """A HF model directory (config.json, random fp32 weights, the tokenizer) of `shape`, built on `device`."""
    import torch

    model, tokenizer = random_model(SHAPES[shape], device, seed)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    del model
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return path


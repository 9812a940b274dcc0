"""Take a trained model home: a run's checkpoint as a Hugging Face folder (vLLM, TGI, the Hub) or a
GGUF file (llama.cpp, Ollama, LM Studio), each with a model card.

The GGUF writer follows llama.cpp's own converter (convert_hf_to_gguf.py) for the architectures in
`GGUF_ARCHS`: its tensor names (gguf's tensor map), Llama's rotary permutation of the query and key
weights, 1-D tensors in f32, the output layer left out when it is tied to the embeddings. The
tokenizer's GGUF fields are copied from the base model's GGUF when it came from one (the embedded
SmolLM2 does), else built from the Hugging Face tokenizer (byte-level BPE).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

from rlpr.errors import ConfigError
from rlpr.train.model_card import model_card, run_info


@dataclass(frozen=True)
class GGUFArch:
    """How one transformers architecture is written: llama.cpp's name for it and whether the query
    and key weights are permuted (llama.cpp's Llama converter does; its Qwen2 converter does not)."""

    name: str
    permute_qk: bool


# transformers class -> how llama.cpp names and lays it out
GGUF_ARCHS = {
    "LlamaForCausalLM": GGUFArch("llama", True),
    "MistralForCausalLM": GGUFArch("llama", True),
    "Qwen2ForCausalLM": GGUFArch("qwen2", False),
}
# llama.cpp's pre-tokenizer name by transformers model_type, when no base GGUF says it
GGUF_PRE_TOKENIZERS = {"qwen2": "qwen2", "llama": "llama-bpe", "mistral": "llama-bpe"}
GGUF_TYPES = ("f16", "q8_0", "f32")
FORMATS = ("hf", "gguf")


def choose_checkpoint(run: Path, step: int | None) -> Path:
    """The run's newest readable checkpoint (a corrupt newest one skipped with a warning), or
    checkpoints/step_N; one line when absent."""
    from rlpr.model.loading import usable_checkpoint
    from rlpr.train.checkpoint import is_complete

    if step is None:
        return usable_checkpoint(run)
    ckpt = run / "checkpoints" / f"step_{step}"
    if not ckpt.is_dir() or not is_complete(ckpt):
        raise ConfigError(f"{run}: no complete checkpoint for step {step} (expected {ckpt})")
    return ckpt


def export_run(run: str | os.PathLike, output: str | os.PathLike, fmt: str = "hf", step: int | None = None,
               gguf_type: str = "f16", dtype: str = "float32") -> Path:
    """Write run `run`'s checkpoint (latest, or `step`) with LoRA merged: a Hugging Face folder at
    `output` (fmt hf: safetensors, tokenizer, generation config, README.md) or a GGUF file (fmt gguf:
    `output` itself if it ends in .gguf, else OUTPUT/model.gguf beside a README.md)."""
    from rlpr.model.loading import load_policy

    run = Path(run)
    if not (run / "config.yaml").is_file():
        raise ConfigError(f"{run}: not a run directory (no config.yaml)")
    if fmt not in FORMATS:
        raise ConfigError(f"--format: {fmt!r} is not one of {', '.join(FORMATS)}")
    if gguf_type not in GGUF_TYPES:
        raise ConfigError(f"--gguf-type: {gguf_type!r} is not one of {', '.join(GGUF_TYPES)}")
    ckpt = choose_checkpoint(run, step)
    info = run_info(run, ckpt)  # the card every checkpoint carries, written for this format
    model, tokenizer = load_policy(info.base, ckpt)
    output = Path(output)
    if fmt == "hf":
        save_hf(model, tokenizer, output, getattr(torch, dtype))
        (output / "README.md").write_text(model_card(info, fmt), encoding="utf-8")
        return output
    target = output if output.suffix == ".gguf" else output / "model.gguf"
    target.parent.mkdir(parents=True, exist_ok=True)
    write_gguf(model, tokenizer, target, gguf_type, base_gguf(info.base), name=run.name)
    (target.parent / "README.md").write_text(model_card(info, fmt), encoding="utf-8")
    return target


def save_hf(model, tokenizer, output: Path, dtype: torch.dtype = torch.float32) -> None:
    """The merged model as safetensors with its tokenizer and generation config (EOS = the tokenizer's)."""
    output.mkdir(parents=True, exist_ok=True)
    model = model.to(dtype)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(output, safe_serialization=True)
    tokenizer.save_pretrained(output)


def base_gguf(base: str) -> Path | None:
    """The GGUF file the base model was read from (the embedded default, or a .gguf path), if any."""
    from rlpr.model.loading import DEFAULT_MODEL, embedded_gguf_path

    if base == DEFAULT_MODEL:
        return embedded_gguf_path()
    path = Path(base)
    return path if path.suffix == ".gguf" and path.is_file() else None


def permute_qk(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """llama.cpp's layout of a query/key projection [heads * d, H]: within each head, the rotary
    halves interleaved (convert_hf_to_gguf.py's LlamaModel.permute; transformers' GGUF loader undoes it)."""
    return weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(
        weight.shape)


def gguf_tensors(model, arch: GGUFArch):
    """(GGUF name, float32 numpy array) of every weight, in llama.cpp's names and layout."""
    import gguf

    config = model.config
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH[arch.name.upper()], config.num_hidden_layers)
    kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    for hf_name, tensor in model.state_dict().items():
        if hf_name == "lm_head.weight" and config.tie_word_embeddings:
            continue  # llama.cpp reads the tied output layer from token_embd
        name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if name is None:
            raise ConfigError(f"GGUF export: no llama.cpp name for tensor {hf_name}")
        tensor = tensor.detach().float().cpu()
        if arch.permute_qk and hf_name.endswith("q_proj.weight"):
            tensor = permute_qk(tensor, config.num_attention_heads)
        elif arch.permute_qk and hf_name.endswith("k_proj.weight"):
            tensor = permute_qk(tensor, kv_heads)
        yield name, tensor.numpy()


def write_gguf(model, tokenizer, path: Path, gguf_type: str = "f16", base: Path | None = None,
               name: str = "rlpr") -> None:
    """`model` (a plain transformers causal LM of an architecture in GGUF_ARCHS) as a GGUF file."""
    import gguf

    config = model.config
    arch = GGUF_ARCHS.get(type(model).__name__)
    if arch is None:
        raise ConfigError(f"GGUF export supports {', '.join(GGUF_ARCHS)}, not {type(model).__name__}: export "
                          "--format hf and convert with llama.cpp's convert_hf_to_gguf.py")
    rope = getattr(config, "rope_parameters", None) or {}
    if rope.get("rope_type", "default") != "default":
        raise ConfigError(f"GGUF export of rope scaling {rope.get('rope_type')!r} is not supported: export "
                          "--format hf and convert with llama.cpp's convert_hf_to_gguf.py")
    qtype = {"f16": gguf.GGMLQuantizationType.F16, "q8_0": gguf.GGMLQuantizationType.Q8_0,
             "f32": gguf.GGMLQuantizationType.F32}[gguf_type]
    ftype = {"f16": gguf.LlamaFileType.MOSTLY_F16, "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
             "f32": gguf.LlamaFileType.ALL_F32}[gguf_type]
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    writer = gguf.GGUFWriter(str(path), arch.name)
    writer.add_name(name)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(heads)
    writer.add_head_count_kv(getattr(config, "num_key_value_heads", None) or heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_freq_base(float(rope.get("rope_theta", getattr(config, "rope_theta", 10000.0))))
    writer.add_rope_dimension_count(head_dim)
    writer.add_vocab_size(config.vocab_size)
    writer.add_file_type(ftype)
    add_tokenizer(writer, tokenizer, config, base)
    for tensor_name, data in gguf_tensors(model, arch):
        if data.ndim == 1 or qtype == gguf.GGMLQuantizationType.F32:  # norms and biases stay f32, as llama.cpp's
            writer.add_tensor(tensor_name, data)
        elif qtype == gguf.GGMLQuantizationType.F16:
            writer.add_tensor(tensor_name, data.astype("float16"))
        else:
            writer.add_tensor(tensor_name, gguf.quants.quantize(data, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def add_tokenizer(writer, tokenizer, config, base: Path | None) -> None:
    """The tokenizer's GGUF fields: copied from the base model's GGUF, or built from `tokenizer`."""
    import gguf

    if base is not None:
        reader = gguf.GGUFReader(str(base))
        for key, field in reader.fields.items():
            if key.startswith("tokenizer."):
                sub = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
                writer.add_key_value(key, field.contents(), field.types[0], sub_type=sub)
        return
    vocab = config.vocab_size
    by_id = {i: t for t, i in tokenizer.get_vocab().items()}
    special = set(tokenizer.all_special_ids)
    added = set(tokenizer.get_added_vocab().values())
    tokens, types = [], []
    for i in range(vocab):
        if i not in by_id:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
            continue
        tokens.append(by_id[i])
        types.append(gguf.TokenType.CONTROL if i in special else
                     gguf.TokenType.USER_DEFINED if i in added else gguf.TokenType.NORMAL)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(GGUF_PRE_TOKENIZERS.get(config.model_type, "default"))
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    import json
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:  # gguf's SpecialVocab reads merges and special ids from files
        tokenizer.save_pretrained(tmp)
        merges = json.loads((Path(tmp) / "tokenizer.json").read_text(encoding="utf-8"))["model"].get("merges", [])
        gguf.SpecialVocab(tmp, load_merges=False).add_to_gguf(writer)
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in merges])

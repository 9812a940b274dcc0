"""A quiet console for the commands that load a model but do not train (export, eval, serve, score,
reward-quality): only rlpr's own lines, unless `-v` asks for the libraries' too (issue 35, E3).

Left alone, a merged export printed DeepSpeed's "Setting accelerator to CPU" warning (DeepSpeed is
imported by accelerate, never used by these commands), transformers' per-file "Loading weights"
and "Writing model shards" bars, and the gguf writer's INFO lines (the whole chat template among
them)."""

from __future__ import annotations

import logging


def quiet_libraries(verbose: bool = False) -> None:
    """Silence what the libraries print while a model is read or written, unless `verbose`."""
    if verbose:
        return
    from rlpr.model.loading import quiet_deepspeed_accelerator

    quiet_deepspeed_accelerator()
    logging.getLogger("gguf").setLevel(logging.WARNING)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()

"""The Hugging Face `datasets` library as a data source (optional: `pip install 'rlpr[datasets]'`).

It is used for what only it knows: folders written by `Dataset.save_to_disk` and
`DatasetDict.save_to_disk`, `.arrow` files, and the layout of a dataset repository (which files
are which split, the configs its README declares). It never touches the Hub: HF_DATASETS_OFFLINE
is set before `datasets` is first imported, and whatever it must cache goes to a temporary folder
that is removed afterwards. datasets>=4 runs no loading scripts, so nothing read here executes code.

Every failure is a one-line DataError naming the path.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import tempfile
from pathlib import Path

from rlpr.errors import DataError, error_reason

INSTALL_HINT = "pip install 'rlpr[datasets]'"


def available() -> bool:
    """Whether the `datasets` package can be imported here."""
    import importlib.util

    return importlib.util.find_spec("datasets") is not None


def _datasets(where: str):
    if "datasets" not in sys.modules:
        os.environ.setdefault("HF_DATASETS_OFFLINE", "1")  # local paths only, never the Hub
    try:
        import datasets
    except ImportError:
        raise DataError(f"{where}: reading this needs the Hugging Face datasets package ({INSTALL_HINT})") from None
    return datasets


@contextlib.contextmanager
def _reading(where: str):
    """`datasets` with its progress bars off (restored after) and its errors as one DataError line."""
    datasets = _datasets(where)
    quiet_before = datasets.are_progress_bars_disabled()
    datasets.disable_progress_bars()
    loggers = [logging.getLogger(name) for name in ("datasets", "huggingface_hub")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:  # "Repo card metadata block was not found" and the like are not the user's concern
        lg.setLevel(logging.ERROR)
    try:
        yield datasets
    except DataError:
        raise
    except Exception as e:  # noqa: BLE001 (any failure inside datasets is the user's path, in one line)
        raise DataError(f"{where}: cannot read with datasets ({type(e).__name__}: {error_reason(e)})") from None
    finally:
        if not quiet_before:
            datasets.enable_progress_bars()
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def load_saved(path: Path, where: str) -> list[dict]:
    """The rows of a folder written by `Dataset.save_to_disk` (memory-mapped, read once)."""
    with _reading(where) as datasets:
        return datasets.Dataset.load_from_disk(str(path)).to_list()


def read_arrow(path: Path, where: str) -> list[dict]:
    """The rows of an Arrow file (the stream format datasets writes, or the IPC file format)."""
    with tempfile.TemporaryDirectory(prefix="rlpr-datasets-") as cache, _reading(where) as datasets:
        return datasets.load_dataset("arrow", data_files=str(path), split="train", cache_dir=cache).to_list()


def config_names(path: Path, where: str) -> list[str]:
    """The configs of a dataset folder: those its README declares, else ["default"]."""
    with _reading(where) as datasets:
        return list(datasets.get_dataset_config_names(str(path)))


def folder_splits(path: Path, config: str | None, where: str) -> dict[str, list[Path]]:
    """{split: its data files} of a folder laid out as a dataset repository (`data/train-*.parquet`,
    `train.jsonl` and `test.jsonl`, or the `configs:` of its README); `config` picks one of those."""
    names = config_names(path, where)
    if config is not None and config not in names:
        raise DataError(f"{where}: no config {config!r} (configs: {', '.join(names)})")
    if config is None and len(names) > 1:
        raise DataError(f"{where}: has configs {', '.join(names)}; name one as {path}:CONFIG or {path}:CONFIG:SPLIT")
    with tempfile.TemporaryDirectory(prefix="rlpr-datasets-") as cache, _reading(where) as datasets:
        builder = datasets.load_dataset_builder(str(path), config, cache_dir=cache)
        files = builder.config.data_files or {}
        return {str(split): [Path(f) for f in found] for split, found in files.items()}

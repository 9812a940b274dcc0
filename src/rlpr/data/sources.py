"""Where the rows of `data.train`, `data.val` and `rlpr eval --data` come from.

A source is a path, optionally followed by `:SPLIT` or `:CONFIG:SPLIT` when the path is a folder.
What the path is picks its reader from `READERS`: a file by its suffix, a folder by what it holds:

- `.parquet` (the verl/RLPR layout, the primary format), `.jsonl`/`.ndjson`, `.json`, `.csv`,
  `.tsv`: read here, with pyarrow and the standard library (faster than going through `datasets`,
  errors that name the row, CSV cells kept as the text they are; benchmarks/data_loading.py (retired; code in commit a0f9d4c));
- `.gz`, `.bz2`, `.xz` around any of those;
- through the Hugging Face `datasets` library (rlpr.data.hf_datasets, an optional extra): `.arrow`
  files, folders written by `Dataset.save_to_disk` or `DatasetDict.save_to_disk`, and folders
  laid out as a dataset repository (`data/train-00000-of-00001.parquet`, `train.jsonl` +
  `test.jsonl`, or README `configs:`), whose files it finds and the readers above read.

Every reader returns `Table`s (rows and the name that errors give them); a user mistake is a
one-line DataError naming the path.
"""

from __future__ import annotations

import bz2
import csv
import gzip
import json
import lzma
import shutil
import tempfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rlpr.data import hf_datasets
from rlpr.errors import PARSE_ERRORS, DataError, parse_error_reason


@dataclass(frozen=True)
class Source:
    """A data source as written (`spec`, which errors name): the path and what follows it."""

    spec: str
    path: Path
    selector: tuple[str, ...] = ()  # (SPLIT,) or (CONFIG, SPLIT) after a folder

    @property
    def stem(self) -> str:
        """The file's stem or the folder's name (e.g. the data_source of flat rows)."""
        if self.path.is_dir():
            return self.path.resolve().name
        stem = self.path.stem
        return Path(stem).stem if self.path.suffix.lower() in COMPRESSIONS else stem

    @property
    def name(self) -> str:
        """The stem plus the selector: a benchmark's name in `rlpr eval` results."""
        return ":".join((self.stem, *self.selector))


@dataclass
class Table:
    """Rows and the name errors give them ("NAME: row N")."""

    where: str
    rows: list


def parse_source(spec: str | Path) -> Source:
    """`PATH`, `PATH:SPLIT` or `PATH:CONFIG:SPLIT`; a path that exists as written is never split
    at a colon (C:\\data\\x.parquet, a file with a colon in its name)."""
    spec = str(spec)
    if Path(spec).exists() or ":" not in spec:
        return Source(spec, Path(spec))
    for n in (1, 2):
        head, *selector = spec.rsplit(":", n)
        if Path(head).exists() and head and all(selector):
            return Source(spec, Path(head), tuple(selector))
    return Source(spec, Path(spec))


def source_exists(spec: str | Path) -> bool:
    """Whether the path of a source exists (what the config checks before any reading)."""
    return parse_source(spec).path.exists()


# --------------------------------------------------------------------------- files

def lone_surrogate(value, name: str = "") -> tuple[str, str] | None:
    """(field, text) of the first string in a row (`value`: its fields, nested lists and mappings,
    their keys too) that holds a lone surrogate: JSON can spell one ("\\ud800"), no tokenizer or
    UTF-8 writer can take it (issue 60, S13: a traceback from eval and score)."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return name or "value", value
        return None
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        field = f"{name}[{key}]" if isinstance(key, int) else f"{name}.{key}" if name else str(key)
        found = lone_surrogate(key, field) if isinstance(key, str) else None
        found = found or lone_surrogate(item, field)
        if found:
            return found
    return None


def check_text(row, where: str) -> None:
    """A DataError naming the row and field when a row holds a lone surrogate (`lone_surrogate`)."""
    found = lone_surrogate(row)
    if found:
        field, text = found
        raise DataError(f"{where}: field '{field.encode('utf-8', 'backslashreplace').decode()}' holds a lone "
                        f"surrogate ({ascii(text)[:80]}), which is not text")


def iter_jsonl(path: str | Path):
    """(where, row) per non-blank line of a JSONL file, `where` = "FILE: row N" (N = line
    number); a line that is not a JSON object raises a one-line DataError."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: file not found")
    with open(path, "rb") as f:
        for n, raw in enumerate(f, start=1):
            where = f"{path}: row {n}"
            try:
                line = raw.decode("utf-8-sig" if n == 1 else "utf-8")  # a BOM (Windows editors) is not data
            except UnicodeDecodeError as e:
                raise DataError(f"{where}: not valid UTF-8 (byte {e.start + 1} of the line)") from None
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{where}: not valid JSON ({e.msg} at column {e.colno})") from None
            except PARSE_ERRORS as e:  # an integer of over 4300 digits, nesting a thousand deep
                raise DataError(f"{where}: not valid JSON ({parse_error_reason(e)})") from None
            if not isinstance(row, dict):
                raise DataError(f"{where}: expected a JSON object")
            check_text(row, where)
            yield where, row


def _parquet(path: Path) -> list:
    import pyarrow.parquet as pq

    return pq.read_table(path).to_pylist()


def _jsonl(path: Path) -> list:
    return [row for _, row in iter_jsonl(path)]


def _json(path: Path) -> list:
    with open(path, encoding="utf-8-sig") as f:
        data = json.load(f)
    if isinstance(data, dict):  # {"examples": [...]} or {"data": [...]}
        lists = [v for v in data.values() if isinstance(v, list)]
        if len(lists) != 1:
            raise DataError(f"{path}: expected a list of rows or an object with one list")
        data = lists[0]
    if not isinstance(data, list):
        raise DataError(f"{path}: expected a list of rows")
    return data


def _delimited(delimiter: str) -> Callable[[Path], list]:
    def read(path: Path) -> list:
        with open(path, encoding="utf-8-sig", newline="") as f:
            return list(csv.DictReader(f, delimiter=delimiter))
    return read


def _arrow(path: Path) -> list:
    return hf_datasets.read_arrow(path, str(path))


FILE_READERS: dict[str, Callable[[Path], list]] = {
    ".parquet": _parquet,
    ".jsonl": _jsonl,
    ".ndjson": _jsonl,
    ".json": _json,
    ".csv": _delimited(","),
    ".tsv": _delimited("\t"),
    ".arrow": _arrow,
}
COMPRESSIONS = {".gz": gzip.open, ".bz2": bz2.open, ".xz": lzma.open}


def read_file(path: str | Path) -> list:
    """Raw rows of one file, by its suffix (a compressed file by the suffix inside)."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: file not found")
    suffix = path.suffix.lower()
    if suffix in COMPRESSIONS:
        return _read_compressed(path, COMPRESSIONS[suffix])
    if suffix not in FILE_READERS:
        raise DataError(f"{path}: unsupported file type {suffix!r} (use {', '.join(FILE_READERS)}, "
                        f"compressed with {', '.join(COMPRESSIONS)}, or a datasets folder)")
    try:
        return FILE_READERS[suffix](path)
    except DataError:
        raise
    except RecursionError:  # a .json nested a thousand deep
        raise DataError(f"{path}: cannot read (nested too deep)") from None
    except (OSError, ValueError, UnicodeDecodeError, csv.Error) as e:
        raise DataError(f"{path}: cannot read ({type(e).__name__}: {e})") from None


def _read_compressed(path: Path, opener) -> list:
    """"x.csv.gz" is read as the CSV inside it; errors name the compressed file."""
    with tempfile.TemporaryDirectory(prefix="rlpr-data-") as tmp:
        inner = Path(tmp) / path.stem
        if inner.suffix.lower() in COMPRESSIONS:
            raise DataError(f"{path}: compressed twice")
        try:
            with opener(path, "rb") as src, open(inner, "wb") as dst:
                shutil.copyfileobj(src, dst)
        except (OSError, EOFError, lzma.LZMAError, zlib.error) as e:  # zlib.error: a .gz's corrupt data
            raise DataError(f"{path}: cannot decompress ({type(e).__name__}: {e})") from None
        try:
            return read_file(inner)
        except DataError as e:
            raise DataError(str(e).replace(str(inner), str(path))) from None


# --------------------------------------------------------------------------- folders

def pick_split(where: str, splits: list[str], wanted: str | None, default: str | None) -> str:
    """The split asked for; else the only one; else `default` (training: "train") when there."""
    if wanted is not None:
        if wanted not in splits:
            raise DataError(f"{where}: no split {wanted!r} (splits: {', '.join(splits)})")
        return wanted
    if len(splits) == 1:
        return splits[0]
    if default in splits:
        return default
    raise DataError(f"{where}: has splits {', '.join(splits)}; name one as PATH:SPLIT")


def _saved_dataset(src: Source, default_split: str | None) -> list[Table]:
    if src.selector:
        raise DataError(f"{src.spec}: a saved Dataset has no splits or configs; drop ':{':'.join(src.selector)}'")
    return [Table(str(src.path), hf_datasets.load_saved(src.path, str(src.path)))]


def _saved_dataset_dict(src: Source, default_split: str | None) -> list[Table]:
    if len(src.selector) > 1:
        raise DataError(f"{src.spec}: a saved DatasetDict has no configs; name a split as PATH:SPLIT")
    try:
        splits = json.loads((src.path / "dataset_dict.json").read_text(encoding="utf-8"))["splits"]
        splits = [str(s) for s in splits]
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as e:
        raise DataError(f"{src.path}/dataset_dict.json: cannot read the split names ({type(e).__name__})") from None
    split = pick_split(src.spec, splits, src.selector[0] if src.selector else None, default_split)
    where = src.spec if src.selector else f"{src.spec}:{split}"
    return [Table(where, hf_datasets.load_saved(src.path / split, where))]


def _data_folder(src: Source, default_split: str | None) -> list[Table]:
    if not any(src.path.iterdir()):
        raise DataError(f"{src.spec}: empty folder (expected data files or a datasets save_to_disk folder)")
    config, wanted = None, None
    if len(src.selector) == 2:
        config, wanted = src.selector
    elif src.selector:  # PATH:X: a config when the folder declares one named X, else a split
        named = hf_datasets.config_names(src.path, src.spec)
        config, wanted = (src.selector[0], None) if src.selector[0] in named else (None, src.selector[0])
    splits = hf_datasets.folder_splits(src.path, config, src.spec)
    split = pick_split(src.spec, list(splits), wanted, default_split)
    return [Table(str(f), read_file(f)) for f in splits[split]]


def folder_kind(path: Path) -> str:
    """What a folder holds: a saved DatasetDict, a saved Dataset, or data files."""
    if (path / "dataset_dict.json").is_file():
        return "saved_dataset_dict"
    if (path / "state.json").is_file() and (path / "dataset_info.json").is_file():
        return "saved_dataset"
    return "data_folder"


FOLDER_READERS: dict[str, Callable[[Source, str | None], list[Table]]] = {
    "saved_dataset_dict": _saved_dataset_dict,
    "saved_dataset": _saved_dataset,
    "data_folder": _data_folder,
}


def read_tables(spec: str | Path, default_split: str | None = None) -> list[Table]:
    """The tables of a source; `default_split` is the split a folder's several splits fall back to
    when the source names none (training passes "train"; elsewhere the split must be named)."""
    src = parse_source(spec)
    if not src.path.exists():
        raise DataError(f"{src.spec}: file not found")
    if src.path.is_dir():
        return FOLDER_READERS[folder_kind(src.path)](src, default_split)
    if src.selector:
        raise DataError(f"{src.spec}: a split or config (':{':'.join(src.selector)}') applies only to a folder")
    return [Table(str(src.path), read_file(src.path))]


def read_rows(spec: str | Path, default_split: str | None = None) -> list:
    """Raw rows of a source, every table's rows in order."""
    return [row for table in read_tables(spec, default_split) for row in table.rows]

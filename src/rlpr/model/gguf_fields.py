"""A GGUF file's key-value fields, read without its tensors.

gguf.GGUFReader builds a numpy view per value of every field: for SmolLM2's 49k-token vocabulary and
48k merges that is about 4 s on a laptop core, paid by `rlpr export --format gguf` (it copies the base
GGUF's tokenizer fields) and by the overwrite check (is the marker key there?). This reads the same
fields sequentially from the header: about 0.1 s. Values come as GGUFReader's `field.contents()`
gives them (str, int, float, bool, lists of them), with the value type and, for arrays, the item type,
so that `GGUFWriter.add_key_value` writes them back unchanged. Little-endian GGUF v2/v3 only (what
llama.cpp writes); anything else raises ValueError, and callers fall back to gguf.GGUFReader.

Where a whole GGUFReader is needed (transformers' GGUF loader reads the tensors through one),
`plain_reader` builds it over a plain ndarray view of the file instead of a np.memmap (whose
Python-level slicing is most of the reader's time: 4.3 -> 1.0 s for the embedded model, the same
fields and tensors), and `fast_gguf_loading` hands transformers one such reader per file for a
whole conversion (it built three: tokenizer, config, weights) and one tensor-name table.
"""

from __future__ import annotations

import mmap
import os
import struct
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Any, NamedTuple

STRING, ARRAY = 8, 9
SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
# What gguf's and transformers' GGUF readers (and read_fields) raise on a cut, corrupt or hostile file:
# struct and numpy errors, sizes past the end, unknown value types or architectures, absurd counts
GGUF_READ_ERRORS = (ValueError, struct.error, KeyError, IndexError, TypeError, OverflowError, EOFError,
                    RecursionError, NotImplementedError, MemoryError, OSError)


def gguf_read_reason(e: BaseException) -> str:
    """One of GGUF_READ_ERRORS in a few words for a one-line error."""
    from rlpr.errors import parse_error_reason

    if isinstance(e, struct.error):  # the header's sizes point past the end of the file
        return "cut short, or not a GGUF file"
    return f"{type(e).__name__}: {parse_error_reason(e)}"


class Field(NamedTuple):
    value: Any
    type: int  # gguf.GGUFValueType's number
    item_type: int | None  # an array's items' type


def read_fields(path: str | Path, prefix: str = "", stop_at: str | None = None) -> dict[str, Field]:
    """The fields whose keys start with `prefix` (values of the others are skipped, not decoded);
    reading stops after the key `stop_at` when given."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        if data[:4] != b"GGUF":
            raise ValueError(f"{path}: not a GGUF file")
        version, _tensors, count = struct.unpack_from("<IQQ", data, 4)
        if version not in (2, 3):
            raise ValueError(f"{path}: GGUF version {version} (little-endian 2 or 3 expected)")
        reader, fields = _Reader(data, 24), {}
        for _ in range(count):
            key = reader.string()
            kind = reader.unpack("<I")
            wanted = key.startswith(prefix)
            if kind == ARRAY:
                item, n = reader.unpack("<I"), reader.unpack("<Q")
                value = reader.array(item, n, wanted)
                if wanted:
                    fields[key] = Field(value, kind, item)
            else:
                value = reader.value(kind)
                if wanted:
                    fields[key] = Field(value, kind, None)
            if key == stop_at:
                break
        return fields


class _Reader:
    def __init__(self, data, offset: int):
        self.data, self.offset = data, offset

    def unpack(self, fmt: str):
        value, = struct.unpack_from(fmt, self.data, self.offset)
        self.offset += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        n = self.unpack("<Q")
        start, self.offset = self.offset, self.offset + n
        if self.offset > len(self.data):
            raise ValueError("a string runs past the end of the file")
        return bytes(self.data[start:self.offset]).decode("utf-8")

    def value(self, kind: int):
        if kind == STRING:
            return self.string()
        if kind not in SCALARS:
            raise ValueError(f"unknown GGUF value type {kind}")
        return self.unpack("<" + SCALARS[kind])

    def array(self, item: int, n: int, decode: bool) -> list | None:
        if item in SCALARS:
            fmt = f"<{n}{SCALARS[item]}"
            size = struct.calcsize(fmt)
            if self.offset + size > len(self.data):
                raise ValueError("an array runs past the end of the file")
            values = list(struct.unpack_from(fmt, self.data, self.offset)) if decode else None
            self.offset += size
            return values
        if item == STRING:
            if not decode:
                for _ in range(n):
                    self.offset += 8 + struct.unpack_from("<Q", self.data, self.offset)[0]
                return None
            return [self.string() for _ in range(n)]
        if item == ARRAY:  # nested arrays: each item is (type, length, items)
            values = [self.array(self.unpack("<I"), self.unpack("<Q"), decode) for _ in range(n)]
            return values if decode else None
        raise ValueError(f"unknown GGUF array item type {item}")


@lru_cache(maxsize=1)
def _plain_reader_class():
    import numpy as np
    from gguf.gguf_reader import GGUFReader  # its own module's name: fast_gguf_loading replaces gguf's

    class PlainReader(GGUFReader):
        """gguf.GGUFReader whose `data` (the np.memmap its __init__ assigns) is kept as a plain
        ndarray view of the same mapping: slicing it skips np.memmap's Python __getitem__ and
        __array_finalize__, which the reader calls a few times per vocabulary entry."""

        @property
        def data(self):
            return self._plain

        @data.setter
        def data(self, value):
            self._plain = value.view(np.ndarray) if isinstance(value, np.memmap) else value

    return PlainReader


def plain_reader(path: str | os.PathLike, mode: str = "r"):
    """A gguf.GGUFReader of `path` (same fields and tensors), built about 4x faster."""
    return _plain_reader_class()(path, mode)


@contextmanager
def fast_gguf_loading():
    """Within the block, transformers' GGUF loader reads each file once, faster, and maps tensor
    names once: `gguf.GGUFReader(path)` (called for the tokenizer, the config and the weights)
    returns one `plain_reader` per file (read-only ones shared), and `gguf.get_tensor_name_map`
    (which it calls once per module of the model, rebuilding the same read-only table, ~20 ms each:
    8 s for SmolLM2) one table per (architecture, blocks)."""
    import gguf

    reader_of, name_map_of = gguf.GGUFReader, gguf.get_tensor_name_map
    readers, maps = {}, {}

    def reader(path, mode="r"):
        if mode != "r":  # a writable mapping is never shared
            return plain_reader(path, mode)
        key = os.path.realpath(path)
        if key not in readers:
            readers[key] = plain_reader(path)
        return readers[key]

    def name_map(arch, n_blocks):
        if (arch, n_blocks) not in maps:
            maps[arch, n_blocks] = name_map_of(arch, n_blocks)
        return maps[arch, n_blocks]

    gguf.GGUFReader, gguf.get_tensor_name_map = reader, name_map
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = reader_of, name_map_of

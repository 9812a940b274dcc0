"""A GGUF file's key-value fields, read without its tensors.

gguf.GGUFReader builds a numpy view per value of every field: for SmolLM2's 49k-token vocabulary and
48k merges that is about 4 s on a laptop core, paid by `rlpr export --format gguf` (it copies the base
GGUF's tokenizer fields) and by the overwrite check (is the marker key there?). This reads the same
fields sequentially from the header: about 0.1 s. Values come as GGUFReader's `field.contents()`
gives them (str, int, float, bool, lists of them), with the value type and, for arrays, the item type,
so that `GGUFWriter.add_key_value` writes them back unchanged. Little-endian GGUF v2/v3 only (what
llama.cpp writes); anything else raises ValueError, and callers fall back to gguf.GGUFReader.
"""

from __future__ import annotations

import mmap
import struct
from pathlib import Path
from typing import Any, NamedTuple

STRING, ARRAY = 8, 9
SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}


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

"""rlpr.model.gguf_fields reads a GGUF's key-value fields as gguf.GGUFReader does (on the embedded
model's real GGUF and on one export wrote), refuses what it cannot read with a ValueError, and
export's tokenizer copy writes the same fields through it as through GGUFReader."""

import gguf
import pytest

from rlpr.model import export
from rlpr.model.gguf_fields import read_fields
from rlpr.model.loading import embedded_gguf_path

pytestmark = pytest.mark.unit


def reader_fields(path):
    out = {}
    for key, field in gguf.GGUFReader(str(path)).fields.items():
        if not key.startswith("GGUF."):  # the reader's own header entries (version, counts)
            item = int(field.types[-1]) if field.types[0] == gguf.GGUFValueType.ARRAY else None
            out[key] = (field.contents(), int(field.types[0]), item)
    return out


def test_the_embedded_gguf_reads_as_gguf_reader_reads_it():
    path = embedded_gguf_path()
    fields = read_fields(path)
    assert {k: tuple(f) for k, f in fields.items()} == reader_fields(path)
    assert len(fields["tokenizer.ggml.tokens"].value) == 49152  # the vocabulary, decoded
    only = read_fields(path, prefix="tokenizer.")
    assert only and all(k.startswith("tokenizer.") for k in only) and only == {
        k: v for k, v in fields.items() if k.startswith("tokenizer.")}


def test_an_export_reads_back_with_its_marker(tiny_model, tokenizer, tmp_path):
    path = tmp_path / "m.gguf"
    export.write_gguf(tiny_model, tokenizer, path, "f32", marker="{}")
    assert read_fields(path, prefix="rlpr.")["rlpr.export"].value == "{}" and export.written_by_export(path)
    export.write_gguf(tiny_model, tokenizer, path, "f32")  # no marker: not export's output
    assert not export.written_by_export(path)


def test_what_it_cannot_read_is_a_value_error(tmp_path):
    data = embedded_gguf_path().read_bytes()[:200_000]  # cut inside the tokenizer's fields
    (tmp_path / "cut.gguf").write_bytes(data)
    (tmp_path / "text.gguf").write_text("not a model")
    (tmp_path / "v1.gguf").write_bytes(b"GGUF" + (1).to_bytes(4, "little") + bytes(16))
    for name in ("cut.gguf", "text.gguf", "v1.gguf"):
        with pytest.raises(ValueError):
            read_fields(tmp_path / name)
        assert not export.written_by_export(tmp_path / name)


def test_the_tokenizer_copy_writes_the_same_file_either_way(tiny_model, tokenizer, tmp_path, monkeypatch):
    """The embedded GGUF's tokenizer fields (the tiny model has its vocabulary), copied through
    read_fields and through gguf.GGUFReader (the fallback): the same bytes."""
    export.write_gguf(tiny_model, tokenizer, tmp_path / "fast.gguf", "f32", embedded_gguf_path())
    monkeypatch.setattr(export, "read_fields", lambda *a, **k: (_ for _ in ()).throw(ValueError("big-endian")))
    export.write_gguf(tiny_model, tokenizer, tmp_path / "reader.gguf", "f32", embedded_gguf_path())
    assert (tmp_path / "fast.gguf").read_bytes() == (tmp_path / "reader.gguf").read_bytes()

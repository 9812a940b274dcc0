"""rlpr.model.gguf_fields reads a GGUF's key-value fields as gguf.GGUFReader does (on the embedded
model's real GGUF and on one export wrote), refuses what it cannot read with a ValueError, and
export's tokenizer copy writes the same fields through it as through GGUFReader; `plain_reader` reads what
gguf.GGUFReader reads, and a GGUF conversion builds one reader."""

import gguf
import pytest

from rlpr.model import export
from rlpr.model.gguf_fields import read_fields
from rlpr.model.loading import embedded_gguf_path

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def stock_reader():
    """gguf's own reader of the embedded GGUF (about 4 s to build), shared by the comparisons."""
    return gguf.GGUFReader(str(embedded_gguf_path()))


def reader_fields(reader):
    out = {}
    for key, field in reader.fields.items():
        if not key.startswith("GGUF."):  # the reader's own header entries (version, counts)
            item = int(field.types[-1]) if field.types[0] == gguf.GGUFValueType.ARRAY else None
            out[key] = (field.contents(), int(field.types[0]), item)
    return out


def test_the_embedded_gguf_reads_as_gguf_reader_reads_it(stock_reader):
    path = embedded_gguf_path()
    fields = read_fields(path)
    assert {k: tuple(f) for k, f in fields.items()} == reader_fields(stock_reader)
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
    read_fields and through a GGUFReader (the fallback, `plain_reader`): the same bytes."""
    export.write_gguf(tiny_model, tokenizer, tmp_path / "fast.gguf", "f32", embedded_gguf_path())
    monkeypatch.setattr(export, "read_fields", lambda *a, **k: (_ for _ in ()).throw(ValueError("big-endian")))
    export.write_gguf(tiny_model, tokenizer, tmp_path / "reader.gguf", "f32", embedded_gguf_path())
    assert (tmp_path / "fast.gguf").read_bytes() == (tmp_path / "reader.gguf").read_bytes()


def test_the_plain_reader_reads_what_gguf_reader_reads(stock_reader):
    """plain_reader (a GGUFReader over a plain ndarray view, ~4x faster) gives the same fields and tensors."""
    import numpy as np

    from rlpr.model.gguf_fields import plain_reader

    theirs, ours = stock_reader, plain_reader(embedded_gguf_path())
    assert list(theirs.fields) == list(ours.fields)
    for key, a in theirs.fields.items():
        b = ours.fields[key]
        assert (a.offset, a.name, a.types, a.data) == (b.offset, b.name, b.types, b.data), key
        assert len(a.parts) == len(b.parts) and all(np.array_equal(x, y) for x, y in zip(a.parts, b.parts)), key
    assert len(theirs.tensors) == len(ours.tensors) == 272
    for a, b in zip(theirs.tensors, ours.tensors):
        assert (a.name, a.tensor_type, a.n_elements, a.n_bytes, a.data_offset) == (
            b.name, b.tensor_type, b.n_elements, b.n_bytes, b.data_offset)
        assert np.array_equal(a.shape, b.shape) and np.array_equal(a.data, b.data), a.name


def test_a_conversion_reads_its_gguf_once_and_keeps_the_weights(tiny_model, tokenizer, tmp_path, monkeypatch):
    """A first run on a GGUF converts it (transformers' loader reads it for the tokenizer, the config and
    the weights): one reader is built, gguf's own names are restored after, and the f32 weights come back."""
    import torch

    from rlpr.model import gguf_fields, loading

    path = tmp_path / "tiny.gguf"
    export.write_gguf(tiny_model, tokenizer, path, "f32")
    built = []
    plain = gguf_fields.plain_reader
    monkeypatch.setattr(gguf_fields, "plain_reader", lambda *a: built.append(a) or plain(*a))
    reader_of, name_map_of = gguf.GGUFReader, gguf.get_tensor_name_map
    loading._convert_gguf(path, tmp_path / "converted")
    assert len(built) == 1 and (gguf.GGUFReader, gguf.get_tensor_name_map) == (reader_of, name_map_of)
    model, _ = loading.load_model(tmp_path / "converted")
    ours = model.state_dict()
    for name, value in tiny_model.state_dict().items():
        assert torch.equal(ours[name], value), name

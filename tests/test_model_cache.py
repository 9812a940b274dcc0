"""The converted-GGUF model cache (rlpr/model/loading.py): what resolve_model_dir writes under
RLPR_CACHE_DIR/models for a .gguf model.path."""

import os

import pytest

pytestmark = pytest.mark.unit


def test_the_converted_gguf_cache_gets_the_umask_s_modes(tokenizer, tmp_path, monkeypatch):
    """issue 35, E2: the cache folder was tempfile.mkdtemp's (0700) renamed into place, with
    safetensors' weights 0600, so other users of a shared RLPR_CACHE_DIR could not read it. Now
    0755/0644 under umask 022 and 0750/0640 under 027: the umask decides, never rlpr.

    The real _convert_gguf runs (its mkdtemp, save_pretrained, rename); only transformers' GGUF
    readers are stood in for by a tiny in-process model and the real tokenizer: de-quantizing even
    a tiny GGUF takes about 13 s here, mostly building its 49k-token tokenizer, too slow for the
    unit tier (transformers' GGUF readers on rlpr's GGUFs: tests/test_export.py; the whole conversion
    runs whenever the embedded model is first loaded into a fresh cache)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlpr.model.loading import resolve_model_dir, tiny_llama

    gguf = tmp_path / "tiny.gguf"
    gguf.write_bytes(b"GGUF")  # read only by the stand-ins below
    read = []

    def model_from(path, gguf_file=None, **kwargs):
        read.append(gguf_file)
        return tiny_llama(tokenizer, layers=1, hidden=32, seed=0)

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", model_from)
    monkeypatch.setattr(AutoTokenizer, "from_pretrained", lambda path, gguf_file=None, **kwargs: tokenizer)
    old = os.umask(0o022)
    try:
        for mask, file_mode, dir_mode in ((0o022, 0o644, 0o755), (0o027, 0o640, 0o750)):
            os.umask(mask)
            monkeypatch.setenv("RLPR_CACHE_DIR", str(tmp_path / f"cache{mask:o}"))
            target = resolve_model_dir(gguf)
            assert target.parent == tmp_path / f"cache{mask:o}" / "models" and (target / "config.json").is_file()
            files = [p for p in target.rglob("*") if p.is_file()]
            assert any(p.suffix == ".safetensors" for p in files) and any(p.name == "tokenizer.json" for p in files)
            for p in files:
                assert p.stat().st_mode & 0o777 == file_mode, (p, oct(p.stat().st_mode))
            for p in [target, *(d for d in target.rglob("*") if d.is_dir())]:
                assert p.stat().st_mode & 0o777 == dir_mode, (p, oct(p.stat().st_mode))
            assert resolve_model_dir(gguf) == target  # cached: converted once
    finally:
        os.umask(old)
    assert read == ["tiny.gguf", "tiny.gguf"]  # one conversion per cache

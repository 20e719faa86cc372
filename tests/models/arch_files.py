"""Random-config checkpoints of every Llama-block architecture, written by transformers as Hugging Face
directories and, with the same weights, as GGUF files by the gguf package's writer (llama.cpp's conventions)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

# model_type -> (transformers config class, GGUF architecture, extra config fields)
ARCHS = {
    "qwen2": ("Qwen2Config", "qwen2", {}),
    "qwen3": ("Qwen3Config", "qwen3", {"head_dim": 16}),
    # a window shorter than the test's sequences, so that the window is exercised
    "mistral": ("MistralConfig", "llama", {"sliding_window": 12}),
    "llama": ("LlamaConfig", "llama", {}),
}
GGUF_ARCH_ENUM = {"qwen2": gguf.MODEL_ARCH.QWEN2, "qwen3": gguf.MODEL_ARCH.QWEN3, "llama": gguf.MODEL_ARCH.LLAMA}


def make_hf_model(model_type: str, tmp_path, seed: int = 0):
    """(transformers model, its saved directory) of a small random ``model_type`` with perturbed norms/biases."""
    config_class, _, extra = ARCHS[model_type]
    settings = dict(vocab_size=199, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-5,
                    bos_token_id=1, eos_token_id=2, tie_word_embeddings=False, **extra)
    torch.manual_seed(seed)
    config = getattr(transformers, config_class)(**settings)
    config._attn_implementation = "eager"
    model = transformers.AutoModelForCausalLM.from_config(config).float().eval()
    with torch.no_grad():  # random init leaves norms at 1 and biases at 0: a dropped one would not show
        for name, param in model.named_parameters():
            if "norm" in name or name.endswith(".bias"):
                param.add_(0.1 * torch.randn_like(param))
    directory = tmp_path / f"hf-{model_type}"
    model.save_pretrained(directory)
    return model, directory


def llama_cpp_permute(weights: np.ndarray, num_heads: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf permutation of Llama q/k rows (its rotary pairs adjacent elements)."""
    return (weights.reshape(num_heads, 2, weights.shape[0] // num_heads // 2, *weights.shape[1:])
            .swapaxes(1, 2).reshape(weights.shape))


def write_gguf(model, model_type: str, path, tensor_type: str = "F32", architecture: str | None = None,
               vocab_tokens: bool = False) -> None:
    """``model``'s weights as a GGUF file, named and laid out the way llama.cpp writes them. ``tensor_type``
    "Q8_0" quantizes the 2-D matrices; ``architecture`` overrides general.architecture (bad-input tests)."""
    config = model.config
    _, arch, _ = ARCHS[model_type]
    writer = gguf.GGUFWriter(str(path), architecture or arch)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_freq_base(getattr(config, "rope_theta", None) or config.rope_parameters["rope_theta"])
    if getattr(config, "sliding_window", None) and model_type == "mistral":
        writer.add_sliding_window(config.sliding_window)
    writer.add_bos_token_id(config.bos_token_id)
    writer.add_eos_token_id(config.eos_token_id)
    names = gguf.get_tensor_name_map(GGUF_ARCH_ENUM[arch], config.num_hidden_layers)
    for hf_name, tensor in model.state_dict().items():
        name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        assert name is not None, hf_name
        data = tensor.float().numpy()
        if arch == "llama" and (".q_proj." in hf_name or ".k_proj." in hf_name):
            heads = config.num_attention_heads if ".q_proj." in hf_name else config.num_key_value_heads
            data = llama_cpp_permute(data, heads)
        if tensor_type != "F32" and data.ndim == 2:
            kind = gguf.GGMLQuantizationType[tensor_type]
            writer.add_tensor(name, gguf.quants.quantize(data, kind), raw_dtype=kind)
        else:
            writer.add_tensor(name, np.ascontiguousarray(data))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

"""Model layer: Llama target/draft, Gemma 3 target, EAGLE head, static KV cache, checkpoint and tokenizer loading.

Self-contained: depends only on torch, safetensors and tokenizers (gguf for reading GGUF tensors).
"""

from .model_config import CheckpointError, EagleConfig, LlamaConfig, RopeConfig
from .eagle import EagleHead
from .gemma3 import Gemma3Config, Gemma3ForCausalLM
from .kv_cache import KVCache
from .llama import LlamaForCausalLM
from .checkpoint import (MODEL_ARCHITECTURES, load_draft, load_draft_model, load_eagle_head, load_model,
                         read_weights, register_architecture, save_eagle_head, save_model)
from .outputs import ModelOutput
from .gguf_tokenizer import (build_gguf_tokenizer, chat_template_from_gguf, read_gguf_metadata,
                             tokenizer_config_from_gguf, tokenizer_from_gguf)
from .tokenizer import Tokenizer, chat_template_from_hf, load_tokenizer, save_tokenizer

__all__ = [
    "CheckpointError", "EagleConfig", "EagleHead", "Gemma3Config", "Gemma3ForCausalLM", "KVCache", "LlamaConfig",
    "LlamaForCausalLM",
    "MODEL_ARCHITECTURES", "ModelOutput", "RopeConfig", "Tokenizer", "build_gguf_tokenizer", "chat_template_from_gguf",
    "chat_template_from_hf", "load_draft", "load_draft_model", "load_eagle_head", "load_model", "load_tokenizer",
    "read_gguf_metadata", "read_weights", "register_architecture", "save_eagle_head", "save_model",
    "save_tokenizer", "tokenizer_config_from_gguf", "tokenizer_from_gguf",
]

"""Model layer: Llama target/draft, Gemma 3 target, EAGLE head, static KV cache, checkpoint and tokenizer loading.

Self-contained: depends only on torch, safetensors and tokenizers.
"""

from .config import CheckpointError, EagleConfig, LlamaConfig, RopeConfig
from .eagle import EagleHead
from .gemma3 import Gemma3Config, Gemma3ForCausalLM
from .kv_cache import KVCache
from .llama import LlamaForCausalLM
from .loading import (MODEL_ARCHITECTURES, load_draft_model, load_eagle_head, load_model, read_weights,
                      register_architecture, save_eagle_head, save_model)
from .outputs import ModelOutput
from .tokenizer import Tokenizer, load_tokenizer

__all__ = [
    "CheckpointError", "EagleConfig", "EagleHead", "Gemma3Config", "Gemma3ForCausalLM", "KVCache", "LlamaConfig",
    "LlamaForCausalLM",
    "MODEL_ARCHITECTURES", "ModelOutput", "RopeConfig", "Tokenizer", "load_draft_model", "load_eagle_head",
    "load_model", "load_tokenizer", "read_weights", "register_architecture", "save_eagle_head", "save_model",
]

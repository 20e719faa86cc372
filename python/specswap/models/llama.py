"""Llama decoder for the runtime: forward over (input_ids, positions, cache, slots).

The same class runs Mistral, Qwen 2 and Qwen 3: their configs (``LlamaConfig.from_*_dict``) switch on the
block's variants in the shared layers rather than copying them."""

from __future__ import annotations

import torch
from torch import nn

from .causal_lm import CausalLM, check_cache, check_cacheless
from .kv_cache import KVCache
from .layers import DecoderLayer, RMSNorm, RotaryEmbedding, plan_attention
from .model_config import LlamaConfig
from .outputs import ModelOutput


class LlamaModel(nn.Module):
    """Embedding, decoder layers and final norm (``model.*`` in Hugging Face checkpoints)."""

    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class LlamaForCausalLM(CausalLM):
    """Llama with a static KV cache.

    Requests of different lengths share a batch through their positions; each
    row of the batch reads and writes the cache row ``slots[b]``.
    """

    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.config = config
        self.model = LlamaModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.rotary = RotaryEmbedding(config.rope, config.head_dim)
        self.tie_weights()

    def forward_hidden(self, hidden: torch.Tensor, positions: torch.Tensor, cache: KVCache | None,
                       slots: torch.Tensor | None, key_length: int | None = None,
                       logits_at: torch.Tensor | None = None, with_logits: bool = True,
                       tree_mask: torch.Tensor | None = None, aux_points: tuple[int, ...] | None = None) -> ModelOutput:
        """The decoder and LM head applied to input embeddings ``hidden``: [B, T, H].

        ``cache=None`` is the training path: plain causal attention over the T tokens, nothing stored.
        """
        cos, sin = self.rotary(positions, hidden.dtype)
        captured = None if aux_points is None else []  # EAGLE-3 features (``CausalLM.forward``)
        if cache is None:
            check_cacheless(tree_mask)
            for index, layer in enumerate(self.model.layers):
                self.capture_aux(captured, aux_points, index, hidden)
                hidden = layer(hidden, cos, sin, None, None, None, positions, None)
        else:
            check_cache(cache, self.config.num_hidden_layers, positions, slots)
            plan = plan_attention(positions, cache, key_length, self.config.sliding_window, tree_mask)
            for index, (layer, key_buffer, value_buffer) in enumerate(zip(self.model.layers, cache.keys,
                                                                          cache.values)):
                self.capture_aux(captured, aux_points, index, hidden)
                hidden = layer(hidden, cos, sin, key_buffer, value_buffer, slots, positions, plan)
        self.capture_aux(captured, aux_points, len(self.model.layers), hidden)
        hidden = self.model.norm(hidden)
        self.capture_aux(captured, aux_points, len(self.model.layers) + 1, hidden)  # after the final norm
        return self.output(hidden, logits_at, with_logits, captured)

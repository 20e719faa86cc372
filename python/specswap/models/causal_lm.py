"""What every target architecture shares (``CausalLM``: the embedding, the LM head, rotary tables and the KV
cache's shape; the logits at every position or one per request) and the forward's input checks. Llama
(``models.llama``) and Gemma 3 (``models.gemma3``) derive from it."""

from __future__ import annotations

import torch
from torch import nn

from .kv_cache import KVCache
from .layers import RotaryEmbedding
from .model_config import LlamaConfig
from .outputs import ModelOutput


class CausalLM(nn.Module):
    """What every target architecture shares: ``model.embed_tokens``, ``lm_head`` (tied when the config says
    so), rotary tables rebuilt after loading, and a KV cache shaped from the config."""

    config: LlamaConfig
    model: nn.Module
    lm_head: nn.Linear
    @staticmethod
    def check_aux_points(points, num_layers: int) -> tuple[int, ...]:
        """EAGLE-3 capture points, sorted: each p in 0..L is the residual stream entering layer p (L: after the
        last layer, before the final norm); L + 1 is the final-normed state (Hugging Face's ``hidden_states[L]``);
        ValueError naming them otherwise."""
        points = tuple(sorted(int(p) for p in points))
        if not points or not all(0 <= p <= num_layers + 1 for p in points):
            raise ValueError(f"auxiliary hidden-state points {list(points)} must be a non-empty list in "
                             f"0..{num_layers + 1} (the residual stream entering layer p; {num_layers}: after the "
                             f"last; {num_layers + 1}: after the final norm)")
        return points

    @staticmethod
    def capture_aux(captured: list[torch.Tensor] | None, points, index: int, hidden: torch.Tensor) -> None:
        """Keep ``hidden`` (the residual stream entering layer ``index``) once per capture point naming it."""
        if captured is not None:
            captured.extend(hidden for point in points if point == index)

    @property
    def embed_tokens(self) -> nn.Embedding:
        return self.model.embed_tokens

    def tie_weights(self) -> None:
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, cache: KVCache | None, slots: torch.Tensor | None,
                key_length: int | None = None, logits_at: torch.Tensor | None = None,
                with_logits: bool = True, tree_mask: torch.Tensor | None = None,
                aux_points: tuple[int, ...] | None = None) -> ModelOutput:
        """Run T new tokens per request, writing their keys/values into the cache rows ``slots``.

        input_ids: [B, T] int64; positions: [B, T] int64 absolute positions, consecutive within a row;
        slots: [B] int64 cache rows. ``key_length`` (> every position) skips a host sync when given.
        ``tree_mask`` ([T, T] or [B, T, T] bool): the T tokens are a draft tree rooted at the first, positions
        are the root's plus each node's depth, and node i is stored at the root's position + i
        (``layers.plan_attention``).
        ``cache=None`` (training only): causal attention within the T tokens, positions must be 0..T-1 style.
        ``logits_at`` / ``with_logits``: see ``output``. ``aux_points`` (EAGLE-3, sorted, ``check_aux_points``):
        the output's ``hidden`` is the residual stream entering those layers, concatenated in layer order
        ([B, T, len(points) * H]), instead of the final-normed state; None (default) costs nothing. The embedding
        is the architecture's own (Gemma's scales), then ``forward_hidden`` runs its decoder.
        """
        return self.forward_hidden(self.model.embed_tokens(input_ids), positions, cache, slots, key_length,
                                   logits_at, with_logits, tree_mask, aux_points)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The LM head over final-normed hidden states [..., H] -> [..., V]."""
        return self.lm_head(hidden)

    def output(self, hidden: torch.Tensor, logits_at: torch.Tensor | None, with_logits: bool,
               captured: list[torch.Tensor] | None = None) -> ModelOutput:
        """Final-normed ``hidden`` [B, T, H] with logits at every position, at one position per row
        (``logits_at``: [B] -> logits [B, 1, V]), or none (``with_logits=False``: feature extraction, where the
        LM head over a large vocabulary would cost more than the decoder). ``captured`` (auxiliary hidden
        states, ``aux_points``): the output's ``hidden`` is their concatenation instead."""
        features = hidden if captured is None else torch.cat(captured, dim=-1)
        if not with_logits:
            return ModelOutput(logits=None, hidden=features)
        if logits_at is not None:
            rows = torch.arange(hidden.shape[0], device=hidden.device)
            return ModelOutput(logits=self.compute_logits(hidden[rows, logits_at].unsqueeze(1)), hidden=features)
        return ModelOutput(logits=self.compute_logits(hidden), hidden=features)

    def finish_loading(self, device: torch.device | str) -> None:
        """Re-tie weights and rebuild non-persistent buffers after ``load_state_dict(assign=True)``."""
        self.tie_weights()
        for module in self.modules():
            if isinstance(module, RotaryEmbedding):
                module.reset(device)

    @property
    def dtype(self) -> torch.dtype:
        # models with block-quantized weights (``load_gguf_native``) name their activation dtype
        return getattr(self, "activation_dtype", None) or self.lm_head.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device

    def make_cache(self, max_batch_size: int, capacity: int, dtype: torch.dtype | None = None,
                   device: torch.device | str | None = None) -> KVCache:
        return KVCache(self.config.num_hidden_layers, max_batch_size, self.config.num_key_value_heads, capacity,
                       self.config.head_dim, dtype=dtype or self.dtype, device=device or self.device)


def check_cacheless(tree_mask: torch.Tensor | None) -> None:
    if tree_mask is not None:
        raise ValueError("a tree_mask needs a KV cache (the cacheless training forward is causal)")


def check_cache(cache: KVCache, num_layers: int, input_ids: torch.Tensor, slots: torch.Tensor) -> None:
    """Cheap shape checks (no device sync) that turn index errors deep in attention into clear messages.

    input_ids (or positions): [B, T]; slots: [B].
    """
    if cache.num_layers != num_layers:
        raise ValueError(f"KV cache has {cache.num_layers} layers but the model has {num_layers}; "
                         "make the cache with this model's make_cache()")
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids and positions must be [B, T]; got shape {tuple(input_ids.shape)}")
    if slots.shape != input_ids.shape[:1]:
        raise ValueError(f"slots must be [B] = [{input_ids.shape[0]}]; got shape {tuple(slots.shape)}")
    if input_ids.shape[0] > cache.max_batch_size:
        raise ValueError(f"batch of {input_ids.shape[0]} exceeds the cache's max_batch_size {cache.max_batch_size}")

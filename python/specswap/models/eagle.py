"""EAGLE-1 style draft head that shares the target's embedding and LM head.

At head position j the head consumes (embed(x_{j+1}), f_j), where f_j is the
target's hidden state at position j (or, while drafting, the head's own
previous output), and predicts f_{j+1}, whose logits score x_{j+2}.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .model_config import EagleConfig
from .kv_cache import KVCache
from .layers import DecoderLayer, RMSNorm, RotaryEmbedding, plan_attention
from .llama import check_cache
from .outputs import ModelOutput
from .draft_quantization import int8_linear, quantize_linears_int8, quantize_rows_int8
from .quantized import QuantizedLinear


class EagleHead(nn.Module):
    """embed -> concat features -> fc (2H -> H) -> one decoder layer -> norm -> shared LM head.

    ``token_map``: LongTensor[Vd], draft id -> target id, restricting the logits to a reduced draft
    vocabulary (None = the full target vocabulary, draft id == target id).
    The shared embedding and LM head belong to the target: they are not parameters of the head, are not
    saved with it, and move with the target, not with ``head.to()``.
    """

    def __init__(self, config: EagleConfig, embed_tokens: nn.Embedding, lm_head: nn.Linear,
                 token_map: torch.Tensor | None = None):
        super().__init__()
        self.config = config
        self.fc = nn.Linear(2 * config.hidden_size, config.hidden_size, bias=config.fc_bias)
        self.layers = nn.ModuleList([DecoderLayer(config.decoder_config())])
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary = RotaryEmbedding(config.rope, config.head_dim)
        # plain attributes, so the target's modules are neither registered nor saved here
        object.__setattr__(self, "embed_tokens", embed_tokens)
        object.__setattr__(self, "lm_head", lm_head)
        self.token_map: torch.Tensor | None = None
        self._draft_lm_weight: torch.Tensor | None = None
        self._draft_lm_scales: torch.Tensor | None = None  # set when the LM head rows are int8
        self.set_token_map(token_map)

    def set_token_map(self, token_map: torch.Tensor | None, source: str = "token_map") -> None:
        """Restrict the draft logits to ``token_map`` (draft id -> target id); None restores the full vocab."""
        self._draft_lm_scales = None
        self._draft_lm = None  # a QuantizedLinear over block-format rows (targets with native weights)
        if token_map is None:
            self.token_map, self._draft_lm_weight = None, None
            return
        token_map = token_map.to(dtype=torch.long, device=self.lm_head.weight.device)
        vocab = self.config.target_vocab_size
        if token_map.dim() != 1 or token_map.numel() == 0:
            raise ValueError(f"{source}: token_map must be a non-empty 1-D tensor; got shape {tuple(token_map.shape)}")
        bad = token_map[(token_map < 0) | (token_map >= vocab)]
        if bad.numel():
            raise ValueError(f"{source}: token_map holds target ids out of range {bad[:5].tolist()}; "
                             f"valid ids are 0..{vocab - 1}")
        self.token_map = token_map
        # rows of the shared LM head for the draft vocabulary, gathered once rather than every step
        if isinstance(self.lm_head, QuantizedLinear):  # the target's blocks: gather the draft rows' blocks
            self._draft_lm = self.lm_head.rows(token_map)
            self._draft_lm_weight = None
            return
        self._draft_lm_weight = self.lm_head.weight.detach()[token_map]

    def quantize_q8_0(self) -> None:
        """ggml Q8_0 blocks for the head's own linears (targets with native weights: their LM head rows are in
        the target's block format already). A bias is kept and added in the activation dtype."""
        for name, module in list(self.named_modules()):
            if isinstance(module, nn.Linear):
                parent, _, child = name.rpartition(".")
                setattr(self.get_submodule(parent), child, QuantizedLinear.from_linear(module, "Q8_0"))

    def quantize_int8(self) -> None:
        """Weight-only int8 for every linear of the head and its LM head rows (see ``quantize``): about half the
        bytes a draft step reads. The LM head becomes a quantized copy of the draft vocabulary's rows (of the
        whole target vocabulary without a token map); the target's own LM head is untouched."""
        if self._draft_lm_scales is not None:
            return
        quantize_linears_int8(self)
        rows = self.lm_head.weight if self._draft_lm_weight is None else self._draft_lm_weight
        self._draft_lm_weight, self._draft_lm_scales = quantize_rows_int8(rows, rows.dtype)

    @property
    def draft_vocab_size(self) -> int:
        return self.config.target_vocab_size if self.token_map is None else self.token_map.numel()

    def finish_loading(self, device: torch.device | str) -> None:
        self.rotary.reset(device)

    def make_cache(self, max_batch_size: int, capacity: int, dtype: torch.dtype | None = None,
                   device: torch.device | str | None = None) -> KVCache:
        # an Int8Linear keeps the activation dtype in its scales; a QuantizedLinear has none: the norm's is it
        weight = self.norm.weight if isinstance(self.fc, QuantizedLinear) else getattr(self.fc, "scales", self.fc.weight)
        return KVCache(1, max_batch_size, self.config.num_key_value_heads, capacity, self.config.head_dim,
                       dtype=dtype or weight.dtype, device=device or weight.device)

    def forward(self, input_ids: torch.Tensor, features: torch.Tensor, positions: torch.Tensor,
                cache: KVCache | None, slots: torch.Tensor | None, key_length: int | None = None,
                logits_at: torch.Tensor | None = None, tree_mask=None) -> ModelOutput:
        """input_ids, positions: [B, T]; features: [B, T, H]; slots: [B] -> logits [B, T, Vd], hidden [B, T, H].

        ``tree_mask`` (a ``layers.TreeRegion``, or [T, T] / [B, T, T]): the tokens are draft-tree nodes
        (``layers.plan_attention``), as a tree drafter's steps feed them.

        ``logits_at`` ([B]): logits at that position of each row only ([B, 1, Vd]; a catch-up over many tokens
        needs the last one's, and the LM head over every row would cost more than the layer).
        """
        if features.shape[-1] != self.config.hidden_size:  # a shape, no sync: a clear error instead of fc's
            raise ValueError(f"EAGLE head: features are {features.shape[-1]} wide, expected {self.config.hidden_size};"
                             f" EAGLE-3 auxiliary hidden states (aux_points) cannot feed an EAGLE-1 head")
        embeds = self.embed_tokens(input_ids).to(features.dtype)          # [B, T, H]
        hidden = self.fc(torch.cat((embeds, features), dim=-1))           # [B, T, H]
        cos, sin = self.rotary(positions, hidden.dtype)
        if cache is None:  # training: causal attention within the T tokens
            hidden = self.layers[0](hidden, cos, sin, None, None, None, positions, None)
        else:
            check_cache(cache, 1, input_ids, slots)
            plan = plan_attention(positions, cache, key_length, tree_mask=tree_mask)
            hidden = self.layers[0](hidden, cos, sin, cache.keys[0], cache.values[0], slots, positions, plan)
        hidden = self.norm(hidden)
        rows = hidden if logits_at is None else \
            hidden[torch.arange(hidden.shape[0], device=hidden.device), logits_at].unsqueeze(1)
        return ModelOutput(logits=self._logits(rows), hidden=hidden)

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The draft LM head over normed hidden states [..., H] -> [..., Vd]."""
        if self._draft_lm is not None:
            return self._draft_lm(hidden)
        if isinstance(self.lm_head, QuantizedLinear) and self.token_map is None:
            return self.lm_head(hidden)
        if self._draft_lm_scales is not None:
            return int8_linear(hidden, self._draft_lm_weight, self._draft_lm_scales)
        lm_weight = self.lm_head.weight if self._draft_lm_weight is None else self._draft_lm_weight
        return F.linear(hidden, lm_weight)

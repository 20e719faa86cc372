"""What every model forward returns."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class ModelOutput:
    logits: torch.Tensor | None  # [B, T, V] in the model dtype ([B, 1, V] with logits_at; None without logits)
    hidden: torch.Tensor  # [B, T, H] last hidden state after the final norm (what feeds the LM head); with
                          # aux_points (EAGLE-3) the residual streams there, concatenated: [B, T, n * H]

"""What every model forward returns."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class ModelOutput:
    logits: torch.Tensor  # [B, T, V] in the model dtype
    hidden: torch.Tensor  # [B, T, H] last hidden state after the final norm (what feeds the LM head)

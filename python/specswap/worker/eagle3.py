"""EAGLE-3 drafting: ``EagleDrafter`` over an EAGLE-3 head (``models.eagle3.Eagle3Head``) and the target's fused
auxiliary hidden states.

The head takes EAGLE's call (``models.eagle.EagleHead``): fed the target's fused features (3H, from the
prefill, the verify and the tier-0 catch-up) it applies its ``fc``; fed its own hidden state (H, draft steps
2..k) it does not. So the alignment, trees, tiers, sampling (the draft law over the draft vocabulary, mapped
through ``d2t`` as EAGLE's ``token_map``) and graphs are EagleDrafter's; what differs is that the target must
return its auxiliary hidden states (``CausalLM.set_aux_hidden_points``, set here when the worker is built) and
that the buffers holding target features (the tier-0 features here; the draft-extend graphs' input, sized by
EagleDrafter from the head's ``fused_feature_size``) are 3H wide.
"""

from __future__ import annotations

import torch

from specswap.worker.eagle import EagleDrafter


def attach_aux_hidden_states(target: torch.nn.Module, head: torch.nn.Module) -> None:
    """Make ``target`` return the fused features ``head`` reads (its ``capture_points``). A target that already
    returns other points (shared with another EAGLE-3 worker) is refused rather than changed under it."""
    points = tuple(head.capture_points)
    current = getattr(target, "aux_hidden_points", None)
    if current is not None and current != points:
        raise ValueError(f"the target already returns auxiliary hidden states at {list(current)} for another "
                         f"EAGLE-3 head; this head reads {list(points)}")
    if not hasattr(target, "set_aux_hidden_points"):
        raise ValueError(f"EAGLE-3 needs a target that can return auxiliary hidden states; "
                         f"{type(target).__name__} cannot")
    width = len(points) * target.config.hidden_size
    if width != head.fused_feature_size:
        raise ValueError(f"the target's fused features at {list(points)} are {width} wide; the EAGLE-3 head's fc "
                         f"reads {head.fused_feature_size}")
    target.set_aux_hidden_points(points)


class Eagle3Drafter(EagleDrafter):
    def __init__(self, head: torch.nn.Module, target: torch.nn.Module, slots, cache_rows: int, cache_capacity: int,
                 keep_tier0_features: bool):
        attach_aux_hidden_states(target, head)
        super().__init__(head, target, slots, cache_rows, cache_capacity, keep_tier0_features)
        if self.tier0_features is not None:  # the verify's fused features f_{m-1}, for the catch-up: 3H wide
            self.tier0_features = torch.zeros(cache_rows, cache_capacity, head.fused_feature_size,
                                              dtype=target.dtype, device=target.device)

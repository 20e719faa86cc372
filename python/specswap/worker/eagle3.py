"""EAGLE-3 drafting: ``EagleDrafter`` over an EAGLE-3 head (``models.eagle3.Eagle3Head``) and the target's fused
auxiliary hidden states.

The head takes EAGLE's call (``models.eagle.EagleHead``): fed the target's fused features (3H, from the
prefill, the verify and the tier-0 catch-up) it applies its ``fc``; fed its own hidden state (H, draft steps
2..k) it does not. So the alignment, trees, tiers, sampling (the draft law over the draft vocabulary, mapped
through ``d2t`` as EAGLE's ``token_map``) and graphs are EagleDrafter's; what differs is that the worker calls
the target through ``target_view`` (``models.eagle3.AuxHiddenTarget``: its prefill and verify, graphs
included, return the auxiliary hidden states) and that the buffers holding target features (the tier-0 features here; the draft-extend graphs' input, sized by
EagleDrafter from the head's ``fused_feature_size``) are 3H wide.
"""

from __future__ import annotations

import torch

from specswap.worker.eagle import EagleDrafter


class Eagle3Drafter(EagleDrafter):
    def __init__(self, head: torch.nn.Module, target: torch.nn.Module, slots, cache_rows: int, cache_capacity: int,
                 keep_tier0_features: bool):
        from specswap.models.eagle3 import AuxHiddenTarget

        width = len(head.capture_points) * target.config.hidden_size
        if width != head.fused_feature_size:
            raise ValueError(f"the target's fused features at {list(head.capture_points)} are {width} wide; the "
                             f"EAGLE-3 head's fc reads {head.fused_feature_size}")
        # the target as this worker calls it: returning the fused features the head reads
        self.aux_target = AuxHiddenTarget(target, head.capture_points)
        super().__init__(head, target, slots, cache_rows, cache_capacity, keep_tier0_features)

    def feature_size(self) -> int:
        return self.model.fused_feature_size  # the verify's fused features, for the catch-up: 3H wide

    def target_view(self, target: torch.nn.Module) -> torch.nn.Module:
        if target is not self.aux_target.target:
            raise ValueError("an Eagle3Drafter serves the target it was built for")
        return self.aux_target

"""The compiled core (specswap._C), imported after torch so libtorch is loaded."""

from __future__ import annotations

import torch  # noqa: F401  (loads libtorch/libc10 before the extension needs them)

try:
    from specswap import _C
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError(
        "specswap's compiled core (specswap._C) is missing or was built against another torch. "
        "Install the package with `pip install .` (it needs torch==2.13.0 for the CPU build), "
        "or for a source checkout run `bash tools/build_inplace.sh`."
    ) from exc

StatePool = _C.StatePool
SpecRuntimeState = _C.SpecRuntimeState
AdaptiveConfig = _C.AdaptiveConfig
AdaptiveSpeculativeParams = _C.AdaptiveSpeculativeParams
RoundObservation = _C.RoundObservation  # one round as the policy reads it (AdaptiveSpeculativeParams.observe)
adaptive_config_schema = _C.adaptive_config_schema
tier_key = _C.tier_key      # a tier's key in the pool and the policy: a chain's steps, a tree's encoded shape
tier_shape = _C.tier_shape  # key -> (speculative_num_steps, speculative_eagle_topk, speculative_num_draft_tokens)

__all__ = [
    "StatePool",
    "SpecRuntimeState",
    "AdaptiveConfig",
    "AdaptiveSpeculativeParams",
    "RoundObservation",
    "adaptive_config_schema",
    "tier_key",
    "tier_shape",
]

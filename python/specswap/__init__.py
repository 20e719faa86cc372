"""specswap: adaptive speculative decoding with prebuilt per-tier runtime states.

Heavy pieces load on first use (PEP 562), so ``import specswap.models`` needs
neither the compiled core nor the engine.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

# public name -> module that defines it
_EXPORTS = {
    "StatePool": "specswap._core",
    "SpecRuntimeState": "specswap._core",
    "AdaptiveConfig": "specswap._core",
    "AdaptiveSpeculativeParams": "specswap._core",
    "RoundObservation": "specswap._core",
    "cpu_capability": "specswap.capability",
    "load_adaptive_config": "specswap.adaptive_config",
    "AdaptiveController": "specswap.controller",
    "SpeculativeWorker": "specswap.worker",
    "algorithm": "specswap.algorithms",
    "SamplingParams": "specswap.sampling",
    "Engine": "specswap.engine",
    "RequestOutput": "specswap.engine",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str):
    module_name = _EXPORTS.get(name)
    if module_name is None:
        raise AttributeError(f"module 'specswap' has no attribute {name!r}")
    value = getattr(importlib.import_module(module_name), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(__all__)

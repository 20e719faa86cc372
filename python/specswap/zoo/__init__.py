"""The tiny test zoo: small models trained here from offline text and shipped with the package.

``path(name)`` gives the directory of a shipped checkpoint; ``python -m specswap.zoo train tiny`` rebuilds them.
"""

from __future__ import annotations

from pathlib import Path

WEIGHTS_DIR = Path(__file__).resolve().parent / "weights"
NAMES = ("tiny", "tiny-eagle", "tiny-draft", "gemma-3-270m-eagle")  # shipped weights; the Gemma target itself comes from zoo.gemma


def path(name: str) -> Path:
    """Directory of the shipped checkpoint ``name`` (config.json, model.safetensors, tokenizer.json)."""
    if name not in NAMES:
        raise ValueError(f"unknown zoo model {name!r}; valid names: {', '.join(NAMES)}")
    return WEIGHTS_DIR / name

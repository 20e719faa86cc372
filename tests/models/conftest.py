"""Fixtures the C++ operator tests share."""

from __future__ import annotations

import pytest

from specswap import _core


@pytest.fixture
def simd_restored():
    """specswap._C.simd_math_set (the AVX2 forms of the fp32 operators) back to its value after the test."""
    previous = _core._C.simd_math_set(True)
    yield
    _core._C.simd_math_set(previous)

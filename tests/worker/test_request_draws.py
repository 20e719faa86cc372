"""Every draw from a request's generator goes through sampling's draw helpers, made on the generator's device.

On CUDA a request's generator is a CUDA generator; a draw that made a CPU tensor with it (``torch.randint(...,
generator=g)`` without ``device=``) raised on every sampled tier-0 round. The behaviour on a GPU is covered by
tools/gpu_check.sh (the worker tests on CUDA); here the structure: no code outside the helpers draws from a
generator, and the helpers draw on the generator's device."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from specswap import sampling

PACKAGE = Path(sampling.__file__).resolve().parent
HELPERS = {"draw_key", "draw_uniform_", "exponential_", "_check_generator_device"}
# training code seeds generators of its own for data order and initialisation; no request draws there
OUTSIDE_REQUESTS = ("zoo",)
DRAWING_CALLS = {"randint", "rand", "randn", "randperm", "multinomial", "uniform_", "exponential_", "normal_",
                 "bernoulli", "bernoulli_", "random_", "geometric_", "cauchy_", "log_normal_"}


def draws_outside_the_helpers() -> list[str]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE)
        if relative.parts[0] in OUTSIDE_REQUESTS:
            continue
        tree = ast.parse(path.read_text())
        helper_lines = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and node.name in HELPERS and path.name == "sampling.py":
                helper_lines.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call) or node.lineno in helper_lines:
                continue
            # torch's draws are attributes (torch.randint, tensor.uniform_); a bare name is a call of a helper
            torch_draw = isinstance(node.func, ast.Attribute) and node.func.attr in DRAWING_CALLS
            if torch_draw or any(keyword.arg == "generator" for keyword in node.keywords):
                found.append(f"{relative}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_code_draws_from_a_generator_but_the_helpers():
    assert not draws_outside_the_helpers()


def test_the_scan_finds_a_draw_that_bypasses_the_helpers(tmp_path, monkeypatch):
    """The check can fail: the old tier-0 key draw is found."""
    (tmp_path / "slots.py").write_text("import torch\n\ndef key(g):\n    return int(torch.randint(2 ** 62, (), generator=g))\n")
    monkeypatch.setattr(__import__(__name__), "PACKAGE", tmp_path)
    assert draws_outside_the_helpers() == ["slots.py:4: torch.randint(2 ** 62, (), generator=g)"]


def test_draw_key_draws_on_the_generator_s_device(monkeypatch):
    seen = {}
    real = torch.randint

    def spy(*args, **kwargs):
        seen.update(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(torch, "randint", spy)
    generator = torch.Generator(device="cpu").manual_seed(5)
    key = sampling.draw_key(generator)
    assert seen["device"] == generator.device and seen["generator"] is generator
    assert key == sampling.draw_key(torch.Generator(device="cpu").manual_seed(5)) and 0 <= key < 2 ** 62
    sampling.draw_key(None)
    assert seen["device"] == torch.device("cpu") and seen["generator"] is None


def test_a_draw_into_another_device_s_tensor_is_refused_with_both_devices():
    generator = torch.Generator(device="cpu")
    out = torch.empty(4, device="meta")
    with pytest.raises(ValueError, match="meta tensor from a cpu generator"):
        sampling.draw_uniform_(out, generator)
    with pytest.raises(ValueError, match="meta tensor from a cpu generator"):
        sampling.exponential_(out, generator)


def test_the_helpers_keep_the_laws():
    generator = torch.Generator().manual_seed(0)
    uniforms = sampling.draw_uniform_(torch.empty(20000), generator)
    assert 0 <= uniforms.min() and uniforms.max() < 1 and abs(uniforms.mean().item() - 0.5) < 0.01
    exponentials = sampling.exponential_(torch.empty(20000), torch.Generator().manual_seed(1))
    assert abs(exponentials.mean().item() - 1.0) < 0.03

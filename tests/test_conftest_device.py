"""tests/conftest.py's test device (SPECSWAP_TEST_DEVICE): ``npu`` / ``npu:N`` are accepted with torch_npu
imported first, and without torch_npu (or without an NPU) the run stops at start-up with a usage error that says
so, as for ``cuda``; ``cpu`` still runs. Each case is a pytest run of its own, in a subprocess."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
THIS = Path(__file__).resolve().relative_to(ROOT)
PROBE = f"{THIS}::test_the_device_fixture_is_the_requested_device"

# pytest in a child process with torch_npu unimportable (as on a machine without it) unless `fake_npu` puts a
# stand-in in its place: a torch_npu that imports and adds a torch.npu seeing `count` devices
CHILD = """
import sys, types
fake = {fake!r}
if fake is None:
    sys.modules["torch_npu"] = None  # import torch_npu raises ImportError
else:
    import torch
    module = types.ModuleType("torch_npu")
    npu = types.SimpleNamespace(is_available=lambda: fake > 0, device_count=lambda: fake, current_device=lambda: 0)
    sys.modules["torch_npu"] = module
    torch.npu = npu
import pytest
sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", {probe!r}]))
"""


def _pytest_with_device(device: str, fake_npu=None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["SPECSWAP_TEST_DEVICE"] = device
    env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"  # torch itself must not load an installed torch_npu
    env.pop("PYTEST_ADDOPTS", None)
    code = CHILD.format(fake=fake_npu, probe=PROBE)
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)


def test_the_device_fixture_is_the_requested_device(device):
    # the probe the child runs use: under the default (cpu) it also runs in the suite itself
    expected = os.environ.get("SPECSWAP_TEST_DEVICE", "cpu").strip() or "cpu"
    assert device.type == expected.split(":")[0]
    print(f"probe device={device}")


def test_cpu_still_runs():
    result = _pytest_with_device("cpu")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 passed" in result.stdout


@pytest.mark.parametrize("device", ["npu", "npu:1"])
def test_npu_without_torch_npu_is_a_usage_error_naming_torch_npu(device):
    result = _pytest_with_device(device)
    assert result.returncode == pytest.ExitCode.USAGE_ERROR, result.stdout + result.stderr
    assert f"SPECSWAP_TEST_DEVICE='{device}' needs torch_npu" in result.stderr, result.stderr
    assert "did not import (ModuleNotFoundError" in result.stderr  # the real message, not a traceback
    assert "passed" not in result.stdout  # stopped at start-up: nothing ran


def test_npu_with_torch_npu_but_no_device_is_a_usage_error():
    result = _pytest_with_device("npu", fake_npu=0)
    assert result.returncode == pytest.ExitCode.USAGE_ERROR, result.stdout + result.stderr
    assert "SPECSWAP_TEST_DEVICE='npu' but torch_npu sees no NPU device" in result.stderr, result.stderr


def test_a_device_type_outside_the_list_names_npu_among_the_valid_ones():
    result = _pytest_with_device("meta")
    assert result.returncode == pytest.ExitCode.USAGE_ERROR, result.stdout + result.stderr
    assert "device type 'meta' is not tested here; valid: cpu, cuda, cuda:N, npu, npu:N" in result.stderr

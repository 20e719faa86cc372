"""The device that device-parametrized tests run on: ``SPECSWAP_TEST_DEVICE`` (default ``cpu``).

``tools/gpu_check.sh`` runs those tests with ``SPECSWAP_TEST_DEVICE=cuda``. A device that is asked for but
absent fails the whole run at start-up instead of skipping, so a GPU check cannot pass by running nothing.
"""

import os

import pytest
import torch

DEVICE_VARIABLE = "SPECSWAP_TEST_DEVICE"
DEVICE_TYPES = ("cpu", "cuda")


def requested_device() -> torch.device:
    """The device named by SPECSWAP_TEST_DEVICE, with an index when it is an accelerator."""
    name = os.environ.get(DEVICE_VARIABLE, "cpu").strip() or "cpu"
    try:
        device = torch.device(name)
    except RuntimeError as error:
        raise pytest.UsageError(f"{DEVICE_VARIABLE}={name!r} is not a device ({error}); valid: cpu, cuda, cuda:N")
    if device.type not in DEVICE_TYPES:
        raise pytest.UsageError(f"{DEVICE_VARIABLE}={name!r}: device type {device.type!r} is not tested here; "
                                f"valid: cpu, cuda, cuda:N")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise pytest.UsageError(f"{DEVICE_VARIABLE}={name!r} but torch {torch.__version__} sees no CUDA device")
        index = torch.cuda.current_device() if device.index is None else device.index
        if index >= torch.cuda.device_count():
            raise pytest.UsageError(f"{DEVICE_VARIABLE}={name!r}: valid indices are 0..{torch.cuda.device_count() - 1}")
        device = torch.device("cuda", index)
    return device


def pytest_configure(config):
    config.specswap_device = requested_device()


def pytest_report_header(config):
    return f"specswap test device: {config.specswap_device} ({DEVICE_VARIABLE})"


@pytest.fixture(scope="session")
def device(pytestconfig) -> torch.device:
    """Where device-parametrized tests build their models, caches and graphs."""
    return pytestconfig.specswap_device

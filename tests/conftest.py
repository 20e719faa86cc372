"""Suite-wide: the CPU capability line, the test device and the property-test seed in the header, the
capability markers, and the device fixture.

- One seed per run for the property tests (hypothesis), printed in the header and again in the summary (``-q``
  hides the header), so a failing run can be repeated. Each run draws new examples: a fixed derandomized set
  would try the same 15-20 cases forever. The seed comes from ``SPECSWAP_TEST_SEED`` when set, else from
  os.urandom; ``--hypothesis-seed`` on the command line wins over both.
- ``@pytest.mark.requires_cpu("native_bf16", ...)``: skip, with the capability line as the reason, unless
  ``cpu_capability()`` has every named attribute true (an unknown name is an error, not a skip).
- ``@pytest.mark.capability``: the test exercises a capability-dependent path (dtype "auto", bf16 weight
  repacking, the int8 draft kernel, the capability module). tools/test.sh runs ``-m capability`` a second time
  with ``SPECSWAP_CPU_CAPS=-avx512`` and torch held to AVX2. Every ``requires_cpu`` test is one too, and so is
  every test whose source names bf16 (CAPABILITY_WORDS).

The device that device-parametrized tests run on: ``SPECSWAP_TEST_DEVICE`` (default ``cpu``; ``cuda[:N]``, or
``npu[:N]`` with torch_npu, which is imported first).

``tools/gpu_check.sh`` runs those tests with ``SPECSWAP_TEST_DEVICE=cuda``. A device that is asked for but
absent fails the whole run at start-up instead of skipping, so a GPU check cannot pass by running nothing.
"""


import dataclasses
import inspect
import os
import shutil
import tempfile
from pathlib import Path

import pytest
import torch

from specswap.capability import CpuCapability, cpu_capability

CAPABILITY_FLAGS = tuple(f.name for f in dataclasses.fields(CpuCapability) if f.type in (bool, "bool"))


def pytest_report_header(config):
    try:
        line = cpu_capability().describe()
    except ValueError as error:  # a bad SPECSWAP_CPU_CAPS: every test that asks fails with this message
        line = f"cpu capability: {error}"
    return [line, f"specswap test device: {config.specswap_device} ({DEVICE_VARIABLE})",
            f"specswap weight cache: {config.specswap_cache} ({CACHE_VARIABLE})", _seed_line(config)]


# a test whose source names one of these runs a capability-dependent path: it is a capability test without a
# marker, so a new bf16 test that forgets the marker still runs under the override (and fails on a missing guard)
CAPABILITY_WORDS = ("bfloat16", "bf16", "pack_linear_weights", "cpu_capability", "draft_quantization")


def _names_a_capability_path(item) -> bool:
    function = getattr(item, "function", None)
    try:
        source = inspect.getsource(function) if function is not None else ""
    except (OSError, TypeError):
        return False
    return any(word in source for word in CAPABILITY_WORDS)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.get_closest_marker("capability") is None and (
                item.get_closest_marker("requires_cpu") is not None or _names_a_capability_path(item)):
            item.add_marker(pytest.mark.capability)


def pytest_runtest_setup(item):
    for marker in item.iter_markers("requires_cpu"):
        unknown = [name for name in marker.args if name not in CAPABILITY_FLAGS]
        if unknown or not marker.args:
            raise pytest.UsageError(f"requires_cpu{marker.args} on {item.nodeid}: valid names are "
                                    f"{', '.join(CAPABILITY_FLAGS)}")
        capability = cpu_capability()
        missing = [name for name in marker.args if not getattr(capability, name)]
        if missing:
            pytest.skip(f"needs {' '.join(missing)}; {capability.describe()}")


@pytest.fixture
def cpu_override(monkeypatch):
    """``cpu_override("-avx512")``: the capability under that SPECSWAP_CPU_CAPS for the rest of the test (it
    replaces the process's own setting; torch's limits still apply), re-read afterwards."""
    def apply(text: str) -> CpuCapability:
        monkeypatch.setenv("SPECSWAP_CPU_CAPS", text)
        cpu_capability.cache_clear()
        return cpu_capability()

    yield apply
    monkeypatch.undo()
    cpu_capability.cache_clear()


DEVICE_VARIABLE = "SPECSWAP_TEST_DEVICE"
DEVICE_TYPES = ("cpu", "cuda", "npu")
VALID_DEVICES = "cpu, cuda, cuda:N, npu, npu:N"


def _import_torch_npu(name: str):
    """torch_npu registers the ``npu`` device type with torch (torch.device("npu") is no device without it);
    returns its module ``torch.npu``."""
    try:
        import torch_npu  # noqa: F401
    except Exception as error:  # not installed, or installed without CANN (its libraries fail to load)
        raise pytest.UsageError(f"{DEVICE_VARIABLE}={name!r} needs torch_npu, the Ascend adapter for torch, and it "
                                f"did not import ({type(error).__name__}: {error}); install torch_npu for torch "
                                f"{torch.__version__} on a machine with CANN and an NPU") from None
    npu = getattr(torch, "npu", None)
    if npu is None:
        raise pytest.UsageError(f"{DEVICE_VARIABLE}={name!r}: torch_npu imported but added no torch.npu module")
    return npu


def requested_device() -> torch.device:
    """The device named by SPECSWAP_TEST_DEVICE, with an index when it is an accelerator."""
    name = os.environ.get(DEVICE_VARIABLE, "cpu").strip() or "cpu"
    npu = _import_torch_npu(name) if name.split(":")[0] == "npu" else None
    if npu is not None and not npu.is_available():
        raise pytest.UsageError(f"{DEVICE_VARIABLE}={name!r} but torch_npu sees no NPU device")
    try:
        device = torch.device(name)
    except RuntimeError as error:
        raise pytest.UsageError(f"{DEVICE_VARIABLE}={name!r} is not a device ({error}); valid: {VALID_DEVICES}")
    if device.type not in DEVICE_TYPES:
        raise pytest.UsageError(f"{DEVICE_VARIABLE}={name!r}: device type {device.type!r} is not tested here; "
                                f"valid: {VALID_DEVICES}")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise pytest.UsageError(f"{DEVICE_VARIABLE}={name!r} but torch {torch.__version__} sees no CUDA device")
        index = torch.cuda.current_device() if device.index is None else device.index
        if index >= torch.cuda.device_count():
            raise pytest.UsageError(f"{DEVICE_VARIABLE}={name!r}: valid indices are 0..{torch.cuda.device_count() - 1}")
        device = torch.device("cuda", index)
    if device.type == "npu":
        index = npu.current_device() if device.index is None else device.index
        if index >= npu.device_count():
            raise pytest.UsageError(f"{DEVICE_VARIABLE}={name!r}: valid indices are 0..{npu.device_count() - 1}")
        device = torch.device("npu", index)
    return device


SEED_VARIABLE = "SPECSWAP_TEST_SEED"


def _session_seed() -> tuple[int, str]:
    value = os.environ.get(SEED_VARIABLE)
    if value is None:
        return int.from_bytes(os.urandom(4), "little"), "drawn for this run"
    try:
        return int(value), f"from {SEED_VARIABLE}"
    except ValueError:
        raise pytest.UsageError(f"{SEED_VARIABLE} must be an integer, got {value!r}") from None


CACHE_VARIABLE = "SPECSWAP_TEST_CACHE_DIR"


def _use_a_test_cache(config) -> None:
    """Converted weights go to ``SPECSWAP_TEST_CACHE_DIR`` (tools/test.sh: build/test-cache, kept between runs of
    one checkout) or a temporary directory removed at the end: never the user's ~/.cache/specswap. Set in the
    environment, so the servers and commands the tests start use it too."""
    given = os.environ.get(CACHE_VARIABLE, "").strip()
    if given:
        directory = Path(given).resolve()
        directory.mkdir(parents=True, exist_ok=True)
    else:
        directory = Path(tempfile.mkdtemp(prefix="specswap-test-cache-"))
        config.add_cleanup(lambda: shutil.rmtree(directory, ignore_errors=True))
    os.environ["SPECSWAP_CACHE_DIR"] = str(directory)
    config.specswap_cache = directory


@pytest.hookimpl(tryfirst=True)  # before hypothesis' own pytest_configure reads --hypothesis-seed
def pytest_configure(config):
    config.specswap_device = requested_device()
    _use_a_test_cache(config)
    given = config.getoption("hypothesis_seed", default=None)
    if given is not None:
        config._specswap_seed = (given, "from --hypothesis-seed")
        return
    seed, origin = _session_seed()
    config.option.hypothesis_seed = str(seed)
    config._specswap_seed = (seed, origin)


def _seed_line(config) -> str:
    seed, origin = config._specswap_seed
    return f"specswap test seed {seed} ({origin}; repeat with {SEED_VARIABLE}={seed})"


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    terminalreporter.write_line(_seed_line(config))


@pytest.fixture(scope="session")
def device(pytestconfig) -> torch.device:
    """Where device-parametrized tests build their models, caches and graphs."""
    return pytestconfig.specswap_device

"""One seed per test run for the property tests (hypothesis), printed so a failing run can be repeated.

Each run draws new examples: a fixed derandomized set would try the same 15-20 cases forever. The seed comes from
``SPECSWAP_TEST_SEED`` when set, else from os.urandom; ``--hypothesis-seed`` on the command line wins over both.
It is printed in the session header and again in the summary (``-q`` hides the header).
"""

from __future__ import annotations

import os

import pytest

SEED_VARIABLE = "SPECSWAP_TEST_SEED"


def _session_seed() -> tuple[int, str]:
    value = os.environ.get(SEED_VARIABLE)
    if value is None:
        return int.from_bytes(os.urandom(4), "little"), "drawn for this run"
    try:
        return int(value), f"from {SEED_VARIABLE}"
    except ValueError:
        raise pytest.UsageError(f"{SEED_VARIABLE} must be an integer, got {value!r}") from None


@pytest.hookimpl(tryfirst=True)  # before hypothesis' own pytest_configure reads --hypothesis-seed
def pytest_configure(config):
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


def pytest_report_header(config):
    return _seed_line(config)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    terminalreporter.write_line(_seed_line(config))

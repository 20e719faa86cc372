"""tests/components.py: a missing component skips its tests in a plain run and fails them under tools/test.sh
(SPECSWAP_TEST_REQUIRE_ALL=1), so a build without the native kernels cannot pass the test command. Checked by
running a native-kernel test module in a child pytest with ggml's package hidden; the install pins free of local
version labels."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parents[1]
HIDE_GGML = "import sys\nsys.modules['libggml'] = None  # find_spec('libggml') is None, import libggml fails\n"


def ggml_hidden_env(tmp_path: Path) -> dict[str, str]:
    """This process's environment, with a sitecustomize that hides ggml's package from the child."""
    (tmp_path / "sitecustomize.py").write_text(HIDE_GGML)
    env = {k: v for k, v in os.environ.items() if k != "SPECSWAP_TEST_REQUIRE_ALL"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tmp_path), env.get("PYTHONPATH")]))
    return env


def run_with_ggml_hidden(tmp_path: Path, strict: bool) -> subprocess.CompletedProcess:
    env = ggml_hidden_env(tmp_path)
    if strict:
        env["SPECSWAP_TEST_REQUIRE_ALL"] = "1"
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "tests/bench/test_bench_qlinear.py"],
                          cwd=REPOSITORY, env=env, capture_output=True, text=True, timeout=300)


def test_without_ggml_the_test_command_fails_and_a_plain_run_skips(tmp_path):
    strict = run_with_ggml_hidden(tmp_path, strict=True)
    output = strict.stdout + strict.stderr
    assert strict.returncode != 0, output
    assert "the native GGUF kernels is missing" in output and "libggml-python" in output, output
    plain = run_with_ggml_hidden(tmp_path, strict=False)
    output = plain.stdout + plain.stderr
    assert plain.returncode in (0, 5) and re.search(r"\d+ skipped", output) and "passed" not in output, output


def test_the_test_command_requires_every_component():
    script = (REPOSITORY / "tools" / "test.sh").read_text()
    exported = script.index("export SPECSWAP_TEST_REQUIRE_ALL=1")
    assert exported < script.index("-m pytest"), "the variable must be set before the suite runs"


def test_the_capability_line_says_whether_the_native_kernels_are_here(tmp_path):
    env = ggml_hidden_env(tmp_path)
    probe = ("from specswap.capability import cpu_capability, native_kernels_problem; "
             "print(cpu_capability().describe()); print(native_kernels_problem())")
    hidden = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
    assert hidden.returncode == 0, hidden.stderr
    line, problem = hidden.stdout.splitlines()
    assert "; native kernels no" in line and "pip install libggml-python" in problem


def test_weights_auto_without_native_kernels_warns_once_with_the_fix(tmp_path):
    env = ggml_hidden_env(tmp_path)
    probe = ("from specswap.loading import resolve_weights; "
             "print(resolve_weights('auto', 'gemma-3-270m', 'float32', 'cpu')); "
             "print(resolve_weights('auto', 'model.gguf', 'float32', 'cpu'))")
    run = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines() == ["('fp32', torch.float32)"] * 2
    warnings = [line for line in run.stderr.splitlines() if "loads dequantized" in line]
    assert len(warnings) == 1 and "pip install libggml-python" in warnings[0], run.stderr


def test_no_warning_where_the_native_kernels_are_or_the_model_is_dense(caplog):
    from specswap import loading
    from specswap.capability import native_kernels_available

    with caplog.at_level("WARNING"):
        loading.resolve_weights("auto", "tiny", "float32", "cpu")
        if native_kernels_available():
            assert loading.resolve_weights("auto", "gemma-3-270m", "float32", "cpu")[0] == "native"
    assert "dequantized" not in caplog.text


def test_the_pins_resolve_from_the_public_index():
    """A local version label (torch==2.13.0+cpu) resolves only where a wheel directory provides it."""
    local = [line for line in (REPOSITORY / ".ci" / "constraints.txt").read_text().splitlines()
             if re.match(r"^[A-Za-z0-9_.-]+==[^;#\s]*\+", line.strip())]
    assert not local, f"local version labels in .ci/constraints.txt: {local}"
    pyproject = (REPOSITORY / "pyproject.toml").read_text()
    assert not re.search(r'==[\w.]+\+\w', pyproject), "a local version label in pyproject.toml"


@pytest.mark.parametrize("where", ["dependencies", "build-system"])
def test_ggml_is_part_of_a_linux_x86_install(where):
    import tomllib

    project = tomllib.loads((REPOSITORY / "pyproject.toml").read_text())
    requirements = project["project"]["dependencies"] if where == "dependencies" else project["build-system"]["requires"]
    assert any(r.startswith("libggml-python==") and "platform_machine == 'x86_64'" in r for r in requirements)


def test_the_suite_keeps_converted_weights_out_of_the_user_s_cache(pytestconfig):
    from specswap.zoo.gemma import cache_root
    from specswap.zoo.eagle_training import default_work

    user_cache = Path.home() / ".cache" / "specswap"
    assert cache_root() == pytestconfig.specswap_cache and cache_root() != user_cache
    assert default_work("gemma-3-270m").parent == cache_root()
    script = (REPOSITORY / "tools" / "test.sh").read_text()
    assert "SPECSWAP_TEST_CACHE_DIR=${SPECSWAP_TEST_CACHE_DIR:-build/test-cache}" in script

"""tools/gpu_check.sh and tools/gpu_check.py off the GPU: arguments, the report, failure exit codes, and the
measurements themselves on the CPU with a small random Gemma-shaped target."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import gpu_check  # noqa: E402

SCRIPT = ROOT / "tools" / "gpu_check.sh"
# the smallest measurement that still runs every part: the tier-memory engine and one timed tier
SMALL_MEASURE = ("--shape small --dtype float32 --steps 1 --batch 1 --rounds 2 --bursts 1 --max-seq-len 64 "
                 "--memory-max-seq-len 64 --memory-batch 1 --threads 1")


def _script(*args, timeout=300):
    env = dict(os.environ)  # specswap as this test sees it: installed, or the source tree on PYTHONPATH
    env.pop("OUT", None)
    return subprocess.run(["bash", str(SCRIPT), "--python", sys.executable, *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("args, message", [
    (["--bogus"], "unknown argument '--bogus'"),
    (["--device", "tpu"], "--device 'tpu' is not checked here; valid: cuda, cuda:N, cpu"),
    (["--budget-s", "soon"], "--budget-s must be a whole number of seconds; got 'soon'"),
    (["--python", "/nonexistent/python"], "no Python interpreter '/nonexistent/python'"),
])
def test_the_script_names_a_bad_argument_and_exits_2(args, message, tmp_path):
    result = _script("--out", str(tmp_path), *args)
    assert result.returncode == 2, result
    assert message in result.stderr
    assert not (tmp_path / "gpu_check.json").exists()


def test_the_script_prints_its_usage():
    result = _script("--help")
    assert result.returncode == 0
    assert "--skip-build" in result.stdout and "gpu_check.json" in result.stdout


@pytest.mark.parametrize("argv", [
    ["run", "--device", "tpu", "--report", "r.json"],
    ["run", "--report", "r.json", "--checks", "everything"],
    ["run", "--report", "r.json", "--budget-s", "0"],
    ["measure", "--json", "m.json", "--rounds", "0"],
    ["measure", "--json", "m.json", "--shape", "gemma-3-27b"],
    ["run"],  # no report path
])
def test_the_runner_rejects_bad_arguments(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        gpu_check.main(argv)
    assert exit_info.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_the_script_measures_on_the_cpu_and_writes_one_report(tmp_path):
    result = _script("--device", "cpu", "--skip-build", "--out", str(tmp_path), "--checks", "measure",
                     "--measure-args", SMALL_MEASURE)
    assert result.returncode == 0, result.stdout + result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gpu_check.json", "gpu_check.log"]
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert report["schema"] == gpu_check.SCHEMA and report["ok"] is True and report["failed"] == []
    assert report["device"] == "cpu" and "--checks measure" in report["command"]
    assert report["commit"] and report["environment"]["torch"] and report["environment"]["cpu"]
    assert [c["name"] for c in report["checks"]] == ["measure"]  # --skip-build: no build entry
    measured = report["measurements"]
    tiers = measured["tier_memory"]["tier_bytes"]
    assert all(tiers[str(t)] > 0 for t in range(1, 8)), tiers
    (row,) = measured["decode_rounds"]["rows"]
    assert row["steps"] == 1 and row["batch"] == 1 and row["rounds"] == 2
    assert row["eager_ms_per_round"] > 0 and row["graph_ms_per_round"] > 0 and row["captures"] > 0
    assert row["captures_while_decoding"] == 0 and row["tier_bytes"] > 0
    assert "eager" in (tmp_path / "gpu_check.log").read_text()


def test_a_failing_check_fails_the_run_and_says_why(tmp_path):
    result = _script("--device", "cpu", "--skip-build", "--out", str(tmp_path), "--checks", "measure",
                     "--measure-args", "--shape gemma-3-27b")
    assert result.returncode == 1, result.stdout + result.stderr
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert report["ok"] is False and report["failed"] == ["measure"]
    (check,) = report["checks"]
    assert check["error"] == "exit status 2" and "invalid choice: 'gemma-3-27b'" in check["log_tail"]


def test_a_failed_build_fails_the_run_and_runs_no_check(tmp_path):
    log = tmp_path / "build.log"
    log.write_text("CMake Error: SPECSWAP_WITH_CUDA=ON needs a CUDA build of torch\n")
    code = gpu_check.main(["run", "--device", "cpu", "--report", str(tmp_path / "r.json"), "--checks", "measure",
                           "--build-rc", "1", "--build-seconds", "3", "--build-log", str(log)])
    assert code == 1
    report = json.loads((tmp_path / "r.json").read_text())
    build, measure = report["checks"]
    assert build["name"] == "build" and not build["ok"] and "CUDA build of torch" in build["log_tail"]
    assert measure == {"name": "measure", "ok": False, "error": "not run: the build failed"}
    assert report["failed"] == ["build", "measure"]


def test_a_spent_budget_fails_the_checks_it_leaves_out(tmp_path):
    code = gpu_check.main(["run", "--device", "cpu", "--report", str(tmp_path / "r.json"), "--checks", "graphs",
                           "measure", "--budget-s", "5"])
    assert code == 1
    report = json.loads((tmp_path / "r.json").read_text())
    assert [c["error"] for c in report["checks"]] == ["not run: the 5 s budget was spent"] * 2


@pytest.mark.parametrize("body, ok, error", [
    ("def test_passes():\n    assert True\n", True, None),
    ("import pytest\n\ndef test_skips():\n    pytest.skip('no weights')\n", False,
     "1 test(s) skipped: a check that did not run proves nothing"),
    ("def test_fails():\n    assert 1 == 2\n", False, "exit status 1"),
    ("x = 1\n", False, "exit status 5"),
])
def test_a_pytest_check_passes_only_if_every_test_ran_and_passed(tmp_path, monkeypatch, body, ok, error):
    test_file = tmp_path / "test_probe.py"
    test_file.write_text(body)
    monkeypatch.setitem(gpu_check.PYTEST_CHECKS, "graphs", ([str(test_file)], 120))
    code = gpu_check.main(["run", "--device", "cpu", "--report", str(tmp_path / "r.json"), "--checks", "graphs"])
    (check,) = json.loads((tmp_path / "r.json").read_text())["checks"]
    assert (code == 0) == ok and check["ok"] == ok
    assert check.get("error") == error
    if body.startswith("def test_fails"):
        assert check["tests"]["failures"] == 1 and check["tests"]["problems"][0]["test"].endswith("test_fails")


def test_junit_summary_counts_each_outcome(tmp_path):
    junit = tmp_path / "j.xml"
    junit.write_text(
        '<testsuites><testsuite tests="4" failures="1" errors="0" skipped="1">'
        '<testcase classname="t" name="a"/><testcase classname="t" name="b"><failure message="boom"/></testcase>'
        '<testcase classname="t" name="c"><skipped message="no gpu"/></testcase><testcase classname="t" name="d"/>'
        '</testsuite></testsuites>')
    summary = gpu_check.junit_summary(junit)
    assert {k: summary[k] for k in ("tests", "passed", "failures", "skipped")} == \
        {"tests": 4, "passed": 2, "failures": 1, "skipped": 1}
    assert summary["problems"] == [{"test": "t::b", "kind": "failure", "message": "boom"},
                                   {"test": "t::c", "kind": "skipped", "message": "no gpu"}]
    assert gpu_check.junit_summary(tmp_path / "missing.xml") == {}


@pytest.mark.parametrize("device, current, index", [("cuda:1", 0, 1), ("cuda:0", 1, 0), ("cuda", 1, 1)])
def test_the_report_names_the_gpu_it_was_given(monkeypatch, device, current, index):
    # two pretend GPUs (torch.cuda's functions answer for the current device when given no index, as torch does)
    import torch

    names = ["Pretend GPU zero", "Pretend GPU one"]
    pick = lambda i=None: current if i is None else int(i)  # noqa: E731
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: current)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=None: names[pick(i)])
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=None: (9, pick(i)))
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda i=None: type("Properties", (), {"total_memory": (pick(i) + 1) << 30})())
    env = gpu_check.environment(device)
    assert "torch_error" not in env, env
    assert env["requested_device"] == device
    assert env["gpu"] == names[index] and env["gpu_index"] == index
    assert env["gpu_capability"] == f"9.{index}" and env["gpu_memory_bytes"] == (index + 1) << 30
    assert env["gpu_count"] == 2

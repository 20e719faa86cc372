"""Benchmark hygiene: the prompts the drafters and the policy were tuned on are kept apart from the prompts whose
figures are reported, the report set is the default, and every benchmark JSON says where it came from."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from specswap.bench import provenance, workloads
from specswap.capability import cpu_capability
from specswap.cli import build_parser

REPOSITORY = Path(__file__).resolve().parents[2]


def _bench_engine():
    spec = importlib.util.spec_from_file_location("bench_engine", REPOSITORY / "bench" / "bench_engine.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _lines(prompt_sets, name):
    """Every non-blank line of every prompt of one set (stripped: indentation alone does not make a new line)."""
    return {line.strip() for prompts, _ in prompt_sets[name].values() for prompt in prompts
            for line in prompt.splitlines() if line.strip()}


def _check_apart(prompt_sets):
    assert set(prompt_sets) == {"tune", "report"}
    tune, report = prompt_sets["tune"], prompt_sets["report"]
    assert list(tune) == list(report), "both sets hold the same kinds of workload"
    for kind in tune:
        (tune_prompts, tune_temperature), (report_prompts, report_temperature) = tune[kind], report[kind]
        assert tune_temperature == report_temperature, kind
        assert len(report_prompts) == len(tune_prompts), kind
        assert len(set(report_prompts)) == len(report_prompts), f"{kind}: a report prompt is repeated"
    shared = _lines(prompt_sets, "tune") & _lines(prompt_sets, "report")
    assert not shared, f"lines in both the tune and the report set: {sorted(shared)}"


def test_phased_benchmark_sets_are_disjoint_and_report_is_the_default():
    _check_apart(workloads.PROMPT_SETS)
    assert workloads.DEFAULT_PROMPT_SET == "report"
    report_high = workloads.PROMPT_SETS["report"]["high"][0]
    assert workloads.build_workload("high", 2)[0].prompts == tuple(report_high[:2])
    assert build_parser().parse_args(["bench"]).prompt_set == "report"
    tune = workloads.build_workload("high", 2, prompt_set="tune")[0].prompts
    assert tune == tuple(workloads.PROMPT_SETS["tune"]["high"][0][:2])
    with pytest.raises(ValueError, match="unknown prompt set 'train'; valid: tune, report"):
        workloads.build_workload("high", 2, prompt_set="train")


def test_engine_benchmark_sets_are_disjoint_and_report_is_the_default():
    bench_engine = _bench_engine()
    _check_apart(bench_engine.PROMPT_SETS)
    assert list(bench_engine.PROMPT_SETS["report"]) == ["code", "repeat", "list", "prose", "resample", "template",
                                                         "multiturn"]
    assert bench_engine.build_parser().parse_args([]).workloads == ["code", "repeat", "list", "prose"]
    assert bench_engine.DEFAULT_PROMPT_SET == "report"
    args = bench_engine.build_parser().parse_args([])
    assert args.prompt_set == "report"
    assert bench_engine.build_parser().parse_args(["--prompt-set", "tune"]).prompt_set == "tune"
    with pytest.raises(SystemExit):
        bench_engine.build_parser().parse_args(["--prompt-set", "train"])


def test_the_disjointness_check_catches_a_shared_line():
    leaked = {"tune": {"code": (["def f():\n    return 1\n"], 0.0)},
              "report": {"code": (["class A:\n    return 1\n"], 0.0)}}
    with pytest.raises(AssertionError, match="return 1"):
        _check_apart(leaked)


def test_engine_benchmark_json_records_the_set_and_its_provenance(tmp_path):
    output = tmp_path / "rows.json"
    subprocess.run(
        [sys.executable, str(REPOSITORY / "bench" / "bench_engine.py"), "--model", "random",
         "--workloads", "repeat", "--batch-sizes", "1", "--static-steps", "1", "--num-prompts", "1",
         "--max-new-tokens", "4", "--repeats", "1", "--threads", "1", "--disable-graphs", "--json", str(output)],
        check=True, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(Path(provenance.__file__).parents[2])})  # the specswap under test
    result = json.loads(output.read_text())
    assert result["prompt_set"] == "report"
    assert "bench_engine.py" in result["command"] and "--json" in result["command"]
    assert result["cpu"] == provenance.cpu_line() and result["commit"] == provenance.git_commit()
    assert {row["workload"] for row in result["rows"]} == {"repeat"}


def test_provenance_names_the_command_the_cpu_and_the_commit(tmp_path):
    assert provenance.command_line(["bench.py", "--adaptive-config", '{"policy": "goodput"}']) == \
        "bench.py --adaptive-config '{\"policy\": \"goodput\"}'"
    assert provenance.cpu_line() == cpu_capability().describe()
    assert provenance.git_commit(tmp_path) == "unknown"  # not a git checkout
    commit = provenance.git_commit()  # of the checkout holding the imported package ("unknown" if none)
    package = Path(provenance.__file__).parent
    head = subprocess.run(["git", "-C", str(package), "rev-parse", "HEAD"], capture_output=True, text=True)
    assert commit.removesuffix("-dirty") == (head.stdout.strip() if head.returncode == 0 else "unknown")
    stamp = provenance.stamp(["x", "y"])
    assert stamp == {"command": "x y", "cpu": provenance.cpu_line(), "cpu_capability": cpu_capability().as_dict(),
                     "commit": commit}


def test_a_changed_benchmark_output_under_results_does_not_mark_the_commit_dirty(tmp_path):
    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "run.json").write_text("{}")
    (tmp_path / "code.py").write_text("x = 1\n")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "start")
    clean = provenance.git_commit(tmp_path)
    assert len(clean) == 40 and not clean.endswith("-dirty")
    (tmp_path / "results" / "run.json").write_text('{"rewritten": true}')
    assert provenance.git_commit(tmp_path) == clean
    (tmp_path / "code.py").write_text("x = 2\n")
    assert provenance.git_commit(tmp_path) == f"{clean}-dirty"

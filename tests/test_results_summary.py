"""results/README.md and README.md's headline table are rendered from results/*.json (tools/render_results.py),
and stay rendered: a JSON added or changed without rerunning the script fails here, naming the stale file."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPOSITORY / "tools"))
sys.path.insert(0, str(REPOSITORY / "tests"))

import render_results  # noqa: E402
from test_docs_evidence import figure_problems  # noqa: E402

PROVENANCE = {"command": "specswap bench --threads 1", "cpu": "cpu: AMD EPYC; avx2; amx no; native bf16 no; "
              "onednn bf16 no; torch kernels AVX2", "commit": "0123456789abcdef0123456789abcdef01234567-dirty"}


def test_the_committed_summaries_are_up_to_date():
    stale = render_results.stale(REPOSITORY)
    assert not stale, (f"{', '.join(str(path.relative_to(REPOSITORY)) for path in stale)} out of date: run "
                       f"python tools/render_results.py")


def main_job(adaptive_vs_baseline: float) -> dict:
    return {**PROVENANCE, "workload": "transition", "prompt_set": "report", "phases": ["low", "high"],
            "model": "gemma-3-270m", "speculative_algorithm": "NGRAM", "weights": "native",
            "modes": {"baseline": {}, "static1": {}, "adaptive": {"settings": {
                "speculative_adaptive_config": "configs/goodput.json"}}},
            "oracle": {"best_static": {"mode": "static1", "throughput_tok_s": 70.0}},
            "ratios": {"adaptive_vs_baseline": adaptive_vs_baseline, "adaptive_vs_best_static": 1.0823,
                       "adaptive_vs_oracle": 0.9865}}


def llamacpp_run() -> dict:
    rows, best = [], []
    for threads in (1, 2):
        for temperature in (0.0, 1.0):
            rows += [
                {"set": "code", "threads": threads, "temperature": temperature, "runtime": "llama.cpp",
                 "mode": "plain", "tokens_per_second": 50.0, "vs_llamacpp_plain": 1.0},
                {"set": "code", "threads": threads, "temperature": temperature, "runtime": "specswap",
                 "mode": "target-only", "tokens_per_second": 60.0 + threads + temperature,
                 "vs_llamacpp_plain": 1.2 + 0.1 * (threads - 1) + 0.01 * temperature, "vs_target_only": 1.0},
                {"set": "code", "threads": threads, "temperature": temperature, "runtime": "specswap",
                 "mode": "eagle static-2", "tokens_per_second": 80.0, "vs_target_only": 1.3 + 0.05 * threads}]
            best.append({"set": "code", "threads": threads, "temperature": temperature,
                         "specswap_over_llamacpp": 1.5 + 0.25 * threads + 0.125 * temperature})
    return {**PROVENANCE, "command": "bench/bench_llamacpp.py --threads 1 2", "model": "gemma-3-270m",
            "weights": "native", "threads": [1, 2], "sets": ["code"], "temperatures": [0.0, 1.0],
            "num_prompts": 3, "new_tokens": 64, "repeats": 1, "prompt_set": "report", "results": rows, "best": best}


def eagle_code_run() -> dict:
    """A run made for EAGLE's static tiers: greedy code only, no llama.cpp."""
    run = llamacpp_run()
    rows = [row for row in run["results"] if row["temperature"] == 0.0 and row["runtime"] == "specswap"]
    return {**run, "temperatures": [0.0], "results": rows, "best": []}


@pytest.fixture
def repository(tmp_path):
    (tmp_path / "results").mkdir()
    (tmp_path / "docs").mkdir()
    (tmp_path / "results" / "main-job.json").write_text(json.dumps(main_job(1.2594)))
    (tmp_path / "results" / "main-job-phases.json").write_text(json.dumps({**main_job(1.2), "phase_ratios": [
        {"name": "low", "mode": "static1", "adaptive_vs_oracle": 0.9716, "by_repeat": [0.958, 0.9855]},
        {"name": "high", "mode": "static3", "adaptive_vs_oracle": 0.9354, "by_repeat": [0.8833, 1.0104]}]}))
    (tmp_path / "results" / "llamacpp.json").write_text(json.dumps(llamacpp_run()))
    (tmp_path / "results" / "eagle-code.json").write_text(json.dumps(eagle_code_run()))
    (tmp_path / "results" / "other.json").write_text(json.dumps({**PROVENANCE, "speedup": 1.5, "rows": [
        {"name": "a", "x_vs_y": 0.9}, {"name": "b", "x_vs_y": 1.1}]}))
    (tmp_path / "README.md").write_text(f"# Project\n\n## Measurements\n\n{render_results.BEGIN}\n"
                                        f"{render_results.END}\n\n## After\n")
    assert render_results.main(["--root", str(tmp_path)]) == 0
    return tmp_path


def test_rendering_fills_both_files_and_check_passes(repository):
    summary = (repository / "results" / "README.md").read_text()
    readme = (repository / "README.md").read_text()
    assert "| [main-job.json](main-job.json) |" in summary and "adaptive 1.26x baseline" in summary
    assert "`0123456-dirty`" in summary and "AMD EPYC, AVX2 only" in summary
    assert "target-only 1.20-1.31x llama.cpp plain" in summary
    assert "speedup 1.50x" in summary and "rows[].x_vs_y 0.90-1.10x" in summary  # any other JSON: ratio-like keys
    assert "0.99x the oracle, per phase 0.972 / 0.935 of the oracle (repeat by repeat 0.883-1.010) |" in summary
    assert readme.startswith("# Project\n") and readme.endswith("\n\n## After\n")
    assert "1.26x / 1.08x / 0.99x ([main-job.json](results/main-job.json))" in readme
    assert "1.20-1.31x / 1.75-2.13x ([llamacpp.json](results/llamacpp.json))" in readme
    assert "1.35x (static-2, 1 thread), 1.40x (static-2, 2 threads) ([eagle-code.json](results/eagle-code.json))" \
        in readme
    assert readme.count("| EAGLE's best static tier") == 1  # llamacpp.json has sampled rows: no run for EAGLE
    assert render_results.main(["--root", str(repository), "--check"]) == 0
    assert render_results.main(["--root", str(repository)]) == 0  # idempotent: nothing to write
    assert figure_problems(repository) == []  # the headline's figures are what the cited JSONs hold


def test_check_fails_naming_the_stale_file_when_a_json_changes(repository, capsys):
    (repository / "results" / "main-job.json").write_text(json.dumps(main_job(1.31)))
    assert render_results.stale(repository) == [repository / "results" / "README.md", repository / "README.md"]
    assert render_results.main(["--root", str(repository), "--check"]) == 1
    err = capsys.readouterr().err
    assert "results/README.md is out of date" in err and "\nREADME.md is out of date" in err
    assert render_results.main(["--root", str(repository)]) == 0
    assert "1.31x / 1.08x / 0.99x" in (repository / "README.md").read_text()
    assert render_results.stale(repository) == []


def test_check_fails_when_a_json_is_added_or_the_summary_edited(repository):
    (repository / "results" / "new.json").write_text(json.dumps({**PROVENANCE, "ratio": 2.0}))
    assert render_results.stale(repository) == [repository / "results" / "README.md"]
    render_results.main(["--root", str(repository)])
    summary = repository / "results" / "README.md"
    summary.write_text(summary.read_text().replace("2.00x", "2.10x"))
    assert render_results.stale(repository) == [summary]


def test_a_readme_without_the_markers_is_an_error_naming_it(repository):
    (repository / "README.md").write_text("# Project\n")
    with pytest.raises(SystemExit, match="README.md: no <!-- results:begin -->"):
        render_results.stale(repository)


def test_the_command_line_check(repository):
    script = REPOSITORY / "tools" / "render_results.py"
    ok = subprocess.run([sys.executable, str(script), "--check", "--root", str(repository)], capture_output=True,
                        text=True)
    assert ok.returncode == 0, ok.stderr
    (repository / "results" / "main-job.json").write_text(json.dumps(main_job(1.4)))
    stale = subprocess.run([sys.executable, str(script), "--check", "--root", str(repository)], capture_output=True,
                           text=True)
    assert stale.returncode == 1 and "results/README.md is out of date" in stale.stderr


@pytest.mark.parametrize("line, short", [
    ("cpu: AMD EPYC; avx2 avx512 avx512_bf16 vnni; amx no; native bf16 yes", "AMD EPYC, AVX-512"),
    ("cpu: Intel(R) Xeon(R) Processor; avx2 avx512 avx512_bf16 vnni; amx yes; native bf16 yes",
     "Intel Xeon, AVX-512, AMX"),
    ("cpu: AMD EPYC; avx2; amx no; torch kernels AVX2; override: -avx512 (removed avx512 avx512_bf16 vnni)",
     "AMD EPYC, AVX2 only (override `-avx512`)"),
])
def test_the_cpu_is_shortened_to_model_and_vector_isa(line, short):
    assert render_results.cpu_short({"cpu": line}) == short


def test_engine_rows_at_several_temperatures_name_them_and_training_curves_are_training_records():
    rows = [{"workload": "code", "temperature": t, "batch_size": 1, "config": c, "ratio": r}
            for t in (0.0, 1.0) for c, r in (("no-spec", 1.0), ("eagle3 static-1", 0.8 + t / 10))]
    data = {**PROVENANCE, "command": "bench/bench_engine.py --model gemma-3-270m", "prompt_set": "report",
            "rows": rows}
    assert render_results.kind(data) == "engine"
    assert render_results.engine_rows(data)[1] == "eagle3 static-1: code T=0 0.80x, code T=1 0.90x (x no speculation)"
    single = {**data, "rows": [row for row in rows if row["temperature"] == 0.0]}
    assert render_results.engine_rows(single)[1] == "eagle3 static-1: code 0.80x (x no speculation)"
    curve = {**PROVENANCE, "kind": "EAGLE-3 head", "best": {"step": 20, "step1": 0.5, "step2": 0.4},
             "evals": [{"step": 20, "step1": 0.5, "step2": 0.4}]}
    assert render_results.kind(curve) == "training"
    assert render_results.training(curve)[1] == "held-out top-1 0.5 / 0.4 at draft steps 1-2 (no ratios)"

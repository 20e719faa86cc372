"""Small random models, a character tokenizer and a uvicorn server in a thread, for the server and bench tests."""

from __future__ import annotations

import contextlib
import socket
import threading
import time

import torch

from specswap.models import EagleConfig, EagleHead, LlamaConfig, LlamaForCausalLM

FORCED_SWITCHING = {"ema_alpha": 1.0, "warmup_batches": 0, "update_interval": 1}


class CharTokenizer:
    """Printable ASCII as tokens (id = code - 30, ids 2..96); 0 = BOS. No EOS, so lengths are predictable.
    Its chat template writes turns as "role: content" lines and ends with "assistant:"."""

    bos_token_id = 0
    eos_token_ids: set[int] = set()
    vocab_size = 100
    special_tokens = {"bos_token": "^"}
    chat_template = ("{{ bos_token }}{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                     "{% if add_generation_prompt %}assistant:{% endif %}")

    def encode(self, text, add_bos=False):
        ids = [min(max(ord(c) - 30, 2), 96) for c in text]
        return [0, *ids] if add_bos else ids

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(i + 30) for i in ids if 2 <= i <= 96)

    def token_to_id(self, token):
        return None


def random_models(hidden_size=32, seed=0):
    """A 2-layer random Llama over the character vocabulary and a random EAGLE head for it."""
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=CharTokenizer.vocab_size, hidden_size=hidden_size,
                         intermediate_size=2 * hidden_size, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=hidden_size // 4, max_position_embeddings=1024)
    target = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        target.model.embed_tokens.weight.normal_(0, 1.0)
        target.lm_head.weight.mul_(3.0)  # peaked laws: greedy output settles into loops that prompt lookup finds
    head = EagleHead(EagleConfig.for_target(config), target.embed_tokens, target.lm_head).eval()
    return target, head


def loaded_models(algorithm="NGRAM"):
    """The bench's LoadedModels over the random pair."""
    from specswap.loading import LoadedModels
    target, head = random_models()
    return LoadedModels("random", target, head if algorithm == "EAGLE" else None, CharTokenizer(), algorithm,
                        torch.float32, "cpu")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def free_port_block(count: int, avoid: tuple[int, ...] = ()) -> int:
    """A port p with p .. p + count - 1 all free now and none in ``avoid`` (a server that takes the ports after its
    own, as ``--dp-size`` does for its groups and the router's metrics)."""
    for _ in range(100):
        base = free_port()
        if any(base + i in avoid for i in range(count)):
            continue
        with contextlib.ExitStack() as stack:
            try:
                for offset in range(count):
                    stack.enter_context(socket.socket()).bind(("127.0.0.1", base + offset))
            except OSError:
                continue
        return base
    raise RuntimeError(f"no {count} consecutive free ports in 100 tries")


@contextlib.contextmanager
def running_server(app, startup_timeout=30.0):
    """Serve ``app`` on 127.0.0.1:<free port> in a thread; yields the base URL; stops the server on exit."""
    import uvicorn
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error", lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + startup_timeout
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the test server did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(15)


def wait_until_healthy(process, url: str, seconds: float, headers: dict | None = None) -> None:
    """Poll ``url``/health until a subprocess server answers 200; fail with its output if it exits first."""
    import httpx  # noqa: PLC0415

    deadline = time.monotonic() + seconds
    while True:
        assert process.poll() is None, process.stdout.read()
        try:
            if httpx.get(f"{url}/health", headers=headers, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, "server did not come up"
        time.sleep(0.2)


@contextlib.contextmanager
def serve_subprocess(arguments: list[str], startup_seconds: float = 120.0, headers: dict | None = None):
    """``python -m specswap.cli serve <arguments> --port <free port>`` in a subprocess, importing the same specswap
    as the test; yields (process, base URL) once /health answers 200. Killed on exit if it is still running."""
    import os  # noqa: PLC0415
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415
    from pathlib import Path  # noqa: PLC0415

    import specswap  # noqa: PLC0415

    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(Path(specswap.__file__).resolve().parents[1])}
    command = [sys.executable, "-m", "specswap.cli", "serve", *arguments, "--port", str(port)]
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(process, url, startup_seconds, headers)
        yield process, url
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(30)

"""`specswap serve` starts as operators expect (flags checked before the model loads, exit status 2, the port bound
first, one ready line, --help with every default, --version) and exits non-zero when its engine fails."""

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

import specswap
from server_helpers import free_port, wait_until_healthy
from specswap.cli import build_parser

ENV = {**os.environ, "PYTHONPATH": str(Path(specswap.__file__).resolve().parents[1])}


def _serve(*flags, timeout=60):
    began = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "specswap.cli", "serve", "--model", "tiny", *flags], env=ENV,
                          capture_output=True, text=True, timeout=timeout)
    return done, time.monotonic() - began


@pytest.mark.parametrize("flags, message", [
    (["--port", "99999"], "--port must be in 1..65535"),
    (["--log-level", "nonsense"], "argument --log-level: invalid choice"),
    (["--threads", "0"], "--threads must be an integer >= 1"),
    (["--max-batch-size", "0"], "--max-batch-size must be"),
    (["--dist-timeout", "-1"], "--dist-timeout must be"),
    (["--header-timeout", "0"], "--header-timeout must be"),
    (["--api-key-probes"], "give --api-key too"),
])
def test_bad_flags_exit_2_before_the_model_loads(flags, message):
    done, seconds = _serve(*flags)
    assert done.returncode == 2, done
    assert message in done.stderr and "Traceback" not in done.stderr
    assert "specswap serve: tiny" not in done.stdout  # nothing loaded


def test_a_taken_port_is_an_error_before_the_model_loads():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        done, _ = _serve("--port", str(taken.getsockname()[1]))
    assert done.returncode == 2 and "cannot be bound" in done.stderr, done
    assert "specswap serve: tiny" not in done.stdout


def test_help_has_a_line_and_a_default_for_every_flag_and_version_is_there(capsys):
    parser = build_parser()
    serve = next(action for action in parser._subparsers._group_actions[0].choices.values()
                 if action.prog.endswith("serve"))
    for action in serve._actions:
        if not action.option_strings or action.dest == "help":
            continue
        assert action.help, action.option_strings
        if action.default not in (None, False):
            assert "default" in serve.formatter_class("x")._get_help_string(action), action.option_strings
    text = serve.format_help()
    text = text[text.index("options:"):]
    for flag, default in (("--port", "30000"), ("--host", "127.0.0.1"), ("--speculative-algorithm", "NONE"),
                          ("--speculative-num-steps", "3"), ("--max-batch-size", "8"), ("--log-level", "warning"),
                          ("--max-body-bytes", "1048576")):
        section = text[text.index("\n  " + flag + " "):]
        section = section[:section.index("\n  -", 3) if "\n  -" in section[3:] else None]
        assert f"default: {default}" in " ".join(section.split()), flag
    with pytest.raises(SystemExit):
        parser.parse_args(["--version"])
    assert f"specswap {specswap.__version__}" in capsys.readouterr().out


SHARED_FAULT = """
import gc
import sys
from specswap.worker.worker import SpeculativeWorker

def broken(self, slots):
    print("frozen objects at the first round:", gc.get_freeze_count(), flush=True)
    raise RuntimeError("injected fault in the shared forward")

SpeculativeWorker.decode_round = broken
from specswap.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_the_ready_line_and_a_fault_in_shared_state_exits_non_zero():
    """One line says the server is ready and what it runs; a fault in shared state answers the client's JSON 500
    and ends the process with status 1 within seconds, so a supervisor restarts it."""
    port = free_port()
    command = [sys.executable, "-c", SHARED_FAULT, "serve", "--model", "tiny", "--speculative-algorithm", "NGRAM",
               "--port", str(port), "--threads", "1", "--disable-cuda-graph"]
    process = subprocess.Popen(command, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(process, url, 180)
        response = httpx.post(f"{url}/v1/completions", json={"prompt": "def f", "max_tokens": 4}, timeout=60)
        assert response.status_code == 500 and response.json()["error"]["code"] == "engine_error"
        began = time.monotonic()
        assert process.wait(15) == 1
        assert time.monotonic() - began < 10
        output = process.stdout.read()
        ready = [line for line in output.splitlines() if "ready on" in line]
        assert len(ready) == 1 and f"http://127.0.0.1:{port}" in ready[0]
        for words in ("model tiny", "algorithm NGRAM", "policy static", "tier a chain of 3 draft tokens"):
            assert words in ready[0], ready[0]
        assert "exiting with status 1" in output
        # serve froze the start-up's objects before it served (freeze_startup_objects)
        [frozen] = [line for line in output.splitlines() if line.startswith("frozen objects at the first round:")]
        assert int(frozen.rsplit(" ", 1)[1]) > 1000, frozen
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(30)


def test_the_start_ups_garbage_is_collected_and_the_rest_frozen():
    """``serve`` freezes what start-up left alive (no generation-2 collection rescans it mid-round), after
    collecting start-up's garbage: a cycle dropped before the freeze is freed, not kept forever."""
    import gc
    import weakref

    from specswap.server.startup import freeze_startup_objects

    class Node:
        pass

    garbage = Node()
    garbage.self = garbage  # a cycle: only the collector frees it
    freed = weakref.ref(garbage)
    del garbage
    try:
        frozen = freeze_startup_objects()
        assert freed() is None
        assert frozen == gc.get_freeze_count() > 1000
    finally:
        gc.unfreeze()

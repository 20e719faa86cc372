"""Load and faults against the real ``specswap serve`` in a subprocess (the tiny EAGLE pair, adaptive), bounded and on
127.0.0.1 only, then a SIGTERM in the middle of traffic.

Phase 1, all at once: more clients than --max-running-requests + --max-queued-requests, streaming and not over
both APIs, some dropped mid-stream, some past their deadline, some malformed. Then requests dropped while they
wait in the queue behind a full batch. Every request gets a 200, a 4xx or a 503 (with Retry-After), or is counted
as dropped by its client; nothing is a 5xx; the server's finish counts match what the clients saw, request for
request; every slot is free at the end.

Phase 2: long and short requests in flight, then SIGTERM: /health and new requests get 503 at once, requests
finish within --drain-timeout or end with finish reason "shutdown" (streams still end with [DONE]), and the
process exits 0. Every request has a client timeout, every thread a join timeout; about 25 s on two cores.
"""

import json
import signal
import threading
import time

import httpx
import pytest

from server_helpers import FORCED_SWITCHING, serve_subprocess
from specswap import zoo

pytestmark = pytest.mark.skipif(
    not all((zoo.path(name) / "model.safetensors").is_file() for name in ("tiny", "tiny-eagle")),
    reason="tiny zoo weights are not built (python -m specswap.zoo train tiny)")

RUNNING, QUEUED, DRAIN = 3, 3, 1.0
SERVE = ["--model", "tiny", "--speculative-algorithm", "EAGLE", "--speculative-adaptive", "--threads", "1",
         "--disable-cuda-graph", "--max-running-requests", str(RUNNING), "--max-queued-requests", str(QUEUED),
         "--request-timeout", "60", "--drain-timeout", str(DRAIN), "--max-prompts-per-request", "4"]
SHORT, LONG = 16, 480           # tokens; the tiny model's max_seq_len is 512 (about 150 tokens/s a request here)
TIMEOUT = 60                    # every client request's timeout (s)
PROMPTS = ["def fibonacci(n):\n    ", "import os\n\n\ndef main():\n    ", "The purpose of this module is",
           "for i in range(10):\n    print("]
MALFORMED = [("/v1/completions", b"{not json"), ("/generate", b"[1, 2]"), ("/v1/completions", {"prompt": 42}),
             ("/generate", {"text": "a", "sampling_param": {}}),                     # an unknown key
             ("/generate", {"text": ["a"] * 5}),                                      # over --max-prompts-per-request
             ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})]  # tiny has no template


def body(api, prompt, tokens, stream=False, **extra):
    if api == "openai":
        return "/v1/completions", {"prompt": prompt, "max_tokens": tokens, "temperature": 0, "ignore_eos": True,
                                   "stream": stream, **extra}
    return "/generate", {"text": prompt, "stream": stream, **extra,
                         "sampling_params": {"max_new_tokens": tokens, "temperature": 0, "ignore_eos": True}}


def reason_of(path, final):
    """The finish reason of a final answer or chunk: OpenAI's string, or SGLang's object's type / message."""
    if path == "/v1/completions":
        return final["choices"][0]["finish_reason"]
    reason = final["meta_info"]["finish_reason"]
    if reason["type"] != "abort":
        return reason["type"]
    message = reason["message"]
    return "timeout" if "deadline" in message else "shutdown" if "--drain-timeout" in message else "abort"


def call(url, path, payload, drop_after_first=False, read_timeout=None, delay=0.0):
    """One request: ("ok", status, headers, final answer, last chunk or error body), or ("dropped", status, headers,
    None) when the client left (after the first chunk, or at its read timeout)."""
    time.sleep(delay)
    timeout = httpx.Timeout(TIMEOUT, read=read_timeout) if read_timeout else TIMEOUT
    kwargs = {"content": payload} if isinstance(payload, bytes) else {"json": payload}
    stream = isinstance(payload, dict) and payload.get("stream")
    try:
        with httpx.Client(timeout=timeout) as client:
            if not stream:
                r = client.post(url + path, **kwargs)
                return "ok", r.status_code, r.headers, (r.json() if r.status_code == 200 else r.json())
            with client.stream("POST", url + path, **kwargs) as r:
                if r.status_code != 200:
                    r.read()
                    return "ok", r.status_code, r.headers, r.json()
                lines = []
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        lines.append(line[len("data: "):])
                        if drop_after_first:
                            time.sleep(0.5)  # hold the slot a while, then hang up mid-stream
                            return "dropped", 200, r.headers, None
            assert lines[-1] == "[DONE]", lines[-3:]   # a complete stream, never cut short
            chunks = [json.loads(line) for line in lines[:-1]]
            return "ok", 200, r.headers, chunks[-1]
    except httpx.ReadTimeout:
        return "dropped", None, None, None


def run_all(jobs):
    """Run ``(name, fn, args)`` jobs at once from a barrier; returns {name: result}; any exception fails."""
    results, errors = {}, []
    barrier = threading.Barrier(len(jobs))

    def runner(name, fn, args):
        try:
            barrier.wait(30)
            results[name] = fn(*args)
        except Exception as error:  # noqa: BLE001 - reported below
            errors.append((name, repr(error)))

    threads = [threading.Thread(target=runner, args=job) for job in jobs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(2 * TIMEOUT)
    assert not any(thread.is_alive() for thread in threads), "a client did not finish in time"
    assert errors == []
    return results


def server_info(url):
    return httpx.get(url + "/server_info", timeout=10).json()


def wait_for(url, condition, seconds=20.0):
    deadline = time.monotonic() + seconds
    while True:
        info = server_info(url)
        if condition(info):
            return info
        assert time.monotonic() < deadline, info
        time.sleep(0.02)


def test_load_faults_then_sigterm_drain(tmp_path):
    config = tmp_path / "adaptive.json"  # a tier decision every batch: switching goes on under the load
    config.write_text(json.dumps({"candidate_steps": [1, 3, 7], **FORCED_SWITCHING}))
    with serve_subprocess([*SERVE, "--speculative-adaptive-config", str(config)]) as (process, url):
        # ---- phase 1: a burst past capacity, with faults --------------------------------------------------
        # requests past their deadline and streams their clients leave fill the server first; short well-formed
        # ones (arriving from 0.3 s to 1.35 s) and malformed ones pile in while they run
        jobs = []
        for i in range(3):  # past their deadline
            api, stream = ("openai", "native")[i % 2], i == 2
            jobs.append((f"deadline{i}", call, (url, *body(api, PROMPTS[i], LONG, stream, request_timeout=0.5))))
        for i in range(3):  # the client leaves 0.5 s after the first chunk
            jobs.append((f"dropstream{i}", call, (url, *body(("openai", "native")[i % 2], PROMPTS[i], LONG, True),
                                                  True)))
        for i in range(8):  # well-formed short requests, both APIs, streaming and not
            api, stream = ("openai", "native")[i % 2], i % 4 >= 2
            jobs.append((f"normal{i}", call, (url, *body(api, PROMPTS[i % 4], SHORT, stream), False, None,
                                              0.3 + 0.15 * i)))
        for i, (path, payload) in enumerate(MALFORMED):
            jobs.append((f"malformed{i}", call, (url, path, payload, False, None, 0.3)))
        assert sum(not name.startswith("malformed") for name, _, _ in jobs) > RUNNING + QUEUED
        results = run_all(jobs)

        statuses = [status for _, status, _, _ in results.values()]
        assert all(status == 200 or 400 <= status < 500 or status == 503 for status in statuses), statuses
        rejected = [name for name, (_, status, _, _) in results.items() if status == 503]
        assert rejected, "the burst never filled the queue"
        for name in rejected:
            _, _, headers, error = results[name]
            assert headers["retry-after"] == "1" and error["error"]["code"] == "server_overloaded", error
        for i in range(len(MALFORMED)):
            assert 400 <= results[f"malformed{i}"][1] < 500, results[f"malformed{i}"]
        expected = {"length": 0, "timeout": 0, "abort": 0}
        for name, (outcome, status, _, final) in results.items():
            if status != 200 or name.startswith("malformed"):
                continue
            job = next(job for job in jobs if job[0] == name)
            if name.startswith("dropstream"):
                assert outcome == "dropped"
                expected["abort"] += 1
            elif name.startswith("deadline"):
                assert reason_of(job[2][1], final) == "timeout", final
                expected["timeout"] += 1
            else:  # answered in full
                assert reason_of(job[2][1], final) in ("length", "stop"), final
                expected["length"] += 1

        for kind in ("deadline", "dropstream", "normal"):  # each kind was admitted at least once
            assert any(status == 200 for name, (_, status, _, _) in results.items() if name.startswith(kind)), kind

        # ---- dropped while queued: a full batch of long requests, then two that wait behind it ------------------
        fill = [threading.Thread(target=call, args=(url, *body("native", PROMPTS[i], LONG, rid=f"fill-{i}")))
                for i in range(RUNNING)]
        for thread in fill:
            thread.start()
        wait_for(url, lambda info: info["num_requests_running"] == RUNNING)
        queued = run_all([(f"queued{i}", call, (url, *body("openai", PROMPTS[i], SHORT), False, 0.5))
                          for i in range(2)])
        assert [outcome for outcome, *_ in queued.values()] == ["dropped", "dropped"]
        # both were aborted from the queue while the batch still ran
        info = wait_for(url, lambda info: info["requests_finished"].get("abort", 0) == expected["abort"] + 2)
        assert info["num_requests_running"] == RUNNING
        for i in range(RUNNING):  # then the batch is ended by rid
            assert httpx.post(url + "/abort_request", json={"rid": f"fill-{i}"}, timeout=10).json()["aborted"] == 1
        for thread in fill:
            thread.join(TIMEOUT)
        expected["abort"] += 2 + RUNNING

        # every slot free again; the server's counts match the clients', request for request
        info = wait_for(url, lambda info: info["num_requests_admitted"] == 0 and info["num_requests_running"] == 0
                        and info["num_requests_waiting"] == 0)
        finished = info["requests_finished"]
        assert finished.get("length", 0) + finished.get("stop", 0) == expected["length"], (finished, expected)
        assert finished.get("timeout", 0) == expected["timeout"], (finished, expected)
        assert finished.get("abort", 0) == expected["abort"], (finished, expected)
        assert info["requests_rejected"] == {"queue_full": len(rejected)}
        assert info["num_switches"] > 0  # the adaptive controller kept working under the load

        # ---- phase 2: SIGTERM with requests in flight ----------------------------------------------------------
        flight = [("long-stream", body("openai", PROMPTS[0], LONG, True)),
                  ("long-whole", body("native", PROMPTS[1], LONG)),
                  ("short-whole", body("openai", PROMPTS[2], 80)),
                  ("short-stream", body("native", PROMPTS[3], 80, True))]
        answers = {}

        def send(name, path, payload):
            answers[name] = call(url, path, payload)
        threads = [threading.Thread(target=send, args=(name, *request)) for name, request in flight]
        for thread in threads:
            thread.start()
        wait_for(url, lambda info: info["num_requests_admitted"] == len(flight))
        process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 5
        while (health := httpx.get(url + "/health", timeout=5)).status_code != 503:
            assert time.monotonic() < deadline, "/health never turned 503"
            time.sleep(0.02)
        assert health.json() == {"status": "draining"}
        refused = httpx.post(url + "/v1/completions", json={"prompt": "x", "max_tokens": 2}, timeout=5)
        assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
        assert refused.json()["error"]["code"] == "server_draining"
        assert httpx.get(url + "/health_generate", timeout=5).status_code == 503
        for thread in threads:
            thread.join(TIMEOUT)
        assert process.wait(DRAIN + 30) == 0
        output = process.stdout.read()

    for name, (path, _) in flight:
        outcome, status, _, final = answers[name]
        assert (outcome, status) == ("ok", 200), (name, answers[name])
        reason = reason_of(path, final)
        if name.startswith("long"):   # 480 tokens cannot finish in the 1 s drain
            assert reason == "shutdown", (name, final)
        else:
            assert reason in ("length", "shutdown"), (name, final)
    assert "draining: 4 request(s) admitted" in output and "drained in" in output, output

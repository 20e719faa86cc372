"""A bounded load test on loopback over the shipped tiny EAGLE pair (adaptive, switching every round): clients
of both APIs, malformed bodies, dropped streams and dropped whole-answer requests, all at once.

Nothing is lost (every request that was not dropped is answered in full, greedy text as target-only decoding
gives it), nothing is a 5xx, each dropped request is aborted, and every slot is free at the end. Bounded: a
fixed set of requests on 127.0.0.1, every client and join with a timeout; it runs in about 20 s.
"""

import json
import threading
import time

import httpx
import pytest

from server_helpers import FORCED_SWITCHING, running_server
from specswap import zoo
from specswap.server.app import create_app
from specswap.cli_flags import build_engine
from specswap.loading import load_models

pytestmark = pytest.mark.skipif(
    not all((zoo.path(name) / "model.safetensors").is_file() for name in ("tiny", "tiny-eagle")),
    reason="tiny zoo weights are not built (python -m specswap.zoo train tiny)")

MAX_SEQ_LEN = 512
MAX_BATCH = 4
MAX_BODY_BYTES = 1 << 16
CLIENTS, REQUESTS_PER_CLIENT, MAX_TOKENS = 6, 4, 24
LONG = 400            # tokens a dropped request asks for: seconds of decoding, far past when its client leaves
CLIENT_TIMEOUT = 120  # seconds: bounds every request, so the test stops by itself
PROMPTS = ["def fibonacci(n):\n    ", "import os\n\n\ndef main():\n    ", "The purpose of this module is",
           "for i in range(10):\n    print(", "class Stack:\n    def push(self, item):\n        ", "x"]
GREEDY = {"temperature": 0}

MALFORMED = [  # (path, body: raw bytes or JSON) -> must be a 4xx, never a 5xx
    ("/v1/completions", b"{not json"),
    ("/generate", b"[1, 2]"),
    ("/v1/completions", {"prompt": 42}),
    ("/v1/completions", {"prompt": "a", "max_tokens": 10**6}),
    ("/v1/completions", {"prompt": "a", "temperature": "hot"}),
    ("/v1/completions", {"prompt": "a", "stream": "yes"}),
    ("/v1/chat/completions", {"messages": []}),
    ("/generate", {"text": "a", "input_ids": [1, 2]}),
    ("/generate", {"text": "a", "sampling_params": {"temperature": -1}}),
    ("/generate", {"text": "a", "sampling_params": {"max_new_tokens": MAX_SEQ_LEN}}),
    ("/generate", {"input_ids": [1, 10**6]}),
    ("/generate", {"text": "a" * MAX_BODY_BYTES}),  # over the body limit: 413
]


# the tiny zoo model is a base model with no chat template; chat requests need one (else they are 400s)
TINY_CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"


@pytest.fixture(scope="module")
def tiny():
    models = load_models("tiny", speculative_algorithm="EAGLE", dtype="float32")
    models.tokenizer.chat_template = TINY_CHAT_TEMPLATE
    return models


@pytest.fixture(scope="module")
def reference(tiny):
    """Greedy target-only texts, computed before the server owns its engine (the weights are shared)."""
    engine = build_engine(tiny, None, max_seq_len=MAX_SEQ_LEN, max_batch_size=len(PROMPTS))
    return {p: r.text for p, r in zip(PROMPTS, engine.generate(PROMPTS, MAX_TOKENS))}


def one_request(client, kind, prompt):
    """One well-formed request of the given kind; returns (status, text or None)."""
    if kind == "completion":
        r = client.post("/v1/completions", json={"prompt": prompt, "max_tokens": MAX_TOKENS, **GREEDY})
        return r.status_code, r.json()["choices"][0]["text"] if r.status_code == 200 else None
    if kind == "generate":
        r = client.post("/generate", json={"text": prompt, "sampling_params": {"max_new_tokens": MAX_TOKENS, **GREEDY}})
        return r.status_code, r.json()["text"] if r.status_code == 200 else None
    if kind == "chat":
        r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": prompt}],
                                                      "max_tokens": MAX_TOKENS, **GREEDY})
        ok = r.status_code == 200 and r.json()["choices"][0]["finish_reason"] in ("stop", "length")
        return r.status_code, None if not ok else "chat"
    path, body = (("/v1/completions", {"prompt": prompt, "max_tokens": MAX_TOKENS, "stream": True, **GREEDY})
                  if kind == "completion-stream" else
                  ("/generate", {"text": prompt, "sampling_params": {"max_new_tokens": MAX_TOKENS, **GREEDY},
                                 "stream": True}))
    with client.stream("POST", path, json=body) as r:
        if r.status_code != 200:
            return r.status_code, None
        lines = [line for line in r.iter_lines() if line.startswith("data: ")]
    if lines[-1] != "data: [DONE]":
        return r.status_code, None  # cut short: lost
    chunks = [json.loads(line[6:]) for line in lines[:-1]]
    if kind == "completion-stream":
        return r.status_code, "".join(c["choices"][0]["text"] for c in chunks)
    return r.status_code, chunks[-1]["text"]


KINDS = ["completion", "generate", "chat", "completion-stream", "generate-stream"]


def test_load_with_faults_loses_nothing_and_frees_every_slot(tiny, reference):
    engine = build_engine(tiny, "EAGLE", speculative_num_steps=3, speculative_adaptive=True,
                          speculative_adaptive_config={"candidate_steps": [1, 3, 7], **FORCED_SWITCHING},
                          max_batch_size=MAX_BATCH, max_seq_len=MAX_SEQ_LEN)
    app = create_app(engine, "tiny", max_body_bytes=MAX_BODY_BYTES)
    results, statuses, drops, errors = [], [], [], []
    lock = threading.Lock()
    start = threading.Barrier(CLIENTS + len(MALFORMED) + 6)

    def guarded(work):
        def run(*args):
            try:
                start.wait(30)
                work(*args)
            except Exception as error:  # noqa: BLE001 - reported by the assertions below
                with lock:
                    errors.append(repr(error))
        return run

    with running_server(app) as url:
        @guarded
        def client(index):
            with httpx.Client(base_url=url, timeout=CLIENT_TIMEOUT) as session:
                for j in range(REQUESTS_PER_CLIENT):
                    kind, prompt = KINDS[(index + j) % len(KINDS)], PROMPTS[(index * 3 + j) % len(PROMPTS)]
                    status, text = one_request(session, kind, prompt)
                    with lock:
                        statuses.append(status)
                        results.append((kind, prompt, text))

        @guarded
        def malformed(path, body):
            kwargs = {"content": body} if isinstance(body, bytes) else {"json": body}
            status = httpx.post(url + path, timeout=CLIENT_TIMEOUT, **kwargs).status_code
            with lock:
                statuses.append(status)
                results.append(("malformed", path, status))

        @guarded
        def drop_stream(path, body):
            with httpx.Client(base_url=url, timeout=CLIENT_TIMEOUT) as session:
                with session.stream("POST", path, json={**body, "stream": True}) as r:
                    first = next(line for line in r.iter_lines() if line.startswith("data: "))
            with lock:
                statuses.append(r.status_code)
                drops.append(("stream", path, r.status_code == 200 and bool(first)))

        @guarded
        def drop_whole(path, body):
            # the client gives up half a second in, while its request is still decoding (or queued)
            try:
                r = httpx.post(url + path, json=body, timeout=httpx.Timeout(CLIENT_TIMEOUT, read=0.5))
                outcome = r.status_code  # answered in full before the drop: the test cannot show an abort
            except httpx.ReadTimeout:
                outcome = "dropped"
            with lock:
                drops.append(("whole", path, outcome == "dropped"))

        long_bodies = [("/v1/completions", {"prompt": PROMPTS[0], "max_tokens": LONG, "ignore_eos": True}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                                 "max_tokens": LONG, "ignore_eos": True}),
                       ("/generate", {"text": PROMPTS[1], "sampling_params": {"max_new_tokens": LONG,
                                                                              "ignore_eos": True}})]
        threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
        threads += [threading.Thread(target=malformed, args=case) for case in MALFORMED]
        threads += [threading.Thread(target=drop_stream, args=case) for case in long_bodies]
        threads += [threading.Thread(target=drop_whole, args=case) for case in long_bodies]
        began = time.monotonic()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(max(1.0, 2 * CLIENT_TIMEOUT - (time.monotonic() - began)))
        assert not any(thread.is_alive() for thread in threads), "a client did not finish in time"
        assert errors == []

        # every slot is free once the dropped requests are aborted (bounded wait)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            info = httpx.get(url + "/server_info").json()
            if info["num_requests_running"] == 0 and info["num_requests_waiting"] == 0:
                break
            time.sleep(0.05)
        assert info["num_requests_running"] == 0 and info["num_requests_waiting"] == 0, info
        finished = info["requests_finished"]
        after = httpx.post(url + "/generate", json={"text": PROMPTS[:MAX_BATCH], "sampling_params": {
            "max_new_tokens": 4, "ignore_eos": True}})  # a full batch fits again
        assert after.status_code == 200 and [o["meta_info"]["completion_tokens"] for o in after.json()] == [4] * 4
        assert info["num_switches"] > 0  # the adaptive controller switched tiers under the load

    assert all(status < 500 for status in statuses), sorted(statuses)
    answered = [(kind, prompt, text) for kind, prompt, text in results if kind != "malformed"]
    assert len(answered) == CLIENTS * REQUESTS_PER_CLIENT
    for kind, prompt, text in answered:  # nothing lost or mixed up between concurrent requests
        assert text == ("chat" if kind == "chat" else reference[prompt]), (kind, prompt, text)
    bad = [status for kind, _, status in results if kind == "malformed"]
    assert len(bad) == len(MALFORMED) and all(400 <= status < 500 for status in bad), bad
    assert len(drops) == 6 and all(ok for _, _, ok in drops), drops
    # each admitted request finished exactly once: the answered ones ran out, the dropped ones were aborted
    assert finished.get("abort", 0) == 6, finished
    assert sum(finished.values()) == CLIENTS * REQUESTS_PER_CLIENT + 6, finished

"""Admission control and SGLang's request-control routes, in process over a small random model whose engine takes
20 ms a step (so a long request is still running when the test looks): the queue limit (503 + Retry-After),
deadlines, the prompt caps, rid, /abort_request, /flush_cache, /get_model_info, /health_generate, unknown keys,
disable_speculative_decoding's accounting, and SGLang's spec_* fields."""

import json
import threading
import time

import httpx
import pytest

from server_helpers import CharTokenizer, random_models, running_server
from specswap.engine import Engine
from specswap.server.app import create_app
from specswap.server.limits import ServerLimits

MODEL = "random-char"
MAX_SEQ_LEN = 1024
RUNNING, QUEUED = 2, 1
LONG = {"max_new_tokens": 900, "ignore_eos": True, "temperature": 0}   # 900 steps x 20 ms: far past any wait here


class SlowEngine(Engine):
    """20 ms a step: requests live long enough to fill the queue, be aborted or pass their deadline."""

    def step(self):
        time.sleep(0.02)
        return super().step()


@pytest.fixture(scope="module")
def models():
    return random_models()


def make_engine(models, steps=3):
    return SlowEngine(models[0], None, "NGRAM", speculative_num_steps=steps, max_batch_size=RUNNING,
                      max_seq_len=MAX_SEQ_LEN, tokenizer=CharTokenizer())


@pytest.fixture(scope="module")
def http(models):
    limits = ServerLimits(max_queued_requests=QUEUED, max_prompts_per_request=4, max_prompt_chars=300)
    with running_server(create_app(make_engine(models), MODEL, limits=limits)) as url, \
            httpx.Client(base_url=url, timeout=60) as session:
        yield session


def wait_until(http, condition, seconds=15.0):
    deadline = time.monotonic() + seconds
    while True:
        info = http.get("/server_info").json()
        if condition(info):
            return info
        assert time.monotonic() < deadline, info
        time.sleep(0.02)


def idle(info):
    return info["num_requests_admitted"] == 0 and info["num_requests_running"] == 0


class Background:
    """Requests sent from threads; ``results`` holds (name, status, json body)."""

    def __init__(self, url):
        self.url, self.results, self.threads = url, [], []

    def post(self, name, path, body, timeout=60):
        def run():
            try:
                r = httpx.post(self.url + path, json=body, timeout=timeout)
                self.results.append((name, r.status_code, r.json()))
            except httpx.HTTPError as error:
                self.results.append((name, None, repr(error)))
        thread = threading.Thread(target=run)
        thread.start()
        self.threads.append(thread)

    def join(self):
        for thread in self.threads:
            thread.join(60)
        assert not any(thread.is_alive() for thread in self.threads)
        return {name: (status, body) for name, status, body in self.results}


def test_past_the_queue_limit_a_request_gets_503_with_retry_after(http):
    url = str(http.base_url).rstrip("/")
    background = Background(url)
    for i in range(RUNNING + QUEUED):
        background.post(f"long{i}", "/generate", {"text": "ab", "rid": f"fill-{i}", "sampling_params": LONG})
    wait_until(http, lambda info: info["num_requests_admitted"] == RUNNING + QUEUED)
    for path, body in [("/generate", {"text": "x"}), ("/v1/completions", {"prompt": "x"}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]}),
                       ("/v1/completions", {"prompt": "x", "stream": True})]:
        response = http.post(path, json=body)
        assert response.status_code == 503, response.text
        assert response.headers["retry-after"] == "1"
        error = response.json()["error"]
        assert error["code"] == "server_overloaded" and error["type"] == "server_error"
        assert "--max-running-requests 2 + --max-queued-requests 1" in error["message"]
    metrics = http.get("/metrics").text
    assert 'spec_requests_rejected_total{reason="queue_full"} 4.0' in metrics
    info = http.get("/server_info").json()
    assert info["requests_rejected"] == {"queue_full": 4}
    assert (info["max_running_requests"], info["max_queued_requests"]) == (RUNNING, QUEUED)
    assert http.get("/flush_cache").status_code == 400  # busy: SGLang refuses to flush too
    assert http.get("/health").status_code == 200 and http.get("/health_generate").status_code == 200
    assert http.post("/abort_request", json={"abort_all": True}).json() == {"success": True, "aborted": 3}
    answers = background.join()
    for i in range(RUNNING + QUEUED):
        status, body = answers[f"long{i}"]
        assert status == 200 and body["meta_info"]["id"] == f"fill-{i}"
        assert body["meta_info"]["finish_reason"] == {"type": "abort", "message": "aborted by /abort_request"}
    wait_until(http, idle)
    assert http.post("/generate", json={"text": "x", "sampling_params": {"max_new_tokens": 2}}).status_code == 200
    flushed = http.post("/flush_cache")
    assert flushed.status_code == 200 and flushed.json()["success"] is True


def test_abort_request_by_rid_streaming_and_not(http):
    url = str(http.base_url).rstrip("/")
    background = Background(url)
    background.post("whole", "/generate", {"text": "ab", "rid": "whole-1", "sampling_params": LONG})
    lines = []

    def stream():
        with httpx.stream("POST", url + "/generate", json={"text": "cd", "rid": "stream-1", "stream": True,
                                                           "sampling_params": LONG}, timeout=60) as r:
            lines.extend(line for line in r.iter_lines() if line)
    thread = threading.Thread(target=stream)
    thread.start()
    wait_until(http, lambda info: info["num_requests_running"] == 2)
    assert http.post("/generate", json={"text": "x", "rid": "whole-1"}).json()["error"]["code"] == "duplicate_rid"
    assert http.post("/abort_request", json={"rid": "whole-1"}).json() == {"success": True, "aborted": 1}
    assert http.post("/abort_request", json={"rid": "stream-1", "abort_message": "stop now"}).json()["aborted"] == 1
    thread.join(30)
    status, body = background.join()["whole"]
    assert status == 200 and body["meta_info"]["finish_reason"]["message"] == "aborted by /abort_request"
    assert body["meta_info"]["completion_tokens"] == len(body["output_ids"]) < 900
    assert lines[-1] == "data: [DONE]"
    last = json.loads(lines[-2][len("data: "):])
    assert last["meta_info"]["id"] == "stream-1"
    assert last["meta_info"]["finish_reason"] == {"type": "abort", "message": "stop now"}
    # a finished or unknown rid is no error (it may just have finished), as in SGLang
    assert http.post("/abort_request", json={"rid": "whole-1"}).json() == {"success": True, "aborted": 0}
    for bad, param in [({"rid": 5}, "rid"), ({}, "rid"), ({"rid": "a", "kill": True}, "kill")]:
        response = http.post("/abort_request", json=bad)
        assert response.status_code == 400 and response.json()["error"]["param"] == param
    wait_until(http, idle)


@pytest.mark.parametrize("stream", [False, True])
def test_a_request_past_its_deadline_is_aborted_with_reason_timeout(http, stream):
    before = http.get("/server_info").json()["requests_finished"].get("timeout", 0)
    body = {"text": "ab", "request_timeout": 0.3, "sampling_params": LONG, "stream": stream}
    began = time.monotonic()
    if stream:
        with http.stream("POST", "/generate", json=body) as r:
            lines = [line for line in r.iter_lines() if line]
        assert lines[-1] == "data: [DONE]"
        meta = json.loads(lines[-2][len("data: "):])["meta_info"]
    else:
        meta = http.post("/generate", json=body).json()["meta_info"]
    assert time.monotonic() - began < 5
    assert meta["finish_reason"] == {"type": "abort", "message": "the request passed its deadline of 0.3 s "
                                                                 "(request_timeout)"}
    assert 0 < meta["completion_tokens"] < 900
    completion = http.post("/v1/completions", json={"prompt": "ab", "max_tokens": 900, "ignore_eos": True,
                                                    "request_timeout": 0.3, "stream": stream})
    if stream:
        chunks = [json.loads(line[6:]) for line in completion.text.splitlines()
                  if line.startswith("data: {")]
        assert chunks[-1]["choices"][0]["finish_reason"] == "timeout"
    else:
        assert completion.json()["choices"][0]["finish_reason"] == "timeout"
    info = wait_until(http, idle)
    assert info["requests_finished"]["timeout"] == before + 2


def test_the_server_deadline_bounds_every_request_and_a_request_may_only_shorten_it(models):
    limits = ServerLimits(request_timeout=0.4)
    with running_server(create_app(make_engine(models), MODEL, limits=limits)) as url, \
            httpx.Client(base_url=url, timeout=60) as http:
        began = time.monotonic()
        out = http.post("/v1/completions", json={"prompt": "ab", "max_tokens": 900, "ignore_eos": True,
                                                 "request_timeout": 60}).json()
        assert out["choices"][0]["finish_reason"] == "timeout" and time.monotonic() - began < 5
        chat = http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}],
                                                       "max_tokens": 900, "ignore_eos": True}).json()
        assert chat["choices"][0]["finish_reason"] == "timeout"
        short = http.post("/generate", json={"text": "ab", "sampling_params": {"max_new_tokens": 3}}).json()
        assert short["meta_info"]["finish_reason"] == {"type": "length", "length": 3}
        assert http.get("/server_info").json()["request_timeout"] == 0.4


@pytest.mark.parametrize("path, body, param", [
    ("/generate", {"text": "a", "request_timeout": 0}, "request_timeout"),
    ("/generate", {"text": "a", "request_timeout": "5"}, "request_timeout"),
    ("/v1/completions", {"prompt": "a", "request_timeout": -1}, "request_timeout"),
    ("/v1/completions", {"prompt": "a", "disable_speculative_decoding": "yes"}, "disable_speculative_decoding"),
    ("/generate", {"text": "a", "sampling_params": {"disable_speculative_decoding": 1}},
     "sampling_params.disable_speculative_decoding"),
    ("/generate", {"text": "a", "rid": 7}, "rid"),
    ("/generate", {"text": ["a", "b"], "rid": ["r1"]}, "rid"),
    ("/generate", {"text": ["a", "b"], "rid": ["r1", "r1"]}, "rid"),
    ("/generate", {"text": ["a", "b"], "rid": "r1"}, "rid"),
    ("/generate", {"text": "a", "sampling_param": {}}, "sampling_param"),          # a typo: unknown key
    ("/generate", {"text": "a", "sampling_param": None}, "sampling_param"),        # unknown even when null
    ("/generate", {"text": "a", "top_logprobs_num": 5}, "top_logprobs_num"),       # known, not supported
    ("/generate", {"text": "a", "return_hidden_states": True}, "return_hidden_states"),
])
def test_bad_fields_are_400_naming_them(http, path, body, param):
    response = http.post(path, json=body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


def test_sglang_fields_at_their_defaults_are_accepted(http):
    # the body SGLang's bench_adaptive_speculative.py sends, and others its clients send by default
    for body in [{"text": "ab", "sampling_params": {"temperature": 0, "max_new_tokens": 4}, "return_logprob": False},
                 {"text": "ab", "sampling_params": {"max_new_tokens": 4}, "log_metrics": True, "stream": False,
                  "logprob_start_len": -1, "top_logprobs_num": 0, "lora_path": None, "custom_labels": {"a": "b"},
                  "return_hidden_states": False, "priority": None}]:
        response = http.post("/generate", json=body)
        assert response.status_code == 200, response.text


def test_prompt_caps_are_400_naming_the_flag(http):
    too_many = http.post("/generate", json={"text": ["a"] * 5})
    assert too_many.status_code == 400
    error = too_many.json()["error"]
    assert error["code"] == "too_many_prompts" and "--max-prompts-per-request" in error["message"]
    assert "at most 4" in error["message"]
    for path, body, param in [("/generate", {"text": "a" * 301}, "text"),
                              ("/generate", {"input_ids": [5] * 301}, "input_ids"),
                              ("/v1/completions", {"prompt": "a" * 301}, "prompt"),
                              ("/v1/completions", {"prompt": [5] * 301}, "prompt"),
                              ("/v1/chat/completions", {"messages": [{"role": "user", "content": "a" * 301}]},
                               "messages")]:
        response = http.post(path, json=body)
        assert response.status_code == 400, (path, response.text)
        error = response.json()["error"]
        assert error["param"] == param and "--max-prompt-chars" in error["message"] and "300" in error["message"]


def test_a_batch_larger_than_the_server_can_hold_is_400(models):
    limits = ServerLimits(max_queued_requests=1, max_prompts_per_request=8)
    with running_server(create_app(make_engine(models), MODEL, limits=limits)) as url:
        response = httpx.post(url + "/generate", json={"text": ["a"] * 4}, timeout=30)
        assert response.status_code == 400 and response.json()["error"]["code"] == "too_many_prompts"
        assert "at most 3 requests" in response.json()["error"]["message"]


def test_rid_is_echoed_as_meta_info_id(http):
    one = http.post("/generate", json={"text": "ab", "rid": "mine", "sampling_params": {"max_new_tokens": 2}})
    assert one.json()["meta_info"]["id"] == "mine"
    batch = http.post("/generate", json={"text": ["a", "b"], "rid": ["r-a", "r-b"],
                                         "sampling_params": {"max_new_tokens": 2}}).json()
    assert [out["meta_info"]["id"] for out in batch] == ["r-a", "r-b"]
    generated = http.post("/generate", json={"text": ["a", "b"], "sampling_params": {"max_new_tokens": 2}}).json()
    ids = [out["meta_info"]["id"] for out in generated]
    assert len(set(ids)) == 2 and all(len(i) == 32 for i in ids)
    # a rid is free again once its request is done
    assert http.post("/generate", json={"text": "ab", "rid": "mine",
                                        "sampling_params": {"max_new_tokens": 2}}).status_code == 200


def test_spec_fields_are_computed_as_sglang_computes_them(http):
    meta = http.post("/generate", json={"text": "q" * 8, "sampling_params": {
        "temperature": 0, "max_new_tokens": 40, "ignore_eos": True}}).json()["meta_info"]
    verifies = meta["spec_verify_ct"]
    assert verifies > 0
    # a static tier (3 steps): SGLang's spec_draft_token_num = spec_verify_ct * (num_draft_tokens - 1)
    assert meta["spec_draft_token_num"] == verifies * 3 == meta["spec_num_proposed_drafts"]
    assert meta["spec_accept_token_num"] == meta["spec_num_correct_drafts"] == sum(
        i * n for i, n in enumerate(meta["spec_correct_drafts_histogram"]))
    assert meta["spec_accept_rate"] == pytest.approx(meta["spec_accept_token_num"] / meta["spec_draft_token_num"])
    assert meta["spec_accept_length"] == pytest.approx(40 / verifies)


def test_disable_speculative_decoding_is_accepted_everywhere_and_counted(http):
    def disabled_count():
        metrics = http.get("/metrics").text
        line = next(line for line in metrics.splitlines()
                    if line.startswith("spec_requests_speculation_disabled_total"))
        return float(line.split()[-1])

    before = disabled_count()
    assert http.get("/server_info").json()["requests_speculation_disabled"] == before
    off = {"disable_speculative_decoding": True}
    meta = http.post("/generate", json={"text": "q" * 8, "sampling_params": {
        "temperature": 0, "max_new_tokens": 20, "ignore_eos": True, **off}}).json()["meta_info"]
    assert meta["spec_draft_token_num"] == 0 and meta["spec_accept_rate"] == 0.0  # it verified no drafts
    assert http.post("/v1/completions", json={"prompt": "ab", "max_tokens": 3, **off}).status_code == 200
    assert http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "ab"}],
                                                   "max_tokens": 3, **off}).status_code == 200
    assert http.post("/generate", json={"text": "ab", "sampling_params": {"max_new_tokens": 3,
                                        "disable_speculative_decoding": False}}).status_code == 200
    assert disabled_count() == before + 3
    assert http.get("/server_info").json()["requests_speculation_disabled"] == before + 3


def test_model_info_and_health_generate(http):
    info = http.get("/get_model_info").json()
    assert info["model_path"] == MODEL and info["is_generation"] is True
    assert info["has_image_understanding"] is False and http.get("/model_info").json() == info
    wait_until(http, idle)
    before = http.get("/server_info").json()["requests_finished"]
    assert http.get("/health_generate").json() == {"status": "ok"}   # idle: a one-token probe ran
    assert http.get("/server_info").json()["requests_finished"] == before  # which no count shows

"""The OpenAI-compatible server over a small random model: the official client, errors, metrics, disconnects."""

import json
import threading
import time

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from server_helpers import FORCED_SWITCHING, CharTokenizer, random_models, running_server
from specswap.capability import cpu_capability
from specswap.engine import Engine
from specswap.server.app import create_app

API_KEY = "test-key"
MODEL = "random-char"
MAX_SEQ_LEN = 256
MAX_BODY_BYTES = 4096


@pytest.fixture(scope="module")
def models():
    return random_models()


@pytest.fixture(scope="module")
def server(models):
    target, _ = models
    engine = Engine(target, None, "NGRAM", speculative_num_steps=3, speculative_adaptive=True,
                    speculative_adaptive_config={"candidate_steps": [1, 3, 7], **FORCED_SWITCHING},
                    max_batch_size=4, max_seq_len=MAX_SEQ_LEN, tokenizer=CharTokenizer())
    app = create_app(engine, MODEL, api_key=API_KEY, max_body_bytes=MAX_BODY_BYTES)
    with running_server(app) as url:
        yield url


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server}/v1", api_key=API_KEY, max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=60) as session:
        yield session


def reference_text(models, prompt, max_new_tokens):
    """Greedy target-only text from a separate in-process engine on the same weights."""
    target, _ = models
    engine = Engine(target, None, None, max_seq_len=MAX_SEQ_LEN, tokenizer=CharTokenizer())
    return engine.generate([prompt], max_new_tokens)[0].text


def test_completion_is_greedy_identical_with_usage(client, models):
    result = client.completions.create(model=MODEL, prompt="def add(a, b):", max_tokens=24, temperature=0)
    choice = result.choices[0]
    assert choice.text == reference_text(models, "def add(a, b):", 24)
    assert choice.finish_reason == "length"
    assert result.usage.prompt_tokens == len("def add(a, b):") + 1  # + BOS
    assert result.usage.completion_tokens == 24
    assert result.usage.total_tokens == result.usage.prompt_tokens + 24
    assert result.object == "text_completion" and result.model == MODEL


def test_streamed_completion_matches_non_streamed_and_reports_usage(client):
    kwargs = dict(model=MODEL, prompt="for i in range(10):", max_tokens=20, temperature=0)
    whole = client.completions.create(**kwargs).choices[0].text
    chunks = list(client.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == whole
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 20 and not chunks[-1].choices


def test_chat_streaming_and_not(client):
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"}]
    result = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=16, temperature=0)
    message = result.choices[0].message
    assert message.role == "assistant" and isinstance(message.content, str)
    assert result.usage.completion_tokens <= 16 and result.usage.prompt_tokens > 10
    stream = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=16, temperature=0, stream=True)
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == message.content
    assert chunks[-1].choices[0].finish_reason == result.choices[0].finish_reason


def test_stop_string_cuts_streamed_and_whole_text(client):
    prompt = "while True:"
    full = client.completions.create(model=MODEL, prompt=prompt, max_tokens=40, temperature=0).choices[0].text
    stop = full[10:13]
    expected = full[:full.find(stop)]
    result = client.completions.create(model=MODEL, prompt=prompt, max_tokens=40, temperature=0, stop=[stop])
    assert result.choices[0].text == expected and result.choices[0].finish_reason == "stop"
    streamed = client.completions.create(model=MODEL, prompt=prompt, max_tokens=40, temperature=0, stop=stop,
                                         stream=True)
    assert "".join(c.choices[0].text for c in streamed) == expected


@pytest.fixture(scope="module")
def static_client(models):
    """A server at a fixed tier: a seed names one sample for a given tier sequence (the law is the target's at
    any tier, but which sample a seed draws depends on where drafts were verified), and the adaptive server
    above may take a different path through the tiers for the same request a second time."""
    target, _ = models
    engine = Engine(target, None, "NGRAM", speculative_num_steps=3, max_batch_size=4, max_seq_len=MAX_SEQ_LEN,
                    tokenizer=CharTokenizer())
    with running_server(create_app(engine, MODEL, api_key=API_KEY)) as url:
        yield openai.OpenAI(base_url=f"{url}/v1", api_key=API_KEY, max_retries=0, timeout=60)


def test_seeded_sampling_repeats(static_client):
    kwargs = dict(model=MODEL, prompt="Once upon a time", max_tokens=16, temperature=1.0, top_p=0.9, seed=11)
    first = static_client.completions.create(**kwargs).choices[0].text
    assert static_client.completions.create(**kwargs).choices[0].text == first
    assert static_client.completions.create(**{**kwargs, "seed": 12}).choices[0].text != first


def test_more_concurrent_requests_than_slots_all_complete_identically(client, models):
    prompts = [f"x = {i} * {i + 1}" for i in range(7)]  # 7 requests, 4 slots
    results = [None] * len(prompts)

    def one(index):
        results[index] = client.completions.create(model=MODEL, prompt=prompts[index], max_tokens=12,
                                                   temperature=0).choices[0].text

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert results == [reference_text(models, p, 12) for p in prompts]


def _error(response, status, param=None):
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    if param is not None:
        assert error["param"] == param
    return error


def test_api_key_is_required_everywhere_but_the_probes(server):
    for method, path in [("GET", "/v1/models"), ("GET", "/server_info"), ("POST", "/v1/completions"),
                         ("POST", "/generate")]:
        _error(httpx.request(method, server + path, json={"prompt": "a"}), 401)
        wrong = httpx.request(method, server + path, json={"prompt": "a"}, headers={"Authorization": "Bearer nope"})
        assert _error(wrong, 401)["type"] == "authentication_error"
    # load balancers' health checks and Prometheus send no key (as vLLM leaves them open)
    assert httpx.get(server + "/health").json() == {"status": "ok"}
    assert "spec_num_steps" in httpx.get(server + "/metrics").text


def test_api_key_probes_guards_the_probes_too(models):
    target, _ = models
    from specswap.server.limits import ServerLimits
    engine = Engine(target, None, None, max_seq_len=MAX_SEQ_LEN, tokenizer=CharTokenizer())
    app = create_app(engine, MODEL, api_key=API_KEY, limits=ServerLimits(api_key_probes=True))
    with running_server(app) as url:
        for path in ("/health", "/metrics", "/health_generate"):
            _error(httpx.get(url + path), 401)
        assert httpx.get(url + "/health", headers={"Authorization": f"Bearer {API_KEY}"}).status_code == 200


@pytest.mark.parametrize("body, param", [
    ({"prompt": "a", "max_tokens": 0}, "max_tokens"),
    ({"prompt": "a", "max_tokens": -3}, "max_tokens"),
    ({"prompt": "a", "max_tokens": "ten"}, "max_tokens"),
    ({"prompt": "a", "temperature": "hot"}, "temperature"),
    ({"prompt": "a", "temperature": 5}, "temperature"),
    ({"prompt": "a", "top_p": 0}, "top_p"),
    ({"prompt": "a", "stream": "yes"}, "stream"),
    ({"prompt": "a", "ignore_eos": 1}, "ignore_eos"),
    ({"prompt": "a", "stop": [1, 2]}, "stop"),
    ({"prompt": "a", "seed": 1.5}, "seed"),
    ({"prompt": "a", "n": 2}, "n"),
    ({"prompt": 42}, "prompt"),
    ({"max_tokens": 4}, "prompt"),
    ({"prompt": [5, 6, 1000]}, "prompt"),          # token id outside the vocabulary
    ({"prompt": "a" * (MAX_SEQ_LEN + 5)}, "prompt"),  # longer than the context
    ({"prompt": "abc", "max_tokens": MAX_SEQ_LEN - 3}, "max_tokens"),  # 4 prompt tokens (BOS) + 253 > 256
])
def test_bad_completion_requests_are_400(http, body, param):
    _error(http.post("/v1/completions", json=body), 400, param)


@pytest.mark.parametrize("body", [
    {"messages": []}, {"messages": "hi"}, {"messages": [{"role": "wizard", "content": "x"}]},
    {"messages": [{"role": "user", "content": 3}]},
    {"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 0},
])
def test_bad_chat_requests_are_400(http, body):
    _error(http.post("/v1/chat/completions", json=body), 400)


def test_max_tokens_beyond_the_context_is_400_naming_the_limit(http):
    error = _error(http.post("/v1/completions", json={"prompt": "abc", "max_tokens": 10**9}), 400, "max_tokens")
    assert error["code"] == "context_length_exceeded"
    assert error["message"].startswith(f"This model's maximum context length is {MAX_SEQ_LEN} tokens. However, you "
                                       f"requested {10**9 + 4} tokens (4 in the prompt, {10**9} in the completion)")
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": MAX_SEQ_LEN}
    assert _error(http.post("/v1/chat/completions", json=chat), 400, "max_completion_tokens")["code"] == \
        "context_length_exceeded"
    # exactly what is left fits; a default max_tokens (chat: 256) is capped to what is left instead
    fits = http.post("/v1/completions", json={"prompt": "abc", "max_tokens": MAX_SEQ_LEN - 4, "temperature": 0})
    assert fits.status_code == 200 and fits.json()["usage"]["completion_tokens"] == MAX_SEQ_LEN - 4
    default = http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}],
                                                      "temperature": 0}).json()
    assert default["usage"]["prompt_tokens"] + default["usage"]["completion_tokens"] <= MAX_SEQ_LEN


def test_invalid_json_body_too_large_and_unknown_route(http):
    _error(http.post("/v1/completions", content=b"{not json", headers={"Content-Type": "application/json"}), 400)
    _error(http.post("/v1/completions", content=b"[1, 2]"), 400)
    big = json.dumps({"prompt": "a" * (MAX_BODY_BYTES + 10)})
    assert _error(http.post("/v1/completions", content=big), 413)["code"] == "request_too_large"
    _error(http.get("/v1/nothing"), 404)
    # bad requests disturb nothing: the server still answers
    assert http.get("/health").json() == {"status": "ok"}
    ok = http.post("/v1/completions", json={"prompt": "abc", "max_tokens": 3, "temperature": 0})
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 3


def test_models_and_health(http):
    models = http.get("/v1/models").json()
    assert models["data"][0]["id"] == MODEL and models["data"][0]["max_model_len"] == MAX_SEQ_LEN
    assert http.get("/health").json()["status"] == "ok"


def test_server_info_reports_the_adaptive_state(http):
    http.post("/v1/completions", json={"prompt": "ab" * 20, "max_tokens": 60, "temperature": 0})
    info = http.get("/server_info").json()
    assert info["speculative_algorithm"] == "NGRAM" and info["speculative_adaptive"] is True
    assert info["speculative_num_steps"] in (1, 3, 7)
    assert info["speculative_num_draft_tokens"] == info["speculative_num_steps"] + 1
    assert info["speculative_eagle_topk"] == 1
    assert info["candidate_steps"] == [1, 3, 7]
    built = {tier["speculative_num_steps"]: tier for tier in info["speculative_tiers"]}
    assert set(built) == {0, 1, 3, 7}  # NGRAM's plain-decode tier too
    assert all(built[k]["memory_bytes"] > 0 and built[k]["build_seconds"] > 0 for k in (1, 3, 7))
    assert info["num_verify_rounds"] > 0 and sum(info["rounds_per_tier"].values()) == info["num_verify_rounds"]
    assert info["avg_spec_accept_length"] >= 1.0 and isinstance(info["ema"], float)
    assert info["num_switches"] >= 1  # forced switching (alpha 1, interval 1) over varied acceptance
    assert info["generated_tokens"] > 0
    assert info["cpu"]["line"] == cpu_capability().describe() and isinstance(info["cpu"]["native_bf16"], bool)


def test_metrics_names_and_accept_length_histogram(http):
    http.post("/v1/completions", json={"prompt": "xyz", "max_tokens": 8, "temperature": 0})
    families = {f.name: f for f in text_string_to_metric_families(http.get("/metrics").text)}
    for name in ("spec_num_steps", "spec_num_draft_tokens", "spec_accept_length", "spec_tier_switches",
                 "spec_generation_tokens", "spec_num_requests_running", "spec_num_requests_waiting",
                 "spec_adaptive_ema", "spec_verify_rounds", "spec_requests_finished", "spec_prompt_tokens"):
        assert name in families, name
    samples = {s.name: s.value for s in families["spec_accept_length"].samples if not s.labels.get("le")}
    assert samples["spec_accept_length_count"] > 0
    assert samples["spec_accept_length_sum"] >= samples["spec_accept_length_count"]  # >= 1 token per verify
    steps = families["spec_num_steps"].samples[0].value
    assert families["spec_num_draft_tokens"].samples[0].value == steps + 1
    assert families["spec_eagle_topk"].samples[0].value == 1


class SlowEngine(Engine):
    """Target-only, one token per step and 20 ms a step: a long request cannot finish before the client hangs up."""

    def step(self):
        time.sleep(0.02)
        return super().step()


def test_disconnect_mid_stream_aborts_and_frees_the_slot(models):
    target, _ = models
    engine = SlowEngine(target, None, None, max_batch_size=1, max_seq_len=1024, tokenizer=CharTokenizer())
    with running_server(create_app(engine, MODEL)) as url, httpx.Client(base_url=url, timeout=30) as session:
        body = {"prompt": "go", "max_tokens": 1000, "temperature": 0, "stream": True}
        with session.stream("POST", "/v1/completions", json=body) as response:
            assert response.status_code == 200
            for line in response.iter_lines():
                if line.startswith("data: "):
                    break  # one chunk, then hang up
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            info = session.get("/server_info").json()
            if info["requests_finished"].get("abort") == 1 and info["num_requests_running"] == 0:
                break
            time.sleep(0.05)
        assert info["requests_finished"] == {"abort": 1}
        assert info["num_requests_running"] == 0 and info["generated_tokens"] < 500
        # the freed slot (the only one) serves the next request
        ok = session.post("/v1/completions", json={"prompt": "ab", "max_tokens": 3, "temperature": 0})
        assert ok.json()["usage"]["completion_tokens"] == 3


def test_disconnect_while_waiting_for_a_whole_answer_aborts_and_frees_the_slot(models):
    """A non-streaming client that gives up (here a client timeout) has its request aborted, as a dropped stream
    has: the handler watches for the disconnect while it waits, not only between updates."""
    target, _ = models
    engine = SlowEngine(target, None, None, max_batch_size=1, max_seq_len=1024, tokenizer=CharTokenizer())
    with running_server(create_app(engine, MODEL, api_key=API_KEY)) as url, \
            httpx.Client(base_url=url, timeout=30, headers={"Authorization": f"Bearer {API_KEY}"}) as session:
        with pytest.raises(httpx.TimeoutException):
            session.post("/v1/completions", json={"prompt": "go", "max_tokens": 1000, "temperature": 0}, timeout=0.5)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            info = session.get("/server_info").json()
            if info["num_requests_running"] == 0:
                break
            time.sleep(0.05)
        assert info["num_requests_running"] == 0 and info["requests_finished"] == {"abort": 1}
        assert info["generated_tokens"] < 500  # stopped soon after the hang-up (20 ms a token)
        ok = session.post("/v1/completions", json={"prompt": "ab", "max_tokens": 3, "temperature": 0})
        assert ok.json()["usage"]["completion_tokens"] == 3

"""No request can take the server down: numbers and text checked at the boundary, a request's own fault ends it
alone, a fault in shared state ends the process non-zero, slow clients time out, every field works or is refused,
and the figures are right at every tier (chains, EAGLE trees, NGRAM tries)."""

import json
import socket
import threading
import time

import httpx
import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families

from server_helpers import CharTokenizer, random_models, running_server
from specswap.engine import Engine
from specswap.server.app import _timed_protocol, create_app
from specswap.server.limits import ServerLimits

MODEL = "random-char"


@pytest.fixture(scope="module")
def models():
    return random_models()


@pytest.fixture(scope="module")
def server(models):
    target, head = models
    engine = Engine(target, head, "EAGLE", speculative_num_steps=3, max_batch_size=4, max_seq_len=256,
                    tokenizer=CharTokenizer())
    with running_server(create_app(engine, MODEL)) as url:
        yield url


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server, timeout=60) as session:
        yield session


def _error(response, status, param=None, code=None):
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    if param is not None:
        assert error["param"] == param, error
    if code is not None:
        assert error["code"] == code, error
    return error


def _still_serving(http):
    ok = http.post("/v1/completions", json={"prompt": "ab", "max_tokens": 2, "temperature": 0})
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 2, ok.text
    assert http.get("/health").json() == {"status": "ok"}


# ---- every number checked at the boundary --------------------------------------------------------------------

BIG = 2 ** 63


@pytest.mark.parametrize("route, body, param", [
    ("/v1/completions", {"prompt": "def f", "max_tokens": 8, "top_k": BIG}, "top_k"),
    ("/v1/completions", {"prompt": "def f", "max_tokens": BIG}, "max_tokens"),
    ("/v1/completions", {"prompt": "def f", "seed": 2 ** 64}, "seed"),
    ("/v1/completions", {"prompt": "def f", "top_p": 5e-324}, "top_p"),
    ("/v1/completions", {"prompt": "def f", "temperature": 1e-45}, "temperature"),
    ("/v1/completions", {"prompt": [5, BIG]}, "prompt"),
    ("/v1/completions", {"prompt": "a", "request_timeout": 10 ** 400}, "request_timeout"),
    ("/v1/completions", {"prompt": "a", "temperature": 10 ** 400}, "temperature"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "top_k": BIG}, "top_k"),
    ("/generate", {"text": "def f", "sampling_params": {"top_k": BIG}}, "sampling_params.top_k"),
    ("/generate", {"text": "def f", "sampling_params": {"temperature": 1e39}}, "sampling_params.temperature"),
    ("/generate", {"text": "def f", "sampling_params": {"temperature": 1e308}}, "sampling_params.temperature"),
    ("/generate", {"text": "def f", "sampling_params": {"temperature": 1e-45}}, "sampling_params.temperature"),
    ("/generate", {"text": "def f", "sampling_params": {"top_p": 1e-300}}, "sampling_params.top_p"),
    ("/generate", {"text": "def f", "sampling_params": {"sampling_seed": 2 ** 64}}, "sampling_params.sampling_seed"),
    ("/generate", {"text": "def f", "sampling_params": {"max_new_tokens": BIG}}, "sampling_params.max_new_tokens"),
    ("/generate", {"input_ids": [5, BIG]}, "input_ids"),
    ("/generate", {"text": "def f", "sampling_params": {"min_new_tokens": 9, "max_new_tokens": 4}},
     "sampling_params.min_new_tokens"),
    ("/generate", {"text": "def f", "sampling_params": {"stop_token_ids": [BIG]}},
     "sampling_params.stop_token_ids"),
])
def test_numbers_past_what_the_sampler_holds_are_400_naming_the_field(http, route, body, param):
    _error(http.post(route, json=body), 400, param)
    _still_serving(http)


def test_the_smallest_and_largest_numbers_that_validate_are_served(http):
    for sampling in ({"temperature": 3.4e38, "top_k": BIG - 1, "top_p": 1.2e-38, "sampling_seed": BIG - 1},
                     {"temperature": 1.2e-38, "top_k": 0}, {"temperature": 1e-7, "top_p": 1.0}):
        response = http.post("/generate", json={"text": "def f", "sampling_params": {**sampling, "max_new_tokens": 4}})
        assert response.status_code == 200, response.text
        assert len(response.json()["output_ids"]) == 4
    _still_serving(http)


# ---- text checked ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("route, raw, param", [
    ("/v1/completions", '{"prompt": "a\\ud800b", "max_tokens": 2}', "prompt"),
    ("/generate", '{"text": "\\udfff"}', "text"),
    ("/generate", '{"text": "ab", "rid": "x\\ud800"}', "rid"),
    ("/v1/completions", '{"prompt": "ab", "\\ud800key": 1}', None),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "\\ud83d"}]}', "messages"),
])
def test_lone_surrogates_anywhere_are_400(http, route, raw, param):
    error = _error(http.post(route, content=raw, headers={"Content-Type": "application/json"}), 400,
                   code="invalid_text")
    if param is not None:
        assert error["param"] == param
    _still_serving(http)


def test_invalid_utf8_and_deep_nesting_are_400(http):
    _error(http.post("/v1/completions", content=b'{"prompt": "\xff\xfe"}'), 400, code="invalid_json")
    deep = "[" * 100_000 + "]" * 100_000
    _error(http.post("/generate", content=deep), 400, code="too_deep")
    nested = {"text": "ab", "extra_key": json.loads("[" * 40 + "]" * 40)}
    _error(http.post("/generate", json=nested), 400, code="too_deep")
    _still_serving(http)


def test_empty_prompts_are_400(http):
    _error(http.post("/v1/completions", json={"prompt": ""}), 400, "prompt")
    _error(http.post("/generate", json={"text": ""}), 400, "text")
    _error(http.post("/generate", json={"text": ["ab", ""]}), 400, "text")


# ---- every field works or is refused ----------------------------------------------------------------------------

@pytest.mark.parametrize("field, value", [
    ("response_format", {"type": "json_object"}), ("tool_choice", "auto"), ("functions", [{"name": "f"}]),
    ("guided_json", {"type": "object"}), ("guided_regex", "a+"), ("repetition_penalty", 1.2),
])
def test_unimplemented_openai_fields_are_400_naming_them(http, field, value):
    _error(http.post("/v1/completions", json={"prompt": "ab", field: value}), 400, field)
    chat = {"messages": [{"role": "user", "content": "hi"}], field: value}
    _error(http.post("/v1/chat/completions", json=chat), 400, field)


def test_neutral_values_of_refused_fields_are_served(http):
    body = {"prompt": "ab", "max_tokens": 2, "response_format": {"type": "text"}, "tool_choice": "none",
            "repetition_penalty": 1.0}
    assert http.post("/v1/completions", json=body).status_code == 200


def _greedy_ids(models, prompt, n, **params):
    target, _ = models
    engine = Engine(target, None, None, max_seq_len=256, tokenizer=CharTokenizer())
    return engine.generate([prompt], n, **params)[0].token_ids


def test_stop_token_ids_end_a_request_on_every_route(http, models):
    free = _greedy_ids(models, "hello", 12)
    stop_id = free[5]
    first = free.index(stop_id)
    completion = http.post("/v1/completions", json={"prompt": "hello", "max_tokens": 12, "temperature": 0,
                                                    "stop_token_ids": [stop_id]}).json()
    assert completion["usage"]["completion_tokens"] == first + 1
    assert completion["choices"][0]["finish_reason"] == "stop"
    native = http.post("/generate", json={"text": "hello", "sampling_params": {"max_new_tokens": 12, "temperature": 0,
                                                                                "stop_token_ids": [stop_id]}}).json()
    assert native["output_ids"] == free[:first + 1]
    assert native["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop_id}


def test_min_tokens_masks_stop_ids_losslessly(http, models):
    """min_tokens (vLLM) / min_new_tokens (SGLang): a stop id cannot be drawn before; the speculative server's
    greedy output equals target-only decoding with the same mask (the engine's masked law, not a filter)."""
    free = _greedy_ids(models, "hello", 12)
    stop_id = free[0]
    least = 6
    expected = _greedy_ids(models, "hello", 12)  # target-only with the same constraint, through the engine
    target, _ = models
    from specswap.sampling import SamplingParams
    reference = Engine(target, None, None, max_seq_len=256, tokenizer=CharTokenizer())
    rid = reference.add_request("hello", SamplingParams(max_new_tokens=12, min_new_tokens=least,
                                                        stop_token_ids=(stop_id,)))
    while reference.has_unfinished():
        for output in reference.step().outputs:
            if output.request_id == rid and output.finished:
                expected = output.token_ids
    assert stop_id not in expected[:least] and expected != free[:len(expected)]
    native = http.post("/generate", json={"text": "hello", "sampling_params": {
        "max_new_tokens": 12, "temperature": 0, "min_new_tokens": least, "stop_token_ids": [stop_id]}}).json()
    assert native["output_ids"] == expected
    completion = http.post("/v1/completions", json={"prompt": "hello", "max_tokens": 12, "temperature": 0,
                                                    "min_tokens": least, "stop_token_ids": [stop_id]}).json()
    assert completion["usage"]["completion_tokens"] == len(expected)


# ---- the figures are right at every tier ------------------------------------------------------------------------

@pytest.mark.parametrize("algorithm, steps, topk, tokens", [("EAGLE", 3, 1, None), ("EAGLE", 3, 2, 7),
                                                             ("NGRAM", 3, 2, 6), ("NGRAM", 3, 1, None)])
def test_figures_are_the_tiers_own(models, algorithm, steps, topk, tokens):
    target, head = models
    engine = Engine(target, head if algorithm == "EAGLE" else None, algorithm, speculative_num_steps=steps,
                    speculative_eagle_topk=topk, speculative_num_draft_tokens=tokens, max_batch_size=2,
                    max_seq_len=256, tokenizer=CharTokenizer())
    shape_tokens = tokens or steps + 1
    with running_server(create_app(engine, MODEL)) as url, httpx.Client(base_url=url, timeout=60) as session:
        out = session.post("/generate", json={"text": "abcabcabc abcabc", "sampling_params": {
            "max_new_tokens": 40, "temperature": 0}}).json()
        meta = out["meta_info"]
        verifies = meta["spec_verify_ct"]
        assert 0 < meta["spec_draft_token_num"] <= verifies * (shape_tokens - 1)
        assert 0 <= meta["spec_accept_rate"] <= 1
        assert meta["spec_accept_token_num"] <= meta["spec_draft_token_num"]
        info = session.get("/server_info").json()
        for where in (info, info["internal_states"][0]):
            assert (where["speculative_num_steps"], where["speculative_eagle_topk"],
                    where["speculative_num_draft_tokens"]) == (steps, topk, shape_tokens)
        label = f"{steps}x{topk}x{shape_tokens}" if topk > 1 else str(steps)
        assert set(info["rounds_per_tier"]) <= {label, "0"}
        families = {f.name: f for f in text_string_to_metric_families(session.get("/metrics").text)}
        assert families["spec_num_steps"].samples[0].value == steps
        assert families["spec_eagle_topk"].samples[0].value == topk
        assert families["spec_num_draft_tokens"].samples[0].value == shape_tokens
        labels = {s.labels["num_steps"] for s in families["spec_verify_rounds"].samples}
        assert labels <= {label, "0"}


def test_ngram_plain_rounds_are_not_drafts(models):
    """NGRAM runs a plain decode where no lookup matches: those rounds verify no drafts."""
    target, _ = models
    engine = Engine(target, None, "NGRAM", speculative_num_steps=7, max_batch_size=2, max_seq_len=256,
                    tokenizer=CharTokenizer())
    with running_server(create_app(engine, MODEL)) as url, httpx.Client(base_url=url, timeout=60) as session:
        meta = session.post("/generate", json={"text": "q", "sampling_params": {"max_new_tokens": 30,
                                                                               "temperature": 0}}).json()["meta_info"]
        plain = session.get("/server_info").json()["rounds_per_tier"].get("0", 0)
        assert plain > 0
        assert meta["spec_draft_token_num"] <= (meta["spec_verify_ct"] - plain) * 7


# ---- a fault stays with its request; a fault in shared state ends the process ----------------------------------

def _inject_request_fault(engine, prompt_ids, after_tokens=3):
    original = engine.batch.append

    def append(request, tokens):
        if request.prompt_ids == prompt_ids and len(request.token_ids) >= after_tokens:
            raise RuntimeError("injected fault in one request's stop check")
        original(request, tokens)
    engine.batch.append = append


def test_a_fault_in_one_request_of_a_batch_of_three_ends_it_alone(models):
    target, head = models
    prompts = ["abc abc abc", "boom", "hello world"]
    reference = Engine(target, None, None, max_seq_len=256, tokenizer=CharTokenizer())
    expected = {p: reference.generate([p], 16)[0].token_ids for p in prompts}
    engine = Engine(target, head, "EAGLE", max_batch_size=4, max_seq_len=256, tokenizer=CharTokenizer())
    _inject_request_fault(engine, CharTokenizer().encode("boom", add_bos=True))
    with running_server(create_app(engine, MODEL)) as url, httpx.Client(base_url=url, timeout=60) as session:
        results = {}

        def one(prompt):
            results[prompt] = session.post("/generate", json={"text": prompt, "sampling_params": {
                "max_new_tokens": 16, "temperature": 0}})
        threads = [threading.Thread(target=one, args=(p,)) for p in prompts]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        error = _error(results["boom"], 500, code="request_failed")
        assert "injected fault" in error["message"]
        for prompt in ("abc abc abc", "hello world"):
            assert results[prompt].json()["output_ids"] == expected[prompt]
        info = session.get("/server_info").json()
        assert info["requests_finished"]["error"] == 1 and info["num_requests_running"] == 0
        metrics = session.get("/metrics").text
        assert 'spec_requests_finished_total{finish_reason="error"} 1.0' in metrics
        assert session.get("/health").json() == {"status": "ok"}
        # the freed slots serve again, the faulty prompt included (its fault fires past 3 tokens)
        again = session.post("/generate", json={"text": "hello world", "sampling_params": {
            "max_new_tokens": 16, "temperature": 0}}).json()
        assert again["output_ids"] == expected["hello world"]


def test_a_fault_in_shared_state_fails_every_request_with_json_and_health_says_so(models):
    target, _ = models
    engine = Engine(target, None, "NGRAM", max_batch_size=4, max_seq_len=256, tokenizer=CharTokenizer())
    armed = threading.Event()
    original = engine.worker.decode_round

    def decode_round(slots):
        if armed.is_set() and len(slots) == 3:  # all three in one batch
            raise RuntimeError("injected fault in the shared forward")
        return original(slots)
    engine.worker.decode_round = decode_round
    app = create_app(engine, MODEL)
    with running_server(app) as url, httpx.Client(base_url=url, timeout=60) as session:
        _still_serving(session)
        armed.set()
        results = []

        def one(index):
            results.append(session.post("/v1/completions", json={"prompt": f"ab{index}", "max_tokens": 8}))
        threads = [threading.Thread(target=one, args=(i,)) for i in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        for response in results:
            assert "injected fault" in _error(response, 500, code="engine_error")["message"]
        health = session.get("/health")
        assert health.status_code == 503 and health.json()["status"] == "error"
        assert app.state.scheduler.died_at is not None and app.state.scheduler.inflight == 0
        _error(session.post("/v1/completions", json={"prompt": "ab"}), 503, code="engine_dead")


# ---- slow clients -----------------------------------------------------------------------------------------------

def _timed_server(app, header_timeout):
    """``app`` under the server ``serve`` runs (the drain, the header timeout), in a thread."""
    import uvicorn
    from server_helpers import free_port
    from specswap.server.app import DrainingServer, _QuietCancel
    port = free_port()
    server = DrainingServer(uvicorn.Config(_QuietCancel(app), host="127.0.0.1", port=port, log_level="error",
                                           http=_timed_protocol(header_timeout)), app)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    return server, thread, port


def _read_all(sock, seconds):
    sock.settimeout(seconds)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except TimeoutError:
        pass
    return data


def test_slow_headers_and_slow_bodies_get_408(models):
    target, _ = models
    engine = Engine(target, None, None, max_seq_len=256, tokenizer=CharTokenizer())
    app = create_app(engine, MODEL, limits=ServerLimits(header_timeout=1.0, body_timeout=1.0))
    server, thread, port = _timed_server(app, 1.0)
    try:
        slow = [socket.create_connection(("127.0.0.1", port)) for _ in range(20)]  # slowloris: headers never end
        for sock in slow:
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
        began = time.monotonic()
        replies = [_read_all(sock, 5) for sock in slow]
        assert time.monotonic() - began < 6
        for reply in replies:  # answered 408 in JSON and closed (recv returned b"" at the end)
            assert reply.startswith(b"HTTP/1.1 408") and b'"request_timeout"' in reply
        stalled = socket.create_connection(("127.0.0.1", port))
        stalled.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                        b"Content-Length: 100\r\n\r\n{\"prompt\": ")
        reply = _read_all(stalled, 5)
        assert reply.startswith(b"HTTP/1.1 408") and b"--body-timeout" in reply
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as session:
            _still_serving(session)
    finally:
        server.should_exit = True
        thread.join(15)


def test_a_stalled_upload_never_holds_a_drain_up(models):
    """SIGTERM's drain waits for admitted requests only; then a body still arriving is answered 503 and the
    server exits at once (not after uvicorn's grace, not with a traceback)."""
    target, _ = models
    engine = Engine(target, None, None, max_seq_len=256, tokenizer=CharTokenizer())
    app = create_app(engine, MODEL, limits=ServerLimits(body_timeout=60.0, drain_timeout=1.0))
    server, thread, port = _timed_server(app, 10.0)
    stalled = socket.create_connection(("127.0.0.1", port))
    stalled.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"text\"")
    time.sleep(0.3)
    began = time.monotonic()
    server.signals = 1  # what SIGTERM does (handle_exit); the drain then runs on the server's loop
    reply = _read_all(stalled, 5)
    thread.join(10)
    assert not thread.is_alive() and time.monotonic() - began < 3
    assert reply.startswith(b"HTTP/1.1 503") and b"server_draining" in reply
    assert app.state.drain_state["report"]["admitted"] == 0


# ---- the sampler is total over its documented domain ----------------------------------------------------------

def test_the_sampler_never_raises_over_the_whole_float_range(models):
    from hypothesis import HealthCheck, given, settings, strategies as st

    from specswap.sampling import SamplingParams
    target, head = models
    engine = Engine(target, head, "EAGLE", max_batch_size=4, max_seq_len=64, tokenizer=CharTokenizer())

    @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
    @given(temperature=st.floats(min_value=0, allow_nan=False, allow_infinity=False, allow_subnormal=True),
           top_p=st.floats(min_value=0, max_value=1, exclude_min=True, allow_subnormal=True),
           top_k=st.integers(min_value=0, max_value=BIG - 1), seed=st.integers(min_value=-BIG, max_value=2 ** 64 - 1),
           min_new=st.integers(min_value=0, max_value=3))
    def run(temperature, top_p, top_k, seed, min_new):
        params = SamplingParams(max_new_tokens=3, temperature=temperature, top_p=top_p, top_k=top_k, seed=seed,
                                min_new_tokens=min_new, stop_token_ids=(5,))
        engine.add_request("abc", params)
        while engine.has_unfinished():
            for output in engine.step().outputs:
                assert output.finish_reason != "error", output.error
                if output.finished:
                    assert len(output.token_ids) == 3 or output.token_ids[-1] == 5
                    assert 5 not in output.token_ids[:min_new]
    run()
    assert torch.get_num_threads() >= 1

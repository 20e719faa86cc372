"""Fuzzing every request route: hypothesis draws at least 500 bodies of each route's shape with extreme and ill-typed
values; every answer is a 200 or a 4xx with a JSON error body, and a normal request succeeds after each (bounded:
loopback, a small random model, under a minute)."""

import json

import httpx
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from server_helpers import CharTokenizer, random_models, running_server
from specswap.engine import Engine
from specswap.server.app import create_app

EXAMPLES = 500
BIG = 2 ** 63

extreme_numbers = st.one_of(
    st.integers(min_value=-(2 ** 70), max_value=2 ** 70), st.sampled_from([0, 1, -1, BIG - 1, BIG, -BIG - 1, 2 ** 64]),
    st.floats(allow_nan=True, allow_infinity=True, allow_subnormal=True),
    st.sampled_from([1e39, 1e308, 1e-45, 5e-324, 1e-300, -0.0, 3.4e38, 1.2e-38]))
odd_text = st.one_of(st.text(max_size=12), st.sampled_from(["", "\ud800", "a\udfff", "\x00", "\u202e", "é" * 5]))
anything = st.recursive(st.one_of(st.none(), st.booleans(), extreme_numbers, odd_text),
                        lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                st.dictionaries(odd_text, inner, max_size=3)), max_leaves=6)
small = st.integers(min_value=1, max_value=6)
sampling_value = st.one_of(extreme_numbers, anything)


def _fields(names, value=sampling_value):
    return {name: value for name in names}


COMMON = ["temperature", "top_p", "top_k", "seed", "stop", "stream", "n", "min_tokens", "stop_token_ids",
          "response_format", "tool_choice", "repetition_penalty", "ignore_eos", "request_timeout", "logprobs",
          "stream_options", "guided_json", "disable_speculative_decoding"]
completion = st.fixed_dictionaries(
    {"prompt": st.one_of(odd_text, st.lists(extreme_numbers, max_size=4), anything)},
    optional={"max_tokens": st.one_of(small, extreme_numbers), "model": anything, **_fields(COMMON)})
message = st.fixed_dictionaries({"role": st.one_of(st.sampled_from(["user", "system", "assistant"]), anything),
                                 "content": st.one_of(odd_text, anything)})
chat = st.fixed_dictionaries(
    {"messages": st.one_of(st.lists(message, min_size=1, max_size=2), anything)},
    optional={"max_tokens": st.one_of(small, extreme_numbers), "max_completion_tokens": small, **_fields(COMMON)})
SAMPLING = ["temperature", "top_p", "top_k", "min_new_tokens", "stop", "stop_token_ids", "ignore_eos",
            "sampling_seed", "min_p", "repetition_penalty", "json_schema", "n"]
sampling_params = st.fixed_dictionaries({}, optional={"max_new_tokens": st.one_of(small, extreme_numbers),
                                                      **_fields(SAMPLING)})
generate = st.fixed_dictionaries(
    {}, optional={"text": st.one_of(odd_text, st.lists(odd_text, max_size=3), anything),
                  "input_ids": st.one_of(st.lists(extreme_numbers, max_size=4), anything),
                  "sampling_params": st.one_of(sampling_params, st.lists(sampling_params, max_size=2), anything),
                  "stream": st.one_of(st.booleans(), anything), "rid": anything, "model": anything,
                  "return_logprob": anything, "log_metrics": anything})
ROUTES = [("/v1/completions", completion), ("/v1/chat/completions", chat), ("/generate", generate)]


@pytest.fixture(scope="module")
def http():
    target, head = random_models()
    engine = Engine(target, head, "EAGLE", max_batch_size=4, max_seq_len=48, tokenizer=CharTokenizer())
    with running_server(create_app(engine, "random-char", max_prompt_chars=64)) as url, \
            httpx.Client(base_url=url, timeout=30) as session:
        yield session


def _check(http, route, body):
    raw = json.dumps(body, ensure_ascii=True, allow_nan=True)
    response = http.post(route, content=raw, headers={"Content-Type": "application/json"})
    assert response.status_code == 200 or 400 <= response.status_code < 500, (body, response.text)
    if response.status_code != 200:
        error = response.json()["error"]
        assert error["message"] and error["type"], body
    elif "text/event-stream" in response.headers.get("content-type", ""):
        assert response.text.rstrip().endswith("data: [DONE]"), (body, response.text[-300:])
        assert '"error"' not in response.text, (body, response.text[-300:])
    else:
        response.json()
    ok = http.post("/v1/completions", json={"prompt": "ab", "max_tokens": 1, "temperature": 0})
    assert ok.status_code == 200, (body, ok.text)


@pytest.mark.parametrize("route, bodies", ROUTES, ids=[route for route, _ in ROUTES])
def test_fuzzed_bodies_get_200_or_a_json_4xx_and_the_server_keeps_serving(http, route, bodies):
    @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(body=bodies)
    def fuzz(body):
        _check(http, route, body)
    fuzz()
    assert http.get("/health").json() == {"status": "ok"}

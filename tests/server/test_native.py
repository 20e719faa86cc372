"""SGLang's native API (/generate, internal_states) over a small random model, driven as SGLang's clients drive
it: the tier moves up and down through /generate alone and is read back from /server_info."""

import json
import random
import string

import httpx
import pytest

from server_helpers import CharTokenizer, random_models, running_server
from specswap.engine import Engine
from specswap.sampling import SamplingParams
from specswap.server import native
from specswap.server.app import create_app

MODEL = "random-char"
MAX_SEQ_LEN = 256
# SGLang's own adaptive e2e test uses this policy: two tiers, the EMA is the last batch, a decision every batch
SGLANG_TEST_POLICY = {"candidate_steps": [1, 3], "ema_alpha": 1.0, "warmup_batches": 1, "update_interval": 1,
                      "up_hysteresis": 0.0}
# greedy decoding of this prompt repeats "q": prompt lookup drafts are all accepted
HIGH_ACCEPT = "q" * 8
# every character occurs in it, so prompt lookup always drafts, and sampled text at temperature 2 rejects it
LOW_ACCEPT = "".join(random.Random(0).sample(string.ascii_letters + string.digits + string.punctuation, 94)) * 2


def make_engine(models, steps=3):
    target, _ = models
    return Engine(target, None, "NGRAM", speculative_num_steps=steps, speculative_adaptive=True,
                  speculative_adaptive_config=SGLANG_TEST_POLICY, max_batch_size=4, max_seq_len=MAX_SEQ_LEN,
                  tokenizer=CharTokenizer())


@pytest.fixture(scope="module")
def models():
    return random_models()


@pytest.fixture(scope="module")
def http(models):
    with running_server(create_app(make_engine(models), MODEL)) as url, \
            httpx.Client(base_url=url, timeout=60) as session:
        yield session


def generate(http, body, status=200):
    response = http.post("/generate", json=body)
    assert response.status_code == status, response.text
    return response.json()


def steps_of(http) -> int:
    return http.get("/server_info").json()["internal_states"][0]["speculative_num_steps"]


def test_tier_moves_up_and_down_through_generate_alone(models):
    """What SGLang's adaptive e2e test does: high-acceptance prompts until the tier reads 3, low-acceptance ones
    until it reads 1, and up again; every answer carries its own verify count and acceptance histogram."""
    with running_server(create_app(make_engine(models, steps=1), MODEL)) as url, \
            httpx.Client(base_url=url, timeout=60) as session:

        def drive(prompt, temperature, target, attempts):
            for _ in range(attempts):
                out = generate(session, {"text": prompt, "sampling_params": {
                    "temperature": temperature, "max_new_tokens": 48, "ignore_eos": True}})
                meta = out["meta_info"]
                assert meta["completion_tokens"] == 48 and meta["finish_reason"] == {"type": "length", "length": 48}
                assert meta["spec_verify_ct"] > 0 and sum(meta["spec_correct_drafts_histogram"]) == meta[
                    "spec_verify_ct"]
                assert meta["spec_accept_length"] == pytest.approx(48 / meta["spec_verify_ct"])
                if steps_of(session) == target:
                    return meta
            return None

        assert steps_of(session) == 1
        high = drive(HIGH_ACCEPT, 0, 3, attempts=4)
        assert high is not None, "never moved up to 3 steps"
        assert high["spec_accept_rate"] > 0.8 and high["spec_correct_drafts_histogram"][3] > 0
        low = drive(LOW_ACCEPT, 2.0, 1, attempts=6)
        assert low is not None, "never moved down to 1 step"
        assert low["spec_accept_rate"] < 0.2
        assert drive(HIGH_ACCEPT, 0, 3, attempts=4) is not None, "never moved back up"
        info = session.get("/server_info").json()
        state = info["internal_states"][0]
        assert state["speculative_num_draft_tokens"] == 4 and state["avg_spec_accept_length"] > 1.0
        assert info["num_switches"] >= 3
        assert session.get("/get_server_info").json()["internal_states"][0]["speculative_num_steps"] == 3


def test_generate_text_matches_the_openai_route_and_target_only_decoding(http, models):
    out = generate(http, {"text": "while True:", "sampling_params": {"temperature": 0, "max_new_tokens": 20}})
    reference = Engine(models[0], None, None, max_seq_len=MAX_SEQ_LEN, tokenizer=CharTokenizer())
    assert out["text"] == reference.generate(["while True:"], 20)[0].text
    assert len(out["output_ids"]) == 20 and CharTokenizer().decode(out["output_ids"]) == out["text"]
    completion = http.post("/v1/completions", json={"prompt": "while True:", "max_tokens": 20, "temperature": 0})
    assert completion.json()["choices"][0]["text"] == out["text"]
    meta = out["meta_info"]
    assert meta["prompt_tokens"] == completion.json()["usage"]["prompt_tokens"] == len("while True:") + 1
    assert set(meta) >= {"id", "finish_reason", "prompt_tokens", "completion_tokens", "spec_verify_ct",
                         "spec_accept_length", "spec_num_correct_drafts", "e2e_latency"}


def test_batched_text_and_input_ids(http):
    prompts = ["x = 1", "def f():", "qqq"]
    greedy = {"temperature": 0, "max_new_tokens": 12}
    singles = [generate(http, {"text": p, "sampling_params": greedy}) for p in prompts]
    batch = generate(http, {"text": prompts, "sampling_params": greedy})
    assert isinstance(batch, list) and [out["text"] for out in batch] == [out["text"] for out in singles]
    ids = [[0, *CharTokenizer().encode(p)] for p in prompts]  # what the engine makes of text: BOS first
    by_ids = generate(http, {"input_ids": ids, "sampling_params": [{**greedy, "max_new_tokens": n} for n in (4, 8, 12)]})
    assert [out["output_ids"] for out in by_ids] == [out["output_ids"][:n] for out, n in zip(singles, (4, 8, 12))]
    assert [out["meta_info"]["prompt_tokens"] for out in by_ids] == [len(i) for i in ids]
    single_ids = generate(http, {"input_ids": ids[0], "sampling_params": greedy})
    assert isinstance(single_ids, dict) and single_ids["text"] == singles[0]["text"]


def stream_lines(http, body):
    with http.stream("POST", "/generate", json=body) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in response.iter_lines() if line]
    assert lines[-1] == "data: [DONE]" and all(line.startswith("data: ") for line in lines)
    return [json.loads(line[len("data: "):]) for line in lines[:-1]]


def test_streaming_sends_the_text_so_far_then_done(http):
    body = {"text": "for i in range(10):", "sampling_params": {"temperature": 0, "max_new_tokens": 24}}
    whole = generate(http, body)
    chunks = stream_lines(http, {**body, "stream": True})
    assert len(chunks) > 1 and chunks[-1]["text"] == whole["text"]
    assert all(whole["text"].startswith(chunk["text"]) for chunk in chunks)  # cumulative, never taken back
    assert [chunk["meta_info"]["finish_reason"] for chunk in chunks[:-1]] == [None] * (len(chunks) - 1)
    assert chunks[-1]["meta_info"]["finish_reason"] == {"type": "length", "length": 24}
    assert "index" not in chunks[-1]
    batch = stream_lines(http, {"text": ["ab", "cd"], "sampling_params": {"temperature": 0, "max_new_tokens": 10},
                                "stream": True})
    finals = {chunk["index"]: chunk for chunk in batch if chunk["meta_info"]["finish_reason"] is not None}
    assert sorted(finals) == [0, 1] and all(len(chunk["output_ids"]) == 10 for chunk in finals.values())


def test_stop_string_is_cut_and_named(http):
    greedy = {"temperature": 0, "max_new_tokens": 30}
    full = generate(http, {"text": "while True:", "sampling_params": greedy})["text"]
    stop = full[10:13]
    out = generate(http, {"text": "while True:", "sampling_params": {**greedy, "stop": [stop]}})
    assert out["text"] == full[:full.find(stop)]
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    chunks = stream_lines(http, {"text": "while True:", "sampling_params": {**greedy, "stop": stop}, "stream": True})
    assert chunks[-1]["text"] == out["text"] and all(out["text"].startswith(c["text"]) for c in chunks)


def test_finish_reason_objects():
    params = SamplingParams(max_new_tokens=5, stop=("END",))
    decode = CharTokenizer().decode
    assert native.finish_reason(None, [5], "x", params, frozenset({1}), decode) is None
    assert native.finish_reason("length", [5, 6], "xy", params, frozenset({1}), decode) == {"type": "length",
                                                                                          "length": 2}
    assert native.finish_reason("stop", [5, 1], "x", params, frozenset({1}), decode) == {"type": "stop", "matched": 1}
    ids = CharTokenizer().encode("abEND")
    assert native.finish_reason("stop", ids, "ab", params, frozenset({1}), decode) == {"type": "stop",
                                                                                     "matched": "END"}
    assert native.finish_reason("abort", [5], "x", params, frozenset(), decode)["type"] == "abort"


def test_sampling_params_left_at_their_neutral_value_are_accepted(http):
    out = generate(http, {"text": "abc", "sampling_params": {
        "max_new_tokens": 3, "temperature": 0.7, "top_p": 0.9, "top_k": -1, "sampling_seed": 4,
        "repetition_penalty": 1.0, "frequency_penalty": 0.0, "n": 1, "skip_special_tokens": True,
        "stop_token_ids": []}})
    assert out["meta_info"]["completion_tokens"] == 3


@pytest.mark.parametrize("body, param", [
    ({"text": "a", "input_ids": [5, 6]}, "text"),
    ({"sampling_params": {"max_new_tokens": 3}}, "text"),
    ({"text": 5}, "text"),
    ({"text": []}, "text"),
    ({"text": ["a", 3]}, "text"),
    ({"input_ids": "abc"}, "input_ids"),
    ({"input_ids": [[5], []]}, "input_ids"),
    ({"input_ids": [5, 6, 1000]}, "input_ids"),                      # outside the vocabulary
    ({"input_ids": [[5, 6], [7, 1000]]}, "input_ids"),
    ({"text": "a" * (MAX_SEQ_LEN + 5)}, "text"),                      # longer than the context
    ({"text": "a", "sampling_params": "greedy"}, "sampling_params"),
    ({"text": "a", "sampling_params": {"temperature": -1}}, "sampling_params.temperature"),
    ({"text": "a", "sampling_params": {"temperature": "hot"}}, "sampling_params.temperature"),
    ({"text": "a", "sampling_params": {"top_p": 0}}, "sampling_params.top_p"),
    ({"text": "a", "sampling_params": {"top_k": -2}}, "sampling_params.top_k"),
    ({"text": "a", "sampling_params": {"max_new_tokens": 0}}, "sampling_params.max_new_tokens"),
    ({"text": "a", "sampling_params": {"max_new_tokens": "8"}}, "sampling_params.max_new_tokens"),
    ({"text": "a", "sampling_params": {"stop": [1]}}, "sampling_params.stop"),
    ({"text": "a", "sampling_params": {"ignore_eos": "yes"}}, "sampling_params.ignore_eos"),
    ({"text": "a", "sampling_params": {"max_new_token": 8}}, "sampling_params.max_new_token"),  # unknown key
    ({"text": "a", "sampling_params": {"repetition_penalty": 1.3}}, "sampling_params.repetition_penalty"),
    ({"text": ["a", "b"], "sampling_params": [{}]}, "sampling_params"),
    ({"text": ["a", "b"], "sampling_params": [{}, {"top_p": 2}]}, "sampling_params[1].top_p"),
    ({"text": "a", "stream": "yes"}, "stream"),
    ({"text": "a", "return_logprob": True}, "return_logprob"),
])
def test_bad_generate_requests_are_400(http, body, param):
    response = http.post("/generate", json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and error["message"]


def test_max_new_tokens_beyond_the_context_is_400_naming_the_limit(http):
    error = generate(http, {"text": "abc", "sampling_params": {"max_new_tokens": MAX_SEQ_LEN}}, 400)["error"]
    assert error["code"] == "context_length_exceeded" and error["param"] == "max_new_tokens"
    assert f"maximum context length is {MAX_SEQ_LEN} tokens" in error["message"]
    assert f"requested {MAX_SEQ_LEN + 4} tokens (4 in the prompt, {MAX_SEQ_LEN} in the completion)" in error["message"]
    fits = generate(http, {"text": "abc", "sampling_params": {"max_new_tokens": MAX_SEQ_LEN - 4, "temperature": 0}})
    assert fits["meta_info"]["completion_tokens"] == MAX_SEQ_LEN - 4


def test_a_batch_with_one_bad_prompt_runs_none(http):
    before = http.get("/server_info").json()["requests_finished"]
    generate(http, {"input_ids": [[5, 6], [7, 1000]], "sampling_params": {"max_new_tokens": 50}}, 400)
    after = http.get("/server_info").json()
    assert after["num_requests_running"] == 0 and after["requests_finished"] == before  # checked before queueing


def test_invalid_json_and_non_object_bodies(http):
    bad = http.post("/generate", content=b"{nope", headers={"Content-Type": "application/json"})
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_json"
    assert http.post("/generate", content=b"[1, 2]").status_code == 400

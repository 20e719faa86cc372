"""SUFFIX through the server: the per-request ``suffix_cache_output`` field (an OpenAI body field, a /generate
sampling parameter; a 400 naming it unless a boolean) keeps a request's output out of the global tree;
``/flush_cache`` empties the tree on the scheduler thread (refused while requests run, a 400 naming why the engine
refused); ``/server_info`` reports the tree's size. The engine refuses a flush under tensor parallelism with
replicated trees."""

import threading
from types import SimpleNamespace

import httpx
import pytest

from components import require_module
from server_helpers import CharTokenizer, random_models, running_server
from specswap.engine import Engine
from specswap.server.app import create_app
from specswap.worker.suffix import INSTALL

require_module("arctic_inference", "arctic-inference's suffix trees (SUFFIX)", INSTALL)

COMPLETION = {"prompt": "ab ab ab", "max_tokens": 6, "temperature": 0}
GENERATE = {"text": "ab ab ab", "sampling_params": {"max_new_tokens": 6, "temperature": 0}}


def suffix_engine():
    target, _ = random_models()
    return Engine(target, None, "SUFFIX", max_batch_size=2, max_seq_len=128, tokenizer=CharTokenizer())


@pytest.fixture(scope="module")
def served():
    engine = suffix_engine()
    with running_server(create_app(engine, "m")) as url, httpx.Client(base_url=url, timeout=60) as http:
        yield engine, http


def tree(http) -> dict:
    return http.get("/server_info").json()["suffix_global_tree"]


def test_suffix_cache_output_keeps_a_request_out_of_the_global_tree_on_every_route(served):
    _, http = served
    assert http.post("/flush_cache").status_code == 200
    assert tree(http)["cached_requests"] == 0
    private = [("/v1/completions", {**COMPLETION, "suffix_cache_output": False}),
               ("/v1/chat/completions", {"messages": [{"role": "user", "content": "ab ab"}], "max_tokens": 4,
                                         "suffix_cache_output": False}),
               ("/generate", {**GENERATE, "sampling_params": {**GENERATE["sampling_params"],
                                                              "suffix_cache_output": False}})]
    for path, body in private:
        assert http.post(path, json=body).status_code == 200, path
    assert tree(http)["cached_requests"] == 0
    shared = [("/v1/completions", COMPLETION), ("/v1/completions", {**COMPLETION, "suffix_cache_output": True}),
              ("/v1/completions", {**COMPLETION, "suffix_cache_output": None}), ("/generate", GENERATE)]
    for path, body in shared:
        assert http.post(path, json=body).status_code == 200, path
    info = tree(http)
    assert info["cached_requests"] == len(shared) and info["cached_tokens"] >= 6 * len(shared)
    assert info["bytes"] > 0 and info["max_cached_requests"] == 10000


@pytest.mark.parametrize("path,body,param", [
    ("/v1/completions", {**COMPLETION, "suffix_cache_output": "no"}, "suffix_cache_output"),
    ("/v1/completions", {**COMPLETION, "suffix_cache_output": 0}, "suffix_cache_output"),
    ("/generate", {**GENERATE, "sampling_params": {"suffix_cache_output": 1}}, "sampling_params.suffix_cache_output"),
])
def test_a_non_boolean_suffix_cache_output_is_a_400_naming_it(served, path, body, param):
    _, http = served
    response = http.post(path, json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and "must be a boolean" in error["message"]


def test_flush_cache_empties_the_tree_on_the_scheduler_thread(served, monkeypatch):
    engine, http = served
    assert http.post("/generate", json=GENERATE).status_code == 200
    assert tree(http)["cached_tokens"] > 0
    threads = []
    flush = engine.flush_cache
    monkeypatch.setattr(engine, "flush_cache", lambda: (threads.append(threading.current_thread().name), flush()))
    response = http.get("/flush_cache")
    assert response.status_code == 200 and response.json()["success"] is True
    assert threads == ["specswap-scheduler"]  # never the event loop's thread
    info = http.get("/server_info").json()
    assert info["suffix_global_tree"]["cached_tokens"] == 0 and info["suffix_global_tree"]["cached_requests"] == 0


def test_a_flush_the_engine_refuses_is_a_400_naming_why(served, monkeypatch):
    engine, http = served

    def refuse():
        raise ValueError("flush_cache is refused under tensor parallelism with tp_draft 'replicate'")
    monkeypatch.setattr(engine, "flush_cache", refuse)
    response = http.post("/flush_cache")
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "flush_failed" and "tp_draft 'replicate'" in error["message"]
    assert http.post("/generate", json=GENERATE).status_code == 200  # the loop goes on


def test_the_engine_refuses_a_flush_of_replicated_trees_under_tensor_parallelism():
    engine = suffix_engine()
    engine.generate(["ab ab ab"], 6)
    engine.dist = SimpleNamespace(group=SimpleNamespace(tp_size=2))  # as a tensor-parallel rank sees itself
    engine.tp_draft = "replicate"
    with pytest.raises(ValueError, match="refused under tensor parallelism with tp_draft 'replicate'"):
        engine.flush_cache()
    assert engine.stats()["suffix_global_tree"]["cached_requests"] == 1
    engine.tp_draft = "leader"  # only the leader holds trees: its flush is the group's
    engine.flush_cache()
    assert engine.stats()["suffix_global_tree"]["cached_requests"] == 0
    engine.dist = None

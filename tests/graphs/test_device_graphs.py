"""Graph runners on the test device (``SPECSWAP_TEST_DEVICE``, tests/conftest.py; ``tools/gpu_check.sh`` sets
``cuda``, CI runs them on the CPU): every stage of every tier in every bucket, padded ones included, with the
EAGLE head, and the engine end to end (greedy output identical to target-only decoding at every tier, a tier
switch every round, nothing captured after start-up)."""

import pytest
import torch

from specswap import zoo
from specswap._core import _C
from specswap.engine import Engine
from specswap.graphs import GraphContext, StageGraphs, capture_count

from test_graphs import CAPACITY, MAX_BATCH, small_head, small_target

TIERS = (1, 3, 7)
VOCAB = 96  # small_target's vocabulary: the ids every stage reads are target ids
LENGTHS = [7, 30, 70, 100]  # prompts already in slots 0..3: reads end in the 64, 128 and 160 key buckets


@pytest.fixture(autouse=True)
def _needs_the_backend(device):
    if device.type not in _C.compiled_backends():
        pytest.fail(f"the test device is {device} but this build has graph backends {_C.compiled_backends()}; "
                    f"rebuild with -DSPECSWAP_WITH_{device.type.upper()}=ON (tools/gpu_check.sh does)")


def test_a_device_without_index_is_the_current_one(device):
    # torch.device("cuda") makes tensors on cuda:<current>; the pool must accept them as its own
    pool = _C.GraphPool(torch.device(device.type))
    assert pool.device == torch.empty(0, device=device.type).device
    runner = _C.GraphRunner("verify", 1, 1, pool)
    runner.set_buffer("x", torch.zeros(2, device=device.type))
    if device.type != "cpu":
        with pytest.raises(ValueError, match="does not exist; valid: cuda:0"):
            _C.GraphPool(torch.device(device.type, torch.cuda.device_count()))


def _models(device, token_map=None):
    # the head is built after the target moved: it shares the target's embedding and LM head, and puts its
    # token map (a plain attribute, which .to() does not move) on their device
    target = small_target().to(device)
    return target, small_head(target, token_map).to(device)


def _caches(model, device, with_features):
    """Two caches holding the same random prompts in slots 0..3 (row 4: the scratch row): graphs, eager."""
    caches = [model.make_cache(MAX_BATCH + 1, CAPACITY, device=device) for _ in range(2)]
    generator = torch.Generator().manual_seed(5)
    for slot, length in enumerate(LENGTHS):
        ids = torch.randint(0, VOCAB, (1, length), generator=generator).to(device)
        features = torch.randn(1, length, model.config.hidden_size, generator=generator).to(device) \
            if with_features else None
        for cache in caches:
            _forward(model, ids, torch.arange(length, device=device)[None], cache, torch.tensor([slot], device=device),
                     None, features)
    return caches


def _forward(model, ids, positions, cache, slots, key_length, features):
    if features is None:
        return model(ids, positions, cache, slots, key_length=key_length)
    return model(ids, features[:, :ids.shape[1]], positions, cache, slots, key_length=key_length)


def _check_stage(device, stage, steps, model, num_tokens, with_features):
    cache_graph, cache_eager = _caches(model, device, with_features)
    context = GraphContext(device, MAX_BATCH, CAPACITY)
    context.share_model(model, cache_graph)
    graphs = StageGraphs(context, stage, steps, model, cache_graph, num_tokens, with_features=with_features)
    graphs.capture()
    assert {runner.backend for runner in graphs.runners.values()} == {device.type}
    assert set(graphs.runners) == {(b, k) for b in (1, 2, 4) for k in (64, 128, 160) if k >= num_tokens}
    # a runner's memory: its own buffers (the logits among them) plus what the backend keeps for the captured work
    # (the CPU tape's intermediates, if any; on an accelerator the graph memory its capture reserved, where the
    # first capture into a fresh pool reserves at least one segment)
    buffers = sum(runner.buffer(name).nbytes for runner in graphs.runners.values()
                  for name in runner.buffer_names() if not runner.pool.is_shared(runner.buffer(name)))
    for (bucket, _), runner in graphs.runners.items():
        logits = runner.buffer("logits")
        assert logits.shape[:2] == (bucket, num_tokens) and runner.memory_bytes() >= logits.nbytes > 0
    if device.type == "cpu":
        assert graphs.memory_bytes() >= buffers, (graphs.memory_bytes(), buffers)
    else:
        assert graphs.memory_bytes() > buffers, (graphs.memory_bytes(), buffers)
    captured = capture_count()
    generator = torch.Generator().manual_seed(steps)
    hidden_size = model.config.hidden_size
    for batch in (1, 2, 3, 4):  # 3 runs padded in the bucket of 4: its 4th row writes the scratch cache row
        slots = torch.arange(batch, device=device)
        positions = torch.tensor(LENGTHS[:batch], device=device)[:, None] + torch.arange(num_tokens, device=device)
        ids = torch.randint(0, VOCAB, (batch, num_tokens), generator=generator).to(device)
        features = torch.randn(batch, num_tokens, hidden_size, generator=generator).to(device) if with_features \
            else None
        key_length = int(positions.max()) + 1
        bucket, bucket_keys = graphs.runner_for(batch, key_length)
        out = graphs(ids, positions, slots, key_length, features)
        ref = _forward(model, ids, positions, cache_eager, slots, bucket_keys, features)
        where = f"{stage} k={steps} batch={batch} bucket=({bucket}, {bucket_keys})"
        if bucket == batch:  # the same kernels on the same shapes: the same bits
            assert torch.equal(out.logits, ref.logits), where
            assert torch.equal(out.hidden, ref.hidden), where
        else:  # a padded batch runs its matmuls at another size, which may sum in another order
            torch.testing.assert_close(out.logits, ref.logits, rtol=0, atol=1e-5, msg=where)
        assert torch.equal(out.logits.argmax(-1), ref.logits.argmax(-1)), where
        for layer in range(len(cache_graph.keys)):  # real rows agree; padding wrote only the scratch row
            torch.testing.assert_close(cache_graph.keys[layer][:MAX_BATCH], cache_eager.keys[layer][:MAX_BATCH],
                                       rtol=0, atol=1e-5, msg=where)
    assert capture_count() == captured, "a replay captured"


@pytest.mark.parametrize("steps", TIERS)
@torch.inference_mode()
def test_verify_replays_eager_in_every_bucket(device, steps):
    target, _ = _models(device)
    _check_stage(device, "verify", steps, target, steps + 1, with_features=False)


@pytest.mark.parametrize("steps", TIERS)
@pytest.mark.parametrize("token_map", [None, list(range(0, 96, 2))], ids=["full_vocab", "token_map"])
@torch.inference_mode()
def test_eagle_head_draft_extend_replays_eager_in_every_bucket(device, steps, token_map):
    _, head = _models(device, token_map)
    _check_stage(device, "draft_extend", steps, head, steps + 1, with_features=True)


@pytest.mark.parametrize("token_map", [None, list(range(0, 96, 2))], ids=["full_vocab", "token_map"])
@torch.inference_mode()
def test_eagle_head_draft_step_replays_eager_in_every_bucket(device, token_map):
    _, head = _models(device, token_map)
    _check_stage(device, "draft", 3, head, 1, with_features=True)


@pytest.mark.parametrize("num_tokens", [1, 2])
@torch.inference_mode()
def test_standalone_draft_steps_replay_eager_in_every_bucket(device, num_tokens):
    target, _ = _models(device)
    _check_stage(device, "draft", 3, target, num_tokens, with_features=False)


tiny_built = all((zoo.path(name) / "model.safetensors").is_file() for name in zoo.NAMES)
TEXTS = ["def fibonacci(n):\n    ", "The purpose of this module is", "x", "for i in range(10):\n    print("]
MAX_NEW_TOKENS = 32


@pytest.fixture(scope="module")
def tiny_reference(device):
    if not tiny_built:
        pytest.skip("tiny zoo weights are not built (python -m specswap.zoo train tiny)")
    engine = Engine("tiny", None, None, device=device, dtype="float32", max_seq_len=128, max_batch_size=4)
    assert engine.worker.graph_context is not None
    return [r.token_ids for r in engine.generate(TEXTS, MAX_NEW_TOKENS)]


def _generate_switching_every_round(engine, cycle):
    """Every prompt at once, the worker put on the next tier of ``cycle`` before every round."""
    ids = [engine.add_request(text, max_new_tokens=MAX_NEW_TOKENS) for text in TEXTS]
    round_index, finished = 0, {}
    while engine.has_unfinished():
        engine.worker.pool.activate(cycle[round_index % len(cycle)])
        finished.update((output.request_id, output) for output in engine.step().finished)
        round_index += 1
    return [finished[i].token_ids for i in ids]


@pytest.mark.parametrize("algorithm", ["EAGLE", "STANDALONE", "NGRAM"])
def test_engine_is_lossless_while_the_tier_changes_every_round(device, tiny_reference, algorithm):
    cycle = [1, 7, 2, 6, 3, 5, 4]  # every tier, each round a different one from the last
    engine = Engine("tiny", speculative_algorithm=algorithm, device=device, dtype="float32", max_seq_len=128,
                    max_batch_size=4, speculative_adaptive=True,
                    speculative_adaptive_config={"candidate_steps": sorted(cycle), "warmup_batches": 0})
    assert engine.target.device.type == device.type and engine.worker.graph_context is not None
    captured = capture_count()  # every tier was captured at start-up
    assert _generate_switching_every_round(engine, cycle) == tiny_reference
    assert capture_count() == captured, "a tier switch captured new graphs"
    ran = {tier for tier, count in engine.stats()["rounds_per_tier"].items() if count}
    if algorithm == "NGRAM":  # a round where no request's last token occurs earlier is a plain decode (tier 0)
        assert len(ran - {0}) >= 2, ran
    else:
        assert set(cycle) <= ran, ran

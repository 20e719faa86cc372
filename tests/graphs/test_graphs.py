"""Graph capture and replay: replay == eager, buckets, padding, capture counting, memory, backend choice."""

import pytest
import torch

from specswap import SpecRuntimeState, StatePool
from specswap._core import _C
from specswap.graphs import GraphContext, StageGraphs, batch_buckets, capture_count, key_buckets
from specswap.models import EagleConfig, EagleHead, LlamaConfig, LlamaForCausalLM

MAX_BATCH = 4
CAPACITY = 160


def small_target(seed=0):
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=512)
    return LlamaForCausalLM(config).eval()


def small_head(target, token_map=None):
    torch.manual_seed(1)
    config = EagleConfig.for_target(target.config, None if token_map is None else len(token_map))
    return EagleHead(config, target.embed_tokens, target.lm_head,
                     None if token_map is None else torch.tensor(token_map)).eval()


def test_buckets():
    assert key_buckets(160) == (64, 128, 160)
    assert key_buckets(64) == (64,)
    assert batch_buckets(8) == (1, 2, 4, 8)
    assert batch_buckets(6) == (1, 2, 4, 6)
    assert batch_buckets(1) == (1,)


def _fill_cache(model, cache, lengths):
    """Eager prefill of random prompts into slots 0..len-1."""
    for slot, length in enumerate(lengths):
        ids = torch.randint(0, model.config.vocab_size, (1, length))
        model(ids, torch.arange(length)[None], cache, torch.tensor([slot]))


def _twin_caches(model, lengths):
    """Two caches holding the same random prompts in slots 0..len-1: one for graphs, one for eager."""
    caches = model.make_cache(MAX_BATCH + 1, CAPACITY), model.make_cache(MAX_BATCH + 1, CAPACITY)
    torch.manual_seed(5)
    state = torch.get_rng_state()
    for cache in caches:
        torch.set_rng_state(state)
        _fill_cache(model, cache, lengths)
    return caches


@pytest.mark.parametrize("num_tokens", [1, 4])
@torch.inference_mode()
def test_target_replay_equals_eager_in_every_bucket(num_tokens):
    target = small_target()
    lengths = [7, 30, 70, 100]
    cache_graph, cache_eager = _twin_caches(target, lengths)
    context = GraphContext(torch.device("cpu"), MAX_BATCH, CAPACITY)
    graphs = StageGraphs(context, "verify", num_tokens - 1, target, cache_graph, num_tokens, with_features=False)
    graphs.capture()
    assert set(graphs.runners) == {(b, k) for b in (1, 2, 4) for k in (64, 128, 160)}
    for batch in (1, 2, 3, 4):
        slots = torch.arange(batch)
        starts = torch.tensor(lengths[:batch])
        positions = starts[:, None] + torch.arange(num_tokens)                # [B, T]
        input_ids = torch.randint(0, 96, (batch, num_tokens))
        key_length = int(positions.max()) + 1
        out = graphs(input_ids, positions, slots, key_length)
        bucket_keys = graphs.runner_for(batch, key_length)[1]
        ref = target(input_ids, positions, cache_eager, slots, key_length=bucket_keys)
        if graphs.runner_for(batch, key_length)[0] == batch:
            # the same kernels on the same shapes: bit-identical
            assert torch.equal(out.logits, ref.logits), (batch, num_tokens)
            assert torch.equal(out.hidden, ref.hidden)
        else:
            # a padded batch runs the matmuls at another M, which may block the sums differently
            torch.testing.assert_close(out.logits, ref.logits, rtol=0, atol=1e-5)
        assert torch.equal(out.logits.argmax(-1), ref.logits.argmax(-1))
        for slot in range(batch):  # the caches of real requests agree; padding only touched the scratch row
            for layer in range(target.config.num_hidden_layers):
                torch.testing.assert_close(cache_graph.keys[layer][slot], cache_eager.keys[layer][slot],
                                           rtol=0, atol=1e-5)


@pytest.mark.parametrize("token_map", [None, list(range(0, 96, 2))])
@torch.inference_mode()
def test_head_graphs_with_logits_at_give_the_logits_at_each_request_s_index(token_map):
    """The draft-extend graphs of an EAGLE head compute the LM head at one index per request (the accepted length):
    those rows equal the full forward's logits at that index, padded batches included, and the hidden states are
    every position's; a replay must pass logits_at exactly when the graphs were captured with it."""
    target = small_target()
    head = small_head(target, token_map)
    lengths = [7, 30, 70, 100]
    head_graph, head_eager = head.make_cache(MAX_BATCH + 1, CAPACITY), head.make_cache(MAX_BATCH + 1, CAPACITY)
    context = GraphContext(torch.device("cpu"), MAX_BATCH, CAPACITY)
    graphs = StageGraphs(context, "draft_extend", 3, head, head_graph, 4, with_features=True, logits_at=True)
    graphs.capture()
    for batch in (1, 3, 4):
        slots = torch.arange(batch)
        positions = torch.tensor(lengths[:batch])[:, None] + torch.arange(4)          # [B, 4]
        input_ids = torch.randint(0, 96, (batch, 4))
        features = torch.randn(batch, 4, target.config.hidden_size)
        index = torch.tensor([3, 0, 2, 1][:batch])
        key_length = int(positions.max()) + 1
        out = graphs(input_ids, positions, slots, key_length, features, logits_at=index)
        ref = head(input_ids, features, positions, head_eager, slots,
                   key_length=graphs.runner_for(batch, key_length)[1])
        assert out.logits.shape == (batch, 1, ref.logits.shape[-1])
        torch.testing.assert_close(out.logits[:, 0], ref.logits[torch.arange(batch), index], rtol=0, atol=1e-5)
        torch.testing.assert_close(out.hidden, ref.hidden, rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match="captured with logits_at; a replay must pass it"):
        graphs(input_ids, positions, slots, key_length, features)
    plain = StageGraphs(context, "verify", 0, target, target.make_cache(MAX_BATCH + 1, CAPACITY), 1,
                        with_features=False)
    plain.capture()
    with pytest.raises(ValueError, match="captured without logits_at; a replay must not pass it"):
        plain(input_ids[:, :1], positions[:, :1], slots, key_length, logits_at=index)


@pytest.mark.requires_cpu("onednn_bf16")  # mkldnn::_reorder_linear_weight refuses bf16 without it
@torch.inference_mode()
def test_packed_bf16_linears_replay_the_same_bits_as_eager():
    target = small_target().to(torch.bfloat16)
    lengths = [7, 30, 70, 100]
    cache_graph, cache_eager = _twin_caches(target, lengths)
    context = GraphContext(torch.device("cpu"), MAX_BATCH, CAPACITY)
    context.share_model(target, cache_graph)
    context.pool.pack_linear_weights = True
    graphs = StageGraphs(context, "verify", 3, target, cache_graph, 4, with_features=False)
    graphs.capture()
    # every linear of the layers and the LM head, packed once for all 9 runners (not once per runner)
    weights = [m.weight for m in target.modules() if isinstance(m, torch.nn.Linear)]
    assert context.pool.derived_bytes == sum(w.numel() * w.element_size() for w in weights)
    # ... and counted there, not by each runner: the runners hold what they would hold without packing
    plain_context = GraphContext(torch.device("cpu"), MAX_BATCH, CAPACITY)
    plain_cache = target.make_cache(MAX_BATCH + 1, CAPACITY)
    plain_context.share_model(target, plain_cache)
    plain = StageGraphs(plain_context, "verify", 3, target, plain_cache, 4, with_features=False)
    plain.capture()
    assert plain_context.pool.derived_bytes == 0
    assert {k: r.memory_bytes() for k, r in graphs.runners.items()} == \
        {k: r.memory_bytes() for k, r in plain.runners.items()}
    for batch in (1, 2, 4):
        slots = torch.arange(batch)
        positions = torch.tensor(lengths[:batch])[:, None] + torch.arange(4)
        input_ids = torch.randint(0, 96, (batch, 4))
        key_length = int(positions.max()) + 1
        out = graphs(input_ids, positions, slots, key_length)
        ref = target(input_ids, positions, cache_eager, slots, key_length=graphs.runner_for(batch, key_length)[1])
        assert torch.equal(out.logits, ref.logits) and torch.equal(out.hidden, ref.hidden), batch
        lengths[:batch] = [n + 4 for n in lengths[:batch]]


@torch.inference_mode()
def test_stale_rows_of_a_larger_batch_never_write_real_slots():
    target = small_target()
    cache = target.make_cache(MAX_BATCH + 1, CAPACITY)
    _fill_cache(target, cache, [10, 10, 10, 10])
    context = GraphContext(torch.device("cpu"), MAX_BATCH, CAPACITY)
    graphs = StageGraphs(context, "verify", 0, target, cache, 1, with_features=False)
    graphs.capture()
    # a batch of 4, then a batch of 3 through the same bucket: slot 3 must not be written again
    graphs(torch.zeros(4, 1, dtype=torch.long), torch.full((4, 1), 10), torch.arange(4), 11)
    snapshot = [k[3].clone() for k in cache.keys]
    graphs(torch.ones(3, 1, dtype=torch.long), torch.full((3, 1), 11), torch.arange(3), 12)
    assert all(torch.equal(k[3], s) for k, s in zip(cache.keys, snapshot))


@torch.inference_mode()
def test_eagle_head_with_token_map_replays():
    target = small_target()
    head = small_head(target, token_map=list(range(0, 96, 2)))
    cache = head.make_cache(MAX_BATCH + 1, CAPACITY)
    context = GraphContext(torch.device("cpu"), MAX_BATCH, CAPACITY)
    graphs = StageGraphs(context, "draft_extend", 3, head, cache, 4, with_features=True)
    graphs.capture()
    ids = torch.randint(0, 96, (2, 4))
    features = torch.randn(2, 4, 32)
    positions = torch.arange(4).expand(2, -1)
    out = graphs(ids, positions, torch.arange(2), 4, features)
    assert out.logits.shape == (2, 4, 48)
    ref_cache = head.make_cache(MAX_BATCH + 1, CAPACITY)
    ref = head(ids, features, positions, ref_cache, torch.arange(2), key_length=64)
    assert torch.equal(out.logits, ref.logits)


@torch.inference_mode()
def test_capture_count_unchanged_by_thousands_of_switches():
    target = small_target()
    cache = target.make_cache(MAX_BATCH + 1, CAPACITY)
    context = GraphContext(torch.device("cpu"), MAX_BATCH, CAPACITY)
    context.share_model(target, cache)
    pool = StatePool()
    tiers = {}
    for steps in (1, 3):
        graphs = StageGraphs(context, "verify", steps, target, cache, steps + 1, with_features=False)
        graphs.capture()
        tiers[steps] = graphs
        pool.register(SpecRuntimeState(steps, steps + 1, verify=graphs))
    captured = capture_count()
    for i in range(1000):
        steps = (1, 3)[i % 2]
        pool.activate(steps)
        graphs = pool.acquire().verify
        graphs(torch.zeros(1, steps + 1, dtype=torch.long), torch.arange(steps + 1)[None] + 5, torch.tensor([0]), 9)
    assert capture_count() == captured
    assert pool.num_switches == 999


@torch.inference_mode()
def test_memory_reported_without_shared_weights():
    target = small_target()
    cache = target.make_cache(MAX_BATCH + 1, CAPACITY)
    context = GraphContext(torch.device("cpu"), MAX_BATCH, CAPACITY)
    unshared = StageGraphs(context, "verify", 1, target, cache, 2, with_features=False)
    unshared.capture()
    unshared_bytes = unshared.memory_bytes()
    context.share_model(target, cache)
    shared = StageGraphs(context, "verify", 1, target, cache, 2, with_features=False)
    shared.capture()
    weights = sum(p.numel() * p.element_size() for p in target.parameters())
    # its own buffers only: no weights, no KV cache
    assert 0 < shared.memory_bytes() < weights
    assert unshared_bytes > shared.memory_bytes() + weights
    assert unshared.memory_bytes() == shared.memory_bytes()


def test_runner_contract():
    pool = _C.GraphPool(torch.device("cpu"))
    runner = _C.GraphRunner("verify", 3, 2, pool)
    assert runner.backend == "cpu" and runner.stage == "verify" and runner.bucket == 2
    with pytest.raises(RuntimeError, match="before capture"):
        runner.replay()
    x = torch.zeros(2)
    runner.set_buffer("x", x)
    runner.capture(lambda: x.add_(1))
    runner.replay()
    assert x.tolist() == [2.0, 2.0]
    with pytest.raises(RuntimeError, match="already captured"):
        runner.capture(lambda: None)
    with pytest.raises(RuntimeError, match="after capture"):
        runner.set_buffer("y", torch.zeros(1))
    with pytest.raises(IndexError, match="no buffer 'nope'"):
        runner.buffer("nope")
    with pytest.raises(ValueError, match="unknown stage"):
        _C.GraphRunner("decode", 1, 1, pool)


def test_host_sync_inside_capture_is_refused():
    pool = _C.GraphPool(torch.device("cpu"))
    runner = _C.GraphRunner("draft", 1, 1, pool)
    x = torch.ones(3)
    with pytest.raises(RuntimeError, match="host value"):
        runner.capture(lambda: x.sum().item())
    assert not runner.captured


def test_replay_runs_the_recorded_ops_on_new_data():
    pool = _C.GraphPool(torch.device("cpu"))
    runner = _C.GraphRunner("verify", 1, 1, pool)
    a, b, out = torch.randn(4, 4), torch.randn(4, 4), torch.empty(4, 4)
    runner.capture(lambda: out.copy_(torch.softmax(a @ b + 1.0, dim=-1)))
    a.copy_(torch.randn(4, 4))
    runner.replay()
    assert torch.equal(out, torch.softmax(a @ b + 1.0, dim=-1))


def test_composites_and_views_of_buffers_replay_on_new_data():
    # linear/matmul/reshape are recorded as the kernels they reach, views of buffers are made once at
    # capture: both must still see what the buffers hold at replay, bit for bit
    pool = _C.GraphPool(torch.device("cpu"))
    runner = _C.GraphRunner("verify", 1, 1, pool)
    x, weight, cache = torch.randn(2, 3, 8), torch.randn(16, 8), torch.randn(4, 16)
    out = torch.empty(2, 3, 16)

    def forward():
        hidden = torch.nn.functional.linear(x, weight).reshape(6, 16)  # [2*3, 16]
        window = cache[1:3].t()                                          # a view of a buffer: [16, 2]
        return (hidden @ window @ window.t()).view(2, 3, 16).to(torch.float32)

    with torch.inference_mode():
        runner.capture(lambda: out.copy_(forward()))
        for _ in range(3):
            x.copy_(torch.randn(2, 3, 8))
            cache.copy_(torch.randn(4, 16))
            runner.replay()
            assert torch.equal(out, forward())


def test_row_gather_follows_the_row_index():
    # cache[rows, :, :L] (every layer's KV read) replays as index_select: the same tensor, bit for bit
    pool = _C.GraphPool(torch.device("cpu"))
    runner = _C.GraphRunner("verify", 1, 1, pool)
    cache, rows = torch.randn(3, 2, 16, 4), torch.tensor([2])
    out = torch.empty(1, 2, 8, 4)

    def gather():
        return cache[rows, :, :8] * 1.0

    with torch.inference_mode():
        runner.capture(lambda: out.copy_(gather()))
        for row in (0, 1, 2):
            rows.fill_(row)
            cache.copy_(torch.randn(3, 2, 16, 4))
            runner.replay()
            assert torch.equal(out, gather()) and torch.equal(out, cache[row:row + 1, :, :8])


def test_backend_choice_per_device():
    backends = _C.compiled_backends()
    assert "cpu" in backends
    assert _C.GraphRunner("verify", 1, 1, _C.GraphPool(torch.device("cpu"))).backend == "cpu"
    if "cuda" not in backends:
        with pytest.raises(RuntimeError, match="SPECSWAP_WITH_CUDA=ON"):
            _C.GraphPool(torch.device("cuda"))
    if "npu" not in backends:
        with pytest.raises(RuntimeError, match="SPECSWAP_WITH_NPU=ON"):
            _C.GraphPool(torch.device("privateuseone"))
    with pytest.raises(ValueError, match="no graph runner for device meta"):
        _C.GraphPool(torch.device("meta"))


def test_tensor_from_python_data_inside_capture_is_kept():
    # torch.tensor(x) is an allocation filled outside the dispatcher; replay must not re-allocate it empty
    pool = _C.GraphPool(torch.device("cpu"))
    runner = _C.GraphRunner("verify", 1, 1, pool)
    x, out = torch.randn(8), torch.empty(8)
    runner.capture(lambda: out.copy_(x * torch.tensor(2.5) + torch.tensor([1.0] * 8)))
    for _ in range(3):
        x.copy_(torch.randn(8))
        runner.replay()
        assert torch.equal(out, x * 2.5 + 1.0)


def test_scratch_allocated_inside_capture_is_rewritten_each_replay():
    pool = _C.GraphPool(torch.device("cpu"))
    runner = _C.GraphRunner("verify", 1, 1, pool)
    x, out = torch.randn(4), torch.empty(4)

    def body():
        scratch = torch.empty(4)
        torch.mul(x, 3.0, out=scratch)
        out.copy_(scratch + 1)

    runner.capture(body)
    x.copy_(torch.randn(4))
    runner.replay()
    assert torch.equal(out, x * 3.0 + 1)


def test_recording_is_confined_to_the_capturing_thread():
    # The recording key is switched on thread-locally (op_tape.cpp): an operator another thread runs during
    # the capture is not on the tape, so replay repeats only the capturing thread's work.
    import threading

    pool = _C.GraphPool(torch.device("cpu"))
    runner = _C.GraphRunner("verify", 1, 1, pool)
    mine, theirs = torch.zeros(3), torch.zeros(3)

    def body():
        other = threading.Thread(target=lambda: theirs.add_(1))
        other.start()
        other.join()
        mine.add_(1)

    runner.capture(body)
    runner.replay()
    runner.replay()
    assert mine.tolist() == [3.0, 3.0, 3.0]
    assert theirs.tolist() == [1.0, 1.0, 1.0]

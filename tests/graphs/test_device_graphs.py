"""CUDA / Ascend graph runners: run only where the device and the matching build exist (tools/gpu_check.sh)."""

import pytest
import torch

from specswap._core import _C
from specswap.graphs import GraphContext, StageGraphs, capture_count

from test_graphs import small_target

cuda_ready = torch.cuda.is_available() and "cuda" in _C.compiled_backends()


@pytest.mark.skipif(not cuda_ready, reason="needs a CUDA device and a build with SPECSWAP_WITH_CUDA=ON")
@torch.inference_mode()
def test_cuda_replay_is_bit_identical_and_never_recaptures():
    device = torch.device("cuda")
    target = small_target().to(device)
    cache_graph = target.make_cache(5, 160, device=device)
    cache_eager = target.make_cache(5, 160, device=device)
    context = GraphContext(device, 4, 160)
    context.share_model(target, cache_graph)
    graphs = StageGraphs(context, "verify", 3, target, cache_graph, 4, with_features=False)
    graphs.capture()
    captured = capture_count()
    assert all(r.backend == "cuda" for r in graphs.runners.values())
    for batch in (1, 2, 4):
        ids = torch.randint(0, 96, (batch, 4), device=device)
        positions = torch.arange(4, device=device).expand(batch, -1) + 10
        slots = torch.arange(batch, device=device)
        out = graphs(ids, positions, slots, 14)
        ref = target(ids, positions, cache_eager, slots, key_length=graphs.runner_for(batch, 14)[1])
        assert torch.equal(out.logits, ref.logits)
    assert capture_count() == captured
    assert graphs.memory_bytes() > 0

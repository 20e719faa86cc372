"""The CPU tape replays what eager runs for tensors made inside a capture (docs/graphs.md, "The CPU backend"):
torch's Python factory wrappers hand such a tensor back under a new TensorImpl, so the tape must know it by its
memory, not its identity. Each form below, written into in place, accumulated over replays before op_tape.cpp
matched by memory (replays gave 2, 3, 4 where eager gives 1)."""

import numpy as np
import pytest
import torch

from specswap._core import _C

FACTORIES = {
    "zeros": lambda x: torch.zeros(4),
    "ones": lambda x: torch.ones(4),
    "full": lambda x: torch.full((4,), 2.0),
    "zeros_like": lambda x: torch.zeros_like(x),
    "full_like": lambda x: torch.full_like(x, 3.0),
    "arange_dtype": lambda x: torch.arange(4, dtype=torch.float32),
    "eye": lambda x: torch.eye(4)[0],
    "tensor": lambda x: torch.tensor([0.5, 0.0, -1.0, 2.0]),
}


def _runner():
    return _C.GraphRunner("verify", 1, 1, _C.GraphPool(torch.device("cpu")))


def _replays_as_eager(body, x, out, replays=3):
    runner = _runner()
    runner.capture(lambda: out.copy_(body()))
    for step in range(replays):
        x.copy_(torch.arange(4, dtype=torch.float32) + step)
        runner.replay()
        assert torch.equal(out, body()), f"replay {step + 1}: {out.tolist()} != eager {body().tolist()}"


@pytest.mark.parametrize("factory", FACTORIES, ids=list(FACTORIES))
def test_an_in_place_write_into_a_factory_tensor_replays_as_eager(factory):
    x, out = torch.ones(4), torch.empty(4)
    _replays_as_eager(lambda: FACTORIES[factory](x).add_(x), x, out)


@pytest.mark.parametrize("factory", FACTORIES, ids=list(FACTORIES))
def test_a_factory_tensor_read_before_it_is_written_reads_its_first_value(factory):
    # the read comes first on the tape: it must see the factory's value, not the last replay's write
    x, out = torch.ones(4), torch.empty(4)

    def body():
        made = FACTORIES[factory](x)
        before = made * 2.0
        made.add_(x)
        return before + made

    _replays_as_eager(body, x, out)


def test_inference_mode_factories_replay_as_eager():
    # the engine captures under inference_mode: the same forms there
    x, out = torch.ones(4), torch.empty(4)
    with torch.inference_mode():
        for factory in FACTORIES.values():
            _replays_as_eager(lambda: factory(x).add_(x), x, out)


def test_sampling_s_one_hot_by_scatter_into_zeros_like_replays_as_eager():
    # sampling.py: torch.zeros_like(probs).scatter_(-1, argmax, 1.0), were it recorded
    probs, out = torch.softmax(torch.randn(2, 6), -1), torch.empty(2, 6)
    runner = _runner()
    one_hot = lambda: torch.zeros_like(probs).scatter_(-1, probs.argmax(-1, keepdim=True), 1.0)  # noqa: E731
    runner.capture(lambda: out.copy_(one_hot()))
    for _ in range(3):
        probs.copy_(torch.softmax(torch.randn(2, 6), -1))
        runner.replay()
        assert torch.equal(out, one_hot()) and out.sum().item() == 2.0


def test_a_view_of_capture_memory_made_outside_torch_s_operators_is_refused_naming_the_op():
    # numpy slices the factory's memory where the dispatcher cannot see it: the tape cannot follow that
    # tensor to the replay's memory, so capture refuses it instead of replaying into capture-time memory
    x = torch.ones(3)
    runner = _runner()

    def body():
        made = torch.zeros(4)
        torch.from_numpy(made.numpy()[1:]).add_(x)

    # named at the first operator that takes it (from_numpy's aten::lift_fresh), before add_ could write
    with pytest.raises(RuntimeError, match=r"graph capture: aten::\w+ uses a tensor over memory made during the "
                                           r"capture"):
        runner.capture(body)
    assert not runner.captured


def test_a_same_shaped_numpy_alias_of_a_factory_tensor_is_followed():
    x, out = torch.ones(4), torch.empty(4)
    _replays_as_eager(lambda: torch.from_numpy(torch.zeros(4).numpy()).add_(x), x, out)


def test_writes_into_memory_that_existed_before_capture_still_land_there():
    # buffers and caches are written in place every replay, and a view of one made before the capture follows
    cache, x = torch.zeros(4), torch.ones(4)
    window = torch.from_numpy(cache.numpy()[1:])
    runner = _runner()
    runner.capture(lambda: (cache.add_(x), window.mul_(2.0)))
    runner.replay()
    expected = torch.zeros(4)
    for _ in range(2):
        expected.add_(1.0)
        expected[1:].mul_(2.0)
    assert torch.equal(cache, expected)
    assert np.shares_memory(window.numpy(), cache.numpy())

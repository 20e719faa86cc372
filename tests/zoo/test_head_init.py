"""Starting an EAGLE head's training from a saved head (``eagle_training.train(init=...)``): the weights carry over
exactly, and a head of another draft vocabulary is refused by name."""

from __future__ import annotations

import pytest
import torch

from specswap import zoo
from specswap.models import load_model, save_eagle_head
from specswap.zoo.eagle_training import make_head, start_from


@pytest.fixture(scope="module")
def tiny_target():
    return load_model(zoo.path("tiny"), torch.float32).requires_grad_(False)


def test_start_from_loads_the_saved_weights(tiny_target, tmp_path):
    token_map = torch.arange(0, tiny_target.config.vocab_size, 2)
    torch.manual_seed(0)
    saved = make_head(tiny_target, token_map)
    save_eagle_head(saved, tmp_path, dtype=torch.float32)
    torch.manual_seed(1)
    fresh = make_head(tiny_target, token_map)
    assert not torch.equal(fresh.fc.weight, saved.fc.weight)
    record = start_from(fresh, tmp_path, tiny_target, token_map)
    assert record["from"] == str(tmp_path)
    for (name, a), (_, b) in zip(saved.state_dict().items(), fresh.state_dict().items()):
        assert torch.equal(a, b), name


def test_start_from_refuses_another_draft_vocabulary(tiny_target, tmp_path):
    token_map = torch.arange(0, tiny_target.config.vocab_size, 2)
    save_eagle_head(make_head(tiny_target, token_map), tmp_path, dtype=torch.float32)
    with pytest.raises(ValueError, match="token maps differ"):
        start_from(make_head(tiny_target, token_map), tmp_path, tiny_target, token_map + 1)

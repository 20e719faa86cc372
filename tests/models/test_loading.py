"""EAGLE head, standalone draft and tokenizer loading, and checkpoint errors that say what is wrong."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from model_reference import make_hf_llama
from specswap.models import (CheckpointError, EagleConfig, EagleHead, load_draft_model, load_eagle_head, load_model,
                             load_tokenizer, save_eagle_head, save_model)


@pytest.fixture
def target_dir(tmp_path):
    return make_hf_llama(tmp_path)[1]


@pytest.fixture
def target(target_dir):
    return load_model(target_dir)


def random_head(target, token_map=None, seed=1):
    torch.manual_seed(seed)
    head = EagleHead(EagleConfig.for_target(target.config), target.embed_tokens, target.lm_head, token_map)
    with torch.no_grad():
        for param in head.parameters():
            param.normal_(0, 0.05)
    return head.eval()


def head_outputs(head, target, ids):
    positions = torch.arange(len(ids))[None]
    features = torch.randn(1, len(ids), target.config.hidden_size, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        return head(torch.tensor([ids]), features, positions, head.make_cache(1, 16), torch.tensor([0]))


def test_eagle_head_round_trips_without_shared_weights(target, tmp_path):
    head = random_head(target)
    save_eagle_head(head, tmp_path / "head")
    stored = load_file(tmp_path / "head" / "model.safetensors")
    assert not any("embed_tokens" in name or "lm_head" in name for name in stored)
    loaded = load_eagle_head(tmp_path / "head", target)
    assert loaded.embed_tokens is target.embed_tokens and loaded.lm_head is target.lm_head
    ids = [1, 5, 7, 9]
    expected, got = head_outputs(head, target, ids), head_outputs(loaded, target, ids)
    assert got.logits.shape == (1, 4, target.config.vocab_size)
    torch.testing.assert_close(got.logits, expected.logits)
    torch.testing.assert_close(got.hidden, expected.hidden)


def test_token_map_restricts_logits_to_draft_vocab(target, tmp_path):
    token_map = torch.tensor([2, 5, 9, 40, 100, 210])
    full = random_head(target)
    restricted = random_head(target, token_map)
    ids = [1, 5, 7]
    full_logits = head_outputs(full, target, ids).logits
    restricted_logits = head_outputs(restricted, target, ids).logits
    assert restricted_logits.shape == (1, 3, 6)
    torch.testing.assert_close(restricted_logits, full_logits[..., token_map])
    save_eagle_head(restricted, tmp_path / "head")
    loaded = load_eagle_head(tmp_path / "head", target)
    assert loaded.token_map.tolist() == token_map.tolist()
    assert json.loads((tmp_path / "head" / "config.json").read_text())["draft_vocab_size"] == 6


def test_token_map_out_of_range_names_file_and_valid_range(target, tmp_path):
    save_eagle_head(random_head(target, torch.tensor([2, 5])), tmp_path / "head")
    weights = load_file(tmp_path / "head" / "model.safetensors")
    weights["token_map"] = torch.tensor([2, 211])
    save_file(weights, tmp_path / "head" / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"model\.safetensors.*\[211\].*0\.\.210"):
        load_eagle_head(tmp_path / "head", target)
    with pytest.raises(ValueError, match="out of range"):
        random_head(target, torch.tensor([-1, 3]))


def test_eagle_head_for_other_target_is_rejected(target, tmp_path):
    save_eagle_head(random_head(target), tmp_path / "head")
    other = load_model(make_hf_llama(tmp_path, seed=3, hidden_size=32, num_attention_heads=4)[1])
    with pytest.raises(CheckpointError, match=r"config\.json.*hidden_size 64.*hidden_size 32"):
        load_eagle_head(tmp_path / "head", other)
    other_vocab = load_model(make_hf_llama(tmp_path, seed=4, vocab_size=300)[1])
    with pytest.raises(CheckpointError, match=r"target_vocab_size 211.*vocab_size 300"):
        load_eagle_head(tmp_path / "head", other_vocab)


def test_standalone_draft_loads_and_must_share_vocab(target, tmp_path):
    draft_dir = make_hf_llama(tmp_path, seed=5, num_hidden_layers=1, hidden_size=32, num_attention_heads=4)[1]
    draft = load_draft_model(draft_dir, target)
    assert draft.config.num_hidden_layers == 1 and draft.config.vocab_size == target.config.vocab_size
    bad_dir = make_hf_llama(tmp_path, seed=6, num_hidden_layers=1, vocab_size=100)[1]
    with pytest.raises(CheckpointError, match=r"config\.json.*vocab_size 100.*vocab_size 211"):
        load_draft_model(bad_dir, target)


def test_missing_files_are_named(tmp_path, target_dir):
    with pytest.raises(CheckpointError, match="does not exist"):
        load_model(tmp_path / "nowhere")
    (target_dir / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"missing weights.*model\.safetensors"):
        load_model(target_dir)
    (target_dir / "config.json").unlink()
    with pytest.raises(CheckpointError, match=r"config\.json"):
        load_model(target_dir)


def test_wrong_keys_and_shapes_are_listed(target_dir):
    weights_file = target_dir / "model.safetensors"
    weights = load_file(weights_file)
    weights["model.layers.0.self_attn.q_bias"] = weights.pop("model.layers.0.self_attn.q_proj.weight")
    save_file(weights, weights_file)
    with pytest.raises(CheckpointError, match=r"model\.safetensors.*missing keys.*q_proj.*unexpected keys.*q_bias"):
        load_model(target_dir)
    weights["model.layers.0.self_attn.q_proj.weight"] = torch.zeros(3, 3)
    del weights["model.layers.0.self_attn.q_bias"]
    save_file(weights, weights_file)
    with pytest.raises(CheckpointError, match=r"shape mismatch.*q_proj.*\(3, 3\)"):
        load_model(target_dir)


def test_unknown_model_type_lists_supported(target_dir):
    config = json.loads((target_dir / "config.json").read_text())
    config["model_type"] = "mamba"
    (target_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"'mamba'.*supported.*llama"):
        load_model(target_dir)


def test_sharded_checkpoint_loads(target, target_dir, tmp_path):
    weights = load_file(target_dir / "model.safetensors")
    names = sorted(weights)
    shard_dir = tmp_path / "sharded"
    shard_dir.mkdir()
    (shard_dir / "config.json").write_text((target_dir / "config.json").read_text())
    halves = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for shard, shard_names in halves.items():
        save_file({n: weights[n] for n in shard_names}, shard_dir / shard)
    weight_map = {n: shard for shard, shard_names in halves.items() for n in shard_names}
    (shard_dir / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    sharded = load_model(shard_dir)
    for (name, a), (_, b) in zip(target.state_dict().items(), sharded.state_dict().items()):
        torch.testing.assert_close(a, b, msg=name)
    (shard_dir / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"index\.json.*model-00002-of-00002"):
        load_model(shard_dir)


def test_saved_model_round_trips(target, tmp_path):
    save_model(target, tmp_path / "copy")
    copy = load_model(tmp_path / "copy")
    ids, positions = torch.tensor([[1, 2, 3]]), torch.arange(3)[None]
    with torch.no_grad():
        a = target(ids, positions, target.make_cache(1, 8), torch.tensor([0])).logits
        b = copy(ids, positions, copy.make_cache(1, 8), torch.tensor([0])).logits
    torch.testing.assert_close(a, b)


def test_tokenizer_round_trips_and_checks_vocab(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    bpe = tokenizers.Tokenizer(tokenizers.models.BPE())
    bpe.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(vocab_size=300, special_tokens=["<s>", "</s>"],
                                             initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator(["def f(x):\n    return x + 1\n"] * 20, trainer)
    bpe.save(str(tmp_path / "tokenizer.json"))
    tokenizer = load_tokenizer(tmp_path)
    text = "def g(y):\n    return y * 2  # é\n"
    assert tokenizer.decode(tokenizer.encode(text)) == text
    assert tokenizer.bos_token_id == 0 and tokenizer.eos_token_ids == {1}
    assert tokenizer.encode("x", add_bos=True)[0] == 0
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 100, "eos_token_id": [1, 7]}))
    with pytest.raises(CheckpointError, match=r"tokenizer\.json.*vocab_size 100"):
        load_tokenizer(tmp_path)

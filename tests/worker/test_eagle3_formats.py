"""EAGLE-3 heads as SGLang and vLLM load them: the target's embedding in place of a shipped one (one log line),
no ``d2t`` for a full-vocabulary head, ``pytorch_model.bin`` read with ``weights_only=True``, the last layer's
output captured after the final norm as SpecForge trains it (a head of our recipe records "pre_norm"), and vLLM's
speculators eagle3 format, written here by hand and decoded losslessly."""

import json
import logging
import pickle
from collections import Counter

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from eagle3_helpers import write_random_eagle3
from spec_helpers import random_target, run_to_completion
from specswap.models import CheckpointError
from specswap.models.eagle3 import AuxHiddenTarget, load_eagle3_head
from specswap.models.layers import apply_rotary
from specswap.worker import SpeculativeWorker

PROMPTS = [[1, 2, 3], [5, 6, 7, 8, 9, 10, 11], [4], [9, 9, 9, 9, 2]]
MAX_NEW = 16
VOCAB, HIDDEN, HEADS, KV, HEAD_DIM = 12, 32, 4, 2, 8


def target_only(target, prompts=PROMPTS, max_new=MAX_NEW):
    return run_to_completion(SpeculativeWorker(target, None, None, max_seq_len=64), prompts, max_new)[0]


def frequent_tokens(target, count=3):
    """The target's most frequent greedy tokens on the prompts: a draft vocabulary whose random drafts are often
    right, so rounds accept drafts."""
    return sorted(t for t, _ in Counter(sum(target_only(target), [])).most_common(count))


def edit(directory, weights=None, config=None):
    if weights is not None:
        tensors = load_file(str(directory / "model.safetensors"))
        weights(tensors)
        save_file(tensors, str(directory / "model.safetensors"))
    if config is not None:
        raw = json.loads((directory / "config.json").read_text())
        config(raw)
        (directory / "config.json").write_text(json.dumps(raw))


def features(target, points, ids):
    positions = torch.arange(ids.shape[1]).unsqueeze(0)
    with torch.no_grad():
        return AuxHiddenTarget(target, points)(ids, positions, None, None).hidden


def streams(target, ids):
    """The residual stream entering each layer and after the last (pre-norm), and the final-normed state."""
    positions = torch.arange(ids.shape[1]).unsqueeze(0)
    with torch.no_grad():
        states = [target.model.embed_tokens(ids)]
        for layer in target.model.layers:
            states.append(layer(states[-1], *target.rotary(positions, torch.float32), None, None, None, positions,
                                None))
        return states, target(ids, positions, None, None).hidden


# ------------------------------------------------------------------------------------------- embedding, d2t, bin

def test_a_shipped_embedding_is_ignored_for_the_targets_with_one_log_line(tmp_path, caplog):
    """SGLang's set_embed: when the head's hidden size is the target's, the target's embedding is used; the
    checkpoint's is shape-checked, then dropped with one log line (not one per load)."""
    target = random_target(VOCAB, HIDDEN, num_layers=4, logit_scale=3.0)
    plain = load_eagle3_head(write_random_eagle3(target, tmp_path / "plain"), target)
    directory = write_random_eagle3(target, tmp_path / "shipped")
    edit(directory, weights=lambda t: t.update({"embed_tokens.weight": torch.randn(VOCAB, HIDDEN)}))
    with caplog.at_level(logging.WARNING, logger="specswap.models.eagle3"):
        head = load_eagle3_head(directory, target)
        load_eagle3_head(directory, target)
    assert head.embed_tokens is target.embed_tokens
    lines = [r.getMessage() for r in caplog.records if "embed_tokens.weight is ignored" in r.getMessage()]
    assert len(lines) == 1 and "model.safetensors" in lines[0]
    ids, positions = torch.tensor([[3, 1, 4, 1, 5]]), torch.arange(5).unsqueeze(0)
    fused = torch.randn(1, 5, 3 * HIDDEN)
    with torch.no_grad():  # the same head as the one written without an embedding
        torch.testing.assert_close(head(ids, fused, positions, None, None).logits,
                                   plain(ids, fused, positions, None, None).logits)
    worker = SpeculativeWorker(target, head, "EAGLE3", speculative_num_steps=2, max_seq_len=64, tiers=(0, 2))
    assert run_to_completion(worker, PROMPTS, MAX_NEW, switch=lambda i: (2, 0)[i % 2])[0] == target_only(target)
    edit(directory, weights=lambda t: t.update({"embed_tokens.weight": torch.zeros(VOCAB, HIDDEN - 1)}))
    with pytest.raises(CheckpointError, match=r"embed_tokens.weight: \(12, 31\), expected \(12, 32\)"):
        load_eagle3_head(directory, target)


def test_a_full_vocabulary_head_needs_no_d2t_and_a_reduced_one_does(tmp_path):
    target = random_target(VOCAB, HIDDEN, num_layers=4, logit_scale=3.0)
    full = write_random_eagle3(target, tmp_path / "full")
    edit(full, weights=lambda t: (t.pop("d2t"), t.pop("t2d")))
    head = load_eagle3_head(full, target)
    assert head.token_map is None and head.draft_vocab_size == VOCAB
    worker = SpeculativeWorker(target, head, "EAGLE3", speculative_num_steps=3, max_seq_len=64)
    assert run_to_completion(worker, PROMPTS, MAX_NEW)[0] == target_only(target)
    reduced = write_random_eagle3(target, tmp_path / "reduced", token_map=[0, 2, 3, 5])
    edit(reduced, weights=lambda t: t.pop("d2t"))
    with pytest.raises(CheckpointError, match="no d2t, but draft_vocab_size 4 is smaller than the target vocabulary"):
        load_eagle3_head(reduced, target)


class NotATensor:
    pass


def test_pytorch_model_bin_loads_with_weights_only(tmp_path):
    """A release shipping pytorch_model.bin loads as its safetensors twin; a pickle carrying an object is refused
    (weights_only=True), never unpickled into code."""
    target = random_target(VOCAB, HIDDEN, num_layers=4, logit_scale=3.0)
    directory = write_random_eagle3(target, tmp_path / "bin", token_map=frequent_tokens(target))
    twin = load_eagle3_head(directory, target)
    tensors = load_file(str(directory / "model.safetensors"))
    (directory / "model.safetensors").unlink()
    torch.save(tensors, directory / "pytorch_model.bin")
    head = load_eagle3_head(directory, target)
    for (name, mine), (_, theirs) in zip(head.state_dict().items(), twin.state_dict().items()):
        assert torch.equal(mine, theirs), name
    assert torch.equal(head.token_map, twin.token_map)
    worker = SpeculativeWorker(target, head, "EAGLE3", speculative_num_steps=3, max_seq_len=64, graphs=True)
    assert run_to_completion(worker, PROMPTS, MAX_NEW)[0] == target_only(target)
    with open(directory / "pytorch_model.bin", "wb") as handle:
        pickle.dump({"fc.weight": NotATensor()}, handle, protocol=2)
    with pytest.raises(CheckpointError, match="pytorch_model.bin: cannot read PyTorch weights with weights_only=True"):
        load_eagle3_head(directory, target)


# ------------------------------------------------------------------------------------------- capture points

def test_the_last_layer_output_is_read_after_the_final_norm_unless_the_config_says_pre_norm(tmp_path, caplog):
    """SpecForge trains layer id L - 1 on Hugging Face's hidden_states[L], which is after the final norm: such a
    head reads the target's final-normed state (point L + 1), with one log line saying so; a config saying
    specswap_last_layer_capture "pre_norm" reads the residual stream before the norm (point L)."""
    target = random_target(VOCAB, HIDDEN, num_layers=4, logit_scale=3.0)
    ids = torch.tensor([[3, 1, 4, 1, 5, 9]])
    states, normed = streams(target, ids)
    directory = write_random_eagle3(target, tmp_path / "spec", aux_layer_ids=[0, 1, 3])
    edit(directory, config=lambda raw: raw.pop("specswap_last_layer_capture", None))  # as SpecForge writes it
    with caplog.at_level(logging.WARNING, logger="specswap.models.eagle3"):
        head = load_eagle3_head(directory, target)
    assert head.capture_points == (1, 2, 5)
    assert any("after the target's final norm" in r.getMessage() for r in caplog.records)
    torch.testing.assert_close(features(target, head.capture_points, ids),
                               torch.cat((states[1], states[2], normed), -1))
    assert not torch.allclose(normed, states[4])  # the two capture points differ
    edit(directory, config=lambda raw: raw.update({"specswap_last_layer_capture": "pre_norm"}))
    pre = load_eagle3_head(directory, target)
    assert pre.capture_points == (1, 2, 4)
    torch.testing.assert_close(features(target, pre.capture_points, ids),
                               torch.cat((states[1], states[2], states[4]), -1))
    for head in (load_eagle3_head(directory, target), head):
        worker = SpeculativeWorker(target, head, "EAGLE3", speculative_num_steps=3, max_seq_len=64, tiers=(0, 1, 3),
                                   graphs=True)
        tokens = run_to_completion(worker, PROMPTS, MAX_NEW, switch=lambda i: (3, 0, 1)[i % 3])[0]
        assert tokens == target_only(target)
    edit(directory, config=lambda raw: raw.update({"specswap_last_layer_capture": "after"}))
    with pytest.raises(CheckpointError,
                       match=r"specswap_last_layer_capture 'after'; valid: \['pre_norm', 'post_norm'\]"):
        load_eagle3_head(directory, target)


def test_a_head_of_our_recipe_records_its_pre_norm_capture_and_reloads_identically(tmp_path):
    from specswap.models.eagle3 import save_eagle3_head
    from specswap.zoo.eagle3_training import make_head

    target = random_target(VOCAB, HIDDEN, num_layers=4, logit_scale=3.0)
    head = make_head(target, torch.tensor([0, 2, 3, 5]), warm_start=False, aux_layer_ids=(0, 1, 3))
    assert head.capture_points == (1, 2, 4)  # the recipe's features: the last layer's output before the norm
    save_eagle3_head(head, tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    assert raw["specswap_last_layer_capture"] == "pre_norm"
    assert raw["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0, 1, 3]
    loaded = load_eagle3_head(tmp_path, target)
    assert loaded.capture_points == head.capture_points
    ids, positions = torch.tensor([[3, 1, 4, 1, 5]]), torch.arange(5).unsqueeze(0)
    fused = features(target, loaded.capture_points, ids)
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids, fused, positions, None, None).logits,
                                   head.eval()(ids, fused, positions, None, None).logits)


# ------------------------------------------------------------------------------------------- speculators format

def speculators_config(aux_ids=None, **top):
    """config.json as vLLM's speculators library writes an eagle3 head (Eagle3SpeculatorConfig)."""
    raw = {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "speculators_version": "0.3.0",
        "speculators_config": {"algorithm": "eagle3", "default_proposal_method": "greedy",
                               "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
                               "verifier": {"name_or_path": "random-target", "architectures": ["LlamaForCausalLM"]}},
        "transformer_layer_config": {
            "model_type": "llama", "vocab_size": VOCAB, "hidden_size": HIDDEN, "intermediate_size": 2 * HIDDEN,
            "num_hidden_layers": 1, "num_attention_heads": HEADS, "num_key_value_heads": KV, "head_dim": HEAD_DIM,
            "hidden_act": "silu", "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "max_position_embeddings": 512,
            "attention_bias": False, "mlp_bias": False, "tie_word_embeddings": False},
        "draft_vocab_size": 4,
        "norm_before_residual": True,
        "target_hidden_size": None,
        "eagle_aux_hidden_state_layer_ids": aux_ids,
        "torch_dtype": "float32",
    }
    raw.update(top)
    return raw


def write_speculators_head(directory, token_map, aux_ids=None, seed=5, **top):
    """A random head in the speculators layout, tensor by tensor: layers.0.*, fc, norm, lm_head, d2t, t2d and
    (as the library saves it) embed_tokens."""
    torch.manual_seed(seed)
    directory.mkdir(parents=True, exist_ok=True)
    h, i, vd = HIDDEN, 2 * HIDDEN, len(token_map)
    shapes = {"fc.weight": (h, 3 * h), "layers.0.self_attn.q_proj.weight": (HEADS * HEAD_DIM, 2 * h),
              "layers.0.self_attn.k_proj.weight": (KV * HEAD_DIM, 2 * h),
              "layers.0.self_attn.v_proj.weight": (KV * HEAD_DIM, 2 * h),
              "layers.0.self_attn.o_proj.weight": (h, HEADS * HEAD_DIM), "layers.0.mlp.gate_proj.weight": (i, h),
              "layers.0.mlp.up_proj.weight": (i, h), "layers.0.mlp.down_proj.weight": (h, i),
              "lm_head.weight": (vd, h), "embed_tokens.weight": (VOCAB, h)}
    tensors = {name: torch.randn(shape) * 0.3 for name, shape in shapes.items()}
    for name in ("layers.0.input_layernorm.weight", "layers.0.hidden_norm.weight",
                 "layers.0.post_attention_layernorm.weight", "norm.weight"):
        tensors[name] = torch.rand(h) + 0.5
    tensors["d2t"] = torch.tensor(token_map) - torch.arange(vd)
    tensors["t2d"] = torch.zeros(VOCAB, dtype=torch.bool)
    tensors["t2d"][token_map] = True
    save_file(tensors, str(directory / "model.safetensors"))
    (directory / "config.json").write_text(json.dumps(speculators_config(aux_ids, draft_vocab_size=vd, **top)))
    return directory


def _rms(x, weight, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def speculators_reference(w, target, ids, fused, cos, sin, norm_before_residual):
    """The speculators Eagle3 first layer and head written out from the tensors (vLLM's llama_eagle3)."""
    eps, t = 1e-5, ids.shape[1]
    hidden = fused @ w["fc.weight"].T
    normed = _rms(hidden, w["layers.0.hidden_norm.weight"], eps)
    x = torch.cat((_rms(target.model.embed_tokens(ids), w["layers.0.input_layernorm.weight"], eps), normed), -1)
    q, k, v = ((x @ w[f"layers.0.self_attn.{n}_proj.weight"].T).view(1, t, -1, HEAD_DIM).transpose(1, 2)
               for n in "qkv")
    k, v = k.repeat_interleave(HEADS // KV, 1), v.repeat_interleave(HEADS // KV, 1)
    attended = F.scaled_dot_product_attention(apply_rotary(q, cos, sin), apply_rotary(k, cos, sin), v,
                                              is_causal=True)
    residual = normed if norm_before_residual else hidden
    hidden = residual + attended.transpose(1, 2).reshape(1, t, -1) @ w["layers.0.self_attn.o_proj.weight"].T
    m = _rms(hidden, w["layers.0.post_attention_layernorm.weight"], eps)
    hidden = hidden + (F.silu(m @ w["layers.0.mlp.gate_proj.weight"].T) * (m @ w["layers.0.mlp.up_proj.weight"].T)) \
        @ w["layers.0.mlp.down_proj.weight"].T
    return _rms(hidden, w["norm.weight"], eps) @ w["lm_head.weight"].T, hidden


@pytest.mark.parametrize("norm_before_residual", [True, False, None])
def test_a_speculators_head_computes_the_vllm_layer_from_its_tensors(tmp_path, norm_before_residual):
    """layers.0.* are the head's layer; norm_before_residual (absent: true, as vLLM reads the format) makes the
    residual the normed hidden state; rope and eps come from transformer_layer_config."""
    target = random_target(VOCAB, HIDDEN, num_layers=4)
    top = {} if norm_before_residual is None else {"norm_before_residual": norm_before_residual}
    directory = write_speculators_head(tmp_path, [0, 2, 3, 5], **top)
    if norm_before_residual is None:
        edit(directory, config=lambda raw: raw.pop("norm_before_residual"))
    head = load_eagle3_head(directory, target)
    assert head.config.rope.theta == 500000.0 and head.config.rms_norm_eps == 1e-5
    assert head.embed_tokens is target.embed_tokens and head.token_map.tolist() == [0, 2, 3, 5]
    ids, positions = torch.tensor([[3, 1, 4, 1, 5, 9]]), torch.arange(6).unsqueeze(0)
    fused = torch.randn(1, 6, 3 * HIDDEN)
    with torch.no_grad():
        out = head(ids, fused, positions, None, None)
        tensors = load_file(str(directory / "model.safetensors"))
        logits, hidden = speculators_reference(tensors, target, ids, fused, *head.rotary(positions, torch.float32),
                                               norm_before_residual is not False)
    torch.testing.assert_close(out.logits, logits, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(out.hidden, hidden, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("graphs", [False, True])
def test_a_hand_written_speculators_head_decodes_losslessly(tmp_path, graphs):
    """Greedy decoding through the speculators head equals target-only decoding, switching tiers every round; its
    aux layer ids are vLLM's boundaries (id L: the last layer's output, before the final norm)."""
    target = random_target(VOCAB, HIDDEN, num_layers=4, logit_scale=3.0)
    head = load_eagle3_head(write_speculators_head(tmp_path, frequent_tokens(target), aux_ids=[1, 2, 4]), target)
    assert head.capture_points == (1, 2, 4)
    pattern = [3, 0, 1, 3, 2, 0]
    worker = SpeculativeWorker(target, head, "EAGLE3", speculative_num_steps=3, max_seq_len=64, tiers=(0, 1, 2, 3),
                               graphs=graphs)
    tokens, accepts, used = run_to_completion(worker, PROMPTS, MAX_NEW, switch=lambda i: pattern[i % len(pattern)])
    assert tokens == target_only(target)
    assert used == [pattern[i % len(pattern)] for i in range(len(used))]
    assert sum(sum(accepts, [])) > 0  # drafts were taken


def test_a_speculators_head_loads_through_load_models(tmp_path):
    from specswap.loading import load_models
    target = load_models("tiny", speculative_algorithm="NONE", dtype="float32").target
    c = target.config
    raw = speculators_config()
    raw["transformer_layer_config"].update(
        vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=2 * c.hidden_size,
        num_attention_heads=c.num_attention_heads, num_key_value_heads=c.num_key_value_heads, head_dim=c.head_dim)
    write_random_eagle3(target, tmp_path, seed=4)  # tensors in SpecForge's names, renamed below
    (tmp_path / "config.json").write_text(json.dumps({**raw, "draft_vocab_size": c.vocab_size}))
    edit(tmp_path, weights=lambda t: t.update({n.replace("midlayer.", "layers.0."): t.pop(n)
                                               for n in [n for n in t if n.startswith("midlayer.")]}))
    models = load_models("tiny", draft=str(tmp_path), speculative_algorithm="EAGLE3", dtype="float32")
    assert type(models.draft).__name__ == "Eagle3Head"
    assert models.draft.capture_points == (1, 2, 2)  # vLLM's default for 4 layers: inputs of 2, 2, 1


@pytest.mark.parametrize("change,message", [
    ({"speculators_model_type": "eagle"}, "speculators_model_type 'eagle' is not an EAGLE-3 head"),
    ({"norm_before_fc": True}, r"\['norm_before_fc'\] set; this EAGLE-3 head does not implement them"),
    ({"transformer_layer_config": {"model_type": "qwen3"}}, "transformer_layer_config.model_type 'qwen3'"),
    ({"transformer_layer_config": {"num_hidden_layers": 2}}, "num_hidden_layers 2"),
    ({"eagle_aux_hidden_state_layer_ids": [1, 2, 5]}, r"layers \[5\] outside the target's 0..4"),
])
def test_speculators_options_this_head_lacks_are_refused_by_name(tmp_path, change, message):
    target = random_target(VOCAB, HIDDEN, num_layers=4)
    directory = write_speculators_head(tmp_path, [0, 2, 3, 5])
    load_eagle3_head(directory, target)  # the unedited checkpoint loads

    def apply(raw):
        for key, value in change.items():
            if isinstance(value, dict):
                raw[key].update(value)
            else:
                raw[key] = value
    edit(directory, config=apply)
    with pytest.raises(CheckpointError, match=message):
        load_eagle3_head(directory, target)

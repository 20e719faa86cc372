"""EAGLE-3 heads in SpecForge's layout: written by the test at random, loaded, and decoded losslessly (greedy equal
to target-only decoding at every tier, under forced switching and in graph mode; sampling by the exact law);
the drafts follow the alignment; the target's auxiliary hidden states; bad checkpoints refused by name."""

import json
from collections import Counter

import pytest
import torch
from safetensors.torch import load_file, save_file

from eagle3_helpers import write_random_eagle3
from spec_helpers import random_target, reference_eagle_drafts, run_to_completion
from specswap.models import CheckpointError
from specswap.models.eagle3 import AuxHiddenTarget, load_eagle3_head
from specswap.sampling import SamplingParams
from specswap.worker import SpeculativeWorker
from test_worker import (BIASED_VERIFIERS, VOCAB, chi_square_pvalue, exact_law, sample_continuations)

PROMPTS = [[1, 2, 3], [5, 6, 7, 8, 9, 10, 11], [4], [9, 9, 9, 9, 2]]
MAX_NEW = 16
# a small, peaky vocabulary: the random head's drafts are right often enough that rounds accept some
SMALL_VOCAB = 12


def make_pair(name, tmp_path_factory):
    """(target, head): each test builds its own target, as a worker sets the target's capture points."""
    directory = tmp_path_factory.mktemp(name)
    if name == "default_layers":
        # 4 layers, SGLang's default points [2, 2, 1]; the draft vocabulary is the target's 3 most frequent greedy
        # tokens on the prompts (as d2t is built in training), so the random head's drafts are often right
        target = random_target(SMALL_VOCAB, 32, num_layers=4, logit_scale=3.0)
        counts = Counter(sum(target_only(target, PROMPTS, MAX_NEW), []))
        write_random_eagle3(target, directory, token_map=sorted(t for t, _ in counts.most_common(3)))
    elif name == "config_layers":  # 8 layers, the config's eagle_aux_hidden_state_layer_ids, the full vocab
        target = random_target(SMALL_VOCAB, 32, num_layers=8, logit_scale=3.0, seed=2)
        write_random_eagle3(target, directory, seed=3, aux_layer_ids=[1, 4, 7])
    elif name == "tiny":  # the zoo's tiny target in fp32
        from specswap.loading import load_models
        target = load_models("tiny", speculative_algorithm="NONE", dtype="float32").target
        write_random_eagle3(target, directory, seed=4, token_map=list(range(0, 2048, 2)), scale=0.5)
    else:
        raise KeyError(name)
    return target, load_eagle3_head(directory, target)


PAIRS = ["default_layers", "config_layers", "tiny"]


@pytest.fixture(scope="module", params=PAIRS)
def pair(request, tmp_path_factory):
    return make_pair(request.param, tmp_path_factory)


def target_only(target, prompts, max_new_tokens, max_seq_len=64):
    worker = SpeculativeWorker(target, None, None, max_seq_len=max_seq_len)
    return run_to_completion(worker, prompts, max_new_tokens)[0]


@pytest.mark.parametrize("steps", [0, 1, 2, 3, 5])
def test_greedy_equals_target_only_at_every_tier(pair, steps):
    target, head = pair
    worker = SpeculativeWorker(target, head, "EAGLE3", speculative_num_steps=steps, max_seq_len=64)
    tokens, accepts, _ = run_to_completion(worker, PROMPTS, MAX_NEW)
    assert tokens == target_only(target, PROMPTS, MAX_NEW)
    assert all(0 <= a <= steps for a in sum(accepts, []))


@pytest.mark.parametrize("graphs", [False, True])
def test_greedy_equals_target_only_switching_tier_every_round(pair, graphs):
    target, head = pair
    pattern = [3, 0, 1, 0, 0, 2, 3, 1, 0, 3]
    worker = SpeculativeWorker(target, head, "EAGLE3", speculative_num_steps=3, max_seq_len=64, tiers=(0, 1, 2, 3),
                               graphs=graphs)
    tokens, accepts, used = run_to_completion(worker, PROMPTS, MAX_NEW,
                                              switch=lambda index: pattern[index % len(pattern)])
    assert tokens == target_only(target, PROMPTS, MAX_NEW)
    assert used == [pattern[i % len(pattern)] for i in range(len(used))]


def test_drafts_follow_the_alignment_through_tier_zero_stints(tmp_path_factory):
    """Each round's drafts equal a from-scratch recompute (the target's fused features f_0..f_{m-2} into fc, then
    the head's own pre-norm hidden), also after tier-0 rounds (the catch-up over 3H features) and after rounds
    that accepted drafts (the extend keeps the output at the accepted length)."""
    target, head = make_pair("default_layers", tmp_path_factory)
    worker = SpeculativeWorker(target, head, "EAGLE3", speculative_num_steps=3, max_seq_len=64, tiers=(0, 3, 4))
    params = SamplingParams(max_new_tokens=MAX_NEW)
    slots = list(range(len(PROMPTS)))
    first = worker.prefill(slots, PROMPTS, [params] * len(PROMPTS))
    committed = [list(p) + [token] for p, token in zip(PROMPTS, first)]
    accepted = 0
    for steps in (3, 4, 0, 0, 4, 3, 0, 4, 4, 3):
        worker.pool.activate(steps)
        expected = [reference_eagle_drafts(worker.target, head, c, steps) for c in committed]  # the fused view
        result = worker.decode_round(slots)
        assert worker.pool.acquire().draft.draft_tokens[:len(slots)].tolist() == expected
        accepted += sum(result.accept_lengths)
        for c, new in zip(committed, result.new_tokens):
            c.extend(new)
    assert accepted > 0  # rounds took drafts: the extend's accepted-length path was exercised


def test_the_target_returns_the_residual_stream_at_its_capture_points():
    target = random_target(SMALL_VOCAB, 32, num_layers=4)
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    positions = torch.arange(5).unsqueeze(0)
    with torch.no_grad():
        plain = target(ids, positions, None, None)
        streams = [target.model.embed_tokens(ids)]
        for layer in target.model.layers:
            streams.append(layer(streams[-1], *target.rotary(positions, torch.float32), None, None, None, positions,
                                 None))
        fused = target(ids, positions, target.make_cache(1, 8), torch.tensor([0]), aux_points=(1, 3, 4))
        view = AuxHiddenTarget(target, (3, 1, 4))  # sorted: layer order
        through_view = view(ids, positions, None, None)
    torch.testing.assert_close(fused.hidden, torch.cat((streams[1], streams[3], streams[4]), dim=-1))
    torch.testing.assert_close(fused.logits, plain.logits)  # the logits are the target's, unchanged
    torch.testing.assert_close(through_view.hidden, fused.hidden)
    assert view.feature_size == 3 * 32 and view.aux_points == (1, 3, 4)
    assert target(ids, positions, None, None).hidden.shape[-1] == 32  # the target itself is unchanged
    with torch.no_grad():  # point L + 1: the final-normed state, the plain forward's hidden
        torch.testing.assert_close(AuxHiddenTarget(target, (1, 5))(ids, positions, None, None).hidden,
                                   torch.cat((streams[1], plain.hidden), dim=-1))
    with pytest.raises(ValueError, match="0..5"):
        AuxHiddenTarget(target, (1, 6))


def _rms(x, weight, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def test_the_head_computes_the_eagle3_layer_from_the_checkpoint_tensors(tmp_path):
    """The head against the layout written out by hand from the saved tensors: fc on the fused features, attention
    over [input_layernorm(embed), hidden_norm(hidden)] (embedding first), residual on the hidden state, MLP, the
    draft lm_head over norm(hidden); the hidden fed back is the one before norm; fed H-wide it skips fc."""
    import torch.nn.functional as F
    from specswap.models.layers import apply_rotary

    target = random_target(SMALL_VOCAB, 32, num_layers=4)
    directory = write_random_eagle3(target, tmp_path, token_map=[0, 2, 3, 5, 7])
    head = load_eagle3_head(directory, target)
    w = load_file(str(directory / "model.safetensors"))
    eps, heads, kv, d = head.config.rms_norm_eps, 4, 2, 8
    ids = torch.tensor([[3, 1, 4, 1, 5, 9]])
    positions = torch.arange(6).unsqueeze(0)
    features = torch.randn(1, 6, 96)
    with torch.no_grad():
        out = head(ids, features, positions, None, None)
        hidden = features @ w["fc.weight"].T
        x = torch.cat((_rms(target.model.embed_tokens(ids), w["midlayer.input_layernorm.weight"], eps),
                       _rms(hidden, w["midlayer.hidden_norm.weight"], eps)), dim=-1)
        cos, sin = head.rotary(positions, torch.float32)
        q = (x @ w["midlayer.self_attn.q_proj.weight"].T).view(1, 6, heads, d).transpose(1, 2)
        k = (x @ w["midlayer.self_attn.k_proj.weight"].T).view(1, 6, kv, d).transpose(1, 2)
        v = (x @ w["midlayer.self_attn.v_proj.weight"].T).view(1, 6, kv, d).transpose(1, 2)
        k, v = k.repeat_interleave(heads // kv, 1), v.repeat_interleave(heads // kv, 1)
        attended = F.scaled_dot_product_attention(apply_rotary(q, cos, sin), apply_rotary(k, cos, sin), v,
                                                  is_causal=True)
        hidden = hidden + attended.transpose(1, 2).reshape(1, 6, heads * d) @ w["midlayer.self_attn.o_proj.weight"].T
        normed = _rms(hidden, w["midlayer.post_attention_layernorm.weight"], eps)
        mlp = (F.silu(normed @ w["midlayer.mlp.gate_proj.weight"].T) * (normed @ w["midlayer.mlp.up_proj.weight"].T))
        hidden = hidden + mlp @ w["midlayer.mlp.down_proj.weight"].T
        logits = _rms(hidden, w["norm.weight"], eps) @ w["lm_head.weight"].T
        torch.testing.assert_close(out.hidden, hidden, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(out.logits, logits, atol=1e-4, rtol=1e-4)
        assert torch.equal(head.token_map, torch.arange(5) + w["d2t"])
        own = head(ids, out.hidden, positions, None, None)  # H wide: the head's own hidden, no fc
        again = head(ids, torch.cat((out.hidden, torch.zeros(1, 6, 64)), -1), positions, None, None)
        assert not torch.allclose(own.logits, again.logits)
        with pytest.raises(ValueError, match="features are 40 wide"):
            head(ids, torch.zeros(1, 6, 40), positions, None, None)


@pytest.mark.parametrize("graphs", [False, True])
def test_draft_trees_equal_target_only_switching_among_chains_and_trees(pair, graphs):
    """EAGLE-2 dynamic trees from an EAGLE-3 head (its frontier fed its own hidden states), switched with chains
    every round."""
    from specswap.worker.layout import tier_key

    target, head = pair
    tree, wide = tier_key(3, 2, 6), tier_key(2, 3, 7)
    pattern = [tree, 0, 1, wide, tree, 3, 0, tree]
    worker = SpeculativeWorker(target, head, "EAGLE3", speculative_num_steps=3, speculative_eagle_topk=2,
                               speculative_num_draft_tokens=6, max_seq_len=64, tiers=(0, 1, 3, wide), graphs=graphs)
    tokens, _, used = run_to_completion(worker, PROMPTS, MAX_NEW, switch=lambda index: pattern[index % len(pattern)])
    assert tokens == target_only(target, PROMPTS, MAX_NEW)
    assert {0, 1, 2, 3} <= set(used)


@pytest.mark.parametrize("shape", [(1, 2, 3), (2, 3, 7)])
def test_sampled_tree_continuations_follow_the_target_law(tmp_path, shape):
    params = SamplingParams(max_new_tokens=3, temperature=1.0)
    target = random_target(VOCAB, 16, num_layers=3, seed=3, logit_scale=4.0)
    law = exact_law(target, params)
    head = load_eagle3_head(write_random_eagle3(target, tmp_path, seed=4, token_map=[0, 2, 3, 5], scale=3.0), target)
    steps, topk, nodes = shape
    worker = SpeculativeWorker(target, head, "EAGLE3", speculative_num_steps=steps, speculative_eagle_topk=topk,
                               speculative_num_draft_tokens=nodes, max_batch_size=8, max_seq_len=16)
    counts = sample_continuations(worker, params, num_samples=4000, seed=11)
    assert chi_square_pvalue(counts, law) > 1e-3


@pytest.mark.parametrize("steps,biased", [(2, None), (1, None), (0, None), (2, "accept_always")])
def test_sampled_continuations_follow_the_target_law(tmp_path, steps, biased):
    params = SamplingParams(max_new_tokens=3, temperature=0.8, top_k=4, top_p=0.9) if steps == 2 else \
        SamplingParams(max_new_tokens=3, temperature=1.2)
    target = random_target(VOCAB, 16, num_layers=3, seed=3, logit_scale=4.0)
    law = exact_law(target, params)
    # the draft vocabulary is 4 of the 6 tokens (d2t), the draws are over it and mapped to target ids
    head = load_eagle3_head(write_random_eagle3(target, tmp_path, seed=4, token_map=[0, 2, 3, 5], scale=3.0), target)
    worker = SpeculativeWorker(target, head, "EAGLE3", speculative_num_steps=steps, max_batch_size=8,
                               max_seq_len=16, **({"verifier": BIASED_VERIFIERS[biased]} if biased else {}))
    counts = sample_continuations(worker, params, num_samples=1200 if biased else 4000, seed=11)
    pvalue = chi_square_pvalue(counts, law)
    if biased:
        assert pvalue < 1e-4, pvalue
    else:
        assert pvalue > 1e-3, pvalue


# ---- bad checkpoints ------------------------------------------------------------------------------------

def _edit(directory, weights=None, config=None):
    file = directory / "model.safetensors"
    tensors = load_file(str(file))
    if weights:
        weights(tensors)
        save_file(tensors, str(file))
    if config:
        raw = json.loads((directory / "config.json").read_text())
        config(raw)
        (directory / "config.json").write_text(json.dumps(raw))


def _drop_fc(t):
    del t["fc.weight"]


def _widen_q(t):
    t["midlayer.self_attn.q_proj.weight"] = torch.zeros(32, 33)


def _d2t_out_of_range(t):
    t["d2t"][3] = 1000


def _unknown(t):
    t["midlayer.extra.weight"] = torch.zeros(2)


def _t2d_disagrees(t):
    t["t2d"][6] = True


def _no_layers(raw):
    raw["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": [1, 9]}


def _one_aux_layer(raw):
    raw["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": [2]}


def _two_layers(raw):
    raw["num_hidden_layers"] = 2


def _other_hidden(raw):
    raw["target_hidden_size"] = 64


def _not_eagle3(raw):
    raw["architectures"] = ["LlamaForCausalLM"]


@pytest.mark.parametrize("edit,message", [
    ({"weights": _drop_fc}, r"missing tensors \['fc.weight'\]"),
    ({"weights": _widen_q}, r"midlayer.self_attn.q_proj.weight: \(32, 33\), expected \(32, 64\)"),
    ({"weights": _d2t_out_of_range}, r"d2t maps draft ids \[3\] to target ids \[1003\], out of range 0..11"),
    ({"weights": _unknown}, r"unknown tensors \['midlayer.extra.weight'\]"),
    ({"weights": _t2d_disagrees}, "t2d disagrees with d2t"),
    ({"config": _no_layers}, r"layers \[9\] outside the target's 0..3"),
    ({"config": _two_layers}, "num_hidden_layers 2"),
    ({"config": _one_aux_layer}, r"at least two layer indices; got \[2\]"),
    ({"config": _other_hidden}, "target_hidden_size 64 does not match the target's 32"),
    ({"config": _not_eagle3}, "name no EAGLE-3 head"),
])
def test_bad_checkpoints_are_refused_by_name(tmp_path, edit, message):
    target = random_target(SMALL_VOCAB, 32, num_layers=4)
    directory = write_random_eagle3(target, tmp_path, token_map=[0, 1, 2, 4, 5, 7, 8, 10, 11])
    load_eagle3_head(directory, target)  # the unedited checkpoint loads
    _edit(directory, **edit)
    with pytest.raises(CheckpointError, match=message):
        load_eagle3_head(directory, target)


def test_a_target_too_shallow_for_the_default_layers_needs_them_named(tmp_path):
    target = random_target(SMALL_VOCAB, 32, num_layers=2)
    directory = write_random_eagle3(target, tmp_path, aux_layer_ids=[0, 1, 1])
    _edit(directory, config=lambda raw: raw.pop("eagle_config"))
    with pytest.raises(CheckpointError, match="eagle_aux_hidden_state_layer_ids"):
        load_eagle3_head(directory, target)


def test_loads_through_load_models_as_eagle3(tmp_path):
    from specswap.loading import load_models
    target = load_models("tiny", speculative_algorithm="NONE", dtype="float32").target
    write_random_eagle3(target, tmp_path, seed=4)
    models = load_models("tiny", draft=str(tmp_path), speculative_algorithm="EAGLE3", dtype="float32")
    assert models.speculative_algorithm == "EAGLE3" and type(models.draft).__name__ == "Eagle3Head"
    assert models.draft.capture_points == (1, 2, 2)  # SGLang's default for 4 layers: inputs of 2, 2, 1
    quantized = load_models("tiny", draft=str(tmp_path), speculative_algorithm="EAGLE3", dtype="float32",
                            draft_quantization="int8").draft
    assert type(quantized.fc).__name__ == type(quantized.lm_head).__name__ == "Int8Linear"


@pytest.mark.parametrize("quantization", ["int8", "q8_0"])
def test_quantized_heads_stay_lossless_and_draft_like_the_dense_one(tmp_path, quantization):
    """Quantized linears change what the head drafts only slightly, never the output."""
    if quantization == "q8_0":
        from specswap.capability import native_kernels_available
        if not native_kernels_available():
            pytest.skip("q8_0 needs the native kernels (libggml-python)")
    target = random_target(SMALL_VOCAB, 32, num_layers=4, logit_scale=3.0)
    counts = Counter(sum(target_only(target, PROMPTS, MAX_NEW), []))
    directory = write_random_eagle3(target, tmp_path, token_map=sorted(t for t, _ in counts.most_common(3)))
    dense = load_eagle3_head(directory, target)
    head = load_eagle3_head(directory, target, quantization=quantization)
    assert type(head.midlayer.self_attn.q_proj).__name__ == ("Int8Linear" if quantization == "int8"
                                                             else "QuantizedLinear")
    accepted = {}
    for name, draft in (("dense", dense), ("quantized", head)):
        worker = SpeculativeWorker(target, draft, "EAGLE3", speculative_num_steps=3, max_seq_len=64, tiers=(0, 3),
                                   graphs=True)
        tokens, accepts, _ = run_to_completion(worker, PROMPTS, MAX_NEW, switch=lambda i: (3, 0, 3)[i % 3])
        assert tokens == target_only(target, PROMPTS, MAX_NEW)
        accepted[name] = sum(sum(accepts, []))
    assert accepted["quantized"] > 0.5 * accepted["dense"] > 0


def test_one_target_serves_eagle3_eagle_and_target_only_workers_side_by_side(tmp_path):
    """The EAGLE-3 worker calls the target through its own view; the target object is never changed, so workers
    of other algorithms over it, built before or after, interleave and all stay lossless."""
    from spec_helpers import random_eagle_head
    target = random_target(SMALL_VOCAB, 32, num_layers=4, logit_scale=3.0)
    expected = target_only(target, PROMPTS, MAX_NEW)
    eagle_before = SpeculativeWorker(target, random_eagle_head(target), "EAGLE", speculative_num_steps=2,
                                     max_seq_len=64, graphs=True)
    eagle3 = SpeculativeWorker(target, load_eagle3_head(write_random_eagle3(target, tmp_path), target), "EAGLE3",
                               speculative_num_steps=3, max_seq_len=64, graphs=True)
    eagle_after = SpeculativeWorker(target, random_eagle_head(target, seed=3), "EAGLE", speculative_num_steps=3,
                                    max_seq_len=64)
    for worker in (eagle3, eagle_before, eagle_after, eagle3):
        worker_tokens = run_to_completion(worker, PROMPTS, MAX_NEW)[0]
        assert worker_tokens == expected
        for slot in range(len(PROMPTS)):
            worker.release(slot)
    head = random_eagle_head(target)
    with pytest.raises(ValueError, match="features are 96 wide, expected 32"):
        head(torch.tensor([[1]]), torch.zeros(1, 1, 96), torch.tensor([[0]]), None, None)


def test_a_checkpoint_with_its_own_embedding_and_model_prefixes_loads_and_stays_lossless(tmp_path):
    """Some published heads ship ``embed_tokens.weight`` (ignored: the target's is used, as SGLang's set_embed
    does when the hidden sizes match) and prefix names with ``model.``; a llama3 rope in ``rope_scaling``
    round-trips."""
    target = random_target(SMALL_VOCAB, 32, num_layers=4, logit_scale=3.0)
    directory = write_random_eagle3(target, tmp_path)
    own = torch.randn(SMALL_VOCAB, 32)

    def edit(tensors):
        for name in list(tensors):
            if name.startswith("midlayer."):
                tensors[f"model.{name}"] = tensors.pop(name)
        tensors["embed_tokens.weight"] = own

    def llama3(raw):
        raw.pop("rope_theta")
        raw["rope_scaling"] = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                               "original_max_position_embeddings": 8192}

    _edit(directory, weights=edit, config=llama3)
    head = load_eagle3_head(directory, target)
    assert head.embed_tokens is target.embed_tokens and not torch.equal(target.embed_tokens.weight, own)
    assert head.config.rope.rope_type == "llama3" and head.config.rope.theta == 500000.0
    worker = SpeculativeWorker(target, head, "EAGLE3", speculative_num_steps=2, max_seq_len=64, tiers=(0, 2))
    tokens, _, _ = run_to_completion(worker, PROMPTS, MAX_NEW, switch=lambda i: (2, 0)[i % 2])
    assert tokens == target_only(target, PROMPTS, MAX_NEW)
    _edit(directory, weights=lambda t: t.update({"embed_tokens.weight": torch.zeros(SMALL_VOCAB, 31)}))
    with pytest.raises(CheckpointError, match=r"embed_tokens.weight: \(12, 31\), expected \(12, 32\)"):
        load_eagle3_head(directory, target)

"""Draft trees: the target forward under a tree mask, tree acceptance, and a tree drafter slotted into the worker.

A tree tier verifies k draft nodes in one forward (node i sees its ancestors; its keys go to position m-1+i, its
rotary position is m-1+depth), accepts down the tree, and lays the accepted path out as a chain. The drafter
here knows the target's own continuation and hides it in one branch of the tree (a decoy in the other), so
the rounds accept through either branch; whatever it drafts, the output must equal target-only decoding.
"""

from __future__ import annotations

import random

import pytest
import torch

from spec_helpers import random_target
from specswap.models import Gemma3ForCausalLM
from specswap.models.gemma3 import Gemma3Config
from specswap.models.layers import Attention
from specswap.sampling import (KeyedDraws, KeyedNoise, KeyedRow, RoundSampling, SamplingParams, accept_greedy,
                               accept_greedy_tree, accept_keyed, accept_keyed_tree, keyed_draws)
from specswap.worker import SpeculativeWorker
from specswap.worker.drafter import Drafter
from specswap.worker.layout import TreeLayout

# two branches of depth 2 under the root: nodes 1-2 and 3-4
TWO_BRANCHES = (-1, 0, 1, 0, 3)


def invariant(model):
    """fp32 attention through the batch-invariant kernel: a query's output has the same bits whatever keys are
    masked beside it, so a tree node and the same tokens as a chain agree exactly."""
    for module in model.modules():
        if isinstance(module, Attention):
            module.batch_invariant = True
    return model


def tiny_gemma(seed=0):
    torch.manual_seed(seed)
    config = Gemma3Config.from_dict({"vocab_size": 97, "hidden_size": 32, "intermediate_size": 48,
                                     "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
                                     "head_dim": 16, "sliding_window": 6, "layer_types":
                                     ["sliding_attention", "full_attention"], "rope_local_base_freq": 10000.0})
    model = Gemma3ForCausalLM(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.add_(0.1 * torch.randn_like(param))
    return model


MODELS = {"llama": lambda: random_target(seed=2, logit_scale=3.0), "gemma": tiny_gemma}


def forward(model, cache, ids, positions, slot=0, tree_mask=None):
    with torch.inference_mode():
        return model(torch.tensor([ids]), torch.tensor([positions]), cache, torch.tensor([slot]),
                     tree_mask=tree_mask)


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("kernel", ["sdpa", "invariant"])
def test_tree_forward_equals_each_branch_as_a_chain(name, kernel):
    """Every node's logits equal those of its root-to-node path run as a plain chain (to fp32 rounding: the dense
    linears see other row counts), through SDPA and through the batch-invariant attention kernel; the prefix
    is longer than the Gemma test model's sliding window, so the window applies to tree nodes by their depth."""
    model = MODELS[name]()
    if kernel == "invariant":
        invariant(model)
    vocab = model.config.vocab_size
    prefix = [(7 * i + 3) % vocab for i in range(9)]
    nodes = [prefix[-1], 11, 12, 21, 22]                       # root (x_{m-1}) then the two branches
    layout = TreeLayout.fixed(TWO_BRANCHES, None, torch.device("cpu"))
    cache = model.make_cache(1, 32)
    forward(model, cache, prefix[:-1], list(range(len(prefix) - 1)))
    root = len(prefix) - 1
    tree = forward(model, cache, nodes, [root + d for d in layout.depths[0].tolist()], tree_mask=layout.tree_mask)
    for branch in ([0, 1, 2], [0, 3, 4]):
        chain_cache = model.make_cache(1, 32)
        forward(model, chain_cache, prefix[:-1], list(range(len(prefix) - 1)))
        chain = forward(model, chain_cache, [nodes[i] for i in branch], [root, root + 1, root + 2])
        torch.testing.assert_close(tree.logits[0, branch], chain.logits[0], atol=1e-5, rtol=0)


def test_tree_mask_is_checked_and_needs_a_cache():
    model = random_target()
    cache = model.make_cache(1, 16)
    with pytest.raises(ValueError, match=r"tree_mask has shape \(2, 2\).*T=3"):
        forward(model, cache, [1, 2, 3], [0, 1, 1], tree_mask=torch.ones(2, 2, dtype=torch.bool))
    with pytest.raises(ValueError, match="needs a KV cache"):
        model(torch.tensor([[1, 2]]), torch.tensor([[0, 1]]), None, None, tree_mask=torch.ones(2, 2).bool())


def test_cache_move_copies_every_layer_and_reads_before_writing():
    model = random_target(num_layers=2)
    cache = model.make_cache(2, 8)
    for buffer in (*cache.keys, *cache.values):
        buffer.copy_(torch.randn_like(buffer))
    before = [b.clone() for b in (*cache.keys, *cache.values)]
    # slot 1: positions 3, 5 -> 4, 5 (overlapping: 5 is read before it is written)
    cache.move(torch.tensor([1]), torch.tensor([[3, 5]]), torch.tensor([[4, 5]]))
    for old, new in zip(before, (*cache.keys, *cache.values)):
        assert torch.equal(new[1, :, 4], old[1, :, 3]) and torch.equal(new[1, :, 5], old[1, :, 5])
        assert torch.equal(new[0], old[0]) and torch.equal(new[1, :, :4], old[1, :, :4])


def test_bad_trees_are_refused():
    device = torch.device("cpu")
    for parents in ((0, 0), (-1, 1), (-1, 0, 3), ()):
        with pytest.raises(ValueError, match="must start with -1"):
            TreeLayout.fixed(parents, None, device)
    with pytest.raises(ValueError, match="impossible"):
        TreeLayout(4, 4, None, device, 1)


# ---- acceptance ---------------------------------------------------------------------------------------


def chain(length):
    return TreeLayout.fixed((-1, *range(length - 1)), None, torch.device("cpu"))


def test_tree_acceptance_on_a_chain_is_chain_acceptance():
    generator = torch.Generator().manual_seed(0)
    layout = chain(5)
    for _ in range(50):
        logits = torch.randn(3, 5, 4, generator=generator)
        drafts = logits.argmax(-1)[:, :4].clone()
        drafts[torch.rand(3, 4, generator=generator) < 0.3] = 0      # some drafts wrong
        roots = torch.randint(4, (3, 1), generator=generator)
        last, tokens = accept_greedy_tree(logits, torch.cat((roots, drafts), 1), layout.parents, layout.ancestors,
                                          layout.depth_rank)
        expected_lengths, expected_tokens = accept_greedy(logits, drafts)
        assert torch.equal(last, expected_lengths) and torch.equal(tokens, expected_tokens)
        draws = logits.argmax(-1).tolist()
        for row in range(3):
            path, token = accept_keyed_tree(draws[row].__getitem__, [0] + drafts[row].tolist(), layout.children)
            assert (len(path) - 1, token) == accept_keyed(draws[row].__getitem__, drafts[row].tolist())


def test_tree_acceptance_follows_the_branch_the_target_chose():
    layout = TreeLayout.fixed(TWO_BRANCHES, None, torch.device("cpu"))
    vocab = 30
    # the target's choice after each node: root -> 21, node 3 (21) -> 22, node 4 (22) -> 5
    choice = torch.tensor([21, 12, 0, 22, 5])
    logits = torch.nn.functional.one_hot(choice, vocab).float()[None]          # [1, 5, V]
    nodes = torch.tensor([[9, 11, 12, 21, 22]])
    last, token = accept_greedy_tree(logits, nodes, layout.parents, layout.ancestors, layout.depth_rank)
    assert (last.item(), token.item()) == (4, 5)
    assert accept_keyed_tree(choice.tolist().__getitem__, nodes[0].tolist(), layout.children) == ([0, 3, 4], 5)
    # node 1 (11) is the target's choice, node 2 (12) is not what follows it: one accepted, then 12's choice
    choice = torch.tensor([11, 13, 0, 22, 5])
    logits = torch.nn.functional.one_hot(choice, vocab).float()[None]
    last, token = accept_greedy_tree(logits, nodes, layout.parents, layout.ancestors, layout.depth_rank)
    assert (last.item(), token.item()) == (1, 13)


class _NoCache:
    def move(self, slot_index, source, destination):
        pass


def test_a_tree_tells_what_its_chain_of_first_children_accepted():
    """The path of first children from the root is the chain of the tree's depth (drafters write a node's
    children best first): the round reports how many of its nodes the accepted path took, and how deep the tree
    drafted it (a chain cut short was not drafted further: no failure there)."""
    device = torch.device("cpu")
    layout = TreeLayout(5, 2, _NoCache(), device, rows=4)
    trees = [TWO_BRANCHES, TWO_BRANCHES, (-1, 0, 0, 1, 2), (-1, 0, 0, 2, 2)]
    # the target's choice after each node, per row (node tokens: 10 + node index)
    choices = [[11, 12, 0, 0, 0],    # down the first children: 1, 2
               [13, 0, 0, 14, 0],    # down the second branch: 3, 4
               [11, 0, 0, 5, 0],     # node 1 (the chain's), then a token no child has
               [11, 0, 0, 0, 0]]     # node 1, the chain's whole depth in this tree (2's children are not its)
    layout.parents.copy_(torch.tensor([[max(p, 0) for p in tree] for tree in trees]))
    layout.prepare(4)
    assert layout.chain_depth.tolist() == [2, 2, 2, 1]
    assert layout.on_chain.tolist()[2] == [True, True, False, True, False]
    vocab = 20
    logits = torch.nn.functional.one_hot(torch.tensor(choices), vocab).float()
    verify_ids = (10 + torch.arange(5)).expand(4, -1).clone()
    out = type("Out", (), {"logits": logits, "hidden": torch.zeros(4, 5, 2)})()
    accept_lengths, next_tokens, _, _ = layout.accept(None, out, verify_ids, torch.zeros(4, 4, dtype=torch.long),
                                                      torch.zeros(4, 5, dtype=torch.long), torch.arange(4), None)
    assert accept_lengths.tolist() == [2, 2, 1, 1]
    assert layout.chain_accepted.tolist() == [2, 0, 1, 1]


def test_keyed_tree_draws_are_keyed_by_depth():
    """Sibling nodes share an output position: their keyed draws use the same key, so the tree's emitted text is
    the chain's."""
    torch.manual_seed(0)
    logits = torch.randn(1, 5, 40)
    logits[0, 1] = logits[0, 3]                                 # two siblings with the same law
    noise = KeyedNoise(40, torch.device("cpu"))
    sampling = RoundSampling(torch.ones(1), torch.zeros(1, dtype=torch.long), torch.ones(1), False, None, None,
                             None, KeyedDraws([KeyedRow(False, 1.0, 1234, 7)], noise))
    draw = keyed_draws(logits, sampling, [0, 1, 2, 1, 2])[0]
    chain_draw = keyed_draws(logits, sampling)[0]
    assert draw(1) == draw(3) == chain_draw(1)
    # the same law keyed at other positions draws other tokens somewhere (the key is not ignored)
    assert any(keyed_draws(logits, RoundSampling(torch.ones(1), torch.zeros(1, dtype=torch.long), torch.ones(1),
                                                 False, None, None, None,
                                                 KeyedDraws([KeyedRow(False, 1.0, 1234, start)], noise)),
                           [0, 1, 2, 1, 2])[0](3) != draw(3) for start in range(8, 40))


# ---- a tree drafter in the worker ---------------------------------------------------------------------


class HiddenBranchDrafter(Drafter):
    """Draft tree TWO_BRANCHES at tier 4: the target's own next two tokens (``reference``: each slot's whole
    target-only sequence) in a random branch, a decoy in the other, the true second token replaced at random."""

    def __init__(self, slots, reference: dict[int, list[int]], seed: int = 0):
        self.slots, self.reference, self.random = slots, reference, random.Random(seed)
        self.branches_accepted: set[int] = set()

    def supports(self, steps: int) -> bool:
        return steps == len(TWO_BRANCHES) - 1

    def tree_parents(self, steps: int):
        return TWO_BRANCHES

    def begin_round(self, tier, slots) -> bool:
        rows = []
        vocab = 64
        for slot in slots:
            m = self.slots.host_seq_lens[slot]
            truth = (self.reference[slot] + [0, 0])[m:m + 2]
            if self.random.random() < 0.3:
                truth = [truth[0], (truth[1] + 1) % vocab]
            decoy = [(truth[0] + 1) % vocab, (truth[1] + 7) % vocab]
            rows.append(truth + decoy if self.random.random() < 0.5 else decoy + truth)
        tier.draft.draft_tokens[:len(slots)].copy_(torch.tensor(rows))
        return True


def decode(worker, prompts, max_new_tokens, params, seeds=None):
    generators = [None if seeds is None else torch.Generator().manual_seed(s) for s in (seeds or prompts)]
    first = worker.prefill(range(len(prompts)), prompts, [params] * len(prompts), generators)
    outputs, accepts = [[token] for token in first], []
    running = list(range(len(prompts)))
    while running:
        result = worker.decode_round(running)
        for slot, new in zip(running, result.new_tokens):
            outputs[slot].extend(new)
        accepts.extend(result.accept_lengths)
        running = [s for s in running if len(outputs[s]) < max_new_tokens]
    return [out[:max_new_tokens] for out in outputs], accepts


PROMPTS = [[1, 5, 9, 2], [7, 7, 3], [4, 8, 15, 16, 23, 42]]


@pytest.mark.parametrize("mode", ["eager", "stage_graphs", "round_graphs"])
@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "keyed"])
def test_tree_drafter_is_lossless(mode, sampled):
    """A tree tier's output equals target-only decoding token for token (greedy, and keyed draws at T=1), in
    eager mode, stage graphs and whole-round graphs; rounds accept through both branches."""
    target = invariant(random_target(seed=3, logit_scale=3.0))
    params = SamplingParams(max_new_tokens=24, temperature=1.0 if sampled else 0.0)
    seeds = [11, 12, 13] if sampled else None
    options = dict(max_batch_size=4, max_seq_len=64, graphs=mode != "eager", round_graphs=mode == "round_graphs")
    plain = SpeculativeWorker(target, None, speculative_algorithm=None, **options)
    expected, _ = decode(plain, PROMPTS, 24, params, seeds)
    reference = {slot: prompt + out for slot, (prompt, out) in enumerate(zip(PROMPTS, expected))}
    drafters = []

    def factory(slots):
        drafters.append(HiddenBranchDrafter(slots, reference))
        return drafters[-1]

    tree = SpeculativeWorker(target, None, speculative_algorithm=factory, speculative_num_steps=4, **options)
    got, accepts = decode(tree, PROMPTS, 24, params, seeds)
    assert got == expected
    assert max(accepts) == 2 and accepts.count(2) >= 5       # the hidden branch is found, in either position


def test_tree_rounds_accept_through_the_second_branch():
    """The layout really moves the second branch's keys: with only the second branch ever true, output still
    equals target-only and every round accepts two; what the drafter's extend sees is the accepted path as a
    chain (its positions m-1.., the target's hidden states there)."""
    target = invariant(random_target(seed=3, logit_scale=3.0))
    params = SamplingParams(max_new_tokens=20)
    plain = SpeculativeWorker(target, None, speculative_algorithm=None, max_batch_size=4, max_seq_len=64)
    expected, _ = decode(plain, PROMPTS, 20, params)
    reference = {slot: prompt + out for slot, (prompt, out) in enumerate(zip(PROMPTS, expected))}

    class SecondBranch(HiddenBranchDrafter):
        def begin_round(self, tier, slots) -> bool:
            rows = []
            for slot in slots:
                m = self.slots.host_seq_lens[slot]
                truth = (self.reference[slot] + [0, 0])[m:m + 2]
                rows.append([(truth[0] + 1) % 64, truth[1]] + truth)
            tier.draft.draft_tokens[:len(slots)].copy_(torch.tensor(rows))
            return True

        def extend(self, tier, forwards, slot_index, seq_lens, positions, target_hidden, accept_lengths,
                   next_tokens, key_length):
            extended.append((slot_index.tolist(), positions.clone(), target_hidden.clone(), accept_lengths.tolist()))

    extended = []

    tree = SpeculativeWorker(target, None, speculative_algorithm=lambda slots: SecondBranch(slots, reference),
                       speculative_num_steps=4, max_batch_size=4, max_seq_len=64)
    got, accepts = decode(tree, PROMPTS, 20, params)
    assert got == expected
    assert set(accepts[:-3]) == {2}
    full = {}
    for slot, sequence in reference.items():
        with torch.inference_mode():
            full[slot] = target(torch.tensor([sequence]), torch.arange(len(sequence))[None],
                                target.make_cache(1, 64), torch.tensor([0])).hidden[0]
    for slots, positions, hidden, accepted in extended:
        for row, slot in enumerate(slots):
            span = positions[row, :accepted[row] + 1]
            assert torch.equal(span, span[0] + torch.arange(len(span)))
            torch.testing.assert_close(hidden[row, :len(span)], full[slot][span], atol=1e-5, rtol=0)


def test_a_tree_with_the_wrong_node_count_is_refused():
    target = random_target()

    class Wrong(HiddenBranchDrafter):
        def supports(self, steps):
            return True

    with pytest.raises(ValueError, match="draft tree has 4 nodes; it must have 3"):
        SpeculativeWorker(target, None, speculative_algorithm=lambda slots: Wrong(slots, {}), speculative_num_steps=3)

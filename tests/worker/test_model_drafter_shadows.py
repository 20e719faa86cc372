"""The model drafters' checks (``ModelDrafter``, EAGLE and standalone): at tier 0 what tier 1 would have accepted
(shadows), at a chain tier what the chain one step deeper would have accepted one draft past it."""

import pytest
import torch
from spec_helpers import (attention_pair, random_eagle_head, random_target, reference_eagle_drafts, reference_greedy,
                          run_to_completion)

from specswap.sampling import RoundSampling, SamplingParams
from specswap.worker import SpeculativeWorker
from specswap.worker import drafter as drafter_module
from specswap.worker.drafter import (CONFIRM_ROUNDS, DEEP_CHECK_EVERY, DEEP_CHECK_SETTLE_CHECKS,
                                     DEEP_CHECK_SETTLED_EVERY, SHADOW_EVERY)

PROMPTS = [[1, 5, 9, 2], [7, 3, 3, 8, 1, 6]]


def recording_rounds(worker):
    """worker.decode_round wrapped to collect, per round, (its slots, each one's committed length before it, its
    result)."""
    rounds = []
    decode_round = worker.decode_round

    def recording(slots):
        before = [len(worker.slots.host_tokens[s]) for s in slots]
        result = decode_round(slots)
        rounds.append((list(slots), before, result))
        return result

    worker.decode_round = recording
    return rounds


def standalone_pair():
    """A target and a 1-layer draft of the same vocabulary that agrees with it in part."""
    target = random_target(seed=0, logit_scale=3.0)
    draft = random_target(num_layers=1, seed=0, logit_scale=3.0)
    with torch.no_grad():
        draft.model.layers[0].load_state_dict(target.model.layers[0].state_dict())
    return target, draft


def reference_standalone_draft(draft, committed):
    """Tier 1's standalone draft recomputed from scratch: the draft model's argmax after the committed tokens."""
    cache = draft.make_cache(1, len(committed))
    out = draft(torch.tensor([committed]), torch.arange(len(committed)).unsqueeze(0), cache, torch.tensor([0]))
    return int(out.logits[0, -1].argmax())


def check_every_round(monkeypatch):
    """Checks past the chain in every chain round, however long the stay."""
    monkeypatch.setattr(drafter_module, "DEEP_CHECK_EVERY", 1)
    monkeypatch.setattr(drafter_module, "DEEP_CHECK_SETTLE_CHECKS", 10**9)


PAIRS = {"EAGLE": lambda: attention_pair(head_noise=0.1), "STANDALONE": standalone_pair}


@pytest.mark.parametrize("algorithm, graphs", [("EAGLE", False), ("EAGLE", True), ("STANDALONE", False),
                                               ("STANDALONE", True)])
def test_greedy_shadows_are_what_tier_one_would_have_accepted(algorithm, graphs):
    """A static tier-0 worker (tiers 0 and 1) reports, in each of its first CONFIRM_ROUNDS rounds and then every
    SHADOW_EVERY-th, whether tier 1's draft (the draft's argmax, recomputed from scratch) equals the token the
    round emitted."""
    target, draft = PAIRS[algorithm]()
    worker = SpeculativeWorker(target, draft, algorithm, speculative_num_steps=0, tiers=(0, 1), max_seq_len=64,
                               graphs=graphs)
    assert worker.drafter.shadow_steps == 1
    rounds = recording_rounds(worker)
    outputs = run_to_completion(worker, PROMPTS, 48)[0]
    checked, outcomes = 0, []
    for index, (slots, lengths, result) in enumerate(rounds):
        before, shadow = dict(zip(slots, lengths)), result.shadow
        if index >= CONFIRM_ROUNDS and (index + 1 - CONFIRM_ROUNDS) % SHADOW_EVERY:
            assert shadow is None
            continue
        expected = []
        for slot, length in before.items():
            committed = (PROMPTS[slot] + outputs[slot])[:length]
            draft_token = (reference_eagle_drafts(target, draft, committed, 1)[0] if algorithm == "EAGLE"
                           else reference_standalone_draft(draft, committed))
            expected.append(int(draft_token == (PROMPTS[slot] + outputs[slot])[length]))
        assert shadow is not None and shadow.steps == 1 and shadow.accept_lengths == expected
        checked += len(expected)
        outcomes += expected
    assert checked >= 10 and 0 < sum(outcomes) < len(outcomes)  # both outcomes seen: the check can fail


@pytest.mark.parametrize("algorithm", list(PAIRS))
def test_a_drafting_round_drops_the_checks_and_tokens_stay_lossless(algorithm):
    """Checks pending when a drafting round runs are dropped (that round observed itself); switching between
    tier 0 (checked) and drafting tiers keeps greedy output equal to target-only."""
    target, head = PAIRS[algorithm]()
    worker = SpeculativeWorker(target, head, algorithm, speculative_num_steps=0, tiers=(0, 1, 3), max_seq_len=96)
    plain = SpeculativeWorker(target, head, algorithm, speculative_num_steps=0, tiers=(0,), max_seq_len=96)
    assert plain.drafter.shadow_steps == 1  # tier 0 only still checks: a tier-0 worker
    pattern = [0, 0, 3, 0, 0, 0, 0, 1, 0]
    tokens = run_to_completion(worker, PROMPTS, 40, switch=lambda i: pattern[i % len(pattern)])[0]
    assert tokens == run_to_completion(plain, PROMPTS, 40)[0]
    pending = worker.drafter._pending
    worker.pool.activate(0)
    worker.drafter._tier0_rounds = 0  # the next tier-0 round checks
    worker.drafter.begin_round(worker.pool.acquire().round.stages, [0, 1])
    assert pending[0] is not None and pending[1] is not None
    assert worker.drafter.take_shadow([0, 1], drafting=True) is None and pending == [None] * len(pending)


@pytest.mark.parametrize("algorithm", list(PAIRS))
def test_the_first_tier_zero_rounds_after_a_drafting_round_are_all_checked(algorithm):
    """After each drafting round, tier-0 rounds 1..CONFIRM_ROUNDS are all checked, then every SHADOW_EVERY-th:
    a move to tier 0 is confirmed (or undone) on fresh evidence before the checks thin out."""
    target, head = PAIRS[algorithm]()
    worker = SpeculativeWorker(target, head, algorithm, speculative_num_steps=0, tiers=(0, 1), max_seq_len=128)
    rounds = recording_rounds(worker)
    pattern = [1] + [0] * 20
    _, _, tiers = run_to_completion(worker, PROMPTS, 60, switch=lambda i: pattern[i % len(pattern)])
    assert len(tiers) >= 2 * len(pattern)
    checked = []
    for index, (tier, (_, _, result)) in enumerate(zip(tiers, rounds)):
        shadow = result.shadow
        since = index % len(pattern)  # tier-0 rounds since the drafting round
        assert tier == (1 if since == 0 else 0)
        expect = since > 0 and (since <= CONFIRM_ROUNDS or (since - CONFIRM_ROUNDS) % SHADOW_EVERY == 0)
        assert (shadow is not None) == expect, (index, since)
        checked.append(since) if expect else None
    assert CONFIRM_ROUNDS == 8 and SHADOW_EVERY == 8 and set(checked) == {1, 2, 3, 4, 5, 6, 7, 8, 16}


@pytest.mark.parametrize("algorithm", list(PAIRS))
def test_paused_checks_check_nothing_and_a_drafting_round_still_catches_up(algorithm):
    """``pause_checks(True)`` (no drafting tier could pay: ``AdaptiveController.checks_pay``): tier-0 rounds check
    nothing, and the drafting rounds after them catch the draft up as they would anyway (greedy output equal to
    target-only); unpaused, the checks come back."""
    target, head = PAIRS[algorithm]()
    worker = SpeculativeWorker(target, head, algorithm, speculative_num_steps=0, tiers=(0, 1), max_seq_len=128)
    plain = SpeculativeWorker(target, head, algorithm, speculative_num_steps=0, tiers=(0,), max_seq_len=128)
    rounds = recording_rounds(worker)
    worker.drafter.pause_checks(True)
    pattern = [0] * 12 + [1, 1]
    tokens, _, tiers = run_to_completion(worker, PROMPTS, 40, switch=lambda i: pattern[i % len(pattern)])
    assert tokens == run_to_completion(plain, PROMPTS, 40)[0]
    assert 0 in tiers and 1 in tiers and all(result.shadow is None for _, _, result in rounds)
    worker.drafter.pause_checks(False)
    worker.pool.activate(0)
    worker.drafter.begin_round(worker.pool.acquire().round.stages, [0, 1])
    assert worker.drafter._pending[0] is not None


@pytest.mark.parametrize("algorithm", list(PAIRS))
def test_without_tier_zero_nothing_is_checked(algorithm):
    target, head = PAIRS[algorithm]()
    worker = SpeculativeWorker(target, head, algorithm, speculative_num_steps=2, tiers=(1, 2), max_seq_len=64)
    assert worker.drafter.shadow_steps == 0
    rounds = recording_rounds(worker)
    run_to_completion(worker, PROMPTS, 20)
    assert all(result.shadow is None for _, _, result in rounds)


@pytest.mark.parametrize("reduced", [False, True])
def test_sampled_checks_have_the_law_of_tier_one_acceptance(reduced):
    """Exact law: with x drawn from p (the target's law) and one draw at min(1, q(x)/p(x)), a check accepts with
    probability sum_x min(p(x), q(x)), tier 1's acceptance for d ~ q. 6000 checks against that value; the
    obvious biased rule (accept when x equals a draw from q: sum p q) is far outside the tolerance. With a
    reduced draft vocabulary (every other token) q is 0 outside it, and the draft ids map through."""
    target, _ = attention_pair(head_noise=0.1)
    vocab = target.config.vocab_size
    token_map = list(range(0, vocab, 2)) if reduced else None
    head = random_eagle_head(target, token_map=token_map)
    worker = SpeculativeWorker(target, head, "EAGLE", speculative_num_steps=0, tiers=(0, 1), max_seq_len=64)
    drafter = worker.drafter
    torch.manual_seed(3)
    target_logits = torch.randn(2, 1, vocab) * 2.0
    agreeing = target_logits[:, 0] + torch.randn(2, vocab) * 1.5  # a head that agrees in part
    draft_logits = agreeing if token_map is None else agreeing[:, token_map]
    temperature = torch.tensor([0.8, 1.3])
    p = torch.softmax(target_logits[:, 0] / temperature.unsqueeze(-1), dim=-1)
    q_draft = torch.softmax(draft_logits / temperature.unsqueeze(-1), dim=-1)
    q = q_draft if token_map is None else torch.zeros(2, vocab).index_copy_(1, torch.tensor(token_map), q_draft)
    exact = torch.minimum(p, q).sum(-1)
    biased = (p * q).sum(-1)
    assert (exact - biased).abs().min() > 0.1
    sampling = RoundSampling(temperature, torch.zeros(2, dtype=torch.long), torch.ones(2), False,
                             torch.zeros(2, 0, vocab), torch.zeros(2, 0), torch.zeros(2))
    slot_index = torch.tensor([0, 1])
    drafter._check_logits = draft_logits  # the round's check: the law of d_1
    n, accepted = 6000, torch.zeros(2)
    generator = torch.Generator().manual_seed(0)
    for _ in range(n):
        next_tokens = torch.multinomial(p, 1, generator=generator).squeeze(-1)
        for slot in (0, 1):
            drafter._pending[slot] = (0, -1, None)
        drafter.observe_plain_round(slot_index, target_logits, next_tokens, sampling)
        accepted += torch.tensor([drafter._pending[0][2], drafter._pending[1][2]], dtype=torch.float)
    torch.testing.assert_close(accepted / n, exact, atol=0.025, rtol=0)


@pytest.mark.parametrize("algorithm", list(PAIRS))
def test_sampled_checks_reach_the_shadow(algorithm):
    """A sampled tier-0 worker reports its checks, one step each."""
    target, head = PAIRS[algorithm]()
    worker = SpeculativeWorker(target, head, algorithm, speculative_num_steps=0, tiers=(0, 1), max_seq_len=64)
    rounds = recording_rounds(worker)
    run_to_completion(worker, PROMPTS, 48, params=SamplingParams(max_new_tokens=48, temperature=1.0, seed=5))
    settled = [a for _, _, result in rounds if result.shadow is not None for a in result.shadow.accept_lengths]
    assert len(settled) >= 10 and set(settled) <= {0, 1}


# ---- checks one draft past the chain ---------------------------------------------------------------------------


def noisy_standalone_pair(noise=0.1):
    """A target and a draft that is the target with noise on its second layer: its chains accept in part (with
    the 1-layer draft of ``standalone_pair`` no request accepts two drafts)."""
    target = random_target(seed=0, logit_scale=3.0)
    draft = random_target(seed=0, logit_scale=3.0)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in draft.model.layers[1].parameters():
            parameter.add_(noise * torch.randn(parameter.shape, generator=generator))
    return target, draft


@pytest.mark.parametrize("algorithm, graphs", [("EAGLE", False), ("EAGLE", True), ("STANDALONE", False),
                                               ("STANDALONE", True)])
def test_greedy_checks_past_the_chain_are_what_the_next_chain_would_have_accepted(algorithm, graphs, monkeypatch):
    """A chain-k worker with chain k + 1 among its tiers, checking every round (graphs: in place of the
    whole-round graph; EAGLE at k = 1, standalone at k = 2, where these pairs' checks see both outcomes): a
    request that accepted all k drafts reports whether chain k + 1's last draft (recomputed from scratch) equals
    the bonus token it emitted; the others report -1. Tokens stay target-only's."""
    check_every_round(monkeypatch)
    steps = 1 if algorithm == "EAGLE" else 2
    target, draft = attention_pair(head_noise=0.1) if algorithm == "EAGLE" else noisy_standalone_pair()
    worker = SpeculativeWorker(target, draft, algorithm, speculative_num_steps=steps, tiers=(1, 2, 3),
                               max_seq_len=96, graphs=graphs)
    rounds = recording_rounds(worker)
    outputs = run_to_completion(worker, PROMPTS, 48)[0]
    assert outputs == [reference_greedy(target, prompt, 48) for prompt in PROMPTS]
    outcomes = []
    for slots, before, result in rounds:
        expected = []
        for slot, length, accepted, new in zip(slots, before, result.accept_lengths, result.new_tokens):
            if accepted < steps:
                expected.append(-1)
                continue
            committed = (PROMPTS[slot] + outputs[slot])[:length]  # d_1..d_k, then the bonus: new
            deeper = (reference_eagle_drafts(target, draft, committed, steps + 1)[steps] if algorithm == "EAGLE"
                      else reference_standalone_draft(draft, committed + new[:steps]))
            expected.append(int(deeper == new[steps]))
        assert result.deep_checks == expected
        outcomes += [outcome for outcome in expected if outcome >= 0]
    assert len(outcomes) >= 5 and 0 < sum(outcomes) < len(outcomes)  # both outcomes seen: the check can fail


@pytest.mark.parametrize("algorithm", list(PAIRS))
def test_chain_rounds_check_past_the_chain_every_few_rounds_and_only_greedy(algorithm):
    target, draft = PAIRS[algorithm]()
    worker = SpeculativeWorker(target, draft, algorithm, speculative_num_steps=2, tiers=(1, 2, 3), max_seq_len=96)
    rounds = recording_rounds(worker)
    run_to_completion(worker, PROMPTS, 48)
    assert len(rounds) >= 3 * DEEP_CHECK_EVERY
    settled = DEEP_CHECK_SETTLE_CHECKS * DEEP_CHECK_EVERY  # one stay at chain 2: its checks every 4th round, then
    assert [result.deep_checks is not None for _, _, result in rounds] == [
        (index + 1) % (DEEP_CHECK_EVERY if index < settled else DEEP_CHECK_SETTLED_EVERY) == 0
        for index in range(len(rounds))]
    rounds.clear()
    run_to_completion(worker, PROMPTS, 48, params=SamplingParams(temperature=1.0, max_new_tokens=48))
    assert len(rounds) >= DEEP_CHECK_EVERY and all(result.deep_checks is None for _, _, result in rounds)


@pytest.mark.parametrize("algorithm", list(PAIRS))
def test_a_settled_chain_tier_is_checked_less_often(algorithm, monkeypatch):
    """Once a chain tier has made DEEP_CHECK_SETTLE_CHECKS checks, every DEEP_CHECK_SETTLED_EVERY-th round of the
    chain tiers is checked, over its stays (the top chain, tier 3, checks nothing and counts no chain round);
    sampled rounds make no check and unsettle every tier. Here settled after 2 checks, then every 8th: rounds 0-19
    at chain 2 check 3, 7 (every 4th) and 15 (settled, the 16th chain round); round 20 at chain 3; back at chain 2,
    still settled, the rounds of the chain tiers count on (round 24 is the 24th): 24, 32, 40, ... A tier that
    settled before sampled rounds is not settled when greedy rounds come back."""
    monkeypatch.setattr(drafter_module, "DEEP_CHECK_SETTLE_CHECKS", 2)
    monkeypatch.setattr(drafter_module, "DEEP_CHECK_SETTLED_EVERY", 8)
    target, draft = PAIRS[algorithm]()
    worker = SpeculativeWorker(target, draft, algorithm, speculative_num_steps=2, tiers=(1, 2, 3), max_seq_len=256)
    rounds = recording_rounds(worker)
    outputs = run_to_completion(worker, PROMPTS, 160, switch=lambda i: 3 if i == 20 else 2)[0]
    assert outputs == [reference_greedy(target, prompt, 160) for prompt in PROMPTS]
    assert len(rounds) > 40
    checked = {index for index, (_, _, result) in enumerate(rounds) if result.deep_checks is not None}
    assert checked == {3, 7, 15} | set(range(24, len(rounds), 8))
    worker = SpeculativeWorker(target, draft, algorithm, speculative_num_steps=2, tiers=(1, 2, 3), max_seq_len=256)
    run_to_completion(worker, PROMPTS, 40)  # chain 2 settles (checks at chain rounds 4, 8)
    assert worker.drafter._checks == {2: worker.drafter._chain_rounds // 8 + 1}
    worker.drafter._chain_rounds = 0
    rounds = recording_rounds(worker)
    run_to_completion(worker, PROMPTS, 48, params=SamplingParams(temperature=1.0, max_new_tokens=48))
    sampled = len(rounds)  # chain rounds of the stay, none checked
    assert sampled >= 16 and all(result.deep_checks is None for _, _, result in rounds)
    rounds.clear()
    run_to_completion(worker, PROMPTS, 160)
    first = (sampled // 4 + 1) * 4  # the stay's first two checks come every 4th chain round, then every 8th
    expected = {first, first + 4} | set(range((first + 4) // 8 * 8 + 8, sampled + len(rounds) + 1, 8))
    assert {sampled + index + 1 for index, (_, _, result) in enumerate(rounds)
            if result.deep_checks is not None} == expected


@pytest.mark.parametrize("algorithm", list(PAIRS))
def test_checks_past_the_chain_in_every_round_keep_switching_tiers_lossless(algorithm, monkeypatch):
    """Checked every round, with the tier switched among chains 1-3 every round, greedy output is target-only's;
    the top chain (no chain one deeper) and sampled rounds check nothing."""
    check_every_round(monkeypatch)
    target, draft = PAIRS[algorithm]()
    worker = SpeculativeWorker(target, draft, algorithm, speculative_num_steps=1, tiers=(1, 2, 3), max_seq_len=128)
    rounds = recording_rounds(worker)
    pattern = [1, 2, 3, 2]
    outputs = run_to_completion(worker, PROMPTS, 48, switch=lambda i: pattern[i % len(pattern)])[0]
    assert outputs == [reference_greedy(target, prompt, 48) for prompt in PROMPTS]
    assert all((result.deep_checks is None) == (result.ran.steps == 3) for _, _, result in rounds)
    rounds.clear()
    run_to_completion(worker, PROMPTS, 24, params=SamplingParams(temperature=1.0, max_new_tokens=24),
                      switch=lambda i: pattern[i % len(pattern)])
    assert rounds and all(result.deep_checks is None for _, _, result in rounds)

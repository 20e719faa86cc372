"""SpeculativeWorker: greedy outputs equal target-only decoding for every tier, draft alignment, sampling law."""

import itertools

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spec_helpers import (attention_pair, bigram_pair, random_eagle_head, random_target, reference_eagle_drafts,
                          reference_greedy, run_to_completion)
from specswap.sampling import (LOSSLESS, SamplingParams, Verifier, accept_draft_tokens, logits_to_probs,
                               sample_from_cdf)
from specswap.prompt_lookup import NumberTokens
from specswap.worker import SpeculativeWorker

PROMPTS = [[1, 2, 3], [5, 6, 7, 8, 9, 10, 11], [4], [9, 9, 9, 9, 2]]
MAX_NEW = 14


def perturbed_copy(target, scale=0.02, seed=5):
    copy = random_target(target.config.vocab_size, target.config.hidden_size, target.config.num_hidden_layers)
    copy.load_state_dict(target.state_dict())
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in copy.parameters():
            p.add_(scale * torch.randn_like(p))
    return copy.eval()


def make_pair(name):
    """(target, draft, speculative_algorithm) for the draft kinds the worker supports."""
    if name == "eagle_random":
        target = random_target()
        return target, random_eagle_head(target), "EAGLE"
    if name == "eagle_token_map":
        target = random_target()
        return target, random_eagle_head(target, token_map=list(range(1, 64, 3))), "EAGLE"
    if name == "eagle_exact":  # accepts every draft (on a target blind to its cache: the acceptance check only)
        return (*bigram_pair(), "EAGLE")
    if name == "eagle_close":  # accepts nearly every draft, on a target whose attention matters
        return (*attention_pair(), "EAGLE")
    if name == "eagle_partial":
        return (*attention_pair(head_noise=0.1), "EAGLE")
    if name == "standalone_self":  # the target drafting for itself accepts everything
        target = random_target()
        return target, target, "STANDALONE"
    if name == "standalone_copy":
        target = random_target()
        return target, perturbed_copy(target), "STANDALONE"
    if name in ("ngram", "ngram_numbers"):  # the target falls into loops, which prompt lookup predicts
        return attention_pair()[0], None, "NGRAM"
    raise KeyError(name)


# ngram_numbers: tokens 0..9 taken for digits, so NGRAM extrapolates "counters" in the target's loops (its
# drafts go wrong more often than plain copies; the output must not move)
WORKER_OPTIONS = {"ngram_numbers": {"number_tokens": NumberTokens(range(10))}}
PAIRS = ["eagle_random", "eagle_token_map", "eagle_exact", "eagle_close", "eagle_partial", "standalone_self",
         "standalone_copy", "ngram", "ngram_numbers"]
_pair_cache = {}


def pair(name):
    if name not in _pair_cache:
        _pair_cache[name] = make_pair(name)
    return _pair_cache[name]


def target_only(target, prompts, max_new_tokens):
    worker = SpeculativeWorker(target, None, None, max_seq_len=64)
    return run_to_completion(worker, prompts, max_new_tokens)[0]


def test_target_only_matches_full_recompute_greedy():
    target = random_target()
    expected = [reference_greedy(target, p, MAX_NEW) for p in PROMPTS]
    assert target_only(target, PROMPTS, MAX_NEW) == expected


@pytest.mark.parametrize("name", PAIRS)
@pytest.mark.parametrize("steps", range(0, 8))
def test_greedy_equals_target_only_for_every_tier(name, steps):
    target, draft, algorithm = pair(name)
    worker = SpeculativeWorker(target, draft, algorithm, speculative_num_steps=steps, max_seq_len=64,
                         **WORKER_OPTIONS.get(name, {}))
    tokens, accepts, _ = run_to_completion(worker, PROMPTS, MAX_NEW)
    assert tokens == target_only(target, PROMPTS, MAX_NEW)
    flat = list(itertools.chain(*accepts))
    assert all(0 <= a <= steps for a in flat)
    if name in ("eagle_exact", "standalone_self"):
        # every draft accepted: each round but a truncated last one takes k + 1 tokens
        assert all(a == steps for a in flat)
    if name in ("eagle_partial", "ngram", "ngram_numbers") and steps >= 3:
        assert 0 < sum(flat) < steps * len(flat)  # drafts taken and rejected: the caches roll back
    if name == "eagle_close" and steps:
        assert sum(flat) > 0.75 * steps * len(flat)  # and most rounds take every draft (the bonus token)


@pytest.mark.parametrize("name", ["eagle_random", "eagle_token_map", "eagle_partial"])
def test_eagle_drafts_follow_the_alignment(name):
    """Each round's drafts equal a from-scratch recompute of the head over the committed tokens."""
    target, head, _ = pair(name)
    steps = 4
    worker = SpeculativeWorker(target, head, "EAGLE", speculative_num_steps=steps, max_seq_len=64)
    params = SamplingParams(max_new_tokens=MAX_NEW)
    slots = list(range(len(PROMPTS)))
    first = worker.prefill(slots, PROMPTS, [params] * len(PROMPTS))
    committed = [list(p) + [token] for p, token in zip(PROMPTS, first)]
    for _ in range(4):
        expected = [reference_eagle_drafts(target, head, c, steps) for c in committed]
        result = worker.decode_round(slots)
        assert worker.pool.acquire().draft.draft_tokens[:len(slots)].tolist() == expected
        for c, new in zip(committed, result.new_tokens):
            c.extend(new)


@pytest.mark.parametrize("name", ["eagle_partial", "eagle_token_map"])
def test_eagle_drafts_are_right_again_after_a_stint_at_tier_zero(name):
    target, head, _ = pair(name)
    worker = SpeculativeWorker(target, head, "EAGLE", speculative_num_steps=3, max_seq_len=64, tiers=(0, 3, 4))
    params = SamplingParams(max_new_tokens=MAX_NEW)
    slots = list(range(len(PROMPTS)))
    first = worker.prefill(slots, PROMPTS, [params] * len(PROMPTS))
    committed = [list(p) + [token] for p, token in zip(PROMPTS, first)]
    for steps in (3, 0, 0, 0, 4, 4, 0, 4):
        worker.pool.activate(steps)
        expected = [reference_eagle_drafts(target, head, c, steps) for c in committed]
        result = worker.decode_round(slots)
        assert worker.pool.acquire().draft.draft_tokens[:len(slots)].tolist() == expected
        for c, new in zip(committed, result.new_tokens):
            c.extend(new)


def test_eagle_head_logits_at_one_position_equal_that_row_of_all():
    target, head, _ = pair("eagle_token_map")
    cache = head.make_cache(2, 16)
    ids, features = torch.tensor([[3, 4, 5], [6, 7, 8]]), torch.randn(2, 3, target.config.hidden_size)
    positions, slots = torch.arange(3).expand(2, -1), torch.tensor([0, 1])
    with torch.inference_mode():
        full = head(ids, features, positions, cache, slots).logits
        picked = head(ids, features, positions, cache, slots, logits_at=torch.tensor([2, 0])).logits
    torch.testing.assert_close(picked[:, 0], full[[0, 1], [2, 0]], atol=1e-6, rtol=0)
    assert picked.shape == (2, 1, full.shape[-1])


def test_tier_zero_runs_only_its_checks_and_the_self_draft_accepts_everything_after_it():
    target, _, _ = pair("standalone_self")
    calls = []

    class CountingDraft(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = target
            self.config = target.config

        def make_cache(self, *args, **kwargs):
            return target.make_cache(*args, **kwargs)

        def forward(self, *args, **kwargs):
            calls.append(args[0].shape)
            return target(*args, **kwargs)

    worker = SpeculativeWorker(target, CountingDraft(), "STANDALONE", speculative_num_steps=0, max_seq_len=64,
                         tiers=(0, 3))
    params = SamplingParams(max_new_tokens=MAX_NEW)
    worker.prefill([0, 1], PROMPTS[:2], [params] * 2)
    from specswap.worker.drafter import CONFIRM_ROUNDS, SHADOW_EVERY
    per_round = []
    for _ in range(CONFIRM_ROUNDS + SHADOW_EVERY):
        calls.clear()
        assert worker.decode_round([0, 1]).accept_lengths == [0, 0]
        per_round.append(list(calls))
    # tier 0 drafts nothing: the draft runs only for its checks, each over the batch at once (its catch-up, then
    # step 1; nothing to catch up right after the prefill): in each of the first CONFIRM_ROUNDS rounds, then once
    # in SHADOW_EVERY rounds
    assert per_round[0] == [torch.Size([2, 2])]
    assert all(forwards and all(shape[0] == 2 for shape in forwards) for forwards in per_round[:CONFIRM_ROUNDS])
    assert [bool(forwards) for forwards in per_round[CONFIRM_ROUNDS:]] == [False] * (SHADOW_EVERY - 1) + [True]
    worker.pool.activate(3)
    for _ in range(3):
        assert worker.decode_round([0, 1]).accept_lengths == [3, 3]  # caught up: the copy agrees everywhere


SWITCH_PAIRS = ["eagle_partial", "eagle_close", "eagle_random", "standalone_self", "standalone_copy", "eagle_token_map",
                "ngram", "ngram_numbers"]


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    name=st.sampled_from(SWITCH_PAIRS),
    prompts=st.lists(st.lists(st.integers(0, 63), min_size=1, max_size=12), min_size=1, max_size=4),
    max_new_tokens=st.integers(1, 20),
    pattern=st.lists(st.integers(0, 7), min_size=1, max_size=6),
)
def test_greedy_equals_target_only_under_any_switch_pattern(name, prompts, max_new_tokens, pattern):
    target, draft, algorithm = pair(name)
    worker = SpeculativeWorker(target, draft, algorithm, speculative_num_steps=pattern[0], max_seq_len=40,
                         tiers=range(8), **WORKER_OPTIONS.get(name, {}))
    switched = []

    def switch(round_index):
        steps = pattern[round_index % len(pattern)]
        switched.append(steps)
        return steps

    tokens, _, used = run_to_completion(worker, prompts, max_new_tokens, switch=switch)
    # an NGRAM round with nothing to look up runs as a plain decode (tier 0) whatever the tier
    assert len(used) == len(switched)
    assert all(u == s or (algorithm == "NGRAM" and u == 0) for u, s in zip(used, switched)), (used, switched)
    assert tokens == target_only(target, prompts, max_new_tokens)


def test_caches_are_sized_for_the_largest_tier():
    target, draft, _ = pair("standalone_self")
    worker = SpeculativeWorker(target, draft, "STANDALONE", speculative_num_steps=1, max_seq_len=24, tiers=(1, 3, 7))
    assert worker.target_cache.capacity >= 24 + 7 and worker.drafter.cache.capacity >= 24 + 7
    assert worker.tiers == [1, 3, 7]
    with pytest.raises(ValueError, match="no state registered for tier 9"):
        worker.pool.activate(9)
    # fill to the last position at tier 7: verify writes reach max_seq_len + 6
    prompt = list(range(20))
    worker.prefill([0], [prompt], [SamplingParams(max_new_tokens=4)])
    worker.pool.activate(7)
    while worker.slots.host_seq_lens[0] < 24:
        worker.decode_round([0])


def test_a_tier_the_worker_was_not_built_for_cannot_be_activated():
    target, _, _ = pair("standalone_self")
    eagle = SpeculativeWorker(target, random_eagle_head(target), "EAGLE", speculative_num_steps=1, max_seq_len=24,
                              tiers=(1, 3))
    assert eagle.tiers == [1, 3]  # no tier 0: the head keeps no tier-0 features to catch up from
    with pytest.raises(ValueError, match="no state registered for tier 0; registered tiers: "
                                         r"\[1, 3\]"):
        eagle.pool.activate(0)


def test_the_controller_switches_the_worker_s_pool():
    from specswap.controller import AdaptiveController
    target, draft, _ = pair("standalone_self")
    worker = SpeculativeWorker(target, draft, "STANDALONE", speculative_num_steps=2, max_seq_len=24, tiers=(1, 3, 7))
    controller = AdaptiveController(worker.pool, {"ema_alpha": 1.0, "warmup_batches": 0, "update_interval": 1})
    assert controller.candidate_tiers == [1, 2, 3, 7] and worker.active_tier == 2
    worker.prefill([0], [[1, 2, 3]], [SamplingParams(max_new_tokens=8)])
    # the self-draft accepts both drafts: ema 2 > 2 - 0.5, the policy moves up
    assert controller.observe(worker.decode_round([0])) == 3 and worker.active_tier == 3
    assert controller.observe(worker.decode_round([0])) == 7  # ema 3 > 3 - 0.5: up again
    assert worker.active_tier == 7


def test_every_tier_is_built_once_at_start_up_and_its_state_is_what_the_round_runs():
    from specswap.graphs import capture_count
    target, draft, _ = pair("eagle_partial")
    worker = SpeculativeWorker(target, draft, "EAGLE", speculative_num_steps=3, max_seq_len=24, tiers=(1, 3, 7),
                               graphs=True)
    captured = capture_count()
    states = {}
    for steps in (1, 3, 7):
        worker.pool.activate(steps)
        state = worker.pool.acquire()
        assert state.speculative_num_steps == steps == state.round.stages.speculative_num_steps
        assert state.speculative_num_draft_tokens == state.verify.layout.num_draft_tokens == steps + 1
        assert state.draft is state.round.stages.draft and state.verify is state.round.stages.verify
        states[steps] = state
    assert states[7].draft is not states[3].draft
    worker.prefill([0], [[1, 2, 3]], [SamplingParams(max_new_tokens=8)])
    for steps in (7, 1, 3):
        worker.pool.activate(steps)
        assert worker.decode_round([0]).ran.steps == steps
    assert capture_count() == captured  # nothing built or captured after start-up


@pytest.mark.parametrize("graphs", [False, True])
def test_ngram_round_with_nothing_to_look_up_is_a_plain_decode_the_controller_does_not_see(graphs):
    target = random_target(seed=3)
    # a prompt of 3 distinct tokens whose first new token is a fourth: nothing in it to look up
    lonely_prompt = next(p for p in ([a, a + 1, a + 2] for a in range(2, 60))
                         if target_only(target, [p], 1)[0][0] not in p)
    every_token = list(range(64))  # any new token occurred before: a lookup always matches
    from specswap.controller import AdaptiveController

    worker = SpeculativeWorker(target, None, "NGRAM", speculative_num_steps=3, max_batch_size=2, max_seq_len=96,
                               graphs=graphs)
    controller = AdaptiveController(worker.pool, {"candidate_steps": [0, 3], "warmup_batches": 0})
    worker.prefill([0, 1], [lonely_prompt, every_token], [SamplingParams()] * 2)
    lonely = worker.decode_round([0])
    controller.observe(lonely)
    assert lonely.ran.steps == 0 and lonely.accept_lengths == [0] and len(lonely.new_tokens[0]) == 1
    assert lonely.tier.key == 3 and not lonely.measured_tier
    assert 0.0 < lonely.lookup_seconds < lonely.round_seconds  # the lookup that found nothing, within the round
    assert controller.params.num_batches == 0  # it tested no tier: no acceptance observation
    mixed = worker.decode_round([0, 1])
    controller.observe(mixed)
    assert mixed.ran.steps == 3 and controller.params.num_batches == 1  # the tier runs for both
    assert mixed.lookup_seconds == 0.0  # a verify's lookup is in its own round time
    tokens, _, _ = run_to_completion(SpeculativeWorker(target, None, "NGRAM", 3, max_batch_size=2, max_seq_len=96,
                                                 graphs=graphs), [lonely_prompt, every_token], 12)
    reference, _, _ = run_to_completion(SpeculativeWorker(target, None, None, max_batch_size=2, max_seq_len=96),
                                        [lonely_prompt, every_token], 12)
    assert tokens == reference


def test_bad_worker_arguments_are_named():
    target = random_target()
    with pytest.raises(ValueError, match="'MEDUSA'"):
        SpeculativeWorker(target, None, "MEDUSA")
    with pytest.raises(ValueError, match="needs an EAGLE head"):
        SpeculativeWorker(target, None, "EAGLE")
    with pytest.raises(ValueError, match="pass draft=None"):
        SpeculativeWorker(target, target, "NGRAM")
    worker = SpeculativeWorker(target, None, None, max_seq_len=16)
    with pytest.raises(ValueError, match="prompt of 0 tokens"):
        worker.check_prompt([])
    with pytest.raises(ValueError, match="prompt of 16 tokens"):
        worker.check_prompt(list(range(16)))
    with pytest.raises(ValueError, match=r"\[64\]"):
        worker.prefill([0], [[1, 64]], [SamplingParams()])


# ---- sampling: the emitted sequences follow the target's law --------------------------------------

VOCAB = 6
PROMPT = [1, 4, 2]
NUM_NEW = 3


def chi_square_pvalue(counts, probs):
    from test_sampling import chi_square_pvalue as pvalue
    return pvalue(counts, probs)


def exact_law(target, params):
    """P(t_1..t_3 | prompt) for every continuation, by enumeration: [V ** 3]."""
    continuations = torch.tensor(list(itertools.product(range(VOCAB), repeat=NUM_NEW)))  # [C, 3]
    count = continuations.shape[0]
    inputs = torch.cat((torch.tensor(PROMPT).expand(count, -1), continuations), dim=1)  # [C, P+3]
    cache = target.make_cache(count, inputs.shape[1])
    with torch.no_grad():
        logits = target(inputs, torch.arange(inputs.shape[1]).expand(count, -1), cache, torch.arange(count)).logits
    n = len(PROMPT)
    law = torch.ones(count, dtype=torch.float64)
    for i in range(NUM_NEW):
        step_logits = logits[:, n - 1 + i]
        probs = logits_to_probs(
            step_logits, torch.full((count,), params.temperature), torch.full((count,), params.top_k),
            torch.full((count,), params.top_p))
        law *= probs.gather(1, continuations[:, i:i + 1]).squeeze(1).double()
    return law


def sample_continuations(worker, params, num_samples, seed):
    counts = torch.zeros(VOCAB ** NUM_NEW, dtype=torch.long)
    slots = list(range(worker.max_batch_size))
    base = torch.Generator().manual_seed(seed)
    for _ in range(num_samples // len(slots)):
        generators = [torch.Generator(device=worker.device).manual_seed(
            int(torch.randint(0, 2 ** 62, (1,), generator=base))) for _ in slots]
        first = worker.prefill(slots, [PROMPT] * len(slots), [params] * len(slots), generators)
        outputs = [[token] for token in first]
        while any(len(o) < NUM_NEW for o in outputs):
            running = [s for s in slots if len(outputs[s]) < NUM_NEW]
            result = worker.decode_round(running)
            for slot, new in zip(running, result.new_tokens):
                outputs[slot].extend(new)
        for o in outputs:
            a, b, c = o[:NUM_NEW]
            counts[(a * VOCAB + b) * VOCAB + c] += 1
    return counts


def _accept_always(target_probs, draft_probs, draft_tokens, uniforms, noise):
    """A biased verifier: takes every draft, then the bonus token from the target."""
    batch, steps = draft_tokens.shape
    return torch.full((batch,), steps, device=draft_tokens.device), sample_from_cdf(target_probs[:, steps], noise)


def _resample_from_p(target_probs, draft_probs, draft_tokens, uniforms, noise):
    """A subtly biased verifier: the right acceptance test, but a rejection redraws from p, not max(0, p - q)."""
    accept_lengths, _ = accept_draft_tokens(target_probs, draft_probs, draft_tokens, uniforms, noise)
    rows = torch.arange(accept_lengths.shape[0], device=accept_lengths.device)
    return accept_lengths, sample_from_cdf(target_probs[rows, accept_lengths], noise)


def _accept_always_keyed(draw, draft_tokens):
    """accept_always for NGRAM's keyed acceptance: every draft, then the target's draw after the last."""
    return len(draft_tokens), draw(len(draft_tokens))


# full_law verifiers always build the target law (no from_logits shortcut, which is accept_draft_tokens' own)
BIASED_VERIFIERS = {"accept_always": Verifier(full_law=_accept_always, from_logits=None),
                    "resample_from_p": Verifier(full_law=_resample_from_p, from_logits=None)}
BIASED_KEYED_VERIFIERS = {"accept_always": Verifier(keyed=_accept_always_keyed)}


# k = 1 puts the bonus token (all drafts accepted) into the 3-token window; k = 2 the mid-chain rejection
@pytest.mark.parametrize("algorithm,steps,params,biased", [
    ("STANDALONE", 1, SamplingParams(max_new_tokens=3, temperature=1.0), None),
    ("STANDALONE", 1, SamplingParams(max_new_tokens=3, temperature=1.0), "accept_always"),
    ("STANDALONE", 2, SamplingParams(max_new_tokens=3, temperature=1.0), None),
    ("STANDALONE", 2, SamplingParams(max_new_tokens=3, temperature=1.0), "resample_from_p"),
    ("EAGLE", 2, SamplingParams(max_new_tokens=3, temperature=0.8, top_k=4, top_p=0.9), None),
    ("EAGLE", 2, SamplingParams(max_new_tokens=3, temperature=0.8, top_k=4, top_p=0.9), "accept_always"),
    ("EAGLE", 1, SamplingParams(max_new_tokens=3, temperature=1.2), None),
    # tier 0 of drafters with draft laws: plain draws keyed by keys from each request's generator
    ("EAGLE", 0, SamplingParams(max_new_tokens=3, temperature=1.0), None),
    ("STANDALONE", 0, SamplingParams(max_new_tokens=3, temperature=0.8, top_k=4, top_p=0.9), None),
    ("NGRAM", 1, SamplingParams(max_new_tokens=3, temperature=1.0), None),
    ("NGRAM", 2, SamplingParams(max_new_tokens=3, temperature=1.0), "accept_always"),
    ("NGRAM", 2, SamplingParams(max_new_tokens=3, temperature=0.8, top_k=4, top_p=0.9), None),
    ("NGRAM", 1, SamplingParams(max_new_tokens=3, temperature=0.8, top_k=4, top_p=0.9), "accept_always"),
])
def test_sampled_continuations_follow_the_target_law(device, algorithm, steps, params, biased):
    # sharp, clearly different target and draft laws so that a biased verifier shows
    target = random_target(VOCAB, 16, num_layers=1, seed=3, logit_scale=4.0)
    law = exact_law(target, params)  # on the CPU, before the sampling runs on the test device (tests/conftest.py)
    target.to(device)
    if algorithm == "STANDALONE":
        draft = random_target(VOCAB, 16, num_layers=1, seed=4, logit_scale=4.0).to(device)
    elif algorithm == "NGRAM":
        draft = None
    else:  # built after the target moved: the head shares its embedding and LM head
        draft = random_eagle_head(target, seed=4, token_map=[0, 2, 3, 5]).to(device)
    verifier = LOSSLESS
    if biased and algorithm == "NGRAM":  # NGRAM: draws keyed by output position (sampling.accept_keyed)
        verifier = BIASED_KEYED_VERIFIERS[biased]
    elif biased:
        verifier = BIASED_VERIFIERS[biased]
    worker = SpeculativeWorker(target, draft, algorithm, speculative_num_steps=steps, max_batch_size=8, max_seq_len=16,
                         verifier=verifier)
    assert worker.keyed_sampling == (algorithm == "NGRAM")
    # a biased verifier is far off; the unbiased runs need the samples to have power
    counts = sample_continuations(worker, params, num_samples=1200 if biased else 4000, seed=11)
    pvalue = chi_square_pvalue(counts, law)
    label = f"{algorithm} k={steps} biased={biased}: chi-square p-value {pvalue:.3g}"
    if biased:
        assert pvalue < 1e-4, label
    else:
        assert pvalue > 1e-3, label


def test_every_tier_s_vocabulary_buffers_are_contiguous_for_any_batch():
    """Tier k views the shared draft laws and noise as its own [S, k, V]: any batch's rows [:B] are contiguous,
    so the sampled accept reads them in place (a [:, :k] slice of one [S, k_max, V] buffer was copied every round
    at tiers below the largest), and the tiers share one allocation."""
    from specswap.worker.layout import ChainLayout
    from specswap.worker.tiers import TierBuffers

    buffers = TierBuffers(4, 5, 32, 16, torch.device("cpu"))
    stages = {k: buffers.build(k, ChainLayout(k, torch.device("cpu"))) for k in (1, 2, 3, 5)}
    for k, tier in stages.items():
        probs, noise = tier.draft.draft_probs, tier.draft.draft_noise
        assert probs.shape == (4, k, 32) and noise.shape == (4, k, 16)
        assert all(probs[:batch].is_contiguous() and noise[:batch].is_contiguous() for batch in range(1, 5)), k
        assert probs.data_ptr() == stages[5].draft.draft_probs.data_ptr()

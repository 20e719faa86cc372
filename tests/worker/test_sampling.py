"""Sampling warpers and lossless acceptance, on hand-made distributions."""

import math

import pytest
import torch

from specswap.sampling import (KEYED_VOCAB_LIMIT, KeyedNoise, SamplingParams, accept_draft_tokens, accept_from_logits,
                               accept_greedy, accept_keyed, exponential_, logits_to_probs, position_key,
                               sample_from_cdf, sample_from_probs, sample_keyed)


def chi_square_pvalue(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson chi-square goodness of fit; cells with expected count < 5 are pooled."""
    total = counts.sum().item()
    expected = probs.double() * total
    small = expected < 5
    observed = torch.cat([counts.double()[~small], counts.double()[small].sum().reshape(1)])
    expected = torch.cat([expected[~small], expected[small].sum().reshape(1)])
    keep = expected > 0
    observed, expected = observed[keep], expected[keep]
    if (observed[expected == 0] > 0).any():
        return 0.0
    statistic = ((observed - expected) ** 2 / expected).sum()
    dof = max(int(keep.sum().item()) - 1, 1)
    return torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64), statistic / 2).item()


def params(n, temperature=1.0, top_k=0, top_p=1.0):
    return (torch.full((n,), float(temperature)), torch.full((n,), top_k, dtype=torch.long),
            torch.full((n,), float(top_p)))


def test_greedy_rows_are_one_hot_at_argmax():
    logits = torch.tensor([[0.1, 3.0, -1.0, 2.9], [5.0, 0.0, 0.0, 0.0]])
    probs = logits_to_probs(logits, torch.tensor([0.0, 1.0]), torch.tensor([0, 0]), torch.tensor([1.0, 1.0]))
    assert probs[0].tolist() == [0.0, 1.0, 0.0, 0.0]
    torch.testing.assert_close(probs[1], logits[1].softmax(-1))


@pytest.mark.parametrize("temperature,top_k,top_p", [(0.7, 0, 1.0), (1.0, 3, 1.0), (1.3, 0, 0.8), (0.9, 5, 0.6)])
def test_warpers_match_transformers(temperature, top_k, top_p):
    from transformers.generation.logits_process import (
        TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper)
    torch.manual_seed(0)
    logits = torch.randn(6, 50) * 3
    reference = TemperatureLogitsWarper(temperature)(None, logits.clone())
    if top_k:
        reference = TopKLogitsWarper(top_k)(None, reference)
    if top_p < 1.0:
        reference = TopPLogitsWarper(top_p)(None, reference)
    ours = logits_to_probs(logits, *params(6, temperature, top_k, top_p))
    torch.testing.assert_close(ours, reference.softmax(-1))


def test_mixed_rows_each_use_their_own_params():
    torch.manual_seed(1)
    logits = torch.randn(3, 20)
    mixed = logits_to_probs(logits, torch.tensor([0.0, 1.0, 0.5]), torch.tensor([0, 4, 0]),
                            torch.tensor([1.0, 1.0, 0.5]))
    for row, (t, k, p) in enumerate([(0.0, 0, 1.0), (1.0, 4, 1.0), (0.5, 0, 0.5)]):
        alone = logits_to_probs(logits[row:row + 1], *params(1, t, k, p))
        torch.testing.assert_close(mixed[row:row + 1], alone)
    assert (mixed[1] > 0).sum() == 4


@pytest.mark.parametrize("draw", ["torch", "specswap"])
def test_sample_from_probs_follows_the_distribution(draw):
    probs = torch.tensor([0.5, 0.25, 0.125, 0.125, 0.0])
    gen = torch.Generator().manual_seed(0)
    noise = torch.empty(20000, 5)
    noise = noise.exponential_(generator=gen) if draw == "torch" else exponential_(noise, gen)
    tokens = sample_from_probs(probs.expand(20000, 5), noise)
    counts = torch.bincount(tokens, minlength=5)
    assert counts[4] == 0
    assert chi_square_pvalue(counts, probs) > 1e-3


def test_sample_from_cdf_follows_the_distribution():
    probs = torch.tensor([0.0, 0.5, 0.25, 0.0, 0.125, 0.125, 0.0])
    gen = torch.Generator().manual_seed(0)
    tokens = sample_from_cdf(probs.expand(20000, 7) * 3.0, torch.rand(20000, generator=gen))  # unnormalised
    counts = torch.bincount(tokens, minlength=7)
    assert counts[0] == counts[3] == counts[6] == 0
    assert chi_square_pvalue(counts, probs) > 1e-3
    # u = 0 draws the first entry with mass, u just under 1 the last (never a zero entry past it)
    edges = sample_from_cdf(probs.expand(3, 7), torch.tensor([0.0, 0.5, 1.0 - 2 ** -24]))
    assert edges.tolist() == [1, 2, 5]  # token 1 owns [0, 0.5), token 2 [0.5, 0.75)
    one_hot = torch.nn.functional.one_hot(torch.tensor([3, 0, 6]), 7).float()
    assert sample_from_cdf(one_hot, torch.tensor([0.0, 0.999, 0.5])).tolist() == [3, 0, 6]


def test_greedy_acceptance_is_longest_matching_prefix():
    vocab = 6
    target_argmax = torch.tensor([[2, 4, 1, 5], [3, 3, 3, 3], [0, 1, 2, 3]])  # [B, k+1]
    draft_tokens = torch.tensor([[2, 4, 0], [3, 3, 3], [5, 1, 2]])  # [B, k]
    target_probs = torch.nn.functional.one_hot(target_argmax, vocab).float()
    draft_probs = torch.nn.functional.one_hot(draft_tokens, vocab).float()
    accept, nxt = accept_draft_tokens(target_probs, draft_probs, draft_tokens,
                                      torch.rand(3, 3), torch.rand(3))
    assert accept.tolist() == [2, 3, 0]
    assert nxt.tolist() == [1, 3, 0]


def test_greedy_shortcut_equals_one_hot_speculative_sampling():
    gen = torch.Generator().manual_seed(3)
    vocab, steps, batch = 5, 4, 64
    logits = torch.randn(batch, steps + 1, vocab, generator=gen)
    # drafts that often agree with the argmax, so every accept length occurs
    drafts = torch.where(torch.rand(batch, steps, generator=gen) < 0.7, logits[:, :steps].argmax(-1),
                         torch.randint(0, vocab, (batch, steps), generator=gen))
    greedy = torch.zeros(batch * (steps + 1))
    target_probs = logits_to_probs(logits.reshape(-1, vocab), greedy, greedy.long(), greedy + 1).view(logits.shape)
    draft_probs = torch.nn.functional.one_hot(drafts, vocab).float()
    slow = accept_draft_tokens(target_probs, draft_probs, drafts, torch.rand(batch, steps, generator=gen),
                               torch.rand(batch, generator=gen))
    fast = accept_greedy(logits, drafts)
    assert slow[0].tolist() == fast[0].tolist() and slow[1].tolist() == fast[1].tolist()
    assert set(fast[0].tolist()) == set(range(steps + 1))


def test_zero_draft_tokens_samples_from_target():
    target_probs = torch.nn.functional.one_hot(torch.tensor([[4]]), 6).float()
    accept, nxt = accept_draft_tokens(target_probs, torch.zeros(1, 0, 6), torch.zeros(1, 0, dtype=torch.long),
                                      torch.zeros(1, 0), torch.rand(1))
    assert accept.tolist() == [0] and nxt.tolist() == [4]


def _emitted_pairs(target_probs, draft_probs, num_rows, seed, accept_fn):
    """Run one round on num_rows independent copies; return the first two emitted tokens' joint counts."""
    gen = torch.Generator().manual_seed(seed)
    k, vocab = draft_probs.shape
    q = draft_probs.expand(num_rows, k, vocab)
    drafts = sample_from_probs(q, torch.empty(num_rows, k, vocab).exponential_(generator=gen))
    accept, nxt = accept_fn(target_probs.expand(num_rows, k + 1, vocab), q, drafts,
                            torch.rand(num_rows, k, generator=gen), torch.rand(num_rows, generator=gen))
    emitted = torch.cat([drafts, nxt.unsqueeze(-1)], dim=1)  # d1..dk then the correction/bonus token
    emitted.scatter_(1, accept.unsqueeze(-1), nxt.unsqueeze(-1))
    first = emitted[:, 0]
    return first, torch.bincount(first, minlength=vocab)


def _accept_always(target_probs, draft_probs, draft_tokens, uniforms, noise):
    return accept_draft_tokens(target_probs, draft_probs, draft_tokens, torch.zeros_like(uniforms), noise)


@pytest.mark.parametrize("accept_fn,should_match", [(accept_draft_tokens, True), (_accept_always, False)])
def test_first_emitted_token_follows_target_and_biased_verifier_fails(accept_fn, should_match):
    # p and q deliberately different; with position-independent p the first emitted token must follow p.
    p = torch.tensor([0.40, 0.30, 0.15, 0.10, 0.05, 0.0])
    q = torch.tensor([0.10, 0.10, 0.20, 0.20, 0.30, 0.10])
    k = 3
    _, counts = _emitted_pairs(p.expand(k + 1, 6), q.expand(k, 6), 40000, seed=0, accept_fn=accept_fn)
    pvalue = chi_square_pvalue(counts, p)
    assert (pvalue > 1e-3) == should_match, pvalue


@pytest.mark.parametrize("one_hot_drafts", [False, True])
@pytest.mark.parametrize("steps", [0, 1, 3])
def test_accept_from_logits_takes_the_same_decisions_as_the_full_law(one_hot_drafts, steps):
    # same logits, noise and uniforms: the sparse path must accept and emit exactly what the full path does
    gen = torch.Generator().manual_seed(steps + 10 * one_hot_drafts)
    batch, vocab = 64, 50
    logits = torch.randn(batch, steps + 1, vocab, generator=gen) * 2
    temperature = torch.tensor([0.0, 0.7, 1.0, 1.5] * (batch // 4))  # greedy rows mixed in
    drafts = torch.randint(0, vocab, (batch, steps), generator=gen)
    # make a good share of drafts the target's favourite, so long acceptances happen too
    favourite = logits[:, :steps].argmax(-1)
    drafts = torch.where(torch.rand(batch, steps, generator=gen) < 0.6, favourite, drafts)
    if one_hot_drafts:
        draft_probs = torch.zeros(batch, steps, vocab).scatter_(-1, drafts.unsqueeze(-1), 1.0)
    else:
        draft_probs = torch.softmax(torch.randn(batch, steps, vocab, generator=gen), -1)
    uniforms = torch.rand(batch, steps, generator=gen)
    noise = torch.rand(batch, generator=gen)
    n = batch * (steps + 1)
    full = logits_to_probs(logits.reshape(n, vocab), temperature.repeat_interleave(steps + 1),
                           torch.zeros(n, dtype=torch.long), torch.ones(n), apply_filters=False)
    expected = accept_draft_tokens(full.view(batch, steps + 1, vocab), draft_probs, drafts, uniforms, noise)
    got = accept_from_logits(logits, temperature, drafts, draft_probs, uniforms, noise)
    assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])
    if steps:
        assert 0 < int((expected[0] > 0).sum()) and int((expected[0] == 0).sum()) > 0  # both paths exercised


def test_keyed_draws_follow_the_law_and_depend_on_the_key_alone():
    p = torch.tensor([0.05, 0.5, 0.0, 0.15, 0.3])
    keyed = KeyedNoise(5)
    draws = [sample_keyed(p.log(), position_key(seed, 3), keyed) for seed in range(20_000)]
    counts = torch.bincount(torch.tensor(draws), minlength=5)
    assert counts[2] == 0                                                  # zero weight is never drawn
    assert chi_square_pvalue(counts, p) > 1e-3
    # along the positions of one request too: its draws are independent of each other
    along = [sample_keyed(p.log(), position_key(7, n), keyed) for n in range(20_000)]
    assert chi_square_pvalue(torch.bincount(torch.tensor(along), minlength=5), p) > 1e-3
    # unnormalised log weights (logits) draw the same token for the same key; other positions draw anew
    logits = p.log() + 7.0
    assert all(sample_keyed(logits, position_key(seed, 3), keyed) == draws[seed] for seed in range(200))
    other = [sample_keyed(p.log(), position_key(seed, 4), keyed) for seed in range(200)]
    assert sum(a != b for a, b in zip(draws, other)) > 60


def _keyed_draw_over_the_whole_vocabulary(log_weights: torch.Tensor, key: int, keyed: KeyedNoise) -> int:
    """The keyed draw by its definition: every entry's noise, then the first argmax."""
    return int(torch.argmax(keyed.uniform(key).clone().log_().neg_().log_().neg_().add_(log_weights)))


@pytest.mark.parametrize("scale", [0.3, 3.0, 30.0])
def test_keyed_draws_equal_the_whole_vocabulary_draw(scale):
    # sample_keyed draws noise only for entries that can win; the token must be the full computation's, at
    # flat and peaked laws, with filtered (-inf) entries
    vocab = 50_000
    keyed = KeyedNoise(vocab)
    generator = torch.Generator().manual_seed(int(scale * 10))
    for trial in range(40):
        logits = torch.randn(vocab, generator=generator) * scale
        if trial % 4 == 0:
            logits[torch.rand(vocab, generator=generator) < 0.5] = float("-inf")
        key = position_key(trial, trial * 7)
        assert sample_keyed(logits, key, keyed) == _keyed_draw_over_the_whole_vocabulary(logits, key, keyed)
    entries = torch.tensor([0, 5, vocab - 1])
    assert torch.equal(keyed.uniform_at(123, entries), keyed.uniform(123)[entries])


def _splitmix64_top24(counter: int) -> int:
    """SplitMix64 output number ``counter`` (Steele et al. 2014), written out on Python ints: its top 24 bits."""
    mask = (1 << 64) - 1
    z = (counter * 0x9E3779B97F4A7C15) & mask
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
    return (z ^ (z >> 31)) >> 40


@pytest.mark.parametrize("key", [0, 1, 12345, 2 ** 32 + 12345, 2 ** 63 - 3, 2 ** 63, 2 ** 64 - 500, position_key(9, 4)])
def test_keyed_noise_is_splitmix64_bit_for_bit(key):
    # int64 tensor ops must wrap like uint64 ones: keys past 2^63 and counters that wrap past 2^64 included
    vocab = 1000
    got = KeyedNoise(vocab).uniform(key)
    expected = torch.tensor([_splitmix64_top24((key + v) % 2 ** 64) for v in range(vocab)], dtype=torch.float64)
    assert torch.equal(got.double() * 2 ** 24, expected)
    assert got.dtype == torch.float32 and bool((got >= 0).all()) and bool((got < 1).all())


def test_distinct_seed_position_pairs_read_disjoint_counters_in_all_64_bits():
    # the bits that count: every (seed, position) owns counters [key, key + vocab) of SplitMix64, none shared
    # over the grid, seeds that differ only above bit 32 included (a torch CPU generator's manual_seed keeps the
    # low 32 bits: 1M keys folded to 32 bits share a seed n^2 / 2^33 ~ 116 times, each pair drawing the same noise)
    seeds = [*range(1000), *(s + (1 << 32) for s in range(500)), *(s + (1 << 40) for s in range(500))]
    keys = sorted(position_key(seed, n) for seed in seeds for n in range(500))
    vocab = 262_144  # Gemma 3's vocabulary
    assert len(keys) == 1_000_000
    gaps = [b - a for a, b in zip(keys, keys[1:])] + [keys[0] + 2 ** 64 - keys[-1]]  # around the 2^64 circle
    assert min(gaps) >= vocab


def test_keyed_streams_are_distinct_repeatable_and_uniform():
    keyed, vocab = KeyedNoise(4096), 4096
    seeds = [0, 1, 2, 3, 2 ** 32, 2 ** 32 + 1, 2 ** 40 + 2, 2 ** 63, -1, 123456789]
    streams = torch.stack([keyed.uniform(position_key(seed, n)).clone() for seed in seeds for n in range(40)])
    as_ints = (streams.double() * 2 ** 24).long()                                      # [400, V]
    assert len({tuple(row) for row in as_ints.tolist()}) == len(seeds) * 40
    # keys that differ only above bit 32 draw other noise (a generator seeded by them would repeat the stream)
    key = position_key(5, 2)
    high = [keyed.uniform((key + (1 << bit)) % 2 ** 64).clone() for bit in (32, 40, 48, 63)]
    assert all(not torch.equal(keyed.uniform(key), other) for other in high)
    # the same (seed, position) draws the same noise whatever was drawn before
    assert torch.equal(keyed.uniform(position_key(2 ** 32, 17)), streams[4 * 40 + 17])
    # pairwise: entries agree by chance only (2^-24 each), neighbouring streams are uncorrelated
    centred = streams.double() - 0.5
    correlation = (centred @ centred.T) / (centred.norm(dim=1, keepdim=True) * centred.norm(dim=1))
    off_diagonal = correlation - torch.eye(len(streams), dtype=torch.float64)
    assert off_diagonal.abs().max() < 6 / vocab ** 0.5
    # pooled, the uniforms are uniform: Kolmogorov-Smirnov, 1% critical value 1.63 / sqrt(n)
    ordered = streams.flatten().double().sort().values
    grid = torch.arange(1, len(ordered) + 1, dtype=torch.float64) / len(ordered)
    assert (grid - ordered).abs().max() < 1.63 / len(ordered) ** 0.5


def test_keyed_noise_rejects_what_it_cannot_key():
    with pytest.raises(ValueError, match=f"vocab_size must be an int in 1..{KEYED_VOCAB_LIMIT}.*got 16777217"):
        KeyedNoise(KEYED_VOCAB_LIMIT + 1)
    with pytest.raises(ValueError, match="got 0"):
        KeyedNoise(0)
    with pytest.raises(ValueError, match="position must be >= 0, got -1"):
        position_key(3, -1)


def test_keyed_acceptance_takes_a_draft_with_probability_p_and_emits_the_target_draw():
    p = torch.tensor([0.1, 0.6, 0.3])
    keyed = KeyedNoise(3)
    rows = 20_000
    accepted_counts = [0, 0, 0]
    after_rejection = [0, 0, 0]
    for seed in range(rows):
        draws = []

        def draw(i):
            draws.append(sample_keyed(p.log(), position_key(seed, i), keyed))
            return draws[-1]
        accepted, token = accept_keyed(draw, [1, 1])
        assert token == draws[-1] and len(draws) == accepted + 1        # no draw past the first mismatch
        accepted_counts[accepted] += 1
        if accepted == 0:
            after_rejection[token] += 1
    freq = torch.tensor(accepted_counts, dtype=torch.float64) / rows     # 0, 1, 2 accepted: 0.4, 0.24, 0.36
    torch.testing.assert_close(freq, torch.tensor([0.4, 0.24, 0.36], dtype=torch.float64), atol=0.015, rtol=0)
    assert after_rejection[1] == 0                                        # p without d: 0 and 2 as 1 : 3
    assert abs(after_rejection[0] / sum(after_rejection) - 0.25) < 0.02


def test_exponential_noise_has_the_exp1_law():
    gen = torch.Generator().manual_seed(3)
    draws = exponential_(torch.empty(200_000), gen).double()
    assert (draws > 0).all()
    # Kolmogorov-Smirnov distance to Exp(1): 1.63 / sqrt(n) is the 1% critical value
    ordered = draws.sort().values
    cdf = 1 - torch.exp(-ordered)
    grid = torch.arange(1, len(ordered) + 1, dtype=torch.float64) / len(ordered)
    assert (grid - cdf).abs().max() < 1.63 / len(ordered) ** 0.5
    # and the same stream gives the same draws
    again = exponential_(torch.empty(200_000), torch.Generator().manual_seed(3)).double()
    assert torch.equal(draws, again)


def test_sampling_params_reject_bad_values_by_name():
    with pytest.raises(ValueError, match="temperature.*-0.5"):
        SamplingParams(temperature=-0.5)
    with pytest.raises(ValueError, match="top_p.*0"):
        SamplingParams(top_p=0.0)
    with pytest.raises(ValueError, match="top_p.*1.5"):
        SamplingParams(top_p=1.5)
    with pytest.raises(ValueError, match="max_new_tokens.*0"):
        SamplingParams(max_new_tokens=0)
    with pytest.raises(ValueError, match="top_k.*-1"):
        SamplingParams(top_k=-1)
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=math.nan)
    assert SamplingParams(stop="###").stop == ("###",)

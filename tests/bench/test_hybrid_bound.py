"""bench/hybrid_bound.py's counting: where EAGLE's rounds began, the hindsight choice per round, the draft step's fit."""

import pytest

from scripts import load_script

bound = load_script("hybrid_bound")
replay = load_script("suffix_replay")


def test_round_starts_follow_the_accepted_drafts():
    # first output token from the prefill; a round that accepts a drafts emits a + 1 tokens
    assert bound.round_starts([2, 0, 3, 1], 8) == [(1, 2), (4, 0), (5, 3)]  # the last began at 9 >= 8: none
    assert bound.round_starts([], 5) == []


def test_the_hybrid_takes_the_better_draft_each_round():
    k = 2
    costs = replay.RowCosts({1: 1.0, 2: 1.0, 3: 1.5, 4: 2.0})
    # output positions 1..6: SUFFIX's chain of 2 accepts 2 at position 1, nothing elsewhere; lookup never drafts
    positions = [replay.Position({k: None}, {k: 2 if p == 1 else (0 if p % 2 else None)}, {k: None})
                 for p in range(1, 7)]
    row = {"accept_lengths": [0, 1, 2], "output_ids": list(range(7))}  # EAGLE's rounds at 1, 2, 4
    figures = bound.phase_figures([row], [positions], k, costs, draft_step=0.25)
    assert figures["rounds"] == 3
    assert figures["eagle_tokens_per_round"] == pytest.approx((1 + 2 + 3) / 3)
    assert figures["suffix_tokens_per_round"] == pytest.approx((3 + 1 + 1) / 3)  # no draft at 2 and 4: one token
    assert figures["hybrid_tokens_per_round"] == pytest.approx((3 + 2 + 3) / 3)
    assert figures["suffix_share"] == pytest.approx(1 / 3)
    # EAGLE pays its two draft steps every round, the hybrid only where it took EAGLE's draft
    assert figures["eagle"] == pytest.approx(3 * (1.5 + 0.5) / 6)
    assert figures["hybrid"] == pytest.approx((1.5 + 2 * (1.5 + 0.5)) / 8)
    assert figures["hybrid_free_drafts"] == pytest.approx(3 * 1.5 / 8)


def test_the_draft_step_is_fitted_from_round_times():
    costs = replay.RowCosts({1: 1.0, 2: 1.2, 4: 1.6, 8: 2.4})
    plain = 0.01  # seconds per token target-only
    step, host = 0.3, 0.1
    rounds = {1: 50, 3: 40, 7: 20}
    seconds = {None: plain * 100, **{k: n * plain * (costs(k + 1) + step * k + host) for k, n in rounds.items()}}
    assert bound.fit_draft_step(seconds, rounds, 100, costs) == pytest.approx(step)

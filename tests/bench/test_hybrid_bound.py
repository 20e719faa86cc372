"""bench/hybrid_bound.py's counting: where EAGLE's rounds began, the hindsight choice per round, the draft step's fit."""

import pytest

from scripts import load_script

bound = load_script("hybrid_bound")
replay = load_script("suffix_replay")


def test_round_starts_follow_the_accepted_drafts():
    # first output token from the prefill; a round that accepts a drafts emits a + 1 tokens
    assert bound.round_starts([2, 0, 3, 1], 8) == [(1, 2), (4, 0), (5, 3)]  # the last began at 9 >= 8: none
    assert bound.round_starts([], 5) == []


def test_every_drafter_is_judged_at_eagles_round_starts():
    k = 2
    costs = replay.RowCosts({1: 1.0, 2: 1.0, 3: 1.5, 4: 2.0})
    # output positions 1..6: the trees' chain accepts 2 at 1 and nothing at odd positions; lookup drafts only at
    # 4 (accepting 1), where it goes first though the trees would accept 2 there
    positions = [replay.Position({k: 1 if p == 4 else None},
                                 {k: 2 if p in (1, 4) else (0 if p % 2 else None)}, {k: None})
                 for p in range(1, 7)]
    row = {"accept_lengths": [0, 1, 2], "output_ids": list(range(7))}  # EAGLE's rounds begin at 1, 2, 4
    figures = bound.phase_figures([row], [positions], k, costs, draft=(0.25, 0.1))
    assert figures["rounds"] == 3
    assert figures["eagle_tokens_per_round"] == pytest.approx((1 + 2 + 3) / 3)
    # SUFFIX as built: the trees at 1 (3 tokens), nothing at 2 (a plain decode), lookup first at 4 (2 tokens)
    assert figures["suffix_tokens_per_round"] == pytest.approx((3 + 1 + 2) / 3)
    assert figures["suffix"] == pytest.approx((1.5 + 1.0 + 1.5) / 6)
    # the hybrid in hindsight: the trees at 1 (3), EAGLE at 2 (2), the trees at 4 (3, tying EAGLE: EAGLE's draft)
    assert figures["hybrid_tokens_per_round"] == pytest.approx((3 + 2 + 3) / 3)
    assert figures["suffix_share"] == pytest.approx(1 / 3)
    eagle_round = 1.5 + 2 * 0.25 + 0.1  # EAGLE pays its draft steps and its round's share; the suffix rounds not
    assert figures["eagle"] == pytest.approx(3 * eagle_round / 6)
    assert figures["hybrid"] == pytest.approx((1.5 + 2 * eagle_round) / 8)


def test_the_draft_cost_is_fitted_from_round_times():
    costs = replay.RowCosts({1: 1.0, 2: 1.2, 4: 1.6, 8: 2.4})
    plain = 0.01  # seconds per token target-only
    step, fixed = 0.3, 0.1
    rounds = {1: 50, 3: 40, 7: 20}
    seconds = {None: plain * 100, **{k: n * plain * (costs(k + 1) + step * k + fixed) for k, n in rounds.items()}}
    assert bound.fit_draft_cost(seconds, rounds, 100, costs) == pytest.approx((step, fixed))
